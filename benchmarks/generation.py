"""Generation paths of a team, side by side: tokens/s per path, the tutorial epoch against CoMLRL, per-step overheads.

    python benchmarks/generation.py                  # all three parts (about 15 minutes on 2 CPU cores)
    python benchmarks/generation.py --only epoch     # or: throughput, overheads
    python benchmarks/generation.py --update-docs    # also rewrites the docs/benchmarks.md table between its markers

Paths: "plain" (TRL's `generate`, the default: one call for all agents, separate models of one architecture
included), "per_agent" (`generation_mode="per_agent"`: one `generate` call per agent), "continuous_batching"
(`use_transformers_continuous_batching=True`, transformers' paged `generate_batch`, one call per agent) and
"compiled" (`compile_generation=True`: static KV cache and the decoding step compiled by inductor; compiling takes
about a minute per model on a CPU, done before timing and reported as "first call s").

1. throughput: a 2-agent team (separate models, and LoRA adapters on one base with batched generation), the tiny
   (about 90k parameters) and bench-4m (about 4M) models of `multiagent_trl.testing`. One trainer per path, built
   once; each round times one generation of the team, path after path (so that drift in the machine's speed hits
   all alike), as training runs it (`_rollouts`: the tutorial's batch, 2 prompts x 8 completions of up to 32 tokens
   per agent, temperature 0.6, top-p 0.6, top-k 50). Tokens/s: completion tokens of all agents over the time.
2. epoch: the CoMLRL tutorial (`benchmarks/compare_comlrl.py`'s task and settings: 10 prompts, 2 agents, the tiny
   and the 4M model, 8 generations, 32 tokens, 2 prompts per step) for one epoch (one `train()` call, whose start
   includes Trainer's `gc.collect()`): multiagent_trl per path against CoMLRL 1.4.3's
   `MAGRPOTrainer`, in one process, alternating, one epoch per trainer per round. CoMLRL must import here
   (`pip install --no-deps comlrl==1.4.3` suffices: its dependencies are ours).
3. overheads: what each wrapper costs per decoding step of one tiny agent (16 rows, 32 steps): the bare model in
   eval mode, with TRL's fused LM head (`add_fused_lm_head`), in training mode, behind the team (`AgentTeam`), and
   greedy instead of sampling (the logits processors).

Medians over the rounds; the load average and other processes' CPU share are printed, since timings on a shared
machine are noisy.
"""

from __future__ import annotations

import copy
import os
import platform
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
import vs_trl  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from vs_trl import OtherLoad, path_settings  # noqa: E402

PATHS = vs_trl.PATHS
# Randomly initialised models of Qwen2.5-0.5B's shape (no weights can be downloaded), for a GPU; the "-mini" shapes
# keep its vocabulary but 2 narrow layers, to check the device scripts on a CPU.
QWEN_SHAPES = {
    "qwen2.5-0.5b-shape": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2
    ),
    "qwen2.5-0.5b-mini": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
    # The real-vocabulary shape of the CPU benchmarks: Qwen2.5's vocabulary and tied head on 2 narrow layers, with a
    # head size of 32 (128 / 4), which vLLM's attention backends accept (`vllm_device.py` on a CPU too).
    "qwen2.5-vocab-h128": dict(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    ),
}
QWEN_VOCAB = 151936
SIZES = ("tiny", "bench-4m", *QWEN_SHAPES)
KINDS = ("separate", "lora")
PARTS = ("throughput", "epoch", "overheads")
DOCS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
EPOCH_TARGET = 0.5  # multiagent_trl's tutorial epoch at most half of CoMLRL's


