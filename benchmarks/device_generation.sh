#!/usr/bin/env bash
# The generation comparison on a GPU (issue 15): a 2-agent team of randomly initialised models of Qwen2.5-0.5B's
# shape (no weights can be downloaded), bf16, per path (plain generate, one call per agent, continuous batching,
# compiled decoding), separate models and LoRA adapters; then the tutorial epoch on the same shape against CoMLRL.
#
#   bash benchmarks/device_generation.sh            # on the GPU machine, from the repository root (about 6 minutes)
#   SIZE=qwen2.5-0.5b-mini BF16= THREADS=1 ROUNDS=1 PATHS="plain continuous_batching" \
#       bash benchmarks/device_generation.sh     # the same script on a CPU, with a tiny shape
#
# Results: printed, and written to $OUT/generation.md when OUT is set.
set -euo pipefail
SIZE=${SIZE:-qwen2.5-0.5b-shape}
BF16=${BF16---bf16}
PATHS=${PATHS:-plain per_agent continuous_batching compiled}
ROUNDS=${ROUNDS:-4}
THREADS=${THREADS:-$(nproc)}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled
python -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
python -c "import comlrl" 2>/dev/null || pip install --quiet --no-deps comlrl==1.4.3 || echo "CoMLRL not installable"
python benchmarks/generation.py --only throughput epoch overheads --sizes "$SIZE" --epoch-sizes "$SIZE" --paths $PATHS \
    --rounds "$ROUNDS" --epoch-rounds 2 --threads "$THREADS" $BF16 --output-dir /tmp/multiagent_trl_bench_device \
    | tee /tmp/generation-device.txt
if [ -n "${OUT:-}" ]; then cp /tmp/generation-device.txt "$OUT/generation.md"; fi
