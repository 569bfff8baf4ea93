"""Iterative multi-agent RLHF through one `Trainer.train`: `MultiAgentIterativeRLHFConfig` /
`MultiAgentIterativeRLHFTrainer`.

A run is `num_train_epochs` rounds (TRL's epochs). At the start of each round (`IterativeRounds`): the current agents
play every training prompt as the policy (K = `preference_num_candidates` joint candidates) and as the comparator
(K' = `comparator_num_generations`), ranked by the task reward; the round's pairs go to `replay_dir` and `replay_mode`
picks the training pairs. The joint reward model (`RewardModelStage`) is then trained on them with the Bradley-Terry
loss (continuing from the last round's weights, or from its initial ones with `reward_model_reset=True`), and the
round's online epoch trains the team on its raw scores (`num_generations` completions per prompt, as
`MultiAgentRLHFTrainer`). Evaluation keeps the task reward.

Everything else is Trainer's over the whole run: one optimizer, one learning-rate schedule, one `global_step`,
callbacks, logging, checkpoints (each holding the reward model). Resuming inside a round reloads its shard and the
reward model saved in the checkpoint; the reward model is not trained again for that round. Single process only, as
iterative MADPO.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .iterative import IterativeRoundFields, IterativeRounds
from .reward_training import JointPreferencePair
from .rlhf import MultiAgentRLHFConfig, MultiAgentRLHFTrainer


@dataclass
class MultiAgentIterativeRLHFConfig(IterativeRoundFields, MultiAgentRLHFConfig):
    r"""
    Configuration for `MultiAgentIterativeRLHFTrainer`: every `MultiAgentRLHFConfig` field, the round fields of
    `MultiAgentIterativeDPOConfig` (`comparator`, `comparator_num_generations`, `replay_mode`, `replay_k`,
    `replay_lambda`, `replay_sample_size`, `replay_dir`), and:

    Parameters:
        reward_model_reset (`bool`, *optional*, defaults to `False`):
            Train each round's reward model from the weights it had at construction (`True`) rather than from the
            previous round's.

    `num_train_epochs` is the number of rounds; `preference_num_candidates` is K of a round's draw (the
    comparator's K' is `comparator_num_generations`, else K).
    """

    reward_model_reset: bool = field(default=False, metadata={"help": "Each round's reward model from its start."})

    def __post_init__(self):
        self.check_round_fields()
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


class MultiAgentIterativeRLHFTrainer(IterativeRounds, MultiAgentRLHFTrainer):
    """Iterative multi-agent RLHF: rounds of pairs, reward model and online training, by one `Trainer.train` (see the
    module docstring). Takes `MultiAgentRLHFTrainer`'s arguments but `preference_pairs` (the rounds draw them);
    `args` is a `MultiAgentIterativeRLHFConfig`.

    What differs from `MultiAgentRLHFTrainer`: no reward-model stage before training (`train_reward_stage`); instead
    `_generate_and_score_completions` (training) starts a round when a new epoch began. After `train()`:
    `reward_model_histories` (one per round trained), `preference_pairs` (the last round's). Logs `round/index`,
    `round/pairs`, `round/train_pairs` and the reward model's `reward_model/...` at each round.
    """

    _tag_names = ["trl", "grpo", "multiagent-trl", "rlhf", "iterative"]
    _name = "Iterative multi-agent RLHF"

    def __init__(self, *args, **kwargs):
        config = kwargs.get("args", args[2] if len(args) > 2 else None)
        if config is not None and not isinstance(config, MultiAgentIterativeRLHFConfig):
            raise TypeError(
                f"`args` is a {type(config).__name__}; MultiAgentIterativeRLHFTrainer needs a "
                "MultiAgentIterativeRLHFConfig (every MultiAgentRLHFConfig field, plus the round fields)."
            )
        if kwargs.get("preference_pairs") is not None:
            raise ValueError(
                "`preference_pairs` is not taken by MultiAgentIterativeRLHFTrainer: each round draws its pairs from "
                "the team. Use MultiAgentRLHFTrainer to train the reward model on given pairs."
            )
        if config is None:
            kwargs["args"] = MultiAgentIterativeRLHFConfig(output_dir="rlhf-iterative-output")
        super().__init__(*args, **kwargs)
        if self.accelerator.num_processes > 1:
            raise NotImplementedError(
                "MultiAgentIterativeRLHFTrainer runs in one process for now: a round's pairs are not gathered across "
                "processes yet. Use MultiAgentRLHFTrainer for distributed runs."
            )
        # The reward model's start (trainable parameters only: frozen ones never change), for `reward_model_reset`.
        self.initial_reward_state = {
            name: p.detach().to("cpu", copy=True)
            for name, p in self.reward_model.named_parameters()
            if p.requires_grad
        }
        self.reward_model_histories: list[list[dict[str, float]]] = []

    @property
    def round_width(self) -> int:
        """A round's pairs are drawn from `preference_num_candidates` joint candidates per prompt."""
        return self.args.preference_num_candidates

    def train_reward_stage(self) -> None:
        # Departs from MultiAgentRLHFTrainer: no stage before training; each round trains the reward model.
        return None

    def reset_reward_model(self) -> None:
        """Put the reward model's trainable parameters back to their values at construction."""
        with torch.no_grad():
            for name, param in self.reward_model.named_parameters():
                if name in self.initial_reward_state:
                    param.copy_(self.initial_reward_state[name])

    def start_reward_round(self, index: int) -> None:
        """Round `index` (0-based): its pairs (`round_pairs_for`), then the reward model trained on them, unless the
        round was resumed (its reward model came back with the checkpoint)."""
        records = self.round_pairs_for(index)
        if self.round_reloaded:
            return
        if self.args.reward_model_reset:
            self.reset_reward_model()
        self.reward_model_histories.append(self.fit_reward_model([record_pair(record) for record in records]))

    def _generate_and_score_completions(self, inputs: list[dict]):
        if self.model.training:
            index = int(self.state.epoch or 0)  # a round is an epoch: Trainer counts them, resumes included
            if index != self.round_index:
                self.start_reward_round(index)
        return super()._generate_and_score_completions(inputs)


__all__ = ["MultiAgentIterativeRLHFConfig", "MultiAgentIterativeRLHFTrainer", "record_pair"]