@dataclass
class Arguments:
    """Flags (`--help` lists them; `--update-docs` or `--update_docs`)."""

    only: list[str] = field(default_factory=lambda: list(PARTS), metadata={"help": "Parts to run.", "choices": PARTS})
    paths: list[str] = field(default_factory=lambda: list(PATHS), metadata={"help": "Paths.", "choices": PATHS})
    sizes: list[str] = field(
        default_factory=lambda: ["tiny", "bench-4m"], metadata={"help": "Models (throughput).", "choices": SIZES}
    )
    epoch_sizes: list[str] = field(
        default_factory=lambda: ["tiny", "bench-4m"],
        metadata={"help": "Models of the tutorial epoch.", "choices": SIZES},
    )
    bf16: bool = field(default=False, metadata={"help": "bf16 (on a GPU); float32 otherwise."})
    kinds: list[str] = field(default_factory=lambda: list(KINDS), metadata={"help": "Team kinds.", "choices": KINDS})
    rounds: int = field(default=6, metadata={"help": "Alternating rounds (throughput and overheads)."})
    epoch_rounds: int = field(default=3, metadata={"help": "Alternating rounds of one tutorial epoch each."})
    max_new_tokens: int = field(default=32, metadata={"help": "Completion length (throughput)."})
    threads: int = field(default_factory=os.cpu_count, metadata={"help": "torch threads."})
    compile_backend: str = field(default="inductor", metadata={"help": "torch.compile backend of the compiled path."})
    update_docs: bool = field(default=False, metadata={"help": "Rewrite docs/benchmarks.md's table with this run."})
    output_dir: str = field(default="/tmp/multiagent_trl_bench_generation", metadata={"help": "Trainer output."})


def model_path(size: str, output_dir: str) -> str:
    """A model folder: the tiny models of `multiagent_trl.testing`, or a random model of Qwen2.5-0.5B's shape with the
    byte tokenizer grown to Qwen's vocabulary (placeholder tokens), built once under `output_dir`."""
    from multiagent_trl.testing import (
        byte_level_config,
        is_model_folder,
        save_model_folder,
        tiny_model_path,
        tiny_tokenizer,
    )

    if size not in QWEN_SHAPES:
        return tiny_model_path(size)
    folder = Path(output_dir) / f"{size}-model"
    if is_model_folder(folder):
        return str(folder)
    import torch
    from transformers import AutoModelForCausalLM

    tokenizer = tiny_tokenizer()
    tokenizer.add_tokens([f"<t{i}>" for i in range(QWEN_VOCAB - len(tokenizer))])
    config = byte_level_config(tokenizer, max_position_embeddings=4096, **QWEN_SHAPES[size])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    folder.parent.mkdir(parents=True, exist_ok=True)
    return save_model_folder(folder, model, tokenizer)


def team(size: str, kind: str, path: str, args: Arguments, max_new_tokens: int, **extra):
    from datasets import Dataset
    from peft import LoraConfig

    from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

    config = MultiAgentGRPOConfig(
        output_dir=os.path.join(args.output_dir, f"{size}-{kind}-{path}"),
        num_agents=2,
        per_device_train_batch_size=16,
        num_generations=8,
        max_completion_length=max_new_tokens,
        temperature=0.6,
        top_p=0.6,
        top_k=50,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        bf16=args.bf16,
        seed=0,
        **path_settings(path, args.compile_backend),
        **extra,
    )
    peft = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = model_path(size, args.output_dir)
    return MultiAgentGRPOTrainer(
        model=model if kind == "lora" else [model, model],
        reward_funcs=tutorial.proper_length_ratio_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": tutorial.TRAIN_PROMPTS}),
        peft_config=peft if kind == "lora" else None,
    )


def generate_once(trainer) -> tuple[float, int]:
    """One generation of the team as training runs it: seconds and completion tokens (all agents)."""
    rows = [{"prompt": p} for p in tutorial.TRAIN_PROMPTS[:2] for _ in range(8)]
    agent_inputs = [trainer._agent_inputs(rows, i) for i in range(trainer.num_agents)]
    trainer.model.train()
    start = time.perf_counter()
    rollouts = trainer._rollouts(agent_inputs, "train")
    seconds = time.perf_counter() - start
    return seconds, sum(len(ids) for r in rollouts for ids in r.completion_ids)


