"""Iterative multi-agent RLHF through one `Trainer.train`: `MultiAgentIterativeRLHFConfig` /
`MultiAgentIterativeRLHFTrainer`.

A run is rounds of `epochs_per_round` of TRL's epochs (`num_train_epochs` = rounds x `epochs_per_round`). At the start
of each round (`IterativeRounds`): the current agents play every training prompt as the policy (K =
`preference_num_candidates` joint candidates) and as the comparator (K' = `comparator_num_generations`), ranked by the
task reward (or, with `pair_scoring="reward_model"`, from the second round on, by the previous round's reward model);
the round's pairs go to `replay_dir` and `replay_mode` picks the training pairs. The joint reward model
(`RewardModelStage`) is then trained on them with the Bradley-Terry loss (continuing from the last round's weights, or
from its initial ones with `reward_model_reset=True`), and the round's online epochs train the team on its raw scores
(`num_generations` completions per prompt, as `MultiAgentRLHFTrainer`). Evaluation keeps the task reward.

Everything else is Trainer's over the whole run: one optimizer, one learning-rate schedule, one `global_step`,
callbacks, logging, checkpoints (each holding the reward model). Resuming inside a round reloads its shard and the
reward model saved in the checkpoint; the reward model is not trained again for that round. Single process only, as
iterative MADPO. `RewardModelRounds` holds the round logic for any RLHF trainer on the team core (CoMLRL's
`MARLHFIterTrainer` is it on `MARLHFTrainer`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch

from ..rewards.joint import bind_joint_scorer
from .iterative import IterativeRoundFields, IterativeRounds, RoundSaves
from .reward_training import JointPreferencePair
from .rlhf import MultiAgentRLHFConfig, MultiAgentRLHFTrainer

PAIR_SCORINGS = ("task", "reward_model")


def check_reward_round_fields(config) -> None:
    """`epochs_per_round` and `pair_scoring` of a config with `MultiAgentIterativeRLHFConfig`'s round fields."""
    if isinstance(config.epochs_per_round, bool) or int(config.epochs_per_round) != config.epochs_per_round:
        raise ValueError(f"`epochs_per_round` must be a whole number of epochs, got {config.epochs_per_round!r}.")
    if config.epochs_per_round < 1:
        raise ValueError(f"`epochs_per_round` must be at least 1, got {config.epochs_per_round}.")
    config.epochs_per_round = int(config.epochs_per_round)
    rounds = config.num_train_epochs / config.epochs_per_round
    if config.max_steps <= 0 and rounds != int(rounds):  # a part of a round would draw a whole round's pairs
        raise ValueError(
            f"`num_train_epochs={config.num_train_epochs}` is not a whole number of rounds of `epochs_per_round="
            f"{config.epochs_per_round}` epochs: set `num_train_epochs` to rounds x `epochs_per_round`."
        )
    scoring = str(config.pair_scoring).strip().lower()
    if scoring not in PAIR_SCORINGS:
        raise ValueError(f"`pair_scoring` must be one of {list(PAIR_SCORINGS)}, got {config.pair_scoring!r}.")
    config.pair_scoring = scoring


@dataclass
class MultiAgentIterativeRLHFConfig(IterativeRoundFields, MultiAgentRLHFConfig):
    r"""
    Configuration for `MultiAgentIterativeRLHFTrainer`: every `MultiAgentRLHFConfig` field, the round fields of
    `MultiAgentIterativeDPOConfig` (`comparator`, `comparator_history_k`, `comparator_num_generations`,
    `replay_mode`, `replay_k`, `replay_lambda`, `replay_sample_size`, `replay_dir`), and:

    Parameters:
        reward_model_reset (`bool`, *optional*, defaults to `False`):
            Train each round's reward model from the weights it had at construction (`True`) rather than from the
            previous round's.
        epochs_per_round (`int`, *optional*, defaults to `1`):
            Online epochs (passes over the training prompts) of one round: round `r` is epochs
            `r * epochs_per_round ...`. `num_train_epochs` counts epochs, so rounds x `epochs_per_round`.
        pair_scoring (`str`, *optional*, defaults to `"task"`):
            What ranks a round's candidates into pairs: `"task"` (the task reward, with `reward_processor`) or
            `"reward_model"` (from the second round on, the previous round's reward model, its raw score; the first
            round uses the task reward).

    `preference_num_candidates` is K of a round's draw (the comparator's K' is `comparator_num_generations`, else K).

    Two defaults differ from the configs this one builds on, because the tutorial task learned with them and not
    without (docs/benchmarks.md, "Twice the budget"): `beta=0.04` (`GRPOConfig`'s is 0.0), a KL to each agent's start
    policy, without which the team collapsed (equal-length outputs) within two rounds; and
    `replay_mode="all_history"` (iterative DPO's is `"current"`), the reward model trained on every round's pairs so
    far, without which the score swung between 39 and 93 late in the run. `replay_sample_size` bounds the pairs a
    round replays.
    """

    beta: float = field(default=0.04, metadata={"help": "KL coefficient to each agent's start policy (RLHF: 0.04)."})
    replay_mode: str = field(
        default="all_history", metadata={"help": "Reward-model pairs: 'all_history' (RLHF's default), 'current', ..."}
    )
    reward_model_reset: bool = field(default=False, metadata={"help": "Each round's reward model from its start."})
    epochs_per_round: int = field(default=1, metadata={"help": "Online epochs per round (num_train_epochs: total)."})
    pair_scoring: str = field(
        default="task", metadata={"help": "Ranks a round's candidates: 'task' or 'reward_model' (the previous one)."}
    )

    def __post_init__(self):
        self.check_round_fields()
        check_reward_round_fields(self)
        super().__post_init__()


