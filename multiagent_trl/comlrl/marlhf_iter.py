"""CoMLRL compatibility for iterative MARLHF: `MARLHFIterConfig`/`MARLHFIterTrainer` with CoMLRL 1.4.3's names,
defaults and checks, translated onto the native iterative RLHF (`preference.iterative_rlhf.RewardModelRounds` on
`MARLHFTrainer`): CoMLRL's iterations are the native rounds, trained by one `Trainer.train`.

```diff
-from comlrl.trainers.preference import MARLHFIterConfig, MARLHFIterTrainer
+from multiagent_trl import MARLHFIterConfig, MARLHFIterTrainer
```

The field mapping, the steps of an iteration, the logs and every deliberate difference from CoMLRL, with its reason,
are in docs/comlrl-users.md ("MARLHFIter").
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field

from transformers import TrainerCallback

from ..preference.iterative_rlhf import RewardModelRounds, record_pair
from ..preference.replay import COMPARISON_PAIR_SELECTIONS
from ..rewards.joint import reward_range
from .iterative import IterativePreferenceFields, distribution_metrics
from .marlhf import ACTOR_CRITIC_ALGORITHMS, RL_ALGORITHMS, MARLHFConfig, MARLHFTrainer

SCORING_REWARDS = ("task", "reward_model")
SCORING_REWARD_ALIASES = {"oracle": "task", "environment": "task", "env": "task", "model": "reward_model"}
SCORING_REWARD_ALIASES["learned"] = "reward_model"
# CoMLRL's iterative field -> the native round field it becomes (`MARLHFIterConfig.native_config`).
ROUND_FIELDS = {
    "preference_replay_mode": "replay_mode",
    "preference_replay_k": "replay_k",
    "preference_replay_lambda": "replay_lambda",
    "preference_replay_sample_size": "replay_sample_size",
    "preference_replay_dir": "replay_dir",
    "comparator_num_candidates": "comparator_num_generations",
    "preference_scoring_reward": "pair_scoring",
}


@dataclass
class MARLHFIterConfig(IterativePreferenceFields, MARLHFConfig):
    r"""
    `MARLHFConfig` with CoMLRL 1.4.3's iterative fields (`MARLHFIterConfig`), defaults and checks: `num_iterations`
    (6) iterations of `num_train_epochs` (2) online epochs, `preference_num_candidates` (20),
    `preference_pairs_per_sample` (4), `pair_selection` (`"comparator_reward"`), `reward_num_train_epochs` (2),
    `preference_scoring_reward` (`"task"`, or `"reward_model"`; CoMLRL's aliases accepted) and `MADPOIterConfig`'s
    replay and comparator fields. docs/comlrl-users.md ("MARLHFIter") maps each onto the native round fields.
    """

    output_dir: str | None = field(default="marlhf_iter_output", metadata={"help": "Where outputs go."})
    num_train_epochs: float = field(default=2, metadata={"help": "Online epochs per iteration."})
    preference_num_candidates: int = field(default=20, metadata={"help": "Joint candidates per item (K, >= 2)."})
    preference_pairs_per_sample: int | None = field(default=4, metadata={"help": "At most this many pairs per item."})
    pair_selection: str = field(
        default="comparator_reward", metadata={"help": "'comparator_reward', 'reward_gap', 'random' or 'all'."}
    )
    reward_num_train_epochs: int = field(default=2, metadata={"help": "Reward-model passes per iteration."})
    preference_scoring_reward: str = field(
        default="task", metadata={"help": "Ranks the candidates: 'task' or 'reward_model' (the previous one)."}
    )

    def __post_init__(self):
        algorithm = str(self.rl_algorithm or "magrpo").strip().lower()
        if algorithm in ACTOR_CRITIC_ALGORITHMS:  # the rounds are the MAGRPO family's epochs
            raise NotImplementedError(
                f"`rl_algorithm={algorithm!r}`: MARLHFIter's online phase runs the MAGRPO family only (CoMLRL's "
                f"actor-critic back-ends are not ported to it); use `rl_algorithm` in {list(RL_ALGORITHMS)}."
            )
        selection = str(self.pair_selection).strip().lower()
        if selection not in COMPARISON_PAIR_SELECTIONS:
            raise ValueError(
                f"`pair_selection` must be one of {list(COMPARISON_PAIR_SELECTIONS)}; got {self.pair_selection!r}."
            )
        self.pair_selection = "reward_gap" if selection == "comparator_reward" else selection  # MARLHF's checks
        super().__post_init__()
        self.pair_selection = selection
        scoring = str(self.preference_scoring_reward or "task").strip().lower()
        self.preference_scoring_reward = SCORING_REWARD_ALIASES.get(scoring, scoring)
        if self.preference_scoring_reward not in SCORING_REWARDS:
            raise ValueError(
                f"`preference_scoring_reward` must be 'task' or 'reward_model' (or CoMLRL's aliases); got {scoring!r}."
            )
        if int(self.num_train_epochs) != self.num_train_epochs:
            raise ValueError(f"`num_train_epochs` must be a whole number of online epochs per iteration, got "
                             f"{self.num_train_epochs}.")  # fmt: skip
        if self.max_steps > 0:
            raise ValueError(
                f"`max_steps={self.max_steps}` would cut the run across iterations: MARLHFIter trains "
                "`num_train_epochs` online epochs per iteration. Leave `max_steps` at -1."
            )
        self._check_iterative_fields()

    def native_config(self) -> MARLHFIterConfig:
        """The config the trainer runs: a copy with CoMLRL's iterative fields under the native round fields' names
        (`ROUND_FIELDS`), `num_iterations` iterations of `num_train_epochs` epochs as rounds of `epochs_per_round`
        epochs, the reward model reset every round, and TRL's `num_iterations` (1)."""
        config = copy.copy(self)
        for name, native in ROUND_FIELDS.items():
            setattr(config, native, getattr(self, name))
        config.comparator = "current"  # "current_copy" too: every pair of a round is drawn before any update
        config.epochs_per_round = int(self.num_train_epochs)
        config.num_train_epochs = self.num_iterations * config.epochs_per_round
        config.reward_model_reset, config.num_iterations = True, 1
        return config


class PolicyCheckpoints(TrainerCallback):
    """CoMLRL's `policy_checkpoint_dir`: the agents (and the reward model) saved before training (`initial`) and at
    the end of every round (`iteration_XXXX`, 0-based)."""

    def __init__(self, trainer: MARLHFIterTrainer, folder: str):
        self.trainer, self.folder = trainer, folder

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.save_model(os.path.join(self.folder, "initial"))

    def on_epoch_end(self, args, state, control, **kwargs):
        epochs = round(state.epoch or 0)
        if epochs % args.epochs_per_round == 0:
            self.trainer.save_model(os.path.join(self.folder, f"iteration_{epochs // args.epochs_per_round - 1:04d}"))


class MARLHFIterTrainer(RewardModelRounds, MARLHFTrainer):
    """Iterative MARLHF with CoMLRL 1.4.3's `MARLHFIterTrainer` arguments (those of `MARLHFTrainer`): its rounds are
    the native ones (`RewardModelRounds`) on `args.native_config()`, trained by one `Trainer.train`; the user's config
    is `trainer.comlrl_args`. After `train()`: `reward_model` (the last round's), `preference_pairs` (the last training
    pairs), `reward_model_histories` (one per round). Logs CoMLRL's `iter/...` beside the native `round/...`."""

    default_config_cls = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def __init__(self, *args, **kwargs):
        given = kwargs.get("args", args[14] if len(args) > 14 else None)
        given = MARLHFIterConfig() if given is None else given
        if not isinstance(given, MARLHFIterConfig):
            raise TypeError(f"`args` is a {type(given).__name__}; MARLHFIterTrainer needs a MARLHFIterConfig.")
        reward = kwargs.get("reward_func", args[7] if len(args) > 7 else None)
        if given.log_reward_distribution and reward_range(reward) is None:
            raise ValueError(
                "`log_reward_distribution=True` needs the reward's range: set `reward_func.reward_range = (min, "
                "max)` (CoMLRL's `set_reward_range`), or turn `log_reward_distribution` off."
            )
        args = args[:14] + args[15:]  # the config goes by keyword
        super().__init__(*args, **{**kwargs, "args": given.native_config()})
        self.comlrl_args, self.total_train_pairs = given, 0
        self.setup_reward_rounds()
        if given.policy_checkpoint_dir:
            self.add_callback(PolicyCheckpoints(self, given.policy_checkpoint_dir))

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
        logs = {
            "iter/current_iteration": float(index + 1),
            "iter/current_preference_pairs": float(len(self.round_records)),
            "iter/total_preference_pairs": float(self.total_train_pairs),
            "iter/train_preference_pairs": float(len(self.round_pairs)),
        }
        if self.args.log_reward_distribution:
            logs.update(distribution_metrics("iter/reward_distribution", index, *self.round_candidate_rewards))
            selected = [  # (target, comparator) raw rewards of the training pairs that record them
                [r[key] for r in self.round_pairs if r.get(key) is not None]
                for key in ("target_raw_reward", "comparator_raw_reward")
            ]
            pairs = len(self.round_pairs)
            logs.update(distribution_metrics("iter/selected_reward_distribution", index, *selected, pairs))
        self.add_metrics({key: [value] for key, value in logs.items()})


__all__ = ["MARLHFIterConfig", "MARLHFIterTrainer", "record_pair"]