def run_throughput(args: Arguments) -> list[dict]:
    results = []
    for size in args.sizes:
        for kind in args.kinds:
            trainers, compile_s = {}, {}
            for path in args.paths:
                trainers[path] = team(size, kind, path, args, args.max_new_tokens)
                start = time.perf_counter()
                try:
                    generate_once(trainers[path])  # warm-up (the compile, for the compiled path)
                except Exception as error:  # a path that cannot run here is reported, not fatal
                    print(f"  {size} {kind} {path}: {type(error).__name__}: {error}", flush=True)
                    del trainers[path]
                    continue
                compile_s[path] = time.perf_counter() - start
            times = {path: [] for path in trainers}
            tokens = {path: [] for path in trainers}
            with OtherLoad() as load:
                for _ in range(args.rounds):
                    for path, trainer in trainers.items():
                        seconds, count = generate_once(trainer)
                        times[path].append(seconds)
                        tokens[path].append(count)
            for path in trainers:
                rate = statistics.median(t / s for t, s in zip(tokens[path], times[path]))
                results.append(
                    dict(
                        size=size,
                        kind=kind,
                        path=path,
                        seconds=statistics.median(times[path]),
                        tokens_per_s=rate,
                        warmup_s=compile_s[path],
                        other_load=load.share,
                    )
                )
                print(
                    f"  {size:8s} {kind:8s} {path:19s} {statistics.median(times[path]):.3f} s/generation "
                    f"{rate:7.0f} tokens/s (first call {compile_s[path]:.1f} s)",
                    flush=True,
                )
    return results


def comlrl_trainer(settings: tutorial.Settings, model_path: str):
    return tutorial.comlrl_trainer(
        settings, model_path, epochs=1, advantage_mode="mean", reward=tutorial.RecordedReward()
    )


def ours_trainer(settings: tutorial.Settings, model_path: str, path: str, args: Arguments):
    return tutorial.ours_trainer(
        settings, model_path, os.path.join(args.output_dir, f"epoch-{path}"), epochs=1, seed=0,
        advantage_mode="mean", reward=tutorial.RecordedReward(), bf16=args.bf16, **tutorial.MATCHED_OPTIMIZER,
        **path_settings(path, args.compile_backend),
    )  # fmt: skip


def run_epoch(args: Arguments) -> list[dict]:
    return [r for size in args.epoch_sizes for r in run_epoch_of(size, args)]


def run_epoch_of(size: str, args: Arguments) -> list[dict]:
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()
    settings, path_of_model = tutorial.Settings(), model_path(size, args.output_dir)
    trainers = {f"multiagent_trl {path}": ours_trainer(settings, path_of_model, path, args) for path in args.paths}
    try:
        trainers["CoMLRL 1.4.3"] = comlrl_trainer(settings, path_of_model)
    except ImportError as error:
        print(f"  CoMLRL is not importable ({error}): `pip install --no-deps comlrl==1.4.3`", flush=True)
    import torch

    def modules(name, trainer) -> list:
        return list(trainer.agents) if name.startswith("CoMLRL") else [trainer.model]

    # Every timed epoch starts from the same weights and seed: an epoch's time depends on the completions' lengths,
    # which training changes (a trainer that had learned to stop early would decode fewer steps).
    initial = {name: [copy.deepcopy(m.state_dict()) for m in modules(name, t)] for name, t in trainers.items()}

    # The epoch inside `train()`: from Trainer's epoch start to its end, without what `train()` does once before its
    # loop (Accelerate's `free_memory`, a full `gc.collect()` of the process: its cost grows with every object the
    # process holds, other trainers included). CoMLRL's `train()` runs its epoch loop after moving the agents to
    # their devices, so its whole call is its epoch.
    in_loop = {name: EpochTimer() for name in trainers if not name.startswith("CoMLRL")}
    for name, timer in in_loop.items():
        trainers[name].add_callback(timer)

    def epoch(name, trainer) -> tuple[float, float]:
        for module, state in zip(modules(name, trainer), initial[name]):
            module.load_state_dict(state)
        torch.manual_seed(0)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        return seconds, in_loop[name].seconds if name in in_loop else seconds

    first = {name: epoch(name, trainer)[0] for name, trainer in trainers.items()}  # warms up (and compiles): untimed
    times = {name: [] for name in trainers}
    with OtherLoad() as load:
        for _ in range(args.epoch_rounds):
            for name, trainer in trainers.items():
                times[name].append(epoch(name, trainer))
    whole = {name: statistics.median(t for t, _ in values) for name, values in times.items()}
    loop = {name: statistics.median(t for _, t in values) for name, values in times.items()}
    theirs = whole.get("CoMLRL 1.4.3", float("nan"))
    results = []
    for name in trainers:
        seconds, loop_s = whole[name], loop[name]
        results.append(
            dict(size=size, name=name, seconds=seconds, ratio=seconds / theirs, loop_s=loop_s,
                 loop_ratio=loop_s / theirs, first_s=first[name])
        )  # fmt: skip
        print(
            f"  {size:8s} {name:35s} {seconds:6.2f} s/epoch ({seconds / theirs:.2f}x CoMLRL's), in the loop "
            f"{loop_s:.2f} s ({loop_s / theirs:.2f}x); first {first[name]:.1f} s"
        )
    print(f"  other processes' CPU share: {load.share:.0%}", flush=True)
    for r in results:
        r["other_load"] = load.share
    return results


