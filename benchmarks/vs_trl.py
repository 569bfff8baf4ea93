"""Team against TRL: step time, completions per second and peak memory for the same work, side by side.

    python benchmarks/vs_trl.py                    # prints the table (about 6 minutes on 2 CPU cores)
    python benchmarks/vs_trl.py --update-docs      # also rewrites the docs/benchmarks.md table between its markers
                                                   # and draws its figure, docs/figures/vs-trl.png

What is compared, for N = 2 agents, on two models built in code (`multiagent_trl.testing.tiny_model_path`): "tiny"
(about 90k parameters, where per-step overhead shows) and "bench-4m" (about 4M, where matrix work dominates):

- separate models: (a) one TRL `GRPOTrainer` per agent, each with its own copy of the model, against (b) a 2-agent
  `MultiAgentGRPOTrainer` (two copies in one `AgentTeam`). Target: (b) <= 1.10x the sum of the N TRL steps.
- LoRA: (a) one TRL `GRPOTrainer` with a LoRA adapter per agent, against (b) a 2-agent LoRA team (one base, two
  adapters) with `generation_mode="batched"` (one `generate` call for both agents). Target: (b) <= 0.75x.

`--paths` adds a team per generation path to the same rounds (`PATHS`: "plain", the default, generates for both
agents in one `generate` call, separate models included; "per_agent" makes one call per agent; "continuous_batching"
and "compiled" as in `benchmarks/generation.py`), each against the same TRL steps. Memory is measured for "plain".

Every trainer gets the same prompts, model, settings and reward work: 8 completions of at most 16 tokens per agent and
step (2 prompts x 4 generations), TRL's defaults otherwise (beta 0, one iteration: after generation, one forward and
one backward per agent and step, with TRL's default gradient checkpointing).

Step time: the trainers of a case are built once, in one process, and run in rounds of short `train()` runs, one
trainer after the other (TRL agent 0, TRL agent 1, team; again), so that drift in the machine's speed hits all of them
alike. A step is timed from `on_step_begin` to its `on_log` (logging every step): generation, rewards, old log-probs
if any, loss, backward, clipping, optimizer step and logging. The first step of each run warms up and is not timed.
The table shows medians; "TRL" is the median over the rounds' steps of the sum of the N TRL agents' step times (the
k-th timed step of each agent in the same round). Completions per second: completions generated per step (all
agents) over that time. Torch uses the same number of threads everywhere (`--threads`, default: all cores). (Trainers
stepped in turn from threads in one process would be finer-grained, but each thread gets its own OpenMP pool, whose
idle workers spin on the cores: TRL's steps took up to 3x longer that way.)

Peak memory: peak RSS is per process and never decreases, so each setup runs alone in a fresh subprocess (the N TRL
trainers one after the other, or the team) for a few steps, from model loading on. The table shows its peak RSS
above the RSS after importing the libraries; the peak is restarted there (Linux `/proc/self/clear_refs`), since
importing briefly peaks higher than small models ever reach.

Other work on the machine makes times noisy: the share of the CPUs that other processes used during each case's
timed runs is printed (and its range goes into docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", message=".*deprecated.*", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*pin_memory.*", category=UserWarning)

from transformers import TrainerCallback  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

transformers_logging.disable_progress_bar()  # "Loading weights" bars

NUM_AGENTS = 2
SIZES = ("tiny", "bench-4m")
KINDS = ("separate", "lora")
# The team's generation paths: "plain" (TRL's `generate`, one call for all agents: the default), "per_agent" (one
# call per agent), "continuous_batching" (transformers' paged `generate_batch`) and "compiled" (static KV cache and
# `torch.compile`d decoding).
PATHS = ("plain", "per_agent", "continuous_batching", "compiled")
TARGETS = {"separate": 1.10, "lora": 0.75}
PROMPTS_PER_STEP = 2
NUM_GENERATIONS = 4
MAX_COMPLETION_LENGTH = 16
DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
DOCS_FIGURE = DOCS_PAGE.parent / "figures" / "vs-trl.png"
MARKERS = ("<!-- bench:vs_trl start -->", "<!-- bench:vs_trl end -->")


@dataclass
class Arguments:
    """Flags (`--help` lists them; `--steps-per-run` and `--steps_per_run` both work; `--config run.yaml` too)."""

    sizes: list[str] = field(
        default_factory=lambda: list(SIZES), metadata={"help": "Models to run.", "choices": list(SIZES)}
    )
    kinds: list[str] = field(
        default_factory=lambda: list(KINDS), metadata={"help": "Team kinds to run.", "choices": list(KINDS)}
    )
    paths: list[str] = field(
        default_factory=lambda: ["plain"],
        metadata={"help": "The team's generation paths, each a team trainer in the same rounds.", "choices": PATHS},
    )
    compile_backend: str = field(default="inductor", metadata={"help": "torch.compile backend of the compiled path."})
    rounds: int = field(default=12, metadata={"help": "Alternating rounds of short runs per case."})
    steps_per_run: int = field(default=5, metadata={"help": "Timed steps per run (after 1 warm-up step)."})
    memory_steps: int = field(default=2, metadata={"help": "Steps of each memory run."})
    threads: int = field(default_factory=os.cpu_count, metadata={"help": "torch threads, in every process."})
    no_memory: bool = field(default=False, metadata={"help": "Skip the memory subprocesses."})
    update_docs: bool = field(
        default=False,
        metadata={"help": "Rewrite docs/benchmarks.md's table with this run and draw docs/figures/vs-trl.png."},
    )
    output_dir: str = field(default="/tmp/multiagent_trl_bench_vs_trl", metadata={"help": "Where the trainers write."})
    # Internal: one memory setup in its own process (peak RSS is per process): SETUP SIZE KIND.
    worker: list[str] | None = field(default=None, metadata={"metavar": "SETUP SIZE KIND", "help": argparse.SUPPRESS})


def memory_status_mb() -> dict[str, float]:
    """This process's resident memory now (`VmRSS`) and its peak (`VmHWM`), from Linux's /proc."""
    status = Path("/proc/self/status").read_text()
    return {key: int(re.search(rf"{key}:\s+(\d+) kB", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM")}


def reset_peak_memory() -> None:
    """Restart the peak (`VmHWM`) from the current RSS, so that the peak of the imports does not hide the run's."""
    Path("/proc/self/clear_refs").write_text("5")


