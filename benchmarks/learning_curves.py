"""Learning curves of every family on the tutorial task, multiagent_trl against CoMLRL 1.4.3, from one command.

Each family trains the two agents of `examples/story-len-ratio.py` (the tiny random Qwen2 of
`multiagent_trl.testing.tiny_model_path()`, the tutorial's 10 prompts and length-ratio reward x100) with the same
sample budget per agent, for each seed, in both libraries with the same settings, and scores the agents on the 10
held-out prompts of `compare_comlrl.HELDOUT_PROMPTS` every `--interval` samples per agent: `--eval-samples` sampled
joint completions per prompt, with the training sampling settings and ONE fixed random stream (the same for every
family, library, seed and point; the training random state is saved before and restored after, so scoring does not
change what a run trains on). The trainers are built by `benchmarks/compare_comlrl.py`'s functions (one script per
family, only the import differs between the libraries), so the settings are the ones its docstring describes.

    HF_HUB_OFFLINE=1 python benchmarks/learning_curves.py --families magrpo iac maac madpo --seeds 0 1 2 \\
        --budget 3200 --json-out /tmp/curves.json --figure docs/figures/learning-curves.png --update-docs

`--quick` is a smoke test (a budget of 80 samples per agent: one pass, scored every 40; one seed, 4 eval
samples). `--families` picks from:

| family | multiagent_trl | CoMLRL 1.4.3 | learning rate |
|---|---|---|---|
| magrpo | `MAGRPOTrainer` | `MAGRPOTrainer` | 3e-3 |
| iac, maac | `IACTrainer`, `MAACTrainer` (CoMLRL layer) | `IACTrainer`, `MAACTrainer` | 3e-4 |
| ac-native | `ActorCriticTrainer` (IAC settings, TRL's loss) | `IACTrainer` (the iac run) | 3e-4 |
| madpo | `MADPOTrainer` (CoMLRL layer), fresh pairs each pass | `MADPOTrainer` (pairs drawn once) | 3e-4 |
| dpo-native | `MultiAgentDPOTrainer`, fresh pairs each pass | `MADPOTrainer` (the madpo run) | 3e-4 |
| marlhf | `MARLHFTrainer` (CoMLRL layer) | `MARLHFTrainer` | 3e-3 |

The sample budget B counts completions per agent. MAGRPO and the actor-critic families sample G = 8 per prompt:
B / 80 epochs of the 10 prompts. MADPO samples K = 8 joint candidates per prompt and keeps 4 pairs (largest reward
gap) for B / 80 passes; ours draws new candidates from the current agents on each pass (B samples), CoMLRL draws them
once from the initial agents (80 samples) and trains the same passes over them, so its curve has two points: before
and after training. MARLHF draws K = 8 candidates per prompt once for the reward model's pairs, then trains online
(G = 8) for B / 80 epochs; its online samples are scored by the reward model, not the task reward, so it too has two
points, before and after.

Points: a run is scored when the task reward is first called after each `--interval` samples (before that batch's
update, so the score is of the agents that drew it), and once after `train()`. The wall time of a run is the time of
`train()` less the time spent scoring; the ratio ours/CoMLRL is of runs made one after the other in this process.
Runs go one at a time (`--threads` torch threads each, default 1), CoMLRL's first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import compare_comlrl as shared  # noqa: E402  (the trainers of both libraries, the task, the held-out scoring)

FAMILIES = ("magrpo", "iac", "maac", "ac-native", "madpo", "dpo-native", "marlhf")
# family -> (CoMLRL's run it is compared with, default learning rate)
COMLRL_RUN = {"ac-native": "iac", "dpo-native": "madpo"}
LEARNING_RATE = {
    "magrpo": 3e-3,
    "iac": 3e-4,
    "maac": 3e-4,
    "ac-native": 3e-4,
    "madpo": 3e-4,
    "dpo-native": 3e-4,
    "marlhf": 3e-3,
}
SAMPLES_PER_PROMPT = 8  # G for MAGRPO and actor-critic, K for the preference families
EVAL_SEED = 0  # the one random stream of every held-out score
DOCS_MARKERS = ("<!-- bench:curves start -->", "<!-- bench:curves end -->")


@dataclass
class CurveSettings:
    families: list[str] = field(
        default_factory=lambda: list(FAMILIES), metadata={"help": f"Families to run, of {', '.join(FAMILIES)}."}
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Seeds, each run per library."})
    budget: int = field(default=3200, metadata={"help": "Samples per agent (a multiple of 80: 10 prompts x 8)."})
    interval: int = field(default=0, metadata={"help": "Samples per agent between scores; 0: budget / 8."})
    eval_samples: int = field(default=16, metadata={"help": "Joint completions scored per held-out prompt."})
    learning_rate: float = field(default=0.0, metadata={"help": "Every family's learning rate; 0: per family."})
    critic_learning_rate: float = field(default=0.0, metadata={"help": "Actor-critic: critics' rate; 0: the same."})
    value_loss_coef: float = field(default=0.6, metadata={"help": "Actor-critic: weight of the value loss."})
    value_normalization: bool = field(default=False, metadata={"help": "Actor-critic: ours' critics standardized."})
    advantage_normalization: bool = field(default=True, metadata={"help": "Actor-critic and MAGRPO (CoMLRL's)."})
    libraries: list[str] = field(
        default_factory=lambda: list(shared.LIBRARIES), metadata={"help": "multiagent_trl, comlrl or both."}
    )
    quick: bool = field(
        default=False, metadata={"help": "Smoke test: budget 80, interval 40, one seed, 4 eval samples."}
    )
    threads: int = field(default=1, metadata={"help": "Torch threads per run."})
    comlrl_python: str = field(default=sys.executable, metadata={"help": "Interpreter that imports comlrl 1.4.3."})
    from_json: list[str] = field(
        default_factory=list, metadata={"help": "Skip training: merge these --json-out files, then table/figure/docs."}
    )
    json_out: str | None = field(default=None, metadata={"help": "Write every run's points and times here."})
    figure: str | None = field(default=None, metadata={"help": "Draw reward vs samples, a panel per family (PNG)."})
    update_docs: str | None = field(default=None, metadata={"help": "Rewrite the curves table of this Markdown file."})
    command: str = field(default="", metadata={"help": "The command line the docs print (default: this one)."})

    def __post_init__(self) -> None:
        unknown = sorted(set(self.families) - set(FAMILIES))
        if unknown:
            raise ValueError(f"--families {unknown}: unknown; choose from {', '.join(FAMILIES)}.")
        unknown = sorted(set(self.libraries) - set(shared.LIBRARIES))
        if unknown:
            raise ValueError(f"--libraries {unknown}: unknown; choose from {', '.join(shared.LIBRARIES)}.")
        if self.quick:
            self.budget, self.interval, self.seeds, self.eval_samples = 80, 40, self.seeds[:1], 4

    @property
    def points_every(self) -> int:
        return self.interval or max(1, self.budget // 8)


def shared_settings(settings: CurveSettings, family: str) -> shared.Settings:
    """compare_comlrl's settings for `family` at this budget (epochs or passes = budget / (10 prompts x 8))."""
    per_pass = len(shared.TRAIN_PROMPTS) * SAMPLES_PER_PROMPT
    epochs = max(1, settings.budget // per_pass)
    return shared.Settings(
        epochs=epochs,
        seeds=[0],
        learning_rate=settings.learning_rate or LEARNING_RATE[family],
        num_generations=SAMPLES_PER_PROMPT,
        advantage_normalization=settings.advantage_normalization,
        family={"magrpo": "magrpo", "madpo": "preference", "dpo-native": "preference", "marlhf": "preference"}.get(
            family, "ac"
        ),
        ours_api="native" if family == "ac-native" else "comlrl",
        critic_learning_rate=settings.critic_learning_rate,
        value_loss_coef=settings.value_loss_coef,
        value_normalization=settings.value_normalization,
        preference_num_candidates=SAMPLES_PER_PROMPT,
        preference_pairs_per_sample=4,
        preference_train_batch_size=4,
        eval_samples=settings.eval_samples,
        threads=settings.threads,
    )


# --------------------------------------------------------------------------------------------------------- workers


class ScoredReward(shared.RecordedReward):
    """The task reward, which also scores the agents on the held-out prompts every `interval` samples per agent (one
    reward per joint sample: one sample per agent), before returning the batch's rewards."""

    def __init__(self, settings: shared.Settings, tokenizer, interval: int) -> None:
        super().__init__()
        self.settings, self.tokenizer, self.interval = settings, tokenizer, interval
        self.agents = None  # set once the trainer is built: a callable returning the agents it trains
        self.points: list[tuple[int, float]] = []
        self.next_at = 0
        self.score_seconds = 0.0

    def __call__(self, completions1, completions2) -> list[float]:
        seen = len(self.rewards)
        if self.agents is not None and seen >= self.next_at:
            self.score(seen)
            while self.next_at <= seen:
                self.next_at += self.interval
        return super().__call__(completions1, completions2)

    def score(self, seen: int) -> float:
        import torch

        start = time.perf_counter()
        state = torch.get_rng_state()
        agents = list(self.agents())
        modes = [agent.training for agent in agents]
        value = shared.REWARD_SCALE * statistics.fmean(
            shared.heldout_rewards(agents, self.tokenizer, self.settings, EVAL_SEED)
        )
        for agent, mode in zip(agents, modes):
            agent.train(mode)
        torch.set_rng_state(state)
        self.points.append((seen, value))
        self.score_seconds += time.perf_counter() - start
        return value


def team_of(trainer):
    """The agents a trainer trains: ours keep them in an `AgentTeam` (`trainer.model.agents`), the CoMLRL layer and
    CoMLRL in `trainer.agents`."""
    from transformers import PreTrainedModel

    team = getattr(getattr(trainer, "model", None), "agents", None)
    agents = list(team) if team is not None else list(trainer.agents)
    # The actor-critic trainers' agents are language models with a value head: generate with the language model.
    return [agent if isinstance(agent, PreTrainedModel) else agent.model for agent in agents]


def native_dpo_trainer(settings: shared.Settings, agents, tokenizer, output_dir: str, *, seed: int, reward):
    """multiagent_trl's own `MultiAgentDPOTrainer` with MADPO's settings (K candidates, 4 pairs per prompt by reward
    gap, 2 prompts per generation batch, 4 pairs per optimizer step, CoMLRL's optimizer), new pairs each pass."""
    from datasets import Dataset

    from multiagent_trl import MultiAgentDPOConfig, MultiAgentDPOTrainer

    k, prompts = settings.preference_num_candidates, settings.rollout_buffer_size
    config = MultiAgentDPOConfig(
        output_dir=output_dir,
        num_train_epochs=settings.epochs,
        learning_rate=settings.learning_rate,
        num_agents=2,
        num_generations=k,
        per_device_train_batch_size=prompts * k,
        steps_per_generation=1,
        pair_steps_per_generation=max(1, prompts * settings.preference_pairs_per_sample // 4),
        preference_pairs_per_sample=settings.preference_pairs_per_sample,
        pair_selection="reward_gap",
        dpo_beta=settings.dpo_beta,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        shuffle_dataset=False,
        logging_steps=1,
        seed=seed,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        **shared.MATCHED_OPTIMIZER,
    )
    return MultiAgentDPOTrainer(
        model=agents,
        reward_funcs=shared.ScaledReward(reward),
        args=config,
        train_dataset=Dataset.from_dict({"prompt": shared.TRAIN_PROMPTS}),
        processing_class=tokenizer,
    )


def build(library: str, family: str, settings: shared.Settings, args, output_dir: str, reward):
    """The trainer of `family` in `library`, from compare_comlrl's builders (only the import differs)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common = dict(seed=args.seed, reward=reward)
    if family == "magrpo":
        epochs = dict(epochs=settings.epochs, advantage_mode="mean")
        if library == "comlrl":
            return shared.comlrl_trainer(settings, args.model_path, **epochs, reward=reward)
        optimizer = shared.MATCHED_OPTIMIZER
        return shared.ours_trainer(settings, args.model_path, output_dir, **epochs, **common, **optimizer)
    if family in ("iac", "maac", "ac-native"):
        trainer = "maac" if family == "maac" else "iac"
        if family == "ac-native":
            return shared.native_ac_trainer(settings, args.model_path, args.critic_path, output_dir, trainer=trainer,
                                            **common)  # fmt: skip
        return shared.ac_trainer(library, settings, args.model_path, args.critic_path, output_dir, trainer=trainer,
                                 **common)  # fmt: skip
    agents = [AutoModelForCausalLM.from_pretrained(args.model_path) for _ in range(2)]
    if family == "dpo-native":
        tokenizer = AutoTokenizer.from_pretrained(args.model_path)
        return native_dpo_trainer(settings, agents, tokenizer, output_dir, **common)
    return shared.preference_trainer(library, settings, args.model_path, output_dir, trainer=family, agents=agents,
                                     fresh_pairs_per_pass=True, **common)  # fmt: skip


def run_worker(args) -> None:
    """One run: build, score before, train with scores every interval, score after; write points and times."""
    from transformers import AutoTokenizer

    curve = CurveSettings(**json.loads(args.curve_settings))
    settings = shared_settings(curve, args.family)
    tokenizer = AutoTokenizer.from_pretrained(args.model_path)
    shared.seed_everything(args.seed, settings.threads)
    # Candidates drawn once up front (CoMLRL's MADPO, both MARLHFs): scores between draws would all be of the initial
    # agents, so such runs are scored before and after training only.
    drawn_once = args.family == "marlhf" or (args.worker == "comlrl" and args.family in ("madpo", "dpo-native"))
    reward = ScoredReward(settings, tokenizer, 10**9 if drawn_once else curve.points_every)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = build(args.worker, args.family, settings, args, output_dir, reward)
        if hasattr(trainer, "verbose"):
            trainer.verbose = False
        reward.agents = lambda: team_of(trainer)
        start = time.perf_counter()
        stopped = None
        try:
            trainer.train()
        except ValueError as error:  # ours' preference trainers: a generation batch without any pair
            if "No preference pair" not in str(error):
                raise
            stopped = str(error).split(":")[0]
        wall = time.perf_counter() - start - reward.score_seconds
        reward.score(len(reward.rewards))
        if drawn_once:  # the last point at the budget, where the other runs end, though fewer task rewards were drawn
            reward.points[-1] = (curve.budget, reward.points[-1][1])
    result = {"points": reward.points, "train_seconds": wall, "samples": len(reward.rewards), "stopped": stopped}
    # The training logs (losses, critic values, ...) for diagnosis; CoMLRL's trainers keep none (no Trainer state).
    result["log_history"] = trainer.state.log_history if hasattr(trainer, "state") else []
    Path(args.out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------------------- driver


def launch(library: str, family: str, seed: int, settings: CurveSettings, paths: dict, workdir: Path) -> dict:
    """One run in a subprocess (the library's interpreter, `settings.threads` threads); its result."""
    out = workdir / f"{library}-{family}-seed{seed}.json"
    log = out.with_suffix(".log")
    python = settings.comlrl_python if library == "comlrl" else sys.executable
    command = [
        python, __file__, "--worker", library, "--family", family, "--seed", str(seed), "--out", str(out),
        "--model-path", paths["model"], "--critic-path", paths["critic"],
        "--curve-settings", json.dumps(asdict(settings)),
    ]  # fmt: skip
    threads = str(settings.threads)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}  # fmt: skip
    start = time.perf_counter()
    with log.open("w") as handle:
        code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-30:])
        raise RuntimeError(f"{library} {family} seed {seed} failed ({code}):\n{tail}")
    result = json.loads(out.read_text())
    print(f"  {family:10} {library:14} seed {seed}: final {result['points'][-1][1]:5.1f}, best "
          f"{max(v for _, v in result['points']):5.1f}, train {result['train_seconds']:.0f} s "
          f"(process {time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
    return result


def run_driver(settings: CurveSettings) -> dict:
    from multiagent_trl.testing import tiny_model_path

    paths = {"model": str(tiny_model_path()), "critic": str(tiny_model_path(seed=1))}
    runs: dict[str, dict[str, dict[str, dict]]] = {}  # family -> library -> seed -> result
    done: dict[tuple[str, str, int], dict] = {}  # CoMLRL's runs shared by the native families
    with tempfile.TemporaryDirectory() as tmp:
        for seed in settings.seeds:  # seed by seed: a run cut short still has every family's first seeds
            for family in settings.families:
                for library in ("comlrl", "multiagent_trl"):
                    if library not in settings.libraries:
                        continue
                    key = (library, COMLRL_RUN.get(family, family) if library == "comlrl" else family, seed)
                    if key not in done:
                        done[key] = launch(library, key[1], seed, settings, paths, Path(tmp))
                    runs.setdefault(family, {}).setdefault(library, {})[str(seed)] = done[key]
                    if settings.json_out:  # after every run, so that a cut-short run leaves what it did
                        Path(settings.json_out).write_text(json.dumps({"settings": asdict(settings), "runs": runs}))
    return report({"settings": asdict(settings), "runs": runs}, settings)


def report(results: dict, settings: CurveSettings) -> dict:
    """Print the table; write the JSON, the figure and the docs block where asked."""
    if settings.command:
        results["settings"]["command"] = settings.command
    print("\n" + table(results))
    if settings.json_out:
        Path(settings.json_out).write_text(json.dumps(results, indent=1))
    if settings.figure:
        from figures import curves_figure

        print(f"Figure written to {curves_figure(results, settings.figure)}")
    if settings.update_docs:
        update_docs(results, Path(settings.update_docs))
    return results


def table(results: dict) -> str:
    """The Markdown table: final and best held-out reward per family, library and seed, wall times and their ratio."""
    budget = results["settings"]["budget"]
    lines = [
        "| family | seed | ours final | ours best | CoMLRL final | CoMLRL best | ours train (s) | CoMLRL train (s) "
        "| time ours/CoMLRL |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for family, libraries in results["runs"].items():
        ours, theirs = libraries.get("multiagent_trl", {}), libraries.get("comlrl", {})
        for seed in sorted(set(ours) | set(theirs), key=int):
            cells = [family, seed]
            for run in (ours.get(seed), theirs.get(seed)):
                values = [v for _, v in run["points"]] if run else None
                cells += [f"{values[-1]:.1f}", f"{max(values):.1f}"] if values else ["-", "-"]
                if run and run.get("stopped"):
                    cells[-2] += " (stopped: no pair)"
            times = [run["train_seconds"] if run else None for run in (ours.get(seed), theirs.get(seed))]
            cells += [f"{t:.0f}" if t is not None else "-" for t in times]
            cells.append(f"{times[0] / times[1]:.2f}x" if None not in times else "-")
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines.append(f"\nBudget: {budget} samples per agent; held-out reward x100 (10 prompts x "
                 f"{results['settings']['eval_samples']} joint samples, one random stream).")  # fmt: skip
    return "\n".join(lines)


def update_docs(results: dict, page: Path) -> None:
    """Replace the block between DOCS_MARKERS in `page` with the command and the table of this run."""
    text = page.read_text()
    start, end = (text.index(marker) for marker in DOCS_MARKERS)
    command = results["settings"]["command"] or "python benchmarks/learning_curves.py " + " ".join(sys.argv[1:])
    block = f"{DOCS_MARKERS[0]}\n```bash\nHF_HUB_OFFLINE=1 {command}\n```\n\n{table(results)}\n"
    page.write_text(text[:start] + block + text[end:])


def parse_args(argv: list[str] | None = None):
    from transformers import HfArgumentParser

    parser = HfArgumentParser(CurveSettings, description=__doc__.split("\n")[0])
    for name in ("worker", "family", "out", "model_path", "critic_path", "curve_settings"):
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    settings, args = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=False)
    return settings, args


def main(argv: list[str] | None = None) -> dict | None:
    settings, args = parse_args(argv)
    if args.worker:
        run_worker(args)
        return None
    if settings.from_json:
        return report(merged([json.loads(Path(name).read_text()) for name in settings.from_json]), settings)
    return run_driver(settings)


def merged(parts: list[dict]) -> dict:
    """Several runs' results as one: every (family, library, seed) run of each (a later part's run of the same cell
    replaces an earlier one); the settings of the first, with every part's seeds."""
    runs: dict[str, dict[str, dict]] = {}
    for part in parts:
        for family, libraries in part["runs"].items():
            for library, seeds in libraries.items():
                runs.setdefault(family, {}).setdefault(library, {}).update(seeds)
    seeds = sorted({seed for part in parts for seed in part["settings"].get("seeds", [])})
    return {"settings": {**parts[0]["settings"], "seeds": seeds}, "runs": runs}


if __name__ == "__main__":
    main()
