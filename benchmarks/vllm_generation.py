"""A team's generation with vLLM against transformers: completion tokens/s of one training generation batch.

    VLLM_CPU_KVCACHE_SPACE=1 VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_OMP_THREADS_BIND=nobind \\
        python benchmarks/vllm_generation.py                       # tiny-vllm, both team kinds, on a CPU
    python benchmarks/vllm_generation.py --model bench-4m --rounds 5  # a larger model; any hub id works too

A 2-agent team (LoRA adapters on one base; separate models), one trainer per path (`use_vllm` True or False), built
once; each round times the team's generation as training runs it (`_rollouts`: 4 prompts x 8 completions of up to 32
tokens per agent, sampled), path after path, so that drift in a shared machine's speed hits both alike. Prints the
median tokens/s (completion tokens of all agents over the time) per team kind and path.

Measured 2026-12-03 on the development machine (2 shared CPU cores, vllm-cpu 0.30.0, float32; load average 2-6 from
another user, so the 4M row is noisy): vLLM is slower than transformers on these sizes (per-step overhead; CPU LoRA
kernels), as expected; its speed is a GPU's.

| model | team | transformers tokens/s | vLLM tokens/s |
|---|---|---|---|
| tiny-vllm (0.33M) | LoRA, one engine | 9243 | 2525 |
| tiny-vllm (0.33M) | separate, two engines | 6608 | 2682 |
| bench-4m | LoRA, one engine | 407 | 95 |
| bench-4m | separate, two engines | 292 | 232 |
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer  # noqa: E402
from multiagent_trl.testing import ARCHITECTURES, tiny_model_path  # noqa: E402

PROMPTS = ["Describe a city in the clouds:", "Tell a joke about dinosaurs:", "Invent a holiday:", "Name a river:"]


def build(model: str, lora: bool, use_vllm: bool, generations: int, tokens: int, output_dir: str):
    args = MultiAgentGRPOConfig(
        output_dir=output_dir,
        num_agents=2,
        use_vllm=use_vllm,
        per_device_train_batch_size=len(PROMPTS) * generations,
        num_generations=generations,
        max_completion_length=tokens,
        report_to="none",
        bf16=False,
    )
    peft = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False) if lora else None
    return MultiAgentGRPOTrainer(
        model=model,
        reward_funcs=lambda completions1, completions2: [0.0] * len(completions1),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        peft_config=peft,
    )


def generation_seconds(trainer, generations: int) -> tuple[float, int]:
    rows = [{"prompt": p} for p in PROMPTS for _ in range(generations)]
    start = time.perf_counter()
    rollouts = trainer._rollouts([rows] * trainer.num_agents, "train")
    seconds = time.perf_counter() - start
    return seconds, sum(len(ids) for r in rollouts for ids in r.completion_ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny-vllm", help="a multiagent_trl.testing size, or a model id or path")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--teams", nargs="+", default=["lora", "separate"])
    options = parser.parse_args()
    model = tiny_model_path(options.model) if options.model in ARCHITECTURES else options.model
    print(f"model {options.model}, 2 agents, {len(PROMPTS)} prompts x {options.generations} x {options.tokens} tokens")
    print("| team | path | tokens/s (median) | s per batch |")
    print("|---|---|---|---|")
    for team in options.teams:
        with tempfile.TemporaryDirectory() as folder:
            trainers = {
                path: build(model, team == "lora", path == "vllm", options.generations, options.tokens, folder)
                for path in ("transformers", "vllm")
            }
            for trainer in trainers.values():
                generation_seconds(trainer, options.generations)  # warm-up
            times = {path: [] for path in trainers}
            for _ in range(options.rounds):
                for path, trainer in trainers.items():
                    times[path].append(generation_seconds(trainer, options.generations))
            for path, samples in times.items():
                rates = [tokens / seconds for seconds, tokens in samples]
                seconds = statistics.median(s for s, _ in samples)
                print(f"| {team} | {path} | {statistics.median(rates):.0f} | {seconds:.2f} |")
            for trainer in trainers.values():
                if trainer._vllm is not None:
                    trainer._vllm.close()


if __name__ == "__main__":
    main()