class OtherLoad:
    """How busy other processes kept the CPUs over a block: the machine's busy CPU time (Linux /proc/stat) minus this
    process's, as a share of all cores' time. Other work makes step times noisy."""

    @staticmethod
    def _busy_s() -> float:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle and iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self):
        self.start = (self._busy_s(), sum(os.times()[:2]), time.perf_counter())
        return self

    def __exit__(self, *exc):
        busy, own, wall = self._busy_s(), sum(os.times()[:2]), time.perf_counter()
        other = (busy - self.start[0]) - (own - self.start[1])
        self.share = max(other, 0.0) / ((wall - self.start[2]) * os.cpu_count())


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def dataset(steps: int):
    """Enough rows that a run stays in one epoch (an epoch boundary would add work to one step)."""
    from datasets import Dataset

    prompts = ["Describe a city in the clouds:", "Tell a joke about dinosaurs:", "Invent a fruit:", "Design a park:"]
    rows = PROMPTS_PER_STEP * steps
    return Dataset.from_dict({"prompt": (prompts * rows)[:rows]})


def length_reward(prompts, completions, **kwargs) -> list[float]:
    """TRL reward: the completion's length."""
    return [float(len(c)) for c in completions]


def joint_length_reward(prompts, completions, **kwargs) -> list[float]:
    """Team reward: the mean length of the agents' completions (the same work per completion as `length_reward`)."""
    return [sum(len(c) for c in joint) / len(joint) for joint in completions]


