#!/usr/bin/env bash
# vLLM for teams on a GPU: completions/s of one training generation batch of a 2-agent team of randomly
# initialised models of Qwen2.5-0.5B's shape (no weights can be downloaded), bf16: the team with LoRA adapters on one
# engine, the team of separate models on two engines, one TRL+vLLM (colocate) run per agent, and CoMLRL 1.4.3; the
# ratios against the targets (team >= 0.9x N TRL+vLLM runs, >= 5x CoMLRL). See benchmarks/vllm_device.py.
#
#   bash benchmarks/device_vllm.sh                   # on a GPU machine that has vLLM, from the repository root
#                                                    # (estimated 5-8 minutes: 5 engines' start-ups, CoMLRL's
#                                                    # generate; 4 prompts x 8 x 128 tokens, 3 rounds)
#   SIZE=qwen2.5-vocab-h128 BF16= PROMPTS=2 GENERATIONS=4 TOKENS=8 ROUNDS=2 ROWS=lora RESULTS=/tmp/vllm.json \
#       bash benchmarks/device_vllm.sh               # on a CPU (vLLM's CPU build), tiny shape, float32: one row per
#                                                    # call (ROWS=lora, separate, trl, comlrl; 1-4 minutes each on a
#                                                    # shared core), RESULTS gathering the rows into one table
#
# vLLM must already be there: its GPU build pins its own torch and weighs hundreds of MB, so it is not in the
# wheelhouse, and nothing is installed from the network. Without it the script says so and exits with 0. The rest
# comes from the wheelhouse (benchmarks/device_steps.sh: each step under its own time limit, VLLM_LIMIT for the
# benchmark, 480 s; results in RESULTS_DIR, $OUT when set: vllm.txt, vllm_device.md, steps.txt).
#
# On a CPU also export VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind
# (the Python script sets these defaults itself). EXTRA passes more flags, e.g. EXTRA=--trl-sequential (the TRL runs
# one after the other, each engine deleted before the next is built) or EXTRA="--gpu-memory 0.3". The GPU run is not
# done yet: no GPU was lent so far.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/device_steps.sh
SIZE=${SIZE:-qwen2.5-0.5b-shape}
BF16=${BF16---bf16}
PROMPTS=${PROMPTS:-4}
GENERATIONS=${GENERATIONS:-8}
TOKENS=${TOKENS:-128}
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-lora separate trl comlrl}

# Looked up without importing it (an import of vLLM takes many seconds).
if ! "$PYTHON" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("vllm") is None)'; then
    message="vLLM is not installed for $PYTHON: its GPU build pins its own torch and weighs hundreds of MB, so the"
    message+=" wheelhouse does not carry it, and nothing is installed from the network. Use a machine or image that"
    message+=" has vLLM (TRL 1.16 accepts 0.22-0.31)."
    echo "$message" >>"$RESULTS_DIR/vllm.txt"
    record vllm "skipped: vLLM is not installed"
    echo "$message"
    exit 0
fi
prepare
if (($? == 124)); then
    record vllm "skipped: an import hung (imports.txt)"
    exit 0
fi
import_steps vllm || { record vllm "skipped: vLLM does not import (imports.txt)"; exit 0; }
# OUT: vllm_device.py writes its table to $OUT/vllm_device.md
step "vllm benchmark" "${VLLM_LIMIT:-480}" vllm.txt env OUT="$RESULTS_DIR" "$PYTHON" benchmarks/vllm_device.py \
    --size "$SIZE" $BF16 --prompts "$PROMPTS" --generations "$GENERATIONS" --tokens "$TOKENS" --rounds "$ROUNDS" \
    --rows $ROWS ${RESULTS:+--results "$RESULTS"} ${EXTRA:-}
exit 0
