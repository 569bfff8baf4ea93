#!/usr/bin/env bash
# vLLM for teams on a GPU (issue 21): completions/s of one training generation batch of a 2-agent team of randomly
# initialised models of Qwen2.5-0.5B's shape (no weights can be downloaded), bf16: the team with LoRA adapters on one
# engine, the team of separate models on two engines, one TRL+vLLM (colocate) run per agent, and CoMLRL 1.4.3; the
# ratios against the targets (team >= 0.9x N TRL+vLLM runs, >= 5x CoMLRL). See benchmarks/vllm_device.py.
#
#   bash benchmarks/device_vllm.sh                   # on the GPU machine, from the repository root (estimated 6-10
#                                                    # minutes: installing vLLM if missing, 5 engines' start-ups,
#                                                    # CoMLRL's generate; 4 prompts x 8 x 128 tokens, 3 rounds)
#   SIZE=qwen2.5-vocab-h128 BF16= PROMPTS=2 GENERATIONS=4 TOKENS=8 ROUNDS=2 ROWS=lora RESULTS=/tmp/vllm.json \
#       bash benchmarks/device_vllm.sh               # on a CPU (vLLM's CPU build), tiny shape, float32: one row per
#                                                    # call (ROWS=lora, separate, trl, comlrl; 1-4 minutes each on a
#                                                    # shared core), RESULTS gathering the rows into one table
#
# On a CPU also export VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind
# (the Python script sets these defaults itself). EXTRA passes more flags, e.g. EXTRA=--trl-sequential (the TRL runs
# one after the other, each engine deleted before the next is built) or EXTRA="--gpu-memory 0.3". Results: printed,
# and written to $OUT/vllm_device.md when OUT is set. The GPU run is not done yet: no GPU was lent so far.
set -euo pipefail
SIZE=${SIZE:-qwen2.5-0.5b-shape}
BF16=${BF16---bf16}
PROMPTS=${PROMPTS:-4}
GENERATIONS=${GENERATIONS:-8}
TOKENS=${TOKENS:-128}
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-lora separate trl comlrl}
PYTHON=${PYTHON:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 WANDB_MODE=disabled
# TRL 1.16 accepts vLLM 0.22-0.31; the GPU machine may have none.
$PYTHON -c "import vllm" 2>/dev/null || $PYTHON -m pip install --quiet "vllm>=0.22,<0.32" || echo "vLLM not installable"
$PYTHON -c "import comlrl" 2>/dev/null || $PYTHON -m pip install --quiet --no-deps comlrl==1.4.3 \
    || echo "CoMLRL not installable"
$PYTHON -c "import torch, vllm, trl; print('torch', torch.__version__, 'vllm', vllm.__version__, 'trl', trl.__version__, \
'cuda', torch.cuda.is_available(), torch.cuda.get_device_name() if torch.cuda.is_available() else '')"
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; fi
$PYTHON benchmarks/vllm_device.py --size "$SIZE" $BF16 --prompts "$PROMPTS" --generations "$GENERATIONS" \
    --tokens "$TOKENS" --rounds "$ROUNDS" --rows $ROWS ${RESULTS:+--results "$RESULTS"} ${EXTRA:-} | tee /tmp/vllm-device.txt
