#!/usr/bin/env bash
# The generation comparison on a GPU: a 2-agent team of randomly initialised models of Qwen2.5-0.5B's
# shape (no weights can be downloaded), bf16, per path (plain generate, one call per agent, continuous batching,
# compiled decoding), separate models and LoRA adapters; then the tutorial epoch on the same shape against CoMLRL;
# then what each wrapper costs per decoding step.
#
#   bash benchmarks/device_generation.sh            # on the GPU machine, from the repository root, with the
#                                                   # wheelhouse in ./wheelhouse (about 6 minutes)
#   SIZE=qwen2.5-0.5b-mini BF16= THREADS=1 ROUNDS=1 EPOCH_ROUNDS=1 PATHS="plain continuous_batching" \
#       bash benchmarks/device_generation.sh     # the same script on a CPU, with a tiny shape
#
# Installs from the wheelhouse only (WHEELHOUSE, default ./wheelhouse; python benchmarks/wheelhouse.py builds it on
# a connected machine), never from the network. Each step (the machine, the install, each package's import, then
# each of generation.py's three parts) runs under its own time limit and leaves its result in a small file of
# RESULTS_DIR ($OUT when set) as soon as it ends: benchmarks/device_steps.sh. The parts' limits: THROUGHPUT_LIMIT
# (360 s), EPOCH_LIMIT (300 s), OVERHEADS_LIMIT (120 s); EPOCH_ROUNDS (2) is the tutorial epochs per trainer.
# Results: generation.txt (each part's table as it ends) and steps.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
. benchmarks/device_steps.sh
SIZE=${SIZE:-qwen2.5-0.5b-shape}
BF16=${BF16---bf16}
PATHS=${PATHS:-plain per_agent continuous_batching compiled}
ROUNDS=${ROUNDS:-4}
EPOCH_ROUNDS=${EPOCH_ROUNDS:-2}
THREADS=${THREADS:-$(nproc)}

prepare
if (($? == 124)); then
    record generation "skipped: an import hung (imports.txt)"
    exit 0
fi
# One process per part, so that a part that hangs leaves the others' tables; the model is built once, in OUTPUT.
OUTPUT=/tmp/multiagent_trl_bench_device
for part in throughput epoch overheads; do
    case $part in
        throughput) limit=${THROUGHPUT_LIMIT:-360} ;;
        epoch) limit=${EPOCH_LIMIT:-300} ;;
        overheads) limit=${OVERHEADS_LIMIT:-120} ;;
    esac
    step "generation $part" "$limit" generation.txt "$PYTHON" benchmarks/generation.py --only "$part" \
        --sizes "$SIZE" --epoch-sizes "$SIZE" --paths $PATHS --rounds "$ROUNDS" --epoch-rounds "$EPOCH_ROUNDS" \
        --threads "$THREADS" $BF16 --output-dir "$OUTPUT"
done
exit 0
