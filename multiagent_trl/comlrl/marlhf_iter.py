"""CoMLRL compatibility for iterative MARLHF: `MARLHFIterConfig`/`MARLHFIterTrainer` with CoMLRL 1.4.3's names,
defaults and checks, on top of `MARLHFConfig`/`MARLHFTrainer` and the iterative steps of `iterative.IterativePairs`.

```diff
-from comlrl.trainers.preference import MARLHFIterConfig, MARLHFIterTrainer
+from multiagent_trl import MARLHFIterConfig, MARLHFIterTrainer
```

Each of `num_iterations` iterations, as CoMLRL runs them:

1. Pairs: over the whole training set, the current agents sample K = `preference_num_candidates` joint candidates per
   item and the comparator K' = `comparator_num_candidates` (or K); each candidate is scored by the task reward (with
   `reward_processor`), or, with `preference_scoring_reward="reward_model"` and from the second iteration on, by the
   previous iteration's reward model (its raw score, no processor); index-aligned pairs are ordered by
   `pair_selection` and the first `preference_pairs_per_sample` kept (MADPOIter's step, `IterativePairs`).
2. Replay: the pairs are written to `preference_replay_dir/iteration_XXXX.json` and the training pairs drawn by
   `preference_replay_mode`.
3. Reward model: reset to its initial weights and trained on the training pairs with the Bradley-Terry loss
   (`train_reward_model`: a new AdamW, `reward_learning_rate`, `reward_num_train_epochs` (default 2),
   `reward_train_batch_size`).
4. Online: MAGRPO's port (`Trainer.train`) for `num_train_epochs` (default 2) over the training set, on the reward
   model's raw scores; evaluation scores with the task reward.
5. With `policy_checkpoint_dir`, the agents (and the iteration's reward model) are saved to
   `policy_checkpoints/iteration_XXXX` (0-based; the initial agents to `initial`).

An iteration without a training pair skips steps 3 and 4 (as CoMLRL). Logged per iteration, at the step it starts
from: `iter/current_iteration`, `iter/current_preference_pairs`, `iter/total_preference_pairs`,
`iter/train_preference_pairs` and the reward model's `reward_model/loss`, `/accuracy`, `/margin`, `/steps`, `/pairs`.

The online phases make one training run: each is a `Trainer.train` call that continues the previous one. The
optimizer (and its AdamW moments) is created once and reused; the trainer state (`global_step`, `epoch`, the log
history) carries over (`_init_training_state` picks up where the last phase stopped, and the phase runs to
`num_train_epochs` more epochs); the learning-rate schedule is built once, for every iteration's steps, and
continues; each phase's data order is a new shuffle (the sampler's seed is `seed + phase`). Callbacks see one
`on_train_begin`/`on_train_end` per phase.

Deliberate differences from CoMLRL 1.4.3, and why:

1. The reward model is re-created from the same initial weights every iteration (the pretrained backbone and the head
   drawn at construction, restored from a CPU copy of its trainable parameters), with a new optimizer. CoMLRL
   reloads the backbone and draws a new random head each iteration. Same start, no reload from disk, and a run is
   reproducible from the seed set before construction.
2. MADPOIter's differences apply to the pairs and shards (`iterative`'s docstring: shards and checkpoints under
   `output_dir` by default, the comparator `current` on the global random stream, the shards also hold token ids);
   MARLHF's to the reward model and the online phase (`marlhf`'s docstring: loaded at construction, logged, saved
   beside the agents, MAGRPO's port online). Policy checkpoints therefore also hold that iteration's reward model
   (`iteration_XXXX/reward_model/`).
3. Online steps, `logging_steps` and `eval_interval` count over the whole run (one `global_step`); CoMLRL's
   `env_step` also runs on across iterations. With `eval_interval > 0`, each online phase evaluates when it starts (as
   each of CoMLRL's MAGRPO runs does).
4. Pair sampling leaves the training metrics alone: the first log of an online phase holds only its own steps.

Not supported (raise, naming the field): MADPOIter's (`comparator_policy="model"`, `"history"`, `"api"`,
`comparator_devices`, `comparator_generation_mode="centralized"`, more than one process, `train(checkpoint_dir=...)`)
and MARLHF's (`rl_algorithm="iac"`/`"maac"`, `collaboration_mode="centralized"`, the critic arguments).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..preference.iterative_rlhf import record_pair
from ..preference.replay import COMPARISON_PAIR_SELECTIONS
from ..preference.reward_training import summarize, train_reward_model
from ..rewards.joint import bind_joint_scorer
from ..team.views import metrics_aside, swapped
from .iterative import IterativePairs, IterativePreferenceFields
from .marlhf import ACTOR_CRITIC_ALGORITHMS, RL_ALGORITHMS, MARLHFConfig, MARLHFTrainer
from .reinforce import MAGRPOTrainer

logger = logging.getLogger(__name__)

SCORING_REWARDS = ("task", "reward_model")
SCORING_REWARD_ALIASES = {
    "oracle": "task",
    "environment": "task",
    "env": "task",
    "model": "reward_model",
    "learned": "reward_model",
}


@dataclass
class MARLHFIterConfig(IterativePreferenceFields, MARLHFConfig):
    r"""
    `MARLHFConfig` with CoMLRL 1.4.3's iterative fields (`MARLHFIterConfig`), defaults and checks.

    Parameters:
        num_iterations (`int`, *optional*, defaults to `6`):
            Iterations of pairs, reward model and online training (CoMLRL's meaning; TRL's `num_iterations`,
            updates per generation batch, is 1).
        num_train_epochs (`2`):
            Online epochs (MAGRPO's port, over the training set) per iteration.
        preference_num_candidates (`20`), preference_pairs_per_sample (`4`):
            K, the current policy's joint candidates per item, and the pairs kept per item.
        pair_selection (`str`, defaults to `"comparator_reward"`):
            `"comparator_reward"`, `"reward_gap"`, `"random"` or `"all"` (see `preference.replay.comparison_pairs`).
        reward_num_train_epochs (`int`, defaults to `2`):
            Reward-model passes over an iteration's training pairs.
        preference_scoring_reward (`str`, defaults to `"task"`):
            What ranks the candidates: `"task"` (the task reward with `reward_processor`, every iteration) or
            `"reward_model"` (the previous iteration's reward model, raw, from the second iteration on; the first
            uses the task reward). CoMLRL's aliases (`oracle`, `environment`, `env`; `model`, `learned`) accepted.

    The iterative fields (`preference_replay_mode`, `preference_replay_k`, `preference_replay_lambda`,
    `preference_replay_sample_size`, `preference_replay_dir`, `log_reward_distribution`, `policy_checkpoint_dir`,
    `comparator_policy`, `comparator_generation_mode`, `comparator_centralized_agent_index`, `comparator_model_name`,
    `comparator_agents`, `comparator_devices`, `comparator_num_candidates`, `comparator_history_k`,
    `comparator_api_*`) are as in `MADPOIterConfig` (same defaults, checks and unsupported values). Every other
    field is `MARLHFConfig`'s (the reward model's `reward_*` fields, `rl_algorithm`, `num_generations` for the online
    phase, ...).
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
        if algorithm in ACTOR_CRITIC_ALGORITHMS:  # checked here too: the online phase runs MAGRPO's `train`
            raise NotImplementedError(
                f"`rl_algorithm={algorithm!r}`: MARLHFIter's online phase runs the MAGRPO family only (CoMLRL's "
                f"actor-critic back-ends are not ported to it); use `rl_algorithm` in {list(RL_ALGORITHMS)}."
            )
        selection = str(self.pair_selection).strip().lower()
        if selection not in COMPARISON_PAIR_SELECTIONS:
            raise ValueError(
                f"`pair_selection` must be one of {', '.join(COMPARISON_PAIR_SELECTIONS)}; "
                f"got {self.pair_selection!r}."
            )
        self.pair_selection = "reward_gap" if selection == "comparator_reward" else selection  # MARLHF's checks
        super().__post_init__()
        self.pair_selection = selection
        scoring = str(self.preference_scoring_reward or "task").strip().lower()
        scoring = SCORING_REWARD_ALIASES.get(scoring, scoring)
        if scoring not in SCORING_REWARDS:
            raise ValueError(
                f"`preference_scoring_reward` must be 'task' or 'reward_model' (or CoMLRL's aliases); got "
                f"{self.preference_scoring_reward!r}."
            )
        self.preference_scoring_reward = scoring
        if int(self.num_train_epochs) != self.num_train_epochs:
            raise ValueError(
                f"`num_train_epochs` must be a whole number of online epochs per iteration, got "
                f"{self.num_train_epochs}."
            )
        if self.max_steps > 0:
            raise ValueError(
                f"`max_steps={self.max_steps}` would cut the run across iterations: MARLHFIter trains "
                "`num_train_epochs` online epochs per iteration. Leave `max_steps` at -1."
            )
        self._check_iterative_fields()


