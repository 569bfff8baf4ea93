"""Where the seconds of the CoMLRL tutorial's epoch go, for a team of separate models and a LoRA team.

    python benchmarks/profile_epoch.py                                  # real-vocabulary shape, 32 and 128 tokens
    python benchmarks/profile_epoch.py --max-new-tokens 32 --kinds lora --prompts 4 --threads 1

One `train()` call of the tutorial (`benchmarks/compare_comlrl.py`'s task and settings: 2 agents, 8 generations,
2 prompts per step, temperature 0.6, top-p 0.6, top-k 50, `--prompts` of its 10 prompts), after an untimed warm-up
step, from the same weights and seed. The parts are timed by wrapping the functions that do them (wall time, nested
parts inside their parent):

- generation: the team's rollouts (`_rollouts`), of which the LM head's forward (forward hooks on the output
  embeddings, which only generation calls: TRL's fused head reads the weight directly) and the logits processors
  (temperature, top-k, top-p: `LogitsProcessorList.__call__`);
- log-prob passes without gradient (TRL's `_get_per_token_logps_and_entropies` under `no_grad`: old or reference
  log-probs, when TRL computes them), and the loss's forward pass with gradient, of which TRL's chunked
  log-prob/entropy kernel over the vocabulary (`ChunkedLogProbFunction.forward`);
- backward (`Accelerator.backward`), of which the chunked kernel's backward;
- the optimizer step (`on_pre_optimizer_step` to `on_optimizer_step`);
- the rest: rewards, TRL's and the team's bookkeeping, Trainer's loop (the `train()` call minus the parts above).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
import time
import warnings
from collections import defaultdict
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
from transformers import TrainerCallback  # noqa: E402

KINDS = ("separate", "lora")
VARIANTS = ("baseline", "sampling", "all")
PARTS = (
    "generation",
    "  LM head (generation)",
    "  logits processors (sampling)",
    "log-prob passes, no grad",
    "loss forward",
    "  chunked log-prob/entropy kernel",
    "backward",
    "  chunked kernel backward",
    "optimizer step",
    "rest (rewards, bookkeeping, Trainer)",
)


@dataclass
class Arguments:
    """Flags (`--help` lists them)."""

    size: str = field(default="qwen2.5-vocab-h128", metadata={"help": "Model.", "choices": generation.SIZES})
    kinds: list[str] = field(default_factory=lambda: list(KINDS), metadata={"help": "Teams.", "choices": KINDS})
    max_new_tokens: list[int] = field(default_factory=lambda: [32, 128], metadata={"help": "Completion lengths."})
    prompts: int = field(default=10, metadata={"help": "Prompts of the epoch (the tutorial's first ones)."})
    warmup: bool = field(default=True, metadata={"help": "One untimed step first (`--no-warmup`: none)."})
    variants: list[str] = field(
        default_factory=lambda: ["all"],
        metadata={
            "help": "What the team runs with: 'baseline' (transformers' top-k and top-p warpers, TRL's torch "
            "fallbacks of its log-prob kernel: the code before the kernel and sampling changes), 'sampling' "
            "(+ the top-k/top-p warper of "
            "rollout.sampling), 'all' (+ the faster CPU kernel of rollout.logprob_kernel).",
            "choices": VARIANTS,
        },
    )
    threads: int = field(default_factory=os.cpu_count, metadata={"help": "torch threads."})
    output_dir: str = field(default="/tmp/multiagent_trl_profile_epoch", metadata={"help": "Trainer output."})


class Clock:
    """Accumulated wall time per part."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.on = False

    @contextlib.contextmanager
    def part(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.on:
                self.seconds[name] += time.perf_counter() - start

    def wrap(self, owner, attribute: str, name, static: bool = False) -> None:
        """Time every call of `owner.attribute` under `name` (a string, or a function of the call's arguments)."""
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with self.part(name(*args, **kwargs) if callable(name) else name):
                return original(*args, **kwargs)

        setattr(owner, attribute, staticmethod(timed) if static else timed)


class OptimizerTimer(TrainerCallback):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        if self.clock.on:
            self.clock.seconds["optimizer step"] += time.perf_counter() - self.start


def instrument(clock: Clock) -> None:
    import torch
    from accelerate import Accelerator
    from transformers.generation.logits_process import LogitsProcessorList
    from trl import GRPOTrainer
    from trl.kernels.chunked_logprob import ChunkedLogProbFunction

    from multiagent_trl import MultiAgentGRPOTrainer

    clock.wrap(MultiAgentGRPOTrainer, "_rollouts", "generation")
    clock.wrap(LogitsProcessorList, "__call__", "  logits processors (sampling)")
    clock.wrap(
        GRPOTrainer,
        "_get_per_token_logps_and_entropies",
        lambda *a, **k: "loss forward" if torch.is_grad_enabled() else "log-prob passes, no grad",
    )
    clock.wrap(ChunkedLogProbFunction, "forward", "  chunked log-prob/entropy kernel", static=True)
    clock.wrap(ChunkedLogProbFunction, "backward", "  chunked kernel backward", static=True)
    clock.wrap(Accelerator, "backward", "backward")


def time_head(clock: Clock, model) -> None:
    """Forward hooks that time the output embeddings' forward (called by generation only)."""
    head = model.get_output_embeddings()
    starts = []
    head.register_forward_pre_hook(lambda module, args: starts.append(time.perf_counter()))

    def done(module, args, output):
        if clock.on:
            clock.seconds["  LM head (generation)"] += time.perf_counter() - starts.pop()

    head.register_forward_hook(done)


def build(kind: str, max_new_tokens: int, args: Arguments):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors

    path = generation.model_path(args.size, args.output_dir)
    settings = tutorial.Settings()
    config = MAGRPOConfig(
        output_dir=os.path.join(args.output_dir, f"{kind}-{max_new_tokens}"),
        num_train_epochs=1,
        agent_learning_rate=settings.learning_rate,
        logging_steps=1,
        num_agents=2,
        num_generations=settings.num_generations,
        num_turns=1,
        early_termination_threshold=None,
        external_prompt_passthrough=True,
        max_new_tokens=max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        rollout_buffer_size=settings.rollout_buffer_size,
        advantage_mode="mean",
        eval_interval=0,
        seed=0,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        **tutorial.MATCHED_OPTIMIZER,
    )
    if kind == "lora":
        model = dict(
            model=path,
            peft_config=LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        )
    else:
        model = dict(agents=[AutoModelForCausalLM.from_pretrained(path) for _ in range(2)])
    return MAGRPOTrainer(
        **model,
        reward_func=tutorial.RecordedReward(),
        reward_processor=RewardProcessors.scale(factor=tutorial.REWARD_SCALE),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": tutorial.TRAIN_PROMPTS[: args.prompts]}),
        tokenizer=AutoTokenizer.from_pretrained(path),
    )


def set_variant(trainer, variant: str) -> None:
    """Undo the optimizations that `variant` leaves out (see `Arguments.variants`)."""
    from trl.kernels import chunked_logprob

    from multiagent_trl.rollout import logprob_kernel

    logprob_kernel.use_faster_cpu_kernel()
    if variant != "all":
        chunked_logprob._forward_tile = logprob_kernel._original_forward_tile
        chunked_logprob._backward_tile = logprob_kernel._original_backward_tile
    else:
        chunked_logprob._forward_tile = logprob_kernel.faster_forward_tile
        chunked_logprob._backward_tile = logprob_kernel.faster_backward_tile
    if variant == "baseline":
        for model in trainer.model.models():
            model = model.get_base_model() if hasattr(model, "get_base_model") else model
            del model._get_logits_processor  # the class's method again
            model._uses_top_k_top_p = False


def profile(kind: str, max_new_tokens: int, variant: str, args: Arguments, clock: Clock) -> dict[str, float]:
    import torch
    from transformers import PrinterCallback

    trainer = build(kind, max_new_tokens, args)
    set_variant(trainer, variant)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(OptimizerTimer(clock))
    for agent in trainer.model.agents if kind == "separate" else [trainer.model.peft_model]:
        time_head(clock, agent)
    state = copy.deepcopy(trainer.model.state_dict())
    if args.warmup:
        trainer.args.max_steps = 1  # warm-up step, untimed
        torch.manual_seed(0)
        trainer.train()
        trainer.model.load_state_dict(state)
    trainer.args.max_steps = -1
    torch.manual_seed(0)
    clock.seconds.clear()
    clock.on = True
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    clock.on = False
    parts = dict(clock.seconds)
    top = ("generation", "log-prob passes, no grad", "loss forward", "backward", "optimizer step")
    parts["rest (rewards, bookkeeping, Trainer)"] = total - sum(parts.get(p, 0.0) for p in top)
    tokens = [v for k, v in trainer.state.log_history[-2].items() if k.endswith("completions/mean_length")]
    parts["total"] = total
    parts["mean completion length"] = sum(tokens) / len(tokens) if tokens else float("nan")
    return parts


def table(results: dict[tuple[str, int], dict[str, float]], args: Arguments) -> str:
    keys = list(results)
    lines = [
        "| part | " + " | ".join(f"{kind}, {n} tokens, {variant}" for kind, n, variant in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for part in (*PARTS, "total"):
        cells = []
        for key in keys:
            seconds, total = results[key].get(part, 0.0), results[key]["total"]
            cells.append(f"{seconds:.1f} s ({seconds / total:.0%})" if part != "total" else f"**{seconds:.1f} s**")
        lines.append(f"| {part.strip()}{' (of the above)' if part.startswith('  ') else ''} | " + " | ".join(cells))
    cells = [f"{results[key]['mean completion length']:.0f}" for key in keys]
    lines.append("| mean completion length (last step) | " + " | ".join(cells) + " |")
    return "\n".join(line if line.endswith("|") else line + " |" for line in lines)


def main() -> None:
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser([Arguments]).parse_args_into_dataclasses()
    import torch

    torch.set_num_threads(args.threads)
    clock = Clock()
    instrument(clock)
    results = {}
    for n in args.max_new_tokens:
        for kind in args.kinds:
            for variant in args.variants:
                results[kind, n, variant] = profile(kind, n, variant, args, clock)
                print(f"  {kind} {n} tokens {variant}: {results[kind, n, variant]['total']:.1f} s", flush=True)
    warmup = ", after an untimed warm-up step" if args.warmup else ""
    print(
        f"\n`python benchmarks/profile_epoch.py {' '.join(sys.argv[1:])}` ({args.size}): "
        f"{args.prompts} prompts ({(args.prompts + 1) // 2} steps{warmup}), one `train()` call, {args.threads} torch "
        f"threads, load average {os.getloadavg()[0]:.1f}.\n"
    )
    print(table(results, args))


if __name__ == "__main__":
    main()
