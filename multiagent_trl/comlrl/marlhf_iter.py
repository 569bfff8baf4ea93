"""CoMLRL 1.4.3's `MARLHFIterConfig`/`MARLHFIterTrainer` translated onto the native iterative RLHF
(`preference.iterative_rlhf.RewardModelRounds` on `MARLHFTrainer`): an iteration is a native round, all of them in one
`Trainer.train`; docs/comlrl-users.md ("MARLHFIter") maps every field and lists the differences from CoMLRL."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from ..preference.iterative_rlhf import PAIR_SCORINGS, RewardModelRounds, record_pair
from .iterative_fields import ROUND_FIELDS, IterativePreferenceFields, iteration_logs, iterative_config, save_rounds
from .marlhf import ACTOR_CRITIC_ALGORITHMS, RL_ALGORITHMS, MARLHFConfig, MARLHFTrainer

SCORING_ALIASES = {"oracle": "task", "environment": "task", "env": "task", "model": "reward_model"}
SCORING_ALIASES["learned"] = "reward_model"


@dataclass
class MARLHFIterConfig(IterativePreferenceFields, MARLHFConfig):
    """`MARLHFConfig` with CoMLRL 1.4.3's iterative fields (`MARLHFIterConfig`), defaults and checks: `num_iterations`
    iterations of `num_train_epochs` online epochs, `preference_scoring_reward`, MADPOIter's replay and comparator
    fields. docs/comlrl-users.md ("MARLHFIter") maps each onto the native round fields (`native_config()`)."""

    output_dir: str | None = field(default="marlhf_iter_output", metadata={"help": "Where outputs go."})
    num_train_epochs: float = field(default=2, metadata={"help": "Online epochs per iteration."})
    preference_num_candidates: int = field(default=20, metadata={"help": "Joint candidates per item (K, >= 2)."})
    preference_pairs_per_sample: int | None = field(default=4, metadata={"help": "At most this many pairs per item."})
    pair_selection: str = field(default="comparator_reward", metadata={"help": "Or 'reward_gap', 'random', 'all'."})
    reward_num_train_epochs: int = field(default=2, metadata={"help": "Reward-model passes per iteration."})
    preference_scoring_reward: str = field(default="task", metadata={"help": "Ranks pairs: 'task' or 'reward_model'."})

    def __post_init__(self):
        algorithm = str(self.rl_algorithm or "magrpo").strip().lower()
        if algorithm in ACTOR_CRITIC_ALGORITHMS:  # the rounds are the MAGRPO family's epochs
            raise NotImplementedError(
                f"`rl_algorithm={algorithm!r}`: MARLHFIter's online phase runs the MAGRPO family only (CoMLRL's "
                f"actor-critic back-ends are not ported to it); use `rl_algorithm` in {list(RL_ALGORITHMS)}."
            )
        scoring = str(self.preference_scoring_reward or "task").strip().lower()
        self.preference_scoring_reward = SCORING_ALIASES.get(scoring, scoring)
        if self.preference_scoring_reward not in PAIR_SCORINGS:
            raise ValueError(
                f"`preference_scoring_reward` must be 'task' or 'reward_model' (or CoMLRL's aliases); got {scoring!r}."
            )
        if int(self.num_train_epochs) != self.num_train_epochs:
            raise ValueError(
                f"`num_train_epochs` must be a whole number (epochs per iteration), got {self.num_train_epochs}"
            )
        if self.max_steps > 0:
            raise ValueError(f"`max_steps={self.max_steps}` would cut the run across iterations: leave it at -1.")
        super().__post_init__()  # CoMLRL's iterative checks, then MARLHFConfig's

    def native_config(self) -> MARLHFIterConfig:
        """The config the trainer runs: a copy with CoMLRL's iterative fields under the native round fields' names
        (`ROUND_FIELDS`, `pair_scoring`), `num_iterations` iterations of `num_train_epochs` epochs as rounds of
        `epochs_per_round` epochs, the reward model reset every round, and TRL's `num_iterations` (1)."""
        config = copy.copy(self)
        for name, native in ROUND_FIELDS.items():
            setattr(config, native, getattr(self, name))
        config.pair_scoring = self.preference_scoring_reward
        config.epochs_per_round = int(self.num_train_epochs)
        config.num_train_epochs = self.num_iterations * config.epochs_per_round
        config.reward_model_reset, config.num_iterations = True, 1
        return config


class MARLHFIterTrainer(RewardModelRounds, MARLHFTrainer):
    """Iterative MARLHF with CoMLRL 1.4.3's `MARLHFIterTrainer` arguments (those of `MARLHFTrainer`): its rounds are
    the native ones (`RewardModelRounds`) on `args.native_config()`, trained by one `Trainer.train`; the user's config
    is `trainer.comlrl_args`. After `train()`: `reward_model` (the last round's), `preference_pairs` (the last training
    pairs), `reward_model_histories` (one per round). Logs CoMLRL's `iter/...` beside the native `round/...`."""

    default_config_cls = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def __init__(self, *args, **kwargs):
        given = iterative_config(type(self), args, kwargs) or MARLHFIterConfig()
        args = args[:14] + args[15:]  # the config goes by keyword
        super().__init__(*args, **{**kwargs, "args": given.native_config()})
        self.comlrl_args, self.total_train_pairs = given, 0
        self.setup_reward_rounds()
        save_rounds(self)

    __init__.__signature__ = MARLHFTrainer.__init__.__signature__

    def train(self, resume_from_checkpoint: str | bool | None = None, checkpoint_dir: str | None = None, **kwargs):
        """Every iteration, by one `Trainer.train` (`MARLHFTrainer.train`); CoMLRL's checkpoint arguments raise."""
        limit, interval = kwargs.pop("checkpoint_total_limit", None), kwargs.pop("checkpoint_interval", 1)
        if (resume_from_checkpoint, checkpoint_dir, limit) != (None, None, None) or interval != 1:
            self.load_checkpoint(checkpoint_dir or resume_from_checkpoint)
        return super().train(**kwargs)

    def load_checkpoint(self, checkpoint: str):
        """Not ported: CoMLRL's MARLHFIter checkpoints hold the iteration, the shards and the reward model."""
        raise NotImplementedError(
            "MARLHFIter does not resume from checkpoints (CoMLRL's iteration checkpoints are not ported): set "
            "`policy_checkpoint_dir` to save the agents and the reward model after every iteration."
        )

    def start_reward_round(self, index: int) -> None:
        """The native round, then CoMLRL's iteration log entries (in the round's first training log)."""
        super().start_reward_round(index)
        self.total_train_pairs += len(self.round_pairs)
        logs = iteration_logs(
            index,
            len(self.round_records),
            self.round_candidate_rewards,
            self.round_pairs,
            self.total_train_pairs,
            self.args.log_reward_distribution,
        )
        self.add_metrics({key: [value] for key, value in logs.items()})


__all__ = ["MARLHFIterConfig", "MARLHFIterTrainer", "record_pair"]
