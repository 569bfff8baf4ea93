"""LoRA teams against TRL: peak memory and step time, measured side by side in one run.

    python benchmarks/lora_team.py                  # memory and speed (about 5 minutes on 2 CPU cores)
    python benchmarks/lora_team.py --only speed     # or --only memory

Memory: peak RSS of one training step of (a) TRL's GRPOTrainer with one LoRA adapter, (b) a 4-agent LoRA team on one
shared base, (c) 4 separate models with a LoRA each. Each runs in its own process (peak RSS is per process), on a
270M-parameter model built in code, so that model memory dominates the libraries' own footprint. Reported raw and
above the process's footprint after imports.

Speed: median step time of a 2-agent LoRA team with batched generation (one `generate` call for both agents)
against two steps of TRL's single-agent LoRA GRPOTrainer, alternating in one process on a 4M-parameter model.
Targets: memory (b) <= 1.3x (a) and (c) >= 3x (b); speed <= 0.75x.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

MEMORY_CASES = ("trl-lora-1", "team-lora-4", "separate-lora-4")


@dataclass
class Arguments:
    """Flags (`--help` lists them; `--output-dir` and `--output_dir` both work; `--config run.yaml` takes a file)."""

    only: str | None = field(
        default=None, metadata={"help": "Run only this benchmark (default: both).", "choices": ["memory", "speed"]}
    )
    rounds: int = field(default=3, metadata={"help": "Alternating rounds of the speed benchmark."})
    steps: int = field(default=4, metadata={"help": "Steps per run in the speed benchmark."})
    output_dir: str = field(default="/tmp/multiagent_trl_bench", metadata={"help": "Where the trainers write."})
    # Internal: one memory case in its own process (peak RSS is per process).
    worker: str | None = field(default=None, metadata={"choices": list(MEMORY_CASES), "help": argparse.SUPPRESS})
    model_path: str | None = field(default=None, metadata={"help": argparse.SUPPRESS})


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def dataset(rows: int):
    from datasets import Dataset

    prompts = ["Describe a city in the clouds:", "Tell a joke about dinosaurs:", "Invent a fruit:", "Design a park:"]
    return Dataset.from_dict({"prompt": (prompts * rows)[:rows]})


def reward(prompts, completions, **kwargs):
    return [float(len(str(c))) for c in completions]


def settings(output_dir: str, steps: int, **extra) -> dict:
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=16,
        max_steps=steps,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=False,
        disable_tqdm=True,
        **extra,
    )


def build(case: str, model_path: str, output_dir: str, steps: int):
    """One trainer for a benchmark case."""
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

    if case == "trl-lora-1":
        args = GRPOConfig(**settings(output_dir, steps))
        trainer = GRPOTrainer(model_path, reward, args=args, train_dataset=dataset(8), peft_config=lora_config())
    else:
        agents = int(case.rsplit("-", 1)[1])
        args = MultiAgentGRPOConfig(**settings(output_dir, steps, num_agents=agents))
        model = [model_path] * agents if case.startswith("separate") else model_path
        trainer = MultiAgentGRPOTrainer(model, reward, args=args, train_dataset=dataset(8), peft_config=lora_config())
    trainer.remove_callback(PrinterCallback)  # keep the report readable
    return trainer


def memory_worker(case: str, model_path: str, output_dir: str) -> dict:
    import torch  # noqa: F401  (the footprint of the libraries, before any model)
    import transformers  # noqa: F401
    import trl  # noqa: F401

    import multiagent_trl  # noqa: F401

    baseline = rss_mb()
    trainer = build(case, model_path, output_dir, steps=1)
    trainer.train()
    return {"case": case, "peak_rss_mb": rss_mb(), "baseline_rss_mb": baseline}


def step_times(trainer) -> list[float]:
    return [h["step_time"] for h in trainer.state.log_history if "step_time" in h]


def speed(model_path: str, output_dir: str, rounds: int, steps: int) -> dict:
    """Alternate short runs of both setups in one process; compare median step times."""
    single = build("trl-lora-1", model_path, os.path.join(output_dir, "trl"), steps)
    team = build("team-lora-2", model_path, os.path.join(output_dir, "team"), steps)
    times = {"trl-lora-1": [], "team-lora-2": []}
    for _ in range(rounds):
        for name, trainer in (("trl-lora-1", single), ("team-lora-2", team)):
            trainer.train()
            times[name].extend(step_times(trainer)[1:])  # the first step of a run warms up
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "median_step_s": medians,
        "steps_measured": {name: len(values) for name, values in times.items()},
        "ratio_team_vs_two_trl_steps": medians["team-lora-2"] / (2 * medians["trl-lora-1"]),
    }


def run_memory(model_path: str, output_dir: str) -> dict:
    results = {}
    for case in MEMORY_CASES:
        command = [sys.executable, __file__, "--worker", case, "--model-path", model_path, "--output-dir", output_dir]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[case] = json.loads(out.strip().splitlines()[-1])
    return results


def main() -> None:
    from trl import TrlParser

    parser = TrlParser(Arguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    (args,) = parser.parse_args_and_config()

    if args.worker:
        print(json.dumps(memory_worker(args.worker, args.model_path, args.output_dir)))
        return

    from multiagent_trl.testing import tiny_model_path

    started = time.perf_counter()
    if args.only in (None, "memory"):
        memory = run_memory(tiny_model_path("bench-270m"), args.output_dir)
        print("\nMemory: one training step, 270M-parameter base, LoRA r=16 on attention projections")
        print(f"{'case':<18}{'peak RSS MB':>14}{'above imports MB':>18}")
        for case, r in memory.items():
            print(f"{case:<18}{r['peak_rss_mb']:>14.0f}{r['peak_rss_mb'] - r['baseline_rss_mb']:>18.0f}")
        raw = {case: r["peak_rss_mb"] for case, r in memory.items()}
        above = {case: r["peak_rss_mb"] - r["baseline_rss_mb"] for case, r in memory.items()}
        for label, values in (("raw", raw), ("above imports", above)):
            print(
                f"ratios ({label}): 4-agent LoRA team / 1-agent TRL LoRA = "
                f"{values['team-lora-4'] / values['trl-lora-1']:.2f}x (target <= 1.3x); "
                f"4 separate models / LoRA team = {values['separate-lora-4'] / values['team-lora-4']:.2f}x "
                "(target >= 3x)"
            )
    if args.only in (None, "speed"):
        result = speed(tiny_model_path("bench-4m"), args.output_dir, args.rounds, args.steps)
        medians = result["median_step_s"]
        print("\nSpeed: 4M-parameter base, 8 completions of 16 tokens per agent and step")
        print(f"TRL GRPOTrainer, 1 LoRA agent: {medians['trl-lora-1']:.3f} s/step")
        print(f"LoRA team, 2 agents, batched generation: {medians['team-lora-2']:.3f} s/step")
        print(
            f"ratio team step / two TRL steps = {result['ratio_team_vs_two_trl_steps']:.2f}x (target <= 0.75x); "
            f"steps measured: {result['steps_measured']}"
        )
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
