"""CoMLRL 1.4.3's `MADPOIterConfig`/`MADPOIterTrainer` translated onto the native `MultiAgentIterativeDPOConfig`/
`MultiAgentIterativeDPOTrainer`: an iteration is a round (a Trainer epoch); docs/comlrl-users.md ("MADPOIter") maps
every field and lists the deliberate differences from CoMLRL."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..config import whole_number
from ..preference.iterative import MultiAgentIterativeDPOConfig, MultiAgentIterativeDPOTrainer
from ..team.views import swapped
from .iterative_fields import ROUND_FIELDS, IterativePreferenceFields, iteration_logs, iterative_config, save_rounds
from .preference import MADPOConfig, MADPOTrainer


@dataclass
class MADPOIterConfig(IterativePreferenceFields, MADPOConfig, MultiAgentIterativeDPOConfig):
    """`MADPOConfig` with CoMLRL 1.4.3's iterative fields (`IterativePreferenceFields`), defaults and checks, mapped
    onto `MultiAgentIterativeDPOConfig`'s round fields: `num_iterations` rounds, `num_train_epochs` passes over a
    round's pairs (`pair_passes`) in batches of `train_batch_size` pairs (`pair_batch_size`), the `preference_replay_*`
    fields as `replay_*` (docs/comlrl-users.md, "MADPOIter", has the table)."""

    output_dir: str | None = field(default="madpo_iter_output", metadata={"help": "Where outputs go."})
    num_train_epochs: float = field(default=1, metadata={"help": "Passes over an iteration's training pairs."})
    preference_num_candidates: int = field(default=20, metadata={"help": "Joint candidates per item (K, >= 2)."})
    preference_pairs_per_sample: int | None = field(default=4, metadata={"help": "At most this many pairs per item."})
    pair_selection: str = field(
        default="comparator_reward", metadata={"help": "'comparator_reward', 'reward_gap', 'random' or 'all'."}
    )

    centralized_ported: ClassVar[bool] = True

    def __post_init__(self):
        for name, native in ROUND_FIELDS.items():  # checked by CoMLRL's names first (`IterativePreferenceFields`)
            setattr(self, native, getattr(self, name))
        self.pair_batch_size = self.comlrl_train_batch_size or self.rollout_buffer_size
        self.pair_passes = whole_number("num_train_epochs", self.num_train_epochs)  # passes: refused as 1.5, not cut
        super().__post_init__()

    def _generation_batch(self) -> tuple[int, int, None]:
        # A training batch is `pair_batch_size` pairs; the generation batch only sizes the rounds' draws: CoMLRL's
        # item batches, `generation_batch_size // num_generations` = `rollout_buffer_size` items per draw.
        return self.rollout_buffer_size * self.num_generations, 1, None


class MADPOIterTrainer(MADPOTrainer, MultiAgentIterativeDPOTrainer):
    """Iterative MADPO with CoMLRL 1.4.3's `MADPOIterTrainer` arguments (those of `MADPOTrainer`), trained by the
    native iterative trainer: an iteration is a native round (`IterativeRounds`: its draw over CoMLRL's item batches,
    `rollout_buffer_size` items, its shard and replay). What it adds: CoMLRL's `iter/...` log entry at the start of
    an iteration (`round_pairs_for`), `policy_checkpoint_dir` (the native `RoundSaves`), and CoMLRL's `train()`
    arguments (its iteration checkpoints raise)."""

    default_config_cls = MADPOIterConfig
    algorithm_name = "MADPOIter"

    def __init__(self, *args, **kwargs):
        iterative_config(type(self), args, kwargs)
        super().__init__(*args, **kwargs)
        self.num_iterations = 1  # TRL's meaning (updates per generation batch); CoMLRL's is `args.num_iterations`
        self.trained_pairs = 0
        save_rounds(self)

    __init__.__signature__ = MADPOTrainer.__init__.__signature__

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
        if resume_from_checkpoint is not None or checkpoint_dir is not None or checkpoint_total_limit is not None:
            raise NotImplementedError(
                "CoMLRL's iteration checkpoints (`train(checkpoint_dir=..., resume_from_checkpoint=...)`) are not "
                "ported for MADPOIter: set `policy_checkpoint_dir` to save the agents after every iteration."
            )
        if checkpoint_interval != 1 or kwargs:
            raise TypeError(
                f"train() got checkpoint_interval={checkpoint_interval!r} and {sorted(kwargs)}: generation settings "
                "are config fields here, and iteration checkpoints are not ported."
            )
        if self.train_dataset is None:
            raise ValueError("Training needs a `train_dataset`: pass `train_dataset=` to the trainer.")
        self.trained_pairs = 0
        # CoMLRL's `num_train_epochs` is the passes over an iteration's pairs (`pair_passes`); Trainer's: rounds.
        with swapped(self.args, num_train_epochs=self.args.num_iterations):
            return super().train()

    def round_pairs_for(self, epoch: int) -> list[dict[str, Any]]:
        """The native round's pairs; a new round also logs CoMLRL's `iter/...` entries (`iteration_logs`)."""
        if epoch == self.round_index:
            return self.round_pairs
        pairs = super().round_pairs_for(epoch)
        self.trained_pairs += len(pairs)
        self.log(
            iteration_logs(
                epoch,
                len(self.round_records),
                self.round_candidate_rewards,
                pairs,
                self.trained_pairs,
                self.args.log_reward_distribution,
            )
        )
        return pairs


__all__ = ["MADPOIterConfig", "MADPOIterTrainer"]