def record_pair(record: dict) -> JointPreferencePair:
    """A round's pair record (`iterative.comparison_records`, or a CoMLRL shard's) as a reward-model training pair.

    >>> record_pair({"prompts": ["Q", "R"], "winner_completions": ["a", "b"], "loser_completions": ["c", ""],
    ...              "winner_reward": 2.0, "loser_reward": 1.0}).chosen
    ('a', 'b')
    """
    return JointPreferencePair(
        prompts=tuple(record["prompts"]),
        chosen=tuple(record["winner_completions"]),
        rejected=tuple(record["loser_completions"]),
        chosen_reward=float(record.get("winner_reward", float("nan"))),
        rejected_reward=float(record.get("loser_reward", float("nan"))),
    )


class RewardModelRounds(IterativeRounds):
    """The rounds of iterative RLHF, mixed into an RLHF trainer on the team core (`RewardModelStage` on a
    `MultiAgentGRPOTrainer` subclass, after this class in the bases) whose config has `MultiAgentIterativeRLHFConfig`'s
    round fields. No reward-model stage before training (`train_reward_stage`); the first training batch of a round
    draws its pairs (`start_reward_round`), trains the reward model on them, and the round's epochs train on its
    scores. The trainer calls `setup_reward_rounds()` at the end of its constructor."""

    def setup_reward_rounds(self) -> None:
        """Keep the reward model's start for `reward_model_reset`, and set the rounds up (`setup_rounds`: the
        dataset's check, the comparator model)."""
        # The reward model's start: its trainable parameters (frozen ones never change).
        self.initial_reward_state = {
            name: p.detach().to("cpu", copy=True)
            for name, p in self.reward_model.named_parameters()
            if p.requires_grad
        }
        self.reward_model_histories: list[list[dict[str, float]]] = []
        self.setup_rounds()

    @property
    def round_width(self) -> int:
        """A round's pairs are drawn from `preference_num_candidates` joint candidates per prompt."""
        return self.args.preference_num_candidates

    @property
    def epochs_per_round(self) -> int:
        """A round spans `args.epochs_per_round` online epochs."""
        return self.args.epochs_per_round

    @property
    def current_round(self) -> int:
        """The round (0-based) of Trainer's current epoch: `epochs_per_round` epochs each."""
        return int(self.state.epoch or 0) // self.epochs_per_round

    def train_reward_stage(self) -> None:
        # Departs from MultiAgentRLHFTrainer: no stage before training; each round trains the reward model.
        return None

    def reset_reward_model(self) -> None:
        """Put the reward model's trainable parameters back to their values at construction."""
        with torch.no_grad():
            for name, param in self.reward_model.named_parameters():
                if name in self.initial_reward_state:
                    param.copy_(self.initial_reward_state[name])

    @contextmanager
    def ranked_by_reward_model(self) -> Iterator[None]:
        """Inside the block, sampled candidates are scored by the reward model as it is now (raw: no weights, no
        `reward_processor`) instead of the task reward."""
        with self.scored_by(bind_joint_scorer(self.reward_model, self.num_agents)):
            yield

    def start_reward_round(self, index: int) -> None:
        """Round `index` (0-based): its pairs (`round_pairs_for`; ranked by the previous round's reward model from
        the second round on with `pair_scoring="reward_model"`), then the reward model trained on them, unless the
        round was resumed (its reward model came back with the checkpoint)."""
        by_reward_model = self.args.pair_scoring == "reward_model" and index > 0
        with self.ranked_by_reward_model() if by_reward_model else nullcontext():
            records = self.round_pairs_for(index)
        if self.round_reloaded:
            return
        if self.args.reward_model_reset:
            self.reset_reward_model()
        self.reward_model_histories.append(self.fit_reward_model([record_pair(record) for record in records]))

    def _generate_and_score_completions(self, inputs: list[dict]):
        if self.model.training and self.current_round != self.round_index:
            self.start_reward_round(self.current_round)  # a round starts with a new epoch: Trainer counts them
        return super()._generate_and_score_completions(inputs)


class MultiAgentIterativeRLHFTrainer(RewardModelRounds, MultiAgentRLHFTrainer):
    """Iterative multi-agent RLHF: rounds of pairs, reward model and online training, by one `Trainer.train` (see the
    module docstring). Takes `MultiAgentRLHFTrainer`'s arguments but `preference_pairs` (the rounds draw them);
    `args` is a `MultiAgentIterativeRLHFConfig`.

    What differs from `MultiAgentRLHFTrainer` (`RewardModelRounds`): no reward-model stage before training; the first
    training batch of each round draws its pairs and trains the reward model. After `train()`:
    `reward_model_histories` (one per round trained), `preference_pairs` (the last round's). Logs `round/index`,
    `round/pairs`, `round/train_pairs` and the reward model's `reward_model/...` at each round.
    """

    config_class = MultiAgentIterativeRLHFConfig
    _tag_names = ["trl", "grpo", "multiagent-trl", "rlhf", "iterative"]
    _name = "Iterative multi-agent RLHF"

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)  # its type: `RLHFTrainerBase` checks it
        if kwargs.get("preference_pairs") is not None:
            raise ValueError(
                "`preference_pairs` is not taken by MultiAgentIterativeRLHFTrainer: each round draws its pairs from "
                "the team. Use MultiAgentRLHFTrainer to train the reward model on given pairs."
            )
        if config is None:
            kwargs["args"] = MultiAgentIterativeRLHFConfig(output_dir="rlhf-iterative-output")
        super().__init__(*args, **kwargs)
        self.setup_reward_rounds()


__all__ = [
    "MultiAgentIterativeRLHFConfig",
    "MultiAgentIterativeRLHFTrainer",
    "RewardModelRounds",
    "RoundSaves",
    "check_reward_round_fields",
    "record_pair",
]