def settings(output_dir: str, steps: int, **extra) -> dict:
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS,
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION_LENGTH,
        max_steps=steps,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=False,
        disable_tqdm=True,
        seed=0,
        **extra,
    )


def path_settings(path: str, backend: str = "inductor") -> dict:
    """The team's config fields of a generation path (`PATHS`)."""
    if path == "per_agent":
        return {"generation_mode": "per_agent"}
    if path == "continuous_batching":
        return {"use_transformers_continuous_batching": True}
    if path == "compiled":
        return {"compile_generation": True, "compile_generation_kwargs": {"backend": backend}}
    return {}


def build(
    setup: str, kind: str, model_path: str, output_dir: str, steps: int, path: str = "plain", backend: str = "inductor"
) -> list:
    """The trainers of one setup: N TRL trainers (`"trl"`, one per agent) or one N-agent team (`"team"`), the team
    generating by `path`."""
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

    peft_config = lora_config() if kind == "lora" else None
    if setup == "trl":
        trainers = [
            GRPOTrainer(
                model_path,
                length_reward,
                args=GRPOConfig(**settings(os.path.join(output_dir, f"trl-{i}"), steps)),
                train_dataset=dataset(steps),
                peft_config=peft_config,
            )
            for i in range(NUM_AGENTS)
        ]
    else:
        extra = dict(num_agents=NUM_AGENTS, **path_settings(path, backend))
        trainers = [
            MultiAgentGRPOTrainer(
                model_path,
                joint_length_reward,
                args=MultiAgentGRPOConfig(**settings(os.path.join(output_dir, f"team-{path}"), steps, **extra)),
                train_dataset=dataset(steps),
                peft_config=peft_config,
            )
        ]
    for trainer in trainers:
        trainer.remove_callback(PrinterCallback)  # keep the report readable
    return trainers


# ---------------------------------------------------------------------------------------------------- step time


class StepTimer(TrainerCallback):
    """Times each step from `on_step_begin` to its `on_log`, except the first step of each run."""

    def __init__(self):
        self.times: list[float] = []
        self.start: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter() if state.global_step > 0 else None

    def on_log(self, args, state, control, **kwargs):
        if self.start is not None:  # None: the first step, or the summary that ends a run
            self.times.append(time.perf_counter() - self.start)
            self.start = None


def alternate(trainers: dict, rounds: int, steps_per_run: int) -> dict[str, list[float]]:
    """Rounds of short runs, one trainer after the other; the timed step times of each trainer."""
    timers = {name: StepTimer() for name in trainers}
    for name, trainer in trainers.items():
        trainer.add_callback(timers[name])
        trainer.args.max_steps = steps_per_run + 1
    for _ in range(rounds):
        for trainer in trainers.values():
            trainer.train()
    return {name: timer.times for name, timer in timers.items()}


def speed(size: str, kind: str, args: Arguments) -> list[dict]:
    """Step times of the N TRL trainers and of one team per generation path, in the same rounds: one result per
    path."""
    from multiagent_trl.testing import tiny_model_path

    model_path = tiny_model_path(size)
    output_dir = os.path.join(args.output_dir, f"{size}-{kind}")
    steps = args.steps_per_run + 1
    trainers = dict(enumerate(build("trl", kind, model_path, output_dir, steps)))
    for path in args.paths:
        (trainers[path],) = build("team", kind, model_path, output_dir, steps, path, args.compile_backend)
    times = alternate(trainers, args.rounds, args.steps_per_run)
    trl_sums = [sum(step) for step in zip(*(times[i] for i in range(NUM_AGENTS)), strict=True)]
    completions = NUM_AGENTS * PROMPTS_PER_STEP * NUM_GENERATIONS
    trl_s = statistics.median(trl_sums)
    results = []
    for path in args.paths:
        team_s = statistics.median(times[path])
        quartiles = statistics.quantiles([t / s for t, s in zip(times[path], trl_sums, strict=True)], n=4)
        results.append(
            {
                "size": size,
                "kind": kind,
                "path": path,
                "trl_agent_step_s": [statistics.median(times[i]) for i in range(NUM_AGENTS)],
                "trl_step_s": trl_s,
                "team_step_s": team_s,
                "trl_completions_per_s": completions / trl_s,
                "team_completions_per_s": completions / team_s,
                "ratio": team_s / trl_s,
                "ratio_quartiles": (quartiles[0], quartiles[2]),  # of the per-step ratios, for the spread
                "steps_measured": len(times[path]),
            }
        )
    return results


