"""Multi-agent RLHF, native: `MultiAgentRLHFConfig` / `MultiAgentRLHFTrainer`.

The team trains online (MAGRPO, `MultiAgentGRPOTrainer`'s step) on the scores of a `JointRewardModel`, and is
evaluated on the task reward (`reward_funcs`). The reward model is trained with the Bradley-Terry loss
(`reward_training.train_reward_model`) at the start of `train()`, from either

- pairs of the team's own joint samples ranked by the task reward (`sampling.collect_preference_pairs`:
  `preference_num_candidates` per training row, `pair_selection`, `preference_pairs_per_sample`), or
- the given `preference_pairs` (a list of `JointPreferencePair`, e.g. human preferences).

Every checkpoint holds the trained reward model (`checkpoint-N/reward_model/`, also written by `save_model`), and
`train(resume_from_checkpoint=...)` reloads it from there instead of drawing and training again.

`RewardModelStage` holds that logic for any team trainer subclass (CoMLRL's `MARLHFTrainer` uses it on MAGRPO's port).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from accelerate.utils import broadcast
from transformers.trainer_utils import get_last_checkpoint

from ..config import MultiAgentGRPOConfig
from ..rewards.joint import bind_joint_scorer
from ..trainer import MultiAgentGRPOTrainer
from .pairs import PAIR_SELECTIONS
from .reward_model import REWARD_POOLINGS, SPAN_POOLINGS, JointRewardModel
from .reward_training import JointPreferencePair, summarize, train_reward_model
from .sampling import collect_preference_pairs, prompts_per_call

logger = logging.getLogger(__name__)

REWARD_MODEL_DIR = "reward_model"  # under output_dir, and under every checkpoint


def check_reward_model_fields(config) -> None:
    """The reward-model and pair fields shared by `MultiAgentRLHFConfig` and CoMLRL's `MARLHFConfig`; normalises
    `pair_selection` and checks `reward_model_device`. The stage is single-turn and aligned: its pairs are one turn
    of aligned joint samples (`sampling.collect_preference_pairs`), and the reward model scores one joint sample."""
    if getattr(config, "num_turns", 1) != 1:
        raise ValueError(f"RLHF's reward model scores one-turn episodes: set `num_turns=1`, got {config.num_turns}.")
    if str(getattr(config, "joint_mode", "aligned")).strip().lower() == "cross":
        raise ValueError(
            "RLHF's reward model scores aligned joint samples (each agent's j-th completion together): set "
            "`joint_mode='aligned'`, got 'cross'."
        )
    pooling = getattr(config, "reward_pooling", "last")
    if pooling not in REWARD_POOLINGS:
        raise ValueError(f"`reward_pooling` must be one of {list(REWARD_POOLINGS)}, got {pooling!r}.")
    for name, ok, rule in (
        ("reward_learning_rate", config.reward_learning_rate > 0, "> 0"),
        ("reward_num_train_epochs", config.reward_num_train_epochs >= 1, ">= 1"),
        ("reward_train_batch_size", config.reward_train_batch_size >= 1, ">= 1"),
        ("reward_max_length", config.reward_max_length is None or config.reward_max_length >= 1, ">= 1 or None"),
        ("preference_num_candidates", config.preference_num_candidates >= 2, ">= 2"),
        (
            "preference_pairs_per_sample",
            config.preference_pairs_per_sample is None or config.preference_pairs_per_sample >= 1,
            ">= 1 or None",
        ),
    ):
        if not ok:
            raise ValueError(f"`{name}` must be {rule}, got {getattr(config, name)}.")
    if config.reward_model_device is not None:
        config.reward_model_device = str(config.reward_model_device)
        try:
            torch.device(config.reward_model_device)
        except (RuntimeError, ValueError) as error:
            raise ValueError(
                f"`reward_model_device={config.reward_model_device!r}` is not a device ({error}): give one such as "
                "'cuda:0' or 'cpu', or None for the team's device."
            ) from error
    selection = str(config.pair_selection).strip().lower()
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"`pair_selection` must be one of {list(PAIR_SELECTIONS)}, got {config.pair_selection!r}.")
    if selection == "all" and config.preference_pairs_per_sample is not None:
        raise ValueError("`pair_selection='all'` keeps every pair: set `preference_pairs_per_sample=None`.")
    config.pair_selection = selection


@dataclass
class RewardModelFields:
    r"""
    The reward-model stage's fields (`RewardModelStage`), mixed into a team config before it: `MultiAgentRLHFConfig`
    (MAGRPO online) and `ActorCriticRLHFConfig` (actor-critic online).

    Parameters:
        preference_num_candidates (`int`, *optional*, defaults to `8`):
            Joint samples per training row that the task reward ranks into pairs (>= 2); unused when the trainer is
            given `preference_pairs`.
        preference_pairs_per_sample (`int` or `None`, *optional*, defaults to `16`): At most this many pairs per row.
        pair_selection (`str`, *optional*, defaults to `"reward_gap"`): `"reward_gap"`, `"random"` or `"all"`.
        reward_model_name (`str` or `None`, *optional*, defaults to `None`):
            The reward model's causal LM (id or path; a `JointRewardModel.save_pretrained` folder brings its head);
            `None`: the agents' model.
        reward_model_device (`str` or `None`, *optional*, defaults to `None`): `None`: the team's device.
        reward_learning_rate (`float`, *optional*, defaults to `1e-5`): the reward model's AdamW learning rate.
        reward_num_train_epochs (`int`, *optional*, defaults to `1`): passes over the pairs.
        reward_train_batch_size (`int`, *optional*, defaults to `1`): pairs per reward-model step.
        reward_max_length (`int` or `None`, *optional*, defaults to `None`): joint texts cut at this many tokens.
        reward_freeze_backbone (`bool`, *optional*, defaults to `False`): train the reward head only.
        reward_pooling (`str`, *optional*, defaults to `"span_sums"`):
            What a new reward head reads (`JointRewardModel`'s `pooling`): each agent's response tokens summed, the
            agents' features side by side. It ranks held-out pairs of the tutorial task at 0.648 against 0.520 for
            `"last"`, CoMLRL's, which `MARLHFTrainer` keeps (docs/benchmarks.md). A saved reward model keeps its own.
    """

    preference_num_candidates: int = field(default=8, metadata={"help": "Joint samples per row ranked into pairs."})
    preference_pairs_per_sample: int | None = field(default=16, metadata={"help": "At most this many pairs per row."})
    pair_selection: str = field(default="reward_gap", metadata={"help": "'reward_gap', 'random' or 'all'."})
    reward_model_name: str | None = field(default=None, metadata={"help": "Reward model's causal LM; None: agents'."})
    reward_model_device: str | None = field(default=None, metadata={"help": "Reward model's device; None: team's."})
    reward_learning_rate: float = field(default=1e-5, metadata={"help": "Reward model learning rate (> 0)."})
    reward_num_train_epochs: int = field(default=1, metadata={"help": "Passes over the preference pairs."})
    reward_train_batch_size: int = field(default=1, metadata={"help": "Pairs per reward-model step."})
    reward_max_length: int | None = field(default=None, metadata={"help": "Joint texts cut at this many tokens."})
    reward_freeze_backbone: bool = field(default=False, metadata={"help": "Train the reward head only."})
    # Beyond CoMLRL (whose head reads the last token): the pooling that ranked held-out pairs best in our measurements.
    reward_pooling: str = field(
        default="span_sums", metadata={"help": f"A new reward head's pooling: {REWARD_POOLINGS}."}
    )

    def __post_init__(self):
        check_reward_model_fields(self)
        super().__post_init__()


@dataclass
class MultiAgentRLHFConfig(RewardModelFields, MultiAgentGRPOConfig):
    r"""
    `MultiAgentGRPOConfig` (the online phase, `TrainingArguments` fields included) with the reward-model stage's
    fields (`RewardModelFields`: `preference_num_candidates`, `preference_pairs_per_sample`, `pair_selection`,
    `reward_model_name`, `reward_model_device`, `reward_learning_rate`, `reward_num_train_epochs`,
    `reward_train_batch_size`, `reward_max_length`, `reward_freeze_backbone`, `reward_pooling`).
    """


def load_reward_model(source, args, setting: str = "reward_model_name") -> JointRewardModel:
    """A `JointRewardModel` from `source` (a saved reward model with its head, or a causal LM with a new head), with
    `args`' loading kwargs, `reward_freeze_backbone` and `reward_max_length`."""
    if not isinstance(source, (str, os.PathLike)) or not source:
        raise ValueError(
            f"The reward model needs a causal LM: set `{setting}` (a model id or path) when the agents are given as "
            "model objects, or pass `reward_model=` (a JointRewardModel)."
        )
    kwargs = dict(args.model_init_kwargs or {})
    kwargs.pop("device_map", None)  # placed on `reward_model_device` afterwards
    load = JointRewardModel.from_pretrained
    if not JointRewardModel.is_saved(str(source)):  # a new head, read as the config says (CoMLRL's: "last")
        load, pooling = JointRewardModel.from_causal_lm, getattr(args, "reward_pooling", "last")
        kwargs.update(pooling=pooling, num_agents=args.num_agents if pooling in SPAN_POOLINGS else None)
    try:
        return load(
            str(source), freeze_backbone=args.reward_freeze_backbone, max_length=args.reward_max_length, **kwargs
        )
    except (OSError, ValueError) as error:
        raise ValueError(
            f"Cannot build the reward model from {str(source)!r}: {error} Set `{setting}` to a causal LM (id or path) "
            "with a tokenizer."
        ) from error


def reward_device(spec: str | None, accelerator) -> torch.device:
    """`reward_model_device`; `None`, or CUDA where there is none, is the team's device (and with several processes
    each keeps its own copy on its own device)."""
    team = accelerator.device
    if spec is None:
        return team
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        logger.warning("`reward_model_device=%r` but CUDA is not available; the reward model goes on %s.", spec, team)
        return team
    if accelerator.num_processes > 1 and device != team:
        logger.warning(
            "With several processes each keeps its own reward model on its device (%s), not %r.", team, spec
        )
        return team
    if device.type == "meta":
        raise ValueError(
            f"`reward_model_device={spec!r}` holds no weights: give a device that computes ('cuda:0', 'cpu'), or None "
            "for the team's device."
        )
    try:  # a device this torch or machine lacks ('mps', 'xpu') fails here, not at the first weight moved
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(
            f"`reward_model_device={spec!r}` is not on this machine ({error}): give 'cpu', or None for the team's "
            "device."
        ) from error
    return device


class RewardModelStage:
    """The reward-model stage of RLHF, mixed into a `MultiAgentGRPOTrainer` subclass (before it in the bases): pairs
    and reward-model training at the start of `train()`, the reward model's raw scores as the training reward (the
    trainer's own reward functions and `reward_processor` stay for evaluation), the reward model saved with the team
    and in every checkpoint, and restored on resume. The config holds `MultiAgentRLHFConfig`'s reward fields."""

    def setup_reward_model(
        self, reward_model: JointRewardModel | None, preference_pairs: Sequence[JointPreferencePair] | None, source
    ) -> None:
        """Build (from `source`, or `args.reward_model_name`) or adopt the reward model, and keep the given pairs."""
        args = self.args
        if reward_model is not None and not isinstance(reward_model, JointRewardModel):
            raise TypeError(
                f"`reward_model` must be a multiagent_trl JointRewardModel, got {type(reward_model).__name__}."
            )
        self.reward_device = reward_device(args.reward_model_device, self.accelerator)
        if reward_model is None:
            reward_model = load_reward_model(args.reward_model_name or source, args)
        else:
            if args.reward_freeze_backbone:
                reward_model.backbone.requires_grad_(False)
            if args.reward_max_length is not None:
                reward_model.max_length = args.reward_max_length
            if reward_model.tokenizer is None:
                raise ValueError("`reward_model` has no tokenizer: build it with one to score joint texts.")
        if reward_model.num_agents is not None and reward_model.num_agents != self.num_agents:
            raise ValueError(
                f"`reward_model` pools {reward_model.num_agents} agents' responses (`pooling={reward_model.pooling!r}`"
                f"), but the team has {self.num_agents}: build it with `num_agents={self.num_agents}`."
            )
        self.reward_model = reward_model.to(self.reward_device)
        self.given_preference_pairs = check_preference_pairs(preference_pairs, self.num_agents)
        self.preference_pairs: list[JointPreferencePair] = []
        self.reward_model_history: list[dict[str, float]] = []
        self._online_reward: Callable | None = None  # the reward model as the training reward, once trained

    def reward_model_folder(self, output_dir: str) -> str:
        """Where the reward model is saved under `output_dir` (a checkpoint or `save_model`'s folder)."""
        return os.path.join(output_dir, REWARD_MODEL_DIR)

    def train_reward_stage(self) -> None:
        """The given pairs, or pairs drawn from the current policies and ranked by the task reward (K candidates of
        `generation_batch_size // K` prompts per generation call, as the iterative rounds draw); then the reward model
        trained on them, its summary in the first training log."""
        args = self.args
        if self.given_preference_pairs is not None:
            self.preference_pairs = list(self.given_preference_pairs)
        else:
            self.preference_pairs = collect_preference_pairs(
                self,
                self.train_dataset,
                args.preference_num_candidates,
                args.pair_selection,
                args.preference_pairs_per_sample,
                items_per_call=prompts_per_call(
                    args.generation_batch_size, args.preference_num_candidates, self.accelerator.num_processes
                ),
            )
        self.fit_reward_model(self.preference_pairs)

    def fit_reward_model(self, pairs: list[JointPreferencePair]) -> list[dict[str, float]]:
        """Train the reward model on `pairs` with the config's reward fields (Bradley-Terry); keep the pairs and the
        history as `preference_pairs` and `reward_model_history`, and put the summary (`reward_model/*`) in the next
        training log. Returns the history, one record per step."""
        args = self.args
        history = train_reward_model(
            self.reward_model,
            pairs,
            learning_rate=args.reward_learning_rate,
            num_train_epochs=args.reward_num_train_epochs,
            batch_size=args.reward_train_batch_size,
        )
        # Each process trained its own copy on the same pairs, but their random states (the batches' shuffle,
        # dropout) part during sampling: every process takes the main process's, which is the one saved.
        if self.accelerator.num_processes > 1:
            for tensor in self.reward_model.state_dict().values():
                tensor.copy_(broadcast(tensor.clone()))
        self.preference_pairs, self.reward_model_history = list(pairs), history
        self.add_metrics({key: [value] for key, value in summarize(history, len(pairs)).items()})
        return history

    def restore_reward_model(self, checkpoint: str) -> bool:
        """Load the reward model saved in `checkpoint/reward_model/`, if there is one."""
        folder = self.reward_model_folder(checkpoint)
        if not os.path.isdir(folder):
            return False
        kwargs = {k: v for k, v in (self.args.model_init_kwargs or {}).items() if k != "device_map"}
        saved = JointRewardModel.from_pretrained(folder, **kwargs)
        self.reward_model.load_state_dict(saved.state_dict())
        self.reward_model.eval()
        return True

    def prepare_online_reward(self, checkpoint: str | bool | None, output_dir: str | None = None) -> None:
        """Before online training: restore the reward model from `checkpoint` (`True`: the latest in `output_dir`),
        else train it (once per trainer), then score training batches with it."""
        if hasattr(self.train_dataset, "__len__"):  # one that fills no generation batch raises before the stage's work
            self._get_train_sampler(self.train_dataset)
        if checkpoint is True:
            folder = output_dir or self.args.output_dir
            checkpoint = get_last_checkpoint(folder)
            if checkpoint is None:  # Trainer's refusal, before the stage spends its draw and training
                raise ValueError(f"No valid checkpoint found in output directory ({folder})")
        if isinstance(checkpoint, str):
            self.check_checkpoint(checkpoint)  # the whole checkpoint, before the reward model is loaded from it
        restored = isinstance(checkpoint, str) and self.restore_reward_model(checkpoint)
        if self._online_reward is None and not restored:
            self.train_reward_stage()
        self._online_reward = bind_joint_scorer(self.reward_model, self.num_agents)

    def checkpoint_files(self, folder: str) -> list[str]:
        """With `reward_model/` in the checkpoint, every file of the saved reward model: one missing its head is
        refused, not resumed from with a new head."""
        files = super().checkpoint_files(folder)
        saved = self.reward_model_folder(folder)
        if os.path.isdir(saved):
            files += [os.path.join(REWARD_MODEL_DIR, name) for name in JointRewardModel.saved_files(saved)]
        return files

    @contextmanager
    def scored_by(self, scorer: Callable, reward_processor: Callable[[float], float] | None = None) -> Iterator[None]:
        """Inside the block, sampled joint candidates are scored by `scorer` alone (a bound reward function, e.g. a
        joint reward model bound with `bind_joint_scorer`), with no reward weights and only `reward_processor` (none:
        raw scores)."""
        with self._swap(
            reward_funcs=[scorer],
            reward_func_names=[scorer.__name__],
            reward_weights=torch.ones(1, device=self.reward_weights.device),
            reward_processing_classes=[None],
            reward_processor=reward_processor,
        ):
            yield

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        # Training batches are scored by the reward model, raw (no processor); evaluation keeps the task reward.
        if not self.model.training or self._online_reward is None:
            return super()._generate_and_score_completions(inputs)
        with self.scored_by(self._online_reward):
            return super()._generate_and_score_completions(inputs)

    def _load_best_model(self) -> None:
        # `load_best_model_at_end`: the best checkpoint's agents come with the reward model they trained on, which
        # iterative RLHF retrains every round.
        super()._load_best_model()
        if self._online_reward is not None:
            self.restore_reward_model(self.state.best_model_checkpoint)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """The team (as the trainer saves it) and, once trained, the reward model (`output_dir/reward_model/`,
        reloadable with `JointRewardModel.from_pretrained`). Trainer's checkpoints go through here too."""
        super().save_model(output_dir, _internal_call)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if self._online_reward is not None and self.accelerator.is_main_process:
            self.reward_model.save_pretrained(self.reward_model_folder(output_dir))


def check_preference_pairs(pairs, num_agents: int) -> list[JointPreferencePair] | None:
    """`preference_pairs` as a list of `JointPreferencePair` of `num_agents` agents each, or `None`."""
    if pairs is None:
        return None
    pairs = list(pairs)
    if not pairs:
        raise ValueError("`preference_pairs` is empty: give at least one JointPreferencePair, or None to draw them.")
    for k, pair in enumerate(pairs):
        if not isinstance(pair, JointPreferencePair):
            raise TypeError(f"`preference_pairs[{k}]` must be a JointPreferencePair, got {type(pair).__name__}.")
        if not len(pair.prompts) == len(pair.chosen) == len(pair.rejected) == num_agents:
            raise ValueError(
                f"`preference_pairs[{k}]` must hold {num_agents} prompts, chosen and rejected completions (one per "
                f"agent), got {len(pair.prompts)}, {len(pair.chosen)} and {len(pair.rejected)}."
            )
    return pairs


class RLHFTrainerBase(RewardModelStage):
    """TRL's trainer arguments and `train()` for a native RLHF trainer: `RewardModelStage` on a team trainer (the
    class after this one in the bases), with `config_class` its config. `MultiAgentRLHFTrainer` (MAGRPO online) and
    `ActorCriticRLHFTrainer` (actor-critic online) are this on `MultiAgentGRPOTrainer` and `ActorCriticTrainer`; the
    arguments are documented on `MultiAgentRLHFTrainer`.
    """

    config_class: type = RewardModelFields

    def __init__(
        self,
        model=None,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: RewardModelFields | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        *,
        reward_model: JointRewardModel | None = None,
        preference_pairs: Sequence[JointPreferencePair] | None = None,
        **kwargs,
    ):
        config_name, trainer_name = self.config_class.__name__, type(self).__name__
        if args is not None and not isinstance(args, self.config_class):
            article = "an" if config_name[0] in "AEIOU" else "a"
            raise TypeError(f"`args` is a {type(args).__name__}; {trainer_name} needs {article} {config_name}.")
        if args is None:
            name = model if isinstance(model, str) else "model"
            args = self.config_class(f"{name.split('/')[-1]}-RLHF")
        if reward_funcs is None:
            raise ValueError(
                "`reward_funcs` (the task reward) is required: it ranks the team's samples into preference pairs and "
                "scores evaluation; the reward model is trained from it (or from `preference_pairs`)."
            )
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            **kwargs,
        )
        source = model[0] if isinstance(model, (list, tuple)) and model else model
        self.setup_reward_model(reward_model, preference_pairs, source if isinstance(source, str) else None)

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train`, after the reward-model stage (restored from `resume_from_checkpoint` when it holds one)."""
        if self.train_dataset is None:
            raise ValueError("Training needs a `train_dataset`: pass `train_dataset=` to the trainer.")
        self.prepare_online_reward(resume_from_checkpoint)
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)


class MultiAgentRLHFTrainer(RLHFTrainerBase, MultiAgentGRPOTrainer):
    """Multi-agent RLHF: a `MultiAgentGRPOTrainer` that trains on a `JointRewardModel`'s scores and evaluates on the
    task reward (see the module docstring).

    Args:
        model, args, train_dataset, eval_dataset, processing_class, callbacks, optimizers, peft_config, **kwargs:
            As `MultiAgentGRPOTrainer`'s (`args` a `MultiAgentRLHFConfig`).
        reward_funcs: The task reward (as `MultiAgentGRPOTrainer`'s `reward_funcs`, with `reward_processor`): it ranks
            the team's joint samples into pairs and scores evaluation. Required.
        reward_model (`JointRewardModel`, *optional*): the reward model to train; `None` builds one from
            `args.reward_model_name`, else the agents' model.
        preference_pairs (list of `JointPreferencePair`, *optional*): train the reward model on these (e.g. human
            preferences) instead of pairs drawn from the team.

    After `train()`: `trainer.reward_model` (trained), `trainer.preference_pairs`, `trainer.reward_model_history`.
    """

    config_class = MultiAgentRLHFConfig


__all__ = [
    "MultiAgentRLHFConfig",
    "RLHFTrainerBase",
    "RewardModelFields",
    "MultiAgentRLHFTrainer",
    "RewardModelStage",
    "check_reward_model_fields",
    "load_reward_model",
    "reward_device",
]
