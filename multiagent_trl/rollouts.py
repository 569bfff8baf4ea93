"""Named rollouts: TRL's generation output unpacked once, and what the per-agent pass replays to TRL.

`GRPOTrainer._generate` returns a positional tuple. The trainer unpacks it into a `Rollout` in one place
(`Rollout.from_trl`), so the rest of the code reads names; `tests/test_trl_contract.py` checks the field order
against TRL's own `return` statement, so a reordering in TRL fails there instead of passing wrong values along.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Rollout:
    """One agent's generation batch, as `GRPOTrainer._generate` returns it, field for field, in TRL's order."""

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    tool_mask: list[list[int]] | None  # 1 for the model's tokens, 0 for tokens it did not write (no loss on them)
    completions: list  # decoded: strings, or conversations (lists of messages)
    logprobs: list | None
    extra_fields: dict[str, Any]
    images: list | None
    tool_images: list

    @classmethod
    def from_trl(cls, output: tuple) -> Rollout:
        """Name the tuple returned by `GRPOTrainer._generate`."""
        names = [f.name for f in dataclasses.fields(cls)]
        if len(output) != len(names):
            raise RuntimeError(
                f"GRPOTrainer._generate returned {len(output)} values; multiagent_trl expects {len(names)} ({names}). "
                "The installed TRL does not match the version this library supports (see pyproject.toml)."
            )
        return cls(*output)

    def to_trl(self) -> tuple:
        """The tuple `GRPOTrainer._generate` returns, to replay this rollout to TRL."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def masked(self, active: list[bool]) -> Rollout:
        """This rollout with the completions of inactive rows marked as not the model's (TRL's `tool_mask`), so they
        get no loss: how an ended multi-turn trajectory stays in the batch."""
        tool_mask = [[int(a)] * len(ids) for ids, a in zip(self.completion_ids, active, strict=True)]
        return dataclasses.replace(self, tool_mask=tool_mask)


@dataclass
class Replay:
    """What TRL's hooks return, inside one agent's pass, instead of computing it again.

    `completion_ids` answers `_generate_single_turn` (this agent's rows of a batched LoRA generation); `rollout`
    answers `_generate` and `rewards` answers `_calculate_rewards` (the agent's generation and its credited joint
    rewards, while TRL's `_generate_and_score_completions` computes its advantages and log-probs).
    """

    completion_ids: list[list[int]] | None = None
    rollout: Rollout | None = None
    rewards: torch.Tensor | None = None  # (rows, reward columns), gathered across processes as TRL's are