# ---------------------------------------------------------------------------------------------------- memory


def memory_worker(setup: str, size: str, kind: str, output_dir: str, steps: int, threads: int) -> dict:
    import torch
    import transformers  # noqa: F401  (the footprint of the libraries, before any model)
    import trl  # noqa: F401

    import multiagent_trl  # noqa: F401
    from multiagent_trl.testing import tiny_model_path

    torch.set_num_threads(threads)
    model_path = tiny_model_path(size)
    gc.collect()
    reset_peak_memory()
    baseline = memory_status_mb()["VmRSS"]
    for trainer in build(setup, kind, model_path, os.path.join(output_dir, f"memory-{size}-{kind}-{setup}"), steps):
        trainer.train()  # the N TRL trainers one after the other, held together as in the timed runs
    return {"peak_rss_mb": memory_status_mb()["VmHWM"], "baseline_rss_mb": baseline}


def memory(size: str, kind: str, output_dir: str, steps: int, threads: int) -> dict[str, float]:
    """Peak RSS above imports of each setup, each in its own process."""
    results = {}
    for setup in ("trl", "team"):
        command = [sys.executable, __file__, "--worker", setup, size, kind, "--output-dir", output_dir]
        command += ["--memory-steps", str(steps), "--threads", str(threads)]
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        result = json.loads(out.strip().splitlines()[-1])
        results[setup] = result["peak_rss_mb"] - result["baseline_rss_mb"]
    return results


# ---------------------------------------------------------------------------------------------------- report


def verdict(result: dict) -> str:
    return "met" if result["ratio"] <= TARGETS[result["kind"]] else "not met"


def megabytes(value: float, spec: str = ".0f", unit: str = "") -> str:
    return "-" if math.isnan(value) else f"{value:{spec}}{unit}"


