"""The CoMLRL tutorial's epoch at real model shapes: the team against CoMLRL 1.4.3 and against N TRL trainers.

    python benchmarks/real_vocab.py                                       # tiny and real-vocabulary, 32 and 128 tokens
    python benchmarks/real_vocab.py --sizes qwen2.5-vocab-h128 --max-new-tokens 128 --prompts 2 --no-warmup
    python benchmarks/real_vocab.py ... --update-docs --docs-block NAME  # rewrites that docs/benchmarks.md table

The tutorial (`benchmarks/compare_comlrl.py`'s task and settings: 2 agents, 8 generations, 2 prompts per step,
temperature 0.6, top-p 0.6, top-k 50, learning rate 3e-3, CoMLRL's optimizer) for one epoch over `--prompts` of its
10 prompts, each a whole `train()` call, in one process, alternating round by round, every epoch from the same
weights and seed:

- multiagent_trl: a 2-agent team of separate models (`MAGRPOTrainer`, the default plain generation path);
- CoMLRL 1.4.3's `MAGRPOTrainer` (it must import here: `pip install --no-deps comlrl==1.4.3`);
- N TRL trainers: one `GRPOTrainer` per agent with the same settings (each scoring its own completions by length),
  their two `train()` calls summed, run with TRL's own kernels (the team's faster CPU fallback of TRL's log-prob
  kernel, which the team installs process-wide, is switched back to TRL's for them).

Models: `tiny` (`multiagent_trl.testing`, a 258-token byte vocabulary) and `qwen2.5-vocab-h128` (Qwen2.5's
151,936-token vocabulary and tied head on 2 layers of width 128, head size 32; `benchmarks/generation.py` builds it).
The load average and other processes' CPU share are printed, since timings on a shared machine are noisy.
"""

from __future__ import annotations

import copy
import os
import statistics
import sys
import textwrap
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning)

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_comlrl as tutorial  # noqa: E402
import generation  # noqa: E402
from vs_trl import OtherLoad  # noqa: E402

DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
COMLRL_TARGET = 0.5  # the team's epoch at most half of CoMLRL's
TRL_TARGET = 1.0  # and at most the sum of the N TRL trainers'


@dataclass
class Arguments:
    """Flags (`--help` lists them)."""

    sizes: list[str] = field(
        default_factory=lambda: ["tiny", "qwen2.5-vocab-h128"],
        metadata={"help": "Models.", "choices": generation.SIZES},
    )
    max_new_tokens: list[int] = field(default_factory=lambda: [32, 128], metadata={"help": "Completion lengths."})
    prompts: int = field(default=10, metadata={"help": "Prompts of the epoch (the tutorial's first ones)."})
    rounds: int = field(default=1, metadata={"help": "Alternating rounds of one epoch per trainer each."})
    warmup: bool = field(default=True, metadata={"help": "One untimed epoch per trainer first (`--no-warmup`)."})
    libraries: list[str] = field(
        default_factory=lambda: ["multiagent_trl", "CoMLRL 1.4.3", "2 TRL trainers"],
        metadata={"help": "What to run."},
    )
    threads: int = field(default_factory=os.cpu_count, metadata={"help": "torch threads."})
    update_docs: bool = field(default=False, metadata={"help": "Rewrite docs/benchmarks.md's table with this run."})
    docs_block: str = field(
        default="real_vocab", metadata={"help": "The block `--update-docs` rewrites: `<!-- bench:NAME start -->`."}
    )
    output_dir: str = field(default="/tmp/multiagent_trl_bench_real_vocab", metadata={"help": "Trainer output."})


def length_reward(completions, **kwargs) -> list[float]:
    """Each TRL trainer's reward: its completion's length (a reward costs little next to the epoch)."""
    return [float(len(c)) for c in completions]


def trl_trainers(settings: tutorial.Settings, path: str, prompts: list[str], output_dir: str) -> list:
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    trainers = []
    for i in range(2):
        config = GRPOConfig(
            output_dir=os.path.join(output_dir, f"trl-{i}"),
            num_train_epochs=1,
            learning_rate=settings.learning_rate,
            per_device_train_batch_size=settings.rollout_buffer_size * settings.num_generations,
            num_generations=settings.num_generations,
            max_completion_length=settings.max_new_tokens,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            logging_steps=1,
            seed=0,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            bf16=False,
            **tutorial.MATCHED_OPTIMIZER,
        )
        trainer = GRPOTrainer(path, length_reward, args=config, train_dataset=Dataset.from_dict({"prompt": prompts}))
        trainer.remove_callback(PrinterCallback)
        trainers.append(trainer)
    return trainers


class TrlKernels:
    """TRL's own torch fallbacks of its log-prob kernel inside the block (the team installs faster ones)."""

    def __enter__(self):
        from trl.kernels import chunked_logprob

        from multiagent_trl.rollout import logprob_kernel

        self.current = (chunked_logprob._forward_tile, chunked_logprob._backward_tile)
        if logprob_kernel._original_forward_tile is not None:
            chunked_logprob._forward_tile = logprob_kernel._original_forward_tile
            chunked_logprob._backward_tile = logprob_kernel._original_backward_tile

    def __exit__(self, *exc):
        from trl.kernels import chunked_logprob

        chunked_logprob._forward_tile, chunked_logprob._backward_tile = self.current


