# Sourced by the device scripts (device_all.sh, device_generation.sh, device_vllm.sh), from the repository root.
#
# A GPU machine without network: everything beside its own torch and CUDA comes from a wheelhouse built on a
# connected machine (python benchmarks/wheelhouse.py; docs/offline.md); nothing is installed from the network. GPU
# time comes in short slots, so a step that hangs must not take the others' results with it: each step runs under
# its own time limit and writes its result to its own small file as soon as it ends, in RESULTS_DIR ($OUT on the
# device machine, else /tmp/multiagent_trl_device):
#
#   steps.txt        one line per step, written as it ends: name, ok / failed (exit code) / TIMED OUT / skipped, s
#   env.txt          the machine: GPU, Python, `pip list --format=freeze` before installing
#   install.txt      pip installing from the wheelhouse (--no-index)
#   imports.txt      each package imported alone, in a fresh process: version, seconds, and where a hang hung
#   generation.txt   benchmarks/generation.py, one part per step (device_generation.sh)
#   vllm.txt         benchmarks/vllm_device.py (device_vllm.sh; the script also writes vllm_device.md)
#
# A step killed at its limit gets SIGABRT first, so that Python prints every thread's stack (PYTHONFAULTHANDLER)
# into the step's file: a hang names its package and line. DEADLINE (seconds since the epoch; device_all.sh sets it
# from BUDGET) caps every step's limit, and a step left with under MIN_STEP seconds is skipped.
#
# Settings (environment): PYTHON (python3), WHEELHOUSE (./wheelhouse), RESULTS_DIR, DEADLINE, MIN_STEP (20),
# IMPORT_LIMIT (seconds per import, 120), INSTALL_LIMIT (300).

PYTHON=${PYTHON:-python3}
WHEELHOUSE=${WHEELHOUSE:-$PWD/wheelhouse}
RESULTS_DIR=${OUT:-${RESULTS_DIR:-/tmp/multiagent_trl_device}}
MIN_STEP=${MIN_STEP:-20}
IMPORT_LIMIT=${IMPORT_LIMIT:-120}
INSTALL_LIMIT=${INSTALL_LIMIT:-300}
mkdir -p "$RESULTS_DIR"
ulimit -c 0  # a step stopped by SIGABRT leaves no core file

# Nothing may reach for the network: the hubs offline, wandb off, pip only from the wheelhouse.
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 DO_NOT_TRACK=1
export WANDB_MODE=disabled WANDB_SILENT=true TRL_EXPERIMENTAL_SILENCE=1
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export PYTHONFAULTHANDLER=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# record NAME STATUS [SECONDS]: one line in steps.txt
record() {
    printf '%-28s %-40s %s\n' "$1" "$2" "${3:+$3 s}" >>"$RESULTS_DIR/steps.txt"
    printf '[%s] %s: %s\n' "$(date -u +%H:%M:%S)" "$1" "$2${3:+ ($3 s)}" >&2
}

# step NAME LIMIT FILE COMMAND...: COMMAND's output appended to FILE, stopped after LIMIT seconds (fewer if the
# budget's DEADLINE comes first). Returns COMMAND's exit code; 124 when it was stopped, 125 when skipped.
step() {
    local name=$1 limit=$2 file=$RESULTS_DIR/$3 left start rc=0
    shift 3
    if [ -n "${DEADLINE:-}" ]; then
        left=$((DEADLINE - $(date +%s)))
        if ((left < MIN_STEP)); then
            record "$name" "skipped: ${left} s of the budget left"
            return 125
        fi
        if ((limit > left)); then limit=$left; fi
    fi
    printf '\n== %s (limit %s s, %s)\n' "$name" "$limit" "$(date -u +%FT%TZ)" >>"$file"
    start=$(date +%s)
    # ABRT first (Python prints its stacks), KILL 10 s later if that did not end it
    timeout -s ABRT -k 10 "$limit" "$@" >>"$file" 2>&1 </dev/null || rc=$?
    case $rc in
        0) record "$name" ok $(($(date +%s) - start)) ;;
        124 | 137) record "$name" "TIMED OUT after ${limit} s" $(($(date +%s) - start)); rc=124 ;;
        *) record "$name" "failed (exit code $rc)" $(($(date +%s) - start)) ;;
    esac
    return $rc
}

# The machine, before anything is installed.
env_step() {
    step env 60 env.txt bash -c '
        uname -srm; date -u
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
        else
            echo "no nvidia-smi"
        fi
        "$0" -VV
        echo "pip list --format=freeze:"; "$0" -m pip list --format=freeze' "$PYTHON"
}

# Everything the project and the benchmarks need beside torch, from the wheelhouse alone.
install_step() {
    if [ ! -f "$WHEELHOUSE/requirements.txt" ]; then
        echo "No wheelhouse at $WHEELHOUSE: build one on a connected machine (python benchmarks/wheelhouse.py)" \
            "and copy it here; nothing is installed from the network." >>"$RESULTS_DIR/install.txt"
        record install "skipped: no wheelhouse at $WHEELHOUSE"
        return 125
    fi
    # --isolated: pip's environment variables and user configuration (an index, find-links) are ignored.
    step install "$INSTALL_LIMIT" install.txt "$PYTHON" -m pip install --isolated --no-index --no-cache-dir \
        --disable-pip-version-check --find-links "$WHEELHOUSE" -r "$WHEELHOUSE/requirements.txt"
}

# import_steps PACKAGE...: each imported alone in a fresh process, in order; stops at the first that hangs (the
# next ones import it too). Returns 0 when all imported, 1 when one failed, 124 when one hung.
import_steps() {
    local package rc=0 status
    for package in "$@"; do
        step "import $package" "$IMPORT_LIMIT" imports.txt "$PYTHON" -c '
import importlib, sys, time
start = time.perf_counter()
module = importlib.import_module(sys.argv[1])
print(sys.argv[1], getattr(module, "__version__", "?"), f"{time.perf_counter() - start:.1f} s", module.__file__)
if sys.argv[1] == "torch":
    cuda = module.cuda.is_available()
    print("cuda", cuda, module.version.cuda, module.cuda.get_device_name() if cuda else "")
' "$package"
        status=$?
        if ((status == 124)); then
            echo "$package hung on import: its stack is above; the imports after it were not tried" \
                >>"$RESULTS_DIR/imports.txt"
            return 124
        fi
        if ((status != 0)); then rc=1; fi
    done
    return $rc
}

# The packages every device script imports, torch first: a hang in torch would show up in every later one.
COMMON_IMPORTS="torch transformers accelerate peft datasets trl wandb comlrl multiagent_trl"

# env, install and the imports, once: device_all.sh runs them and exports PREPARED with their result.
prepare() {
    if [ -n "${PREPARED:-}" ]; then
        return "$PREPARED"
    fi
    env_step
    install_step
    import_steps $COMMON_IMPORTS
    PREPARED=$?
    export PREPARED
    return $PREPARED
}