class MARLHFIterTrainer(IterativePairs, MARLHFTrainer):
    """Iterative MARLHF with CoMLRL 1.4.3's `MARLHFIterTrainer` arguments (those of `MARLHFTrainer`).

    `train()` runs the iterations described in the module docstring; `evaluate` and `save_model` are
    `MARLHFTrainer`'s. After `train()`: `trainer.reward_model` (the last iteration's), `trainer.preference_pairs` (the
    last training pairs), `trainer.reward_model_histories` (one list of reward-model steps per trained iteration) and
    `trainer.replay_shards`.
    """

    default_config_cls = MARLHFIterConfig
    algorithm_name = "MARLHFIter"

    def __init__(self, *args, **kwargs):
        bounds = self._reward_bounds(self._given_config(args, kwargs), args, kwargs)
        super().__init__(*args, **kwargs)
        self._init_iterations(bounds, "MARLHFTrainer")
        # The reward model's start of every iteration: its trainable parameters (frozen ones never change).
        self._initial_reward_state = {
            name: p.detach().to("cpu", copy=True)
            for name, p in self.reward_model.named_parameters()
            if p.requires_grad
        }
        self.reward_model_histories: list[list[dict[str, float]]] = []
        self._online_phases = 0  # online phases run so far
        self._online_epochs = 0  # their epochs
        self._run_scheduler = None  # the learning-rate schedule of the whole run, built by the first phase

    # ------------------------------------------------------------------ the loop

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **kwargs,
    ):
        """Run `num_iterations` iterations (pairs, shard, replay, reward model, online phase, policy checkpoint).
        Returns the last online phase's `TrainOutput` (`None` if no iteration had a training pair)."""
        self._check_train_arguments(
            resume_from_checkpoint, checkpoint_dir, checkpoint_interval, checkpoint_total_limit, kwargs
        )
        args = self.args
        if self.policy_checkpoint_dir:
            self.save_model(os.path.join(self.policy_checkpoint_dir, "initial"))
        output, total = None, 0
        for it in range(args.num_iterations):
            self.model.train()
            by_reward_model = args.preference_scoring_reward == "reward_model" and self._online_reward is not None
            with self._pair_scoring(by_reward_model):
                current, candidates = self._iteration_pairs()
            train_pairs, logs = self._training_pairs(it, current, candidates, total)
            total += len(train_pairs)
            if train_pairs:
                pairs = [record_pair(record) for record in train_pairs]
                self._reset_reward_model()
                history = train_reward_model(
                    self.reward_model,
                    pairs,
                    learning_rate=args.reward_learning_rate,
                    num_train_epochs=args.reward_num_train_epochs,
                    batch_size=args.reward_train_batch_size,
                )
                self.preference_pairs, self.reward_model_history = pairs, history
                self.reward_model_histories.append(history)
                logs.update(summarize(history, len(pairs)))
                self._online_reward = bind_joint_scorer(self.reward_model, self.num_agents)
            else:
                logger.warning("MARLHFIter: iteration %d has no training pair; it trains nothing.", it + 1)
            self.log(logs)
            if train_pairs:
                output = self._online_phase()
            if self.policy_checkpoint_dir:
                self.save_model(os.path.join(self.policy_checkpoint_dir, f"iteration_{it:04d}"))
        return output

    @contextmanager
    def _pair_scoring(self, by_reward_model: bool) -> Iterator[None]:
        """Pair sampling with its own metrics (the training log keeps only training steps), scored by the task reward
        or, `by_reward_model`, by the current reward model's raw scores (raw = processed, as CoMLRL)."""
        swaps = {"_metrics": {"train": defaultdict(list), "eval": defaultdict(list)}}
        if by_reward_model:
            swaps.update(
                reward_funcs=[self._online_reward],
                reward_func_names=[self._online_reward.__name__],
                reward_weights=torch.ones(1, device=self.reward_weights.device),
                reward_processing_classes=[None],
                reward_processor=None,
            )
        with metrics_aside(self._agent_views), self._swap(**swaps):  # each agent's view records its own metrics
            yield

    def _reset_reward_model(self) -> None:
        """Put the reward model back to its weights at construction (CoMLRL re-creates it every iteration)."""
        with torch.no_grad():
            for name, param in self.reward_model.named_parameters():
                if name in self._initial_reward_state:
                    param.copy_(self._initial_reward_state[name])

    # ------------------------------------------------------------------ the online phase: one run in several calls

    def _online_phase(self):
        """`num_train_epochs` more online epochs: MAGRPO's `train` (not `MARLHFTrainer.train`, whose reward stage
        the loop has run), continuing the run (see `_init_training_state`, `create_scheduler`)."""
        epochs = int(self.args.num_train_epochs)
        with swapped(self.args, num_train_epochs=self._online_epochs + epochs):
            output = MAGRPOTrainer.train(self)
        self._online_phases += 1
        self._online_epochs += epochs
        return output

    def _init_training_state(
        self, max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
    ):
        # Trainer starts a new state each `train()`; an online phase continues the run: its step, epoch and logs.
        previous = self.state
        super()._init_training_state(max_steps, num_update_steps_per_epoch, num_train_epochs, None, trial)
        for name in ("global_step", "epoch", "log_history", "total_flos", "num_input_tokens_seen"):
            value = getattr(previous, name, None)
            if value is not None:
                setattr(self.state, name, value)
        return self._online_epochs, 0  # epochs done (the loop runs the rest), no batch to skip

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        # One schedule for the run: built by the first phase for every iteration's steps, then reused (Trainer
        # would build a new one each `train()`, restarting warm-up and decay). `num_training_steps` is the first
        # phase's steps; an iteration skipped for want of pairs leaves the schedule's end unreached.
        if self._run_scheduler is None:
            self._run_scheduler = super().create_scheduler(num_training_steps * self.args.num_iterations, optimizer)
        self.lr_scheduler = self._run_scheduler
        return self.lr_scheduler

    def load_checkpoint(self, checkpoint: str):
        """Not ported: CoMLRL's MARLHFIter checkpoints hold the iteration, the shards and the reward model."""
        raise NotImplementedError(
            "MARLHFIter does not resume from checkpoints (CoMLRL's iteration checkpoints are not ported): set "
            "`policy_checkpoint_dir` to save the agents and the reward model after every iteration."
        )

    def _get_train_sampler(self, dataset=None):
        # A new sampler each phase, seeded as the first: reseed it so that each phase draws another order.
        sampler = super()._get_train_sampler(dataset)
        generator = getattr(sampler, "generator", None)
        if generator is not None and self._online_phases:
            generator.manual_seed(self.args.seed + self._online_phases)
        return sampler


__all__ = ["MARLHFIterConfig", "MARLHFIterTrainer"]
