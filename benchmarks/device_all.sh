#!/usr/bin/env bash
# Every GPU check, in order of value, within one time budget (BUDGET seconds, default 720):
#
#   1. the machine, the install from the wheelhouse, each package's import alone (benchmarks/device_steps.sh)
#   2. the generation paths, then the tutorial epoch against CoMLRL, then the wrappers' costs (device_generation.sh)
#   3. vLLM for teams, when the machine has vLLM (device_vllm.sh; it is never installed here)
#
#   bash benchmarks/device_all.sh                   # on the GPU machine, from the repository root, the wheelhouse
#                                                   # in ./wheelhouse (python benchmarks/wheelhouse.py builds it)
#   BUDGET=540 bash benchmarks/device_all.sh        # inside a 10-minute slot, with a minute to spare
#   SIZE=qwen2.5-0.5b-mini BF16= THREADS=1 ROUNDS=1 EPOCH_ROUNDS=1 PATHS="plain continuous_batching" \
#       EPOCH_LIMIT=900 BUDGET=1500 unshare -n bash benchmarks/device_all.sh
#                                                   # rehearsed on a CPU without network, with the CPU shapes (CoMLRL's
#                                                   # epoch on Qwen's vocabulary takes minutes on one CPU thread)
#
# Every step's time limit is capped by what is left of the budget, and a step left with under MIN_STEP (20) seconds
# is skipped, so the script ends within BUDGET plus a few seconds of clean-up; whatever it is stopped by, every step
# that ended has already written its file in RESULTS_DIR ($OUT when set; see device_steps.sh): steps.txt says what
# ran, how it ended and how long it took.
set -uo pipefail
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-720}
export DEADLINE=${DEADLINE:-$(($(date +%s) + BUDGET))}
. benchmarks/device_steps.sh
export RESULTS_DIR WHEELHOUSE PYTHON
echo "budget: ${BUDGET} s, until $(date -u -d "@$DEADLINE" +%H:%M:%S) UTC; results in $RESULTS_DIR" \
    | tee -a "$RESULTS_DIR/steps.txt"
prepare
bash benchmarks/device_generation.sh
bash benchmarks/device_vllm.sh
echo "done with $((DEADLINE - $(date +%s))) s of the budget left" | tee -a "$RESULTS_DIR/steps.txt"
cat "$RESULTS_DIR/steps.txt"