class EpochTimer(TrainerCallback):
    """The time of the last epoch, from `on_epoch_begin` to `on_epoch_end`."""

    seconds = float("nan")

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_epoch_end(self, args, state, control, **kwargs):
        self.seconds = time.perf_counter() - self.start


def run_overheads(args: Arguments) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    from trl.trainer.utils import add_fused_lm_head, pad

    from multiagent_trl.team import AgentTeam
    from multiagent_trl.testing import tiny_model_path, tiny_tokenizer

    tokenizer, path = tiny_tokenizer(), tiny_model_path()
    prompts = [tokenizer(p)["input_ids"] for p in tutorial.TRAIN_PROMPTS[:2] for _ in range(8)]
    input_ids = pad([torch.tensor(p) for p in prompts], padding_value=tokenizer.pad_token_id, padding_side="left")
    mask = pad([torch.ones(len(p), dtype=torch.long) for p in prompts], padding_value=0, padding_side="left")
    steps = args.max_new_tokens
    pad_id = tokenizer.pad_token_id
    common = dict(max_new_tokens=steps, min_new_tokens=steps, pad_token_id=pad_id, disable_compile=True)
    sampled = GenerationConfig(**common, do_sample=True, temperature=0.6, top_p=0.6, top_k=50)
    greedy = GenerationConfig(**common, do_sample=False)

    def model(fused: bool, training: bool):
        m = AutoModelForCausalLM.from_pretrained(path)
        if fused:
            add_fused_lm_head(m, temperature=0.6, outputs=("log_probs", "entropy"))
        return m.train(training)

    variants = {
        "bare model, eval mode, sampling": (model(False, False), sampled),
        "+ TRL's fused LM head": (model(True, False), sampled),
        "+ training mode": (model(True, True), sampled),
        "+ behind AgentTeam": (AgentTeam([model(True, True)]), sampled),
        "greedy instead of sampling": (model(True, True), greedy),
    }
    times = {name: [] for name in variants}
    with OtherLoad() as load:
        for _ in range(args.rounds + 1):
            for name, (m, config) in variants.items():
                start = time.perf_counter()
                with torch.no_grad():
                    m.generate(input_ids=input_ids, attention_mask=mask, generation_config=config)
                times[name].append((time.perf_counter() - start) / steps * 1000)
    results = []
    for name, values in times.items():
        ms = statistics.median(values[1:])  # the first round warms up
        results.append(dict(name=name, ms_per_step=ms, other_load=load.share))
        print(f"  {name:35s} {ms:6.2f} ms per decoding step", flush=True)
    return results


