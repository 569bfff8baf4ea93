"""CoMLRL 1.4.3's `MADPOIterConfig`/`MADPOIterTrainer` translated onto the native `MultiAgentIterativeDPOConfig`/
`MultiAgentIterativeDPOTrainer`: an iteration is a round (a Trainer epoch), trained by `Trainer.train` on the round's
pairs in batches of `train_batch_size` pairs (`pair_batch_size`), `num_train_epochs` passes (`pair_passes`).

```diff
-from comlrl.trainers.preference import MADPOIterConfig, MADPOIterTrainer
+from multiagent_trl import MADPOIterConfig, MADPOIterTrainer
```

`docs/comlrl-users.md` (MADPOIter) maps every field and lists the deliberate differences from CoMLRL.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from transformers import TrainerCallback

from ..preference.iterative import MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer
from ..preference.replay import COMPARISON_PAIR_SELECTIONS
from ..team.views import swapped
from .iterative_fields import IterativePreferenceFields
from .iterative_pairs import IterativePairs, distribution_metrics
from .preference import MADPOConfig, MADPOTrainer


@dataclass
class MADPOIterConfig(IterativePreferenceFields, MADPOConfig, MultiAgentIterativeDPOConfig):
    r"""
    `MADPOConfig` with CoMLRL 1.4.3's iterative fields (`MADPOIterConfig`), defaults and checks, mapped onto
    `MultiAgentIterativeDPOConfig`'s round fields (the table in `docs/comlrl-users.md`, MADPOIter).

    Parameters:
        num_iterations (`int`, *optional*, defaults to `6`):
            Pair-refresh iterations: the rounds (`num_train_epochs` of the native trainer, while training).
        num_train_epochs (`1`), train_batch_size (`None`: `rollout_buffer_size`):
            Passes over an iteration's training pairs (`pair_passes`) and pairs per update (`pair_batch_size`).
        preference_num_candidates (`20`), comparator_num_candidates (`None`: K), preference_pairs_per_sample (`4`):
            K (`num_generations`), K' (`comparator_num_generations`) and the pairs kept per item.
        pair_selection (`str`, defaults to `"comparator_reward"`):
            `"comparator_reward"`, `"reward_gap"`, `"random"` or `"all"` (see `preference.replay.comparison_pairs`).
        preference_replay_mode (`str`, defaults to `"current"`):
            The native `replay_mode` (CoMLRL's aliases accepted); `preference_replay_k`, `preference_replay_lambda`,
            `preference_replay_sample_size` and `preference_replay_dir` are `replay_k`, `replay_lambda`,
            `replay_sample_size` and `replay_dir` (the shards go to `output_dir/preference_replay` by default).
        log_reward_distribution (`bool`, defaults to `False`): reward distribution metrics per iteration (needs
            `reward_func.reward_range`).
        policy_checkpoint_dir (`str`, *optional*): save the agents after each iteration there (and the initial ones).
        comparator_policy (`str`, defaults to `"current"`): `"current"` or `"current_copy"`; `"model"`, `"history"`
            and `"api"` raise `NotImplementedError`.

    CoMLRL's other comparator fields (`comparator_generation_mode`, `comparator_centralized_agent_index`,
    `comparator_model_name`, `comparator_agents`, `comparator_devices`, `comparator_history_k`, and the HTTP
    comparator's `comparator_api_*`) are accepted with CoMLRL's defaults and checks.
    """

    output_dir: str | None = field(default="madpo_iter_output", metadata={"help": "Where outputs go."})
    num_train_epochs: float = field(default=1, metadata={"help": "Passes over an iteration's training pairs."})
    preference_num_candidates: int = field(default=20, metadata={"help": "Joint candidates per item (K, >= 2)."})
    preference_pairs_per_sample: int | None = field(default=4, metadata={"help": "At most this many pairs per item."})
    pair_selection: str = field(
        default="comparator_reward", metadata={"help": "'comparator_reward', 'reward_gap', 'random' or 'all'."}
    )

    centralized_ported: ClassVar[bool] = True

    def __post_init__(self):
        selection = str(self.pair_selection).strip().lower()
        if selection not in COMPARISON_PAIR_SELECTIONS:
            raise ValueError(
                f"`pair_selection` must be one of {', '.join(COMPARISON_PAIR_SELECTIONS)}; "
                f"got {self.pair_selection!r}."
            )
        self._check_iterative_fields()  # CoMLRL's names in the errors, before the native checks see them
        if int(self.num_train_epochs) < 1:
            raise ValueError(
                f"`num_train_epochs` (passes over an iteration's pairs) must be >= 1, got {self.num_train_epochs}."
            )
        self.comparator, self.comparator_num_generations = "current", self.comparator_num_candidates
        self.replay_mode, self.replay_k = self.preference_replay_mode, self.preference_replay_k
        self.replay_lambda, self.replay_sample_size = self.preference_replay_lambda, self.preference_replay_sample_size
        self.replay_dir = self.preference_replay_dir
        self.pair_batch_size = self.comlrl_train_batch_size or self.rollout_buffer_size
        self.pair_passes = int(self.num_train_epochs)
        self.pair_selection = "reward_gap" if selection == "comparator_reward" else selection  # MADPO's checks
        super().__post_init__()
        self.pair_selection = selection

    def _generation_batch(self) -> tuple[int, int, None]:
        # A training batch is `pair_batch_size` pairs; the generation batch only sizes the rounds' draws.
        return self.rollout_buffer_size * self.num_generations, 1, None


class PolicyCheckpoints(TrainerCallback):
    """CoMLRL's `policy_checkpoint_dir`: the agents saved at the start (`initial`) and after every iteration
    (`iteration_XXXX`, 0-based)."""

    def __init__(self, trainer: MADPOIterTrainer):
        self.trainer = trainer

    def save(self, name: str) -> None:
        self.trainer.save_model(os.path.join(self.trainer.args.policy_checkpoint_dir, name))

    def on_train_begin(self, args, state, control, **kwargs):
        self.save("initial")

    def on_epoch_end(self, args, state, control, **kwargs):
        self.save(f"iteration_{self.trainer.round_index:04d}")


class MADPOIterTrainer(IterativePairs, MADPOTrainer, MultiAgentIterativeDPOTrainer):
    """Iterative MADPO with CoMLRL 1.4.3's `MADPOIterTrainer` arguments (those of `MADPOTrainer`), trained by the
    native iterative trainer. What it adds: each iteration's draw over CoMLRL's item batches with every candidate's
    raw reward (`draw_round_pairs`), the `iter/...` log entry at the start of an iteration (`round_pairs_for`), the
    policy checkpoints, and CoMLRL's `train()` arguments (its iteration checkpoints raise)."""

    default_config_cls = MADPOIterConfig
    algorithm_name = "MADPOIter"

    def __init__(self, *args, **kwargs):
        bounds = self._reward_bounds(self._given_config(args, kwargs), args, kwargs)
        super().__init__(*args, **kwargs)
        self._init_iterations(bounds, "MADPOTrainer")
        self.trained_pairs, self._drawn = 0, None
        if self.policy_checkpoint_dir:
            self.add_callback(PolicyCheckpoints(self))

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs,
    ):
        """Run `num_iterations` iterations by one `Trainer.train` and return its `TrainOutput`; CoMLRL's iteration
        checkpoint arguments raise."""
        self._check_train_arguments(
            resume_from_checkpoint, checkpoint_dir, checkpoint_interval, checkpoint_total_limit, kwargs
        )
        self.trained_pairs = 0
        # CoMLRL's `num_train_epochs` is the passes over an iteration's pairs (`pair_passes`); Trainer's: rounds.
        with swapped(self.args, num_train_epochs=self.args.num_iterations):
            return super().train()

    def draw_round_pairs(self) -> list[dict[str, Any]]:
        with self.metrics_aside():
            records, candidates = self._iteration_pairs()
        self._drawn = (len(records), candidates)
        return records

    def round_pairs_for(self, epoch: int) -> list[dict[str, Any]]:
        if epoch == self.round_index:
            return self.round_pairs
        pairs = super().round_pairs_for(epoch)
        self.trained_pairs += len(pairs)
        drawn, candidates = self._drawn
        self.log(self.iteration_logs(epoch, drawn, candidates, pairs, self.trained_pairs))
        return pairs


__all__ = [  # the iterative fields and CoMLRL's steps are re-exported for `marlhf_iter`
    "IterativePairs",
    "IterativePreferenceFields",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "PolicyCheckpoints",
    "distribution_metrics",
]