def run_case(size: str, max_new_tokens: int, args: Arguments) -> list[dict]:
    import torch
    from transformers import PrinterCallback

    path = generation.model_path(size, args.output_dir)
    settings = tutorial.Settings(max_new_tokens=max_new_tokens)
    prompts = tutorial.TRAIN_PROMPTS[: args.prompts]
    output_dir = os.path.join(args.output_dir, f"{size}-{max_new_tokens}")
    runners = {}  # name -> (trainers, modules whose weights each epoch restores)
    if "multiagent_trl" in args.libraries:
        ours = tutorial.ours_trainer(
            settings, path, os.path.join(output_dir, "ours"), epochs=1, seed=0, advantage_mode="mean",
            reward=tutorial.RecordedReward(), **tutorial.MATCHED_OPTIMIZER,
        )  # fmt: skip
        ours.train_dataset = ours.train_dataset.select(range(len(prompts)))
        ours.remove_callback(PrinterCallback)
        runners["multiagent_trl"] = ([ours], [ours.model])
    if "2 TRL trainers" in args.libraries:
        trl = trl_trainers(settings, path, prompts, output_dir)
        runners["2 TRL trainers"] = (trl, [t.model for t in trl])
    if "CoMLRL 1.4.3" in args.libraries:
        try:
            theirs = generation.comlrl_trainer(settings, path)
            theirs.train_dataset = theirs.train_dataset.select(range(len(prompts)))
            runners["CoMLRL 1.4.3"] = ([theirs], list(theirs.agents))
        except ImportError as error:
            print(f"  CoMLRL is not importable ({error}): `pip install --no-deps comlrl==1.4.3`", flush=True)
    initial = {name: [copy.deepcopy(m.state_dict()) for m in modules] for name, (_, modules) in runners.items()}

    def epoch(name: str) -> float:
        trainers, modules = runners[name]
        for module, state in zip(modules, initial[name]):
            module.load_state_dict(state)
        seconds = 0.0
        for trainer in trainers:
            torch.manual_seed(0)
            with TrlKernels() if name == "2 TRL trainers" else _nothing():
                start = time.perf_counter()
                trainer.train()
                seconds += time.perf_counter() - start
        return seconds

    if args.warmup:
        for name in runners:
            epoch(name)
    times = {name: [] for name in runners}
    with OtherLoad() as load:
        for _ in range(args.rounds):
            for name in runners:
                times[name].append(epoch(name))
                print(f"  {size} {max_new_tokens} tokens {name}: {times[name][-1]:.1f} s", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    return [
        dict(size=size, tokens=max_new_tokens, name=name, seconds=seconds, comlrl=medians.get("CoMLRL 1.4.3"),
             trl=medians.get("2 TRL trainers"), other_load=load.share)
        for name, seconds in medians.items()
    ]  # fmt: skip


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def report(args: Arguments, results: list[dict]) -> str:
    import torch
    import transformers
    import trl

    steps = (args.prompts + 1) // 2
    head = (
        f"`python benchmarks/real_vocab.py {' '.join(sys.argv[1:])}`, {time.strftime('%Y-%m-%d')}: "
        f"{os.cpu_count()} CPU cores, {args.threads} torch thread{'s' if args.threads > 1 else ''}, float32; "
        f"{args.prompts} prompts ({steps} step{'s' if steps > 1 else ''}) per epoch, {args.rounds} round"
        f"{'s' if args.rounds > 1 else ''}{', after an untimed warm-up epoch' if args.warmup else ', no warm-up'}; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, TRL {trl.__version__}; load average "
        f"{os.getloadavg()[0]:.1f} at the end."
    )
    lines = [
        textwrap.fill(head, width=118),
        "",
        f"| model | new tokens | trainer | s / epoch (`train()`) | vs CoMLRL (target <= {COMLRL_TARGET}x) "
        f"| vs 2 TRL trainers (target <= {TRL_TARGET}x) |",
        "|---|---|---|---|---|---|",
    ]

    def ratio(seconds, base, target, name):
        if base is None or name != "multiagent_trl":
            return "-"
        value = seconds / base
        return f"{value:.2f}x: {'met' if value <= target else 'not met'}"

    for r in results:
        lines.append(
            f"| {r['size']} | {r['tokens']} | {r['name']} | {r['seconds']:.1f} "
            f"| {ratio(r['seconds'], r['comlrl'], COMLRL_TARGET, r['name'])} "
            f"| {ratio(r['seconds'], r['trl'], TRL_TARGET, r['name'])} |"
        )
    shares = [r["other_load"] for r in results]
    lines += ["", f"Other processes used {min(shares):.0%}-{max(shares):.0%} of the CPUs."]
    return "\n".join(lines)


def main() -> None:
    from transformers import HfArgumentParser
    from transformers.utils import logging as transformers_logging

    (args,) = HfArgumentParser([Arguments]).parse_args_into_dataclasses()
    import torch

    torch.set_num_threads(args.threads)
    transformers_logging.disable_progress_bar()
    print(f"Load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    results = [r for size in args.sizes for n in args.max_new_tokens for r in run_case(size, n, args)]
    block = report(args, results)
    print("\n" + block)
    if args.update_docs:
        generation.update_docs(block, DOCS_PAGE, args.docs_block)
        print(f"updated {DOCS_PAGE}")


if __name__ == "__main__":
    main()