def report(args: Arguments, throughput, epoch, overheads) -> str:
    import torch
    import transformers
    import trl

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    lines = [
        f"`python benchmarks/generation.py`, {time.strftime('%Y-%m-%d')}: {os.cpu_count()} CPU cores "
        f"({platform.machine()}), {gpu}, {args.threads} torch threads, {'bf16' if args.bf16 else 'float32'}, load "
        f"average {os.getloadavg()[0]:.1f} at the end; torch {torch.__version__}, transformers "
        f"{transformers.__version__}, TRL {trl.__version__}. Medians.",
        "",
    ]
    lines[0] = textwrap.fill(lines[0], width=118)
    if throughput:
        plain = {(r["size"], r["kind"]): r["tokens_per_s"] for r in throughput if r["path"] == "plain"}
        lines += [
            "| model | agents | path | s / generation | tokens/s | vs plain | first call s |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in throughput:
            base = plain.get((r["size"], r["kind"]))
            ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
            kind = "separate models" if r["kind"] == "separate" else "LoRA adapters"
            lines.append(
                f"| {r['size']} | {kind} | {r['path']} | {r['seconds']:.3f} | {r['tokens_per_s']:.0f} | {ratio} | "
                f"{r['warmup_s']:.1f} |"
            )
        shares = [r["other_load"] for r in throughput]
        lines += ["", f"Throughput: other processes used {min(shares):.0%}-{max(shares):.0%} of the CPUs.", ""]
    if epoch:
        lines += [
            f"| model | tutorial epoch (5 steps) | s / epoch (`train()` call) | vs CoMLRL (target <= {EPOCH_TARGET}x) "
            "| s in the epoch loop | vs CoMLRL | first epoch s |",
            "|---|---|---|---|---|---|---|",
        ]

        def verdict(ratio: float, name: str) -> str:
            return "" if name.startswith("CoMLRL") else (": met" if ratio <= EPOCH_TARGET else ": not met")

        for r in epoch:
            lines.append(
                f"| {r['size']} | {r['name']} | {r['seconds']:.2f} "
                f"| {r['ratio']:.2f}x{verdict(r['ratio'], r['name'])} "
                f"| {r['loop_s']:.2f} | {r['loop_ratio']:.2f}x{verdict(r['loop_ratio'], r['name'])} "
                f"| {r['first_s']:.1f} |"
            )
        shares = [r["other_load"] for r in epoch]
        lines += ["", f"Epochs: other processes used {min(shares):.0%}-{max(shares):.0%} of the CPUs.", ""]
    if overheads:
        lines += ["| one tiny agent, 16 rows | ms per decoding step |", "|---|---|"]
        lines += [f"| {r['name']} | {r['ms_per_step']:.2f} |" for r in overheads]
    return "\n".join(lines).strip()


def update_docs(block: str, page: Path = DOCS_PAGE, name: str = "generation") -> None:
    """Replace the text between `<!-- bench:NAME start -->` and `<!-- bench:NAME end -->` of `page` with `block`."""
    markers = (f"<!-- bench:{name} start -->", f"<!-- bench:{name} end -->")
    text = page.read_text()
    if markers[0] not in text or markers[1] not in text:
        raise SystemExit(f"{page} has no {markers[0]} ... {markers[1]} block to update.")
    start, end = text.index(markers[0]) + len(markers[0]), text.index(markers[1])
    page.write_text(text[:start] + "\n" + block + "\n" + text[end:])


def main() -> None:
    from trl import TrlParser

    (args,) = TrlParser([Arguments]).parse_args_and_config()
    import torch

    torch.set_num_threads(args.threads)
    print(f"Load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    throughput = run_throughput(args) if "throughput" in args.only else []
    epoch = run_epoch(args) if "epoch" in args.only else []
    overheads = run_overheads(args) if "overheads" in args.only else []
    block = report(args, throughput, epoch, overheads)
    print("\n" + block)
    if args.update_docs:
        update_docs(block)
        print(f"updated {DOCS_PAGE}")


if __name__ == "__main__":
    main()