def table(results: list[dict]) -> str:
    """A Markdown table: one row per case and generation path, TRL and the team side by side."""
    lines = [
        f"| model | agents | team's generation | TRL s/step ({NUM_AGENTS} trainers) | team s/step | time ratio "
        "(target) | TRL compl./s | team compl./s | TRL peak MB | team peak MB | memory ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        kind = "separate models" if r["kind"] == "separate" else "LoRA adapters"
        lines.append(
            f"| {r['size']} | {kind} | {r['path']} | {r['trl_step_s']:.3f} | {r['team_step_s']:.3f} | "
            f"**{r['ratio']:.2f}x** (<= {TARGETS[r['kind']]:.2f}x: {verdict(r)}) | "
            f"{r['trl_completions_per_s']:.0f} | {r['team_completions_per_s']:.0f} | {megabytes(r['trl_peak_mb'])} | "
            f"{megabytes(r['team_peak_mb'])} | {megabytes(r['team_peak_mb'] / r['trl_peak_mb'], '.2f', 'x')} |"
        )
    return "\n".join(lines)


def docs_block(results: list[dict], args: Arguments, seconds: float) -> str:
    import torch
    import transformers
    import trl

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    description = (
        f"`python benchmarks/vs_trl.py --update-docs`, {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPU cores "
        f"({platform.machine()}), {gpu}, {args.threads} torch threads; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, TRL {trl.__version__}. {NUM_AGENTS} agents, "
        f"{PROMPTS_PER_STEP * NUM_GENERATIONS} completions of at most {MAX_COMPLETION_LENGTH} tokens per agent and "
        f"step, TRL's defaults otherwise; LoRA r=16 on the attention projections. Medians of "
        f"{results[0]['steps_measured']} timed steps per trainer ({args.rounds} alternating rounds of "
        f"{args.steps_per_run}); time ratio = team step / sum of the {NUM_AGENTS} TRL steps; peak MB = peak RSS above "
        f"imports, one process per setup (the plain path only). Whole run {seconds:.0f} s; other processes used "
        f"{min(r['other_cpu'] for r in results):.0%}-{max(r['other_cpu'] for r in results):.0%} of the CPUs during "
        "the timed runs."
    )
    return "\n".join([MARKERS[0], textwrap.fill(description, width=118), "", table(results), MARKERS[1]])


def update_docs(block: str, page: Path = DOCS_PAGE) -> None:
    text = page.read_text()
    pattern = re.compile(re.escape(MARKERS[0]) + r".*?" + re.escape(MARKERS[1]), re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"{page} has no {MARKERS[0]} ... {MARKERS[1]} block to update.")
    page.write_text(pattern.sub(lambda _: block, text))


def main() -> None:
    from trl import TrlParser

    parser = TrlParser(Arguments, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    (args,) = parser.parse_args_and_config()
    if args.worker is not None and len(args.worker) != 3:
        parser.error(f"--worker takes SETUP SIZE KIND, got {args.worker}")

    import torch

    torch.set_num_threads(args.threads)
    if args.worker:
        setup, size, kind = args.worker
        print(json.dumps(memory_worker(setup, size, kind, args.output_dir, args.memory_steps, args.threads)))
        return

    started = time.perf_counter()
    results = []
    for size in args.sizes:
        for kind in args.kinds:
            with OtherLoad() as other:
                case = speed(size, kind, args)
            peak = {"trl": float("nan"), "team": float("nan")}
            if not args.no_memory:
                peak = memory(size, kind, args.output_dir, args.memory_steps, args.threads)
            for result in case:
                result["other_cpu"] = other.share
                plain = result["path"] == "plain"
                result.update(trl_peak_mb=peak["trl"], team_peak_mb=peak["team"] if plain else float("nan"))
                results.append(result)
                trl_agents = " + ".join(f"{t:.3f}" for t in result["trl_agent_step_s"])
                print(
                    f"{size:<9} {kind:<9} {result['path']:<19} TRL {trl_agents} = {result['trl_step_s']:.3f} s/step, "
                    f"team {result['team_step_s']:.3f} s/step: {result['ratio']:.2f}x (per-step quartiles "
                    f"{result['ratio_quartiles'][0]:.2f}-{result['ratio_quartiles'][1]:.2f}); peak MB above imports: "
                    f"TRL {peak['trl']:.0f}, team {result['team_peak_mb']:.0f}; other processes' CPU use "
                    f"{other.share:.0%}",
                    flush=True,
                )
    seconds = time.perf_counter() - started
    print()
    print(table(results))
    print()
    for r in results:
        print(
            f"{r['size']} {r['kind']} {r['path']}: {r['ratio']:.2f}x, target <= {TARGETS[r['kind']]:.2f}x: "
            f"{verdict(r)}"
        )
    print(f"\ntotal {seconds:.0f} s")
    if args.update_docs:
        from figures import vs_trl_figure  # benchmarks/figures.py, beside this script

        update_docs(docs_block(results, args, seconds))
        vs_trl_figure(results, DOCS_FIGURE, num_agents=NUM_AGENTS)
        print(f"updated {DOCS_PAGE} and {DOCS_FIGURE}")


if __name__ == "__main__":
    main()
