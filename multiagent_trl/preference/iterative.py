"""Iterative MADPO through one `Trainer.train`: `MultiAgentIterativeDPOConfig` / `MultiAgentIterativeDPOTrainer`.

A run is `num_train_epochs` rounds (TRL's epochs). At the start of each round the current agents play every training
prompt twice, once as the policy (K = `num_generations` joint candidates) and once as the comparator (K' =
`comparator_num_generations`); `comparison_records` pairs them index by index (`replay.comparison_pairs`), the round's
pairs are written to `replay_dir/iteration_XXXX.json` and the round trains on the pairs `replay_mode` draws from the
shards (`replay.replay_selection`). The round's generation batches then take their pair rows from those pairs instead
of from their own candidates: the same rows per batch as `MultiAgentDPOTrainer` (`nodes * pairs_per_prompt` rounded to
whole steps), served in a shuffled order and cycled when the round has fewer pairs than that. With `pair_batch_size`
the round's epoch iterates over its pairs instead (`RoundPairBatches`): `pair_passes` passes in batches of that many
pairs, so a round's length follows the pairs it drew (CoMLRL's MADPOIter, `comlrl.iterative`, runs this way).

Everything else is Trainer's, over the whole run: one optimizer, one learning-rate schedule, one `global_step`,
callbacks, gradient accumulation, logging, checkpoints. Resuming inside a round reloads that round's shard (its pairs
are not drawn again), draws the replay sample again and serves the pairs the stopped run had not reached
(`pairs_served_before`); resuming at a round's start draws the round anew.

With several processes (`accelerate launch`, DDP), each plays its share of the prompts, the pairs are gathered so
that every process holds the round's pairs, the process that saves writes the shard (and the history comparator's
round start), and the main process's replay draw is every process's; each process then trains on the next pairs
after those of the processes before it, or, with `pair_batch_size`, on every `num_processes`-th micro-batch.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import broadcast_object_list
from datasets import IterableDataset
from peft import PeftModel
from transformers import AutoModelForCausalLM, TrainerCallback

from ..rollout.buffers import check_fills_a_batch
from ..team.modules import LoraAgentTeam
from .config import MultiAgentDPOConfig
from .replay import (
    ReplayShard,
    check_replay_fields,
    comparison_pairs,
    load_records,
    replay_selection,
    write_shard,
)
from .sampling import gather_in_order, process_share, prompts_per_call
from .trainer import MultiAgentDPOTrainer

COMPARATORS = ("current", "history", "model")


@dataclass
class IterativeRoundFields:
    """The round fields (documented on `MultiAgentIterativeDPOConfig`) and their checks, for any config whose trainer
    mixes in `IterativeRounds` (iterative MADPO here; iterative MARLHF can take the same). A config mixes them in
    before its base config and calls `check_round_fields()` in its `__post_init__`."""

    comparator: str = field(default="current", metadata={"help": "The comparator: 'current', 'history' or 'model'."})
    comparator_history_k: int | None = field(
        default=None, metadata={"help": "With comparator='history': the policy of this many rounds back (None: 1)."}
    )
    comparator_model: list[str] | None = field(
        default=None, metadata={"help": "With comparator='model': a model id or path, or one per agent."}
    )
    comparator_num_generations: int | None = field(
        default=None, metadata={"help": "K', the comparator's candidates per prompt; None: num_generations."}
    )
    replay_mode: str = field(
        default="current", metadata={"help": "'current', 'nearest_k', 'all_history' or 'lambda_decay'."}
    )
    replay_k: int | None = field(default=None, metadata={"help": "Shards 'nearest_k' replays."})
    replay_lambda: float | None = field(default=None, metadata={"help": "'lambda_decay''s lambda in [0, 1]."})
    replay_sample_size: int | None = field(default=None, metadata={"help": "Pairs a replay draws."})
    replay_dir: str | None = field(default=None, metadata={"help": "Shard folder (None: output_dir/...)."})

    def check_round_fields(self) -> None:
        """Raise on a round field that is not allowed or not built, naming it."""
        if self.comparator not in COMPARATORS:
            raise ValueError(f"`comparator` must be one of {list(COMPARATORS)}, got {self.comparator!r}.")
        if self.comparator != "history" and self.comparator_history_k is not None:
            raise ValueError("`comparator_history_k` is only valid with `comparator='history'`.")
        if (self.comparator == "model") != (self.comparator_model is not None):
            raise ValueError(
                "`comparator='model'` needs `comparator_model` (a model id or path, or one per agent), and "
                "`comparator_model` is only valid with `comparator='model'`."
            )
        sources = self.comparator_model
        sources = [sources] if isinstance(sources, (str, os.PathLike)) else sources
        if sources is not None and not (
            isinstance(sources, (list, tuple)) and all(isinstance(s, (str, os.PathLike)) for s in sources)
        ):
            raise TypeError(
                f"`comparator_model` takes model ids or folders (one for every agent, or one per agent), got "
                f"{type(self.comparator_model).__name__}: save a model object with `save_pretrained` and pass its "
                "folder (the weights are loaded once and kept on the CPU)."
            )
        if self.comparator == "history":
            self.comparator_history_k = 1 if self.comparator_history_k is None else self.comparator_history_k
            if self.comparator_history_k < 1:
                raise ValueError(f"`comparator_history_k` must be at least 1, got {self.comparator_history_k}.")
        if self.comparator_num_generations is not None and self.comparator_num_generations < 1:
            raise ValueError(f"`comparator_num_generations` must be >= 1, got {self.comparator_num_generations}.")
        self.replay_mode, self.replay_k, self.replay_lambda, self.replay_sample_size = check_replay_fields(
            self.replay_mode, self.replay_k, self.replay_lambda, self.replay_sample_size, self.replay_dir
        )


@dataclass
class MultiAgentIterativeDPOConfig(IterativeRoundFields, MultiAgentDPOConfig):
    r"""
    Configuration for `MultiAgentIterativeDPOTrainer`: every `MultiAgentDPOConfig` field, plus the round fields.

    `num_train_epochs` is the number of rounds: each round draws fresh pairs (current policy against the comparator)
    over the whole training set and trains one epoch on them.

    Parameters:
        comparator (`str`, *optional*, defaults to `"current"`):
            Who the current policy's candidates are compared with: `"current"` (another draw of the same agents) or
            `"history"` (the agents as they were at the start of the round `comparator_history_k - 1` rounds back,
            the first round's start before that: CoMLRL's policy from `k` iterations ago).
        comparator_history_k (`int` or `None`, *optional*, defaults to `None`):
            With `comparator="history"`: how many rounds back (`None`: 1, the round's own start, which draws as
            `"current"` does: nothing is swapped or written). With `k > 1` the past weights (the agents' trainable
            parameters, at most `comparator_history_k` copies) are kept in `replay_dir` (`round_start_XXXX.pt`),
            where a resumed run finds them too.
        comparator_model (`str`, `list[str]` or `None`, *optional*, defaults to `None`):
            With `comparator="model"`: the model whose candidates each agent's are compared with, an id or path (one
            for every agent, or one per agent), of the agent's architecture and tokenizer (another checkpoint of the
            same model, say the one training started from). Loaded at construction, its weights kept on the CPU and
            put into the agent for the comparator's draw; a team of full models only (not LoRA adapters).
        comparator_num_generations (`int` or `None`, *optional*, defaults to `None`):
            K', the comparator's joint candidates per prompt (`None`: `num_generations`). Pairs are index-aligned,
            so `min(K, K')` comparisons per prompt.
        replay_mode (`str`, *optional*, defaults to `"current"`):
            Which pairs a round trains on: `"current"` (its own), `"nearest_k"`, `"all_history"`, `"lambda_decay"`
            (a sample of the shards, see `multiagent_trl.preference.replay`).
        replay_k (`int` or `None`): the newest shards `"nearest_k"` draws from.
        replay_lambda (`float` or `None`): `"lambda_decay"`'s decay in [0, 1].
        replay_sample_size (`int` or `None`): the pairs a replay draws (`None`: the round's own count).
        replay_dir (`str` or `None`, *optional*, defaults to `None`):
            Where the rounds' shards go (`None`: `output_dir/preference_replay`).
        pair_batch_size (`int` or `None`, *optional*, defaults to `None`):
            `None`: a round's length is set by the prompts (its generation batches serve the round's pairs, cycled).
            An `int`: a round is `pair_passes` shuffled passes over its training pairs in micro-batches of this many
            pairs per process, so its length follows the pairs it drew (CoMLRL's MADPOIter). Trainer sizes the run
            (`max_steps`, the learning-rate schedule) on the most pairs a round can draw (`replay_sample_size`, else
            every prompt's `min(K, K', preference_pairs_per_sample)`); a round that draws fewer ends early. With
            `gradient_accumulation_steps > 1` a round's micro-batches are completed to whole optimizer steps with its
            first ones. Set the rounds with `num_train_epochs` (`max_steps` stays -1); resuming is not supported.
        pair_passes (`int`, *optional*, defaults to `1`):
            With `pair_batch_size`: passes over a round's training pairs, each in a new order.
    """

    pair_batch_size: int | None = field(
        default=None,
        metadata={"help": "Pairs per micro-batch (per process) when a round trains on its pairs; None: by prompts."},
    )
    pair_passes: int = field(default=1, metadata={"help": "With pair_batch_size: passes over a round's pairs."})

    def __post_init__(self):
        self.check_round_fields()
        if self.pair_batch_size is not None and self.pair_batch_size < 1:
            raise ValueError(f"`pair_batch_size` must be at least 1, or None; got {self.pair_batch_size}.")
        if self.pair_passes < 1:
            raise ValueError(f"`pair_passes` must be at least 1, got {self.pair_passes}.")
        if self.max_steps <= 0 and not float(self.num_train_epochs).is_integer():
            raise ValueError(
                f"`num_train_epochs={self.num_train_epochs}` counts the rounds, each drawing its pairs over the whole "
                "training set: give a whole number (a part of a round would draw a whole round's pairs)."
            )
        if self.pair_batch_size is None and self.pair_passes != 1:
            raise ValueError("`pair_passes` counts passes over a round's pairs: it needs `pair_batch_size`.")
        if self.pair_batch_size is not None and self.max_steps > 0:
            raise ValueError(
                f"`max_steps={self.max_steps}` with `pair_batch_size`: a round's length follows its pairs, so the "
                "run is set by rounds. Set `num_train_epochs` (the rounds) and leave `max_steps=-1`."
            )
        super().__post_init__()

    def check_pair_steps(self) -> None:
        """Nothing to check: a round fills every pair row of a generation batch with its pairs (cycled), and with
        `pair_batch_size` the steps follow the pairs."""


def candidate_sets(level, width: int, reward_weights: torch.Tensor, process_index: int = 0) -> list[dict[str, Any]]:
    """Per row of a played `rollout.tree.Level` (`MultiAgentGRPOTrainer.sample`) of process `process_index`: each
    agent's prompt, its `width` completions (text and token ids), the joint rewards of the aligned candidates (after
    the reward processor) and the raw ones (the weighted sum of the reward functions); the level's rewards are
    gathered over the processes, this process's rows are its `process_index`-th block."""
    nodes = len(level.nodes)
    mine = slice(process_index * nodes, (process_index + 1) * nodes)
    processed = level.joint.view(-1, width)[mine].tolist()
    per_func = level.rewards_per_func.to(reward_weights.device)
    raw = (per_func * reward_weights).nansum(dim=1).view(-1, width)[mine].tolist()
    out = []
    for n in range(nodes):
        rows = range(n * width, (n + 1) * width)
        rollouts = level.rollouts
        out.append(
            {
                "prompts": [level.nodes[n].prompts[i] for i in range(len(rollouts))],
                "prompt_ids": [rollout.prompt_ids[rows[0]] for rollout in rollouts],
                "completions": [[rollout.completions[r] for r in rows] for rollout in rollouts],  # (agents, K)
                "completion_ids": [[rollout.completion_ids[r] for r in rows] for rollout in rollouts],
                "rewards": processed[n],
                "raw": raw[n],
            }
        )
    return out


def comparison_records(
    current: dict, comparator: dict, pair_selection: str, pairs_per_sample: int | None
) -> list[dict[str, Any]]:
    """One prompt's pairs of the current policy against the comparator (`replay.comparison_pairs`) as CoMLRL's JSON
    records, with the sampled token ids (`token_ids`: `prompt`, `winner`, `loser`, one entry per agent)."""
    pairs = comparison_pairs(current["rewards"], comparator["rewards"], pair_selection, pairs_per_sample)
    sources = {"current": current, "comparator": comparator}
    everything = current["rewards"] + comparator["rewards"]
    mean = sum(everything) / len(everything) if everything else 0.0
    records = []
    for (win_source, win), (lose_source, lose) in pairs:
        winner, loser = sources[win_source], sources[lose_source]
        target = win if win_source == "current" else lose
        records.append(
            {
                "prompts": list(current["prompts"]),
                "winner_completions": [c[win] for c in winner["completions"]],
                "loser_completions": [c[lose] for c in loser["completions"]],
                "winner_reward": float(winner["rewards"][win]),
                "loser_reward": float(loser["rewards"][lose]),
                "candidate_reward_mean": float(mean),
                "raw_rewards": [float(winner["raw"][win]), float(loser["raw"][lose])],
                "target_raw_reward": float(current["raw"][target]),
                "comparator_raw_reward": float(comparator["raw"][target]),
                "token_ids": {
                    "prompt": current["prompt_ids"],
                    "winner": [ids[win] for ids in winner["completion_ids"]],
                    "loser": [ids[lose] for ids in loser["completion_ids"]],
                },
            }
        )
    return records


def record_tokens(record: dict) -> list[tuple[list[int], list[int], list[int]]]:
    """Each agent's `(prompt, winner, loser)` token ids of a record written by `comparison_records`."""
    ids = record["token_ids"]
    return list(zip(ids["prompt"], ids["winner"], ids["loser"], strict=True))


class IterativeRounds:
    """The round machinery, for a team trainer (`MultiAgentGRPOTrainer` subclass) whose config has the
    `IterativeRoundFields`: `round_pairs_for(epoch)` draws (or reloads) round `epoch`'s pairs the first time it is
    asked for them, writes the shard and returns the replay selection. A round is one of Trainer's epochs, so the
    optimizer, the schedule and `global_step` are Trainer's over every round. Iterative MADPO trains on the pairs
    (`MultiAgentIterativeDPOTrainer`); iterative MARLHF can train its reward model on them."""

    round_index: int = -1  # the round whose pairs are being served
    round_pairs: Sequence[dict] = ()  # the round's training pairs (a list once drawn)
    round_reloaded: bool = False  # whether the round's pairs came back from its shard (a resume inside it)
    round_records: Sequence[dict] = ()  # the round's own pairs (its shard), before the replay draw
    # Every candidate's raw reward in the round's draw, (current, comparator); empty for a reloaded round.
    round_candidate_rewards: tuple[list[float], list[float]] = ((), ())
    # With `comparator="model"`: the comparator models' weights, aligned with `comparator_parameters()` (CPU).
    comparator_model_weights: list[torch.Tensor] | None = None

    @property
    def epochs_per_round(self) -> int:
        """Trainer epochs in one round: 1 (iterative MADPO); iterative RLHF's rounds span `args.epochs_per_round`."""
        return 1

    @property
    def round_width(self) -> int:
        """K, the current policy's joint candidates per prompt in a round's draw: `num_generations` (iterative
        MADPO); a trainer whose online group differs from its pair draw (iterative RLHF) names its own."""
        return self.args.num_generations

    def round_pairs_for(self, epoch: int) -> list[dict[str, Any]]:
        """Round `epoch`'s training pairs (0-based), drawn at its first call."""
        if epoch != self.round_index:
            self._start_round(epoch)
        return self.round_pairs

    @property
    def replay_dir(self) -> str:
        """Where the rounds' shards are written: `args.replay_dir`, else `output_dir/preference_replay`."""
        return self.args.replay_dir or os.path.join(self.args.output_dir, "preference_replay")

    def _shards(self, upto: int) -> list[ReplayShard]:
        """The history of shards on disk, rounds `1..upto` (1-based), those with pairs."""
        shards = []
        for it in range(1, upto + 1):
            path = os.path.join(self.replay_dir, f"iteration_{it:04d}.json")
            if os.path.exists(path):
                count = len(load_records(ReplayShard(it, path, 0)))
                if count:
                    shards.append(ReplayShard(it, path, count))
        return shards

    def policy_parameters(self) -> list[torch.nn.Parameter]:
        """The agents' trainable parameters, agent by agent: what a past policy of the history comparator holds."""
        return [p for i in range(self.num_agents) for p in self.model.agent_parameters(i)]

    def comparator_parameters(self) -> list[torch.nn.Parameter]:
        """What the comparator's draw replaces: the agents' trainable parameters (`"history"`), or every parameter
        of every agent (`"model"`)."""
        if self.args.comparator != "model":
            return self.policy_parameters()
        return [p for agent in self.model.agents for p in agent.parameters()]

    def setup_rounds(self) -> None:
        """At construction: refuse what the rounds cannot run on, then `setup_comparator()`. A round draws over the
        whole training set and is one of Trainer's epochs, which a streamed dataset has neither of."""
        args = self.args
        if args.comparator != "current" and self.is_fsdp_enabled:
            raise NotImplementedError(
                f"`comparator={args.comparator!r}` swaps whole weights into the agents for the comparator's draw, "
                "which FSDP's sharded parameters cannot take yet: launch with DDP (`accelerate launch --multi_gpu`), "
                "or use `comparator='current'`."
            )
        if isinstance(self.train_dataset, IterableDataset):
            raise ValueError(
                f"{type(self).__name__} draws each round over the whole training set, one round per epoch, which a "
                "streamed `train_dataset` (an IterableDataset) has neither of: pass a `datasets.Dataset` (load it "
                "without `streaming=True`, or `Dataset.from_list(list(stream))` for a finite stream)."
            )
        self.setup_comparator()

    def setup_comparator(self) -> None:
        """With `comparator="model"`: load `comparator_model` once per agent and keep its weights on the CPU, in the
        order of `comparator_parameters()`; a model that is not of the agent's architecture raises, naming it."""
        args = self.args
        if args.comparator != "model":
            return
        if isinstance(self.model, LoraAgentTeam) or any(isinstance(a, PeftModel) for a in self.model.agents):
            raise NotImplementedError(
                "`comparator='model'` swaps a model's weights into the agents for the comparator's draw, which a team "
                "of LoRA adapters cannot hold: use full models, or `comparator='history'` (the adapters of earlier "
                "rounds)."
            )
        sources = args.comparator_model
        sources = [sources] if isinstance(sources, (str, os.PathLike)) else list(sources)
        sources = sources * self.num_agents if len(sources) == 1 else sources
        if len(sources) != self.num_agents:
            raise ValueError(
                f"`comparator_model` names {len(sources)} models for {self.num_agents} agents: give one for every "
                "agent, or one per agent."
            )
        weights, models = [], {}  # a source named for several agents (of one dtype) is loaded, and held, once
        for i, (agent, source) in enumerate(zip(self.model.agents, sources)):
            key = (str(source), agent.dtype)
            if key not in models:
                try:
                    model = AutoModelForCausalLM.from_pretrained(key[0], dtype=key[1])
                except (OSError, ValueError) as error:
                    raise ValueError(
                        f"`comparator_model` {source!r} is not a model id or a folder holding a saved causal LM "
                        f"({error})."
                    ) from error
                models[key] = dict(model.named_parameters())
            loaded = models[key]
            for name, p in agent.named_parameters():
                if name not in loaded or loaded[name].shape != p.shape:
                    raise ValueError(
                        f"`comparator_model` {source!r} is not of agent {i}'s architecture (its parameter {name!r} "
                        "is missing or of another shape): name another checkpoint of the agent's model."
                    )
                weights.append(loaded[name].detach().to("cpu"))
        self.comparator_model_weights = weights

    @contextmanager
    def one_writer(self) -> Iterator[bool]:
        """Inside the block only the process that saves writes (it yields whether this one does): Trainer's
        `should_save`, the main process, or each node's with `save_on_each_node` (node-local storage). Every process
        waits for the writes at its end; the rounds' files are the same on every process."""
        writes = self.args.should_save
        try:
            yield writes
        finally:
            self.accelerator.wait_for_everyone()

    def round_start_path(self, index: int) -> str:
        """Where the history comparator keeps round `index`'s start (0-based index, 1-based name, as the shards)."""
        return os.path.join(self.replay_dir, f"round_start_{index + 1:04d}.pt")

    def history_weights(self, index: int) -> list[torch.Tensor] | None:
        """With `comparator="history"`: write the agents' weights at round `index`'s start to `round_start_path`
        when a later round needs them (where a resumed run finds them too), remove those no later round needs, and
        return the comparator's: the start of round `index - comparator_history_k + 1` (the first round's start
        before that), or `None` when that is this round's own start, which the agents hold (no swap, no copy)."""
        k = self.args.comparator_history_k
        oldest = max(index - k + 1, 0)
        with self.one_writer() as writes:  # every process holds the same agents
            if writes:
                os.makedirs(self.replay_dir, exist_ok=True)
                if k > 1:  # k=1: every round compares with its own start, so no later round reads this one's
                    start = [p.detach().to("cpu", copy=True) for p in self.policy_parameters()]
                    torch.save(start, self.round_start_path(index))
                for past in range(oldest):
                    if os.path.exists(self.round_start_path(past)):
                        os.remove(self.round_start_path(past))
        if oldest == index:
            return None
        path = self.round_start_path(oldest)  # written by an earlier round, of this run or of the one resumed
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"`comparator='history'` needs the agents as they were at the start of round {oldest + 1}, which is "
                f"not in {path}: resume from the run's latest checkpoint (older round starts are not kept), with the "
                "same `replay_dir`."
            )
        return torch.load(path, weights_only=True)

    @contextmanager
    def comparator_weights(self, weights: Sequence[torch.Tensor]) -> Iterator[None]:
        """Inside the block the agents hold `weights` (`history_weights`, `comparator_model_weights`) in their
        `comparator_parameters()`; their own come back after it (kept on the CPU meanwhile: a second copy of every
        weight on the device could exhaust its memory)."""
        params = self.comparator_parameters()
        own = [p.detach().to("cpu", copy=True) for p in params]
        with torch.no_grad():
            for p, w in zip(params, weights, strict=True):
                p.copy_(w)
        self.weights_changed()  # vLLM engines generate with what the agents hold
        try:
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(params, own, strict=True):
                    p.copy_(w)
            self.weights_changed()

    @torch.no_grad()
    def draw_round_pairs(self, comparator_weights: Sequence[torch.Tensor] | None = None) -> list[dict[str, Any]]:
        """The current policy's pairs against the comparator over the whole training set (one record per pair),
        with what the sampling records kept out of the training logs; the comparator samples with
        `comparator_weights` in the agents (`history_weights`, `comparator_model_weights`), or with their own
        (`None`). Each batch of prompts is drawn by the policy, then by the comparator (CoMLRL's order); with
        `comparator_weights` every batch is drawn by the policy first and then every batch by the comparator, so
        that the weights are swapped in and back once a round, not once a batch (each swap copies every weight, and
        syncs vLLM's engines)."""
        args = self.args
        width = self.round_width
        comparator_width = args.comparator_num_generations or width
        rows = [dict(row) for row in self.train_dataset]
        accelerator = self.accelerator
        per_call = prompts_per_call(args.generation_batch_size, width, accelerator.num_processes)
        batches = list(process_share(accelerator, rows, per_call))  # this process's share of the rows

        def candidates(items: list[dict], count: int, real: int) -> list[dict[str, Any]]:
            played = self.sample(items, count)
            return candidate_sets(played, count, self.reward_weights, accelerator.process_index)[:real]

        with self.metrics_aside():
            if comparator_weights is None:
                drawn = [(candidates(b, width, real), candidates(b, comparator_width, real)) for b, real in batches]
            else:
                mine = [candidates(b, width, real) for b, real in batches]
                with self.comparator_weights(comparator_weights):
                    drawn = list(zip(mine, [candidates(b, comparator_width, real) for b, real in batches]))
        records, raw = [], ([], [])
        for current, theirs in drawn:
            for mine, other in zip(current, theirs):
                records += comparison_records(mine, other, args.pair_selection, args.preference_pairs_per_sample)
                raw[0].extend(mine["raw"])
                raw[1].extend(other["raw"])
        self.round_candidate_rewards = tuple(gather_in_order(accelerator, part) for part in raw)
        return gather_in_order(accelerator, records)

    def _start_round(self, index: int) -> None:
        """Draw (or, resuming, reload) round `index`'s pairs, write its shard and pick the training pairs."""
        args = self.args
        path = os.path.join(self.replay_dir, f"iteration_{index + 1:04d}.json")
        # A run resumed inside this round (its checkpoint is past the round's start) reloads the round's shard;
        # a fresh run, or one resumed at the round's start (a shard written after that checkpoint, by the run that
        # stopped, was not trained on), draws it anew over older shards.
        resumed_inside = self.round_index < 0 and round(self.state.epoch or 0, 6) > index * self.epochs_per_round
        self.round_reloaded = resumed_inside and os.path.exists(path)
        if self.round_reloaded:  # resumed inside this round: its pairs are on disk
            current = load_records(ReplayShard(index + 1, path, 0))
            self.round_candidate_rewards = ([], [])
        else:
            weights = None  # "current": the agents' own
            if args.comparator == "history":
                weights = self.history_weights(index)
            elif args.comparator == "model":
                weights = self.comparator_model_weights
            current = self.draw_round_pairs(weights)
            with self.one_writer() as writes:
                if writes:
                    write_shard(self.replay_dir, index + 1, current)
        train_pairs = replay_selection(
            args.replay_mode,
            current,
            self._shards(index + 1),
            args.replay_k,
            args.replay_lambda,
            args.replay_sample_size,
        )
        if self.accelerator.num_processes > 1:  # the replay draws on Python's random, whose state each process has
            train_pairs = broadcast_object_list([train_pairs])[0]
        if not train_pairs:
            raise ValueError(
                f"Round {index + 1} has no preference pair: every comparison tied. Raise `num_generations`, sample "
                "more diversely (`temperature`), or use a reward that separates the candidates."
            )
        random.Random(args.seed + index).shuffle(train_pairs)
        self.round_index, self.round_pairs, self.round_records = index, train_pairs, current
        metrics = self._metrics["train"]
        metrics["round/index"].append(float(index + 1))
        metrics["round/pairs"].append(float(len(current)))
        metrics["round/train_pairs"].append(float(len(train_pairs)))


class RoundSaves(TrainerCallback):
    """Save the team (and, for RLHF, its reward model) under `folder` before training (`initial/`) and at the end of
    every round (`iteration_XXXX/`, the round 0-based, as CoMLRL's `policy_checkpoint_dir`): models only, no
    optimizer. `trainer.add_callback(RoundSaves(trainer, folder))` on an `IterativeRounds` trainer (iterative MADPO or
    iterative RLHF)."""

    def __init__(self, trainer: IterativeRounds, folder: str):
        self.trainer, self.folder = trainer, folder

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:  # a resumed run began from a checkpoint, not from the team `initial/` holds
            self.trainer.save_model(os.path.join(self.folder, "initial"))

    def on_epoch_end(self, args, state, control, **kwargs):
        # The epochs done: a pair round that drew fewer pairs than the most ends early, at a fraction of its epoch.
        epochs = math.ceil(round(state.epoch or 0, 6))
        per_round = self.trainer.epochs_per_round
        if epochs % per_round == 0:
            self.trainer.save_model(os.path.join(self.folder, f"iteration_{epochs // per_round - 1:04d}"))


class RoundPairBatches:
    """Trainer's training dataloader when a round trains on its pairs (`pair_batch_size`): Trainer calls
    `set_epoch(round)` before iterating, and the iteration is `trainer.pair_batches(round)`. Its length is the most
    micro-batches a round can have, which Trainer sizes the run on."""

    def __init__(self, trainer: MultiAgentIterativeDPOTrainer, length: int):
        self.trainer, self.length, self.epoch = trainer, length, 0

    def __len__(self) -> int:
        return self.length

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.trainer.pair_batches(self.epoch)


class MultiAgentIterativeDPOTrainer(IterativeRounds, MultiAgentDPOTrainer):
    """Iterative MADPO: rounds of pairs of the current policy against a comparator, with replay, trained by one
    `Trainer.train` (see the module docstring). Takes every `MultiAgentDPOTrainer` argument; `args` is a
    `MultiAgentIterativeDPOConfig`.

    What differs from `MultiAgentDPOTrainer`: `_generate_and_score_completions` (training) serves the current round's
    pairs, drawing the round first when a new epoch began. With `pair_batch_size`, the training dataloader is the
    round's pair micro-batches instead (`RoundPairBatches`, `pair_batches`), which `_prepare_inputs` passes through.
    Logs `round/index`, `round/pairs`, `round/train_pairs`; with `pair_batch_size`, `pairs/count` and
    `pairs/chosen_reward` per micro-batch.
    """

    _tag_names = ["trl", "dpo", "multiagent-trl", "madpo", "iterative"]
    _name = "Iterative MADPO"

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if config is not None and not isinstance(config, MultiAgentIterativeDPOConfig):
            raise TypeError(
                f"`args` is a {type(config).__name__}; MultiAgentIterativeDPOTrainer needs a "
                "MultiAgentIterativeDPOConfig (every MultiAgentDPOConfig field, plus the round fields)."
            )
        if config is None:
            kwargs["args"] = MultiAgentIterativeDPOConfig(output_dir="madpo-iterative-output")
        super().__init__(*args, **kwargs)
        self._round_cursor = (-1, 0)  # (round, pairs served in it)
        self.setup_rounds()

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        if resume_from_checkpoint not in (None, False) and self.args.pair_batch_size is not None:
            raise NotImplementedError(
                "Resuming is not supported with `pair_batch_size`: the rounds' lengths follow their pairs, which "
                "Trainer's step counting cannot place a checkpoint in. Train without `pair_batch_size` to resume."
            )
        self.round_index, self._round_cursor = -1, (-1, 0)  # a new run draws its first round anew (or reloads it)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def record_token_ids(self, record: dict) -> list[tuple[list[int], list[int], list[int]]]:
        """Each agent's `(prompt, winner, loser)` token ids of a pair record: the sampled ones (`token_ids`), or, for
        a record without them (a CoMLRL shard), its text tokenized as CoMLRL does (the prompt with special tokens,
        the completions without)."""
        if record.get("token_ids") is not None:
            return record_tokens(record)
        tokens = []
        for i in range(self.num_agents):
            tokenizer = self._agent_views[i]["processing_class"]
            tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
            prompt, winner, loser = (
                str((record.get(key) or [""] * self.num_agents)[i])
                for key in ("prompts", "winner_completions", "loser_completions")
            )
            tokens.append(
                (
                    tokenizer.encode(prompt, add_special_tokens=True),
                    tokenizer.encode(winner, add_special_tokens=False),
                    tokenizer.encode(loser, add_special_tokens=False),
                )
            )
        return tokens

    def pair_batch(self, records: Sequence[dict]) -> dict[str, Any]:
        """The training batch of pair `records` (every pair weighted 1); logs `pairs/count` and
        `pairs/chosen_reward` (the winners' mean reward)."""
        weight = torch.ones(len(records), device=self.accelerator.device)
        metrics = self._metrics["train"]
        metrics["pairs/count"].append(float(len(records)))
        metrics["pairs/chosen_reward"].append(sum(float(r.get("winner_reward", 0.0)) for r in records) / len(records))
        return self._preference_rows([self.record_token_ids(r) for r in records], weight)

    def most_round_pairs(self) -> int:
        """The most training pairs a round can draw: `replay_sample_size`, else every prompt's most comparisons."""
        args = self.args
        if args.replay_sample_size is not None:
            return args.replay_sample_size
        width = self.round_width
        per_prompt = min(width, args.comparator_num_generations or width)
        if args.preference_pairs_per_sample is not None:
            per_prompt = min(per_prompt, args.preference_pairs_per_sample)
        return len(self.train_dataset) * per_prompt

    def round_micro_batches(self, pairs: int) -> int:
        """A process's micro-batches of a round of `pairs` training pairs (with `pair_batch_size`): its share of
        `pair_passes` passes, completed to whole optimizer steps."""
        args = self.args
        count = -(-args.pair_passes * -(-pairs // args.pair_batch_size) // self.accelerator.num_processes)
        return -(-count // args.gradient_accumulation_steps) * args.gradient_accumulation_steps

    def get_train_dataloader(self):
        if self.args.pair_batch_size is None:
            loader = super().get_train_dataloader()
            self.epoch_micro_batches = len(loader)  # Trainer's `steps_in_epoch`, which `state.epoch` counts in
            return loader
        check_fills_a_batch(len(self.train_dataset), 1)  # a round draws over any rows; an empty set draws no pair
        return RoundPairBatches(self, self.round_micro_batches(self.most_round_pairs()))

    def pairs_served_before(self, index: int, slots: int) -> int:
        """At round `index`'s first generation batch of this run, the round's pairs already served: none, or, for a
        round reloaded by a run resumed inside it, those of the generation batches before its checkpoint (`slots` per
        process each), so that it goes on with the pairs the stopped run had not reached. Trainer's `state.epoch`
        counts the round's micro-batches done; a generation batch serves `pair_steps * num_iterations` of them.
        With `ignore_data_skip` Trainer replays the epoch from its start, and so does the round."""
        if not self.round_reloaded or self.args.ignore_data_skip:
            return 0
        done = round(round((self.state.epoch or 0) - index, 6) * self.epoch_micro_batches)
        batches = -(-done // (self.args.pair_steps * self.num_iterations))
        return batches * self.accelerator.num_processes * slots

    def pair_batches(self, epoch: int) -> Iterator[dict[str, Any]]:
        """This process's micro-batches of round `epoch` (with `pair_batch_size`): the round's training pairs (drawn
        on the first batch asked for), `pair_passes` passes, each in a new order (the first is the round's), cut into
        batches of `pair_batch_size` pairs, dealt to the processes in turn (cycled to `round_micro_batches`)."""
        self.model.train()  # the round's draw happens before Trainer's first training step of the round
        pairs = list(self.round_pairs_for(epoch))
        args, order = self.args, random.Random(self.args.seed + epoch)
        batches = []
        for step in range(args.pair_passes):
            if step:
                order.shuffle(pairs)
            batches += [pairs[s : s + args.pair_batch_size] for s in range(0, len(pairs), args.pair_batch_size)]
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        for k in range(self.round_micro_batches(len(pairs))):
            yield self.pair_batch(batches[(rank + k * world) % len(batches)])

    def _prepare_inputs(self, generation_batch):
        if self.args.pair_batch_size is not None and self.model.training:
            return generation_batch  # a round's micro-batch, already the training rows (`pair_batches`)
        return super()._prepare_inputs(generation_batch)

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        if self._first_train_row is None:
            self._first_train_row = dict(inputs[0])
        index = int(self.state.epoch or 0)  # a round is an epoch: Trainer counts them, resumes included
        round_pairs = self.round_pairs_for(index)
        # As many rows as MultiAgentDPOTrainer's batch of these prompts: whole optimizer steps.
        steps = self.args.pair_steps
        nodes = len(inputs) // self.num_generations
        slots = -(-nodes * self.args.pairs_per_prompt // steps) * steps
        if self._round_cursor[0] != index:
            self._round_cursor = (index, self.pairs_served_before(index, slots))
        served = self._round_cursor[1]
        # The round's pairs in order, cycled, each process taking the next `slots` after those before it.
        first = served + self.accelerator.process_index * slots
        batch = [round_pairs[(first + k) % len(round_pairs)] for k in range(slots)]
        self._round_cursor = (index, served + self.accelerator.num_processes * slots)
        weight = torch.ones(slots, device=self.accelerator.device)
        self._metrics["train"]["pairs/trained"].append(float(slots))
        return self._preference_rows([self.record_token_ids(r) for r in batch], weight)


__all__ = [
    "IterativeRoundFields",
    "IterativeRounds",
    "MultiAgentIterativeDPOConfig",
    "MultiAgentIterativeDPOTrainer",
    "RoundPairBatches",
    "RoundSaves",
    "candidate_sets",
    "comparison_records",
    "record_tokens",
]
