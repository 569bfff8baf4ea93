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

    def check(self, rows: int, source: str) -> Rollout:
        """Raise a `ValueError` naming `source` (what produced this rollout) unless it holds `rows` rows, and each
        row's `tool_mask` (a `rollout_func`'s `env_mask`) is as long as its completion."""
        for name in ("prompt_ids", "completion_ids", "completions"):
            if len(getattr(self, name)) != rows:
                raise ValueError(
                    f"{source} returned {len(getattr(self, name))} `{name}` for {rows} prompts: return one per prompt."
                )
        masks = self.tool_mask or []
        bad = next((k for k, (m, ids) in enumerate(zip(masks, self.completion_ids)) if len(m) != len(ids)), None)
        if bad is not None or (masks and len(masks) != rows):
            raise ValueError(
                f"{source} returned an `env_mask` that does not match its completions (row {bad}): one 0/1 per "
                "completion token, for every prompt."
            )
        return self

    def to_trl(self) -> tuple:
        """The tuple `GRPOTrainer._generate` returns, to replay this rollout to TRL."""
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def masked(self, keep: list[bool]) -> Rollout:
        """This rollout with the completions of the rows not kept marked as not the model's (TRL's `tool_mask`), so
        they get no loss; a kept row keeps its own mask (tool results, a `rollout_func`'s `env_mask`)."""
        own = self.tool_mask if self.tool_mask is not None else [[1] * len(ids) for ids in self.completion_ids]
        tool_mask = [mask if k else [0] * len(mask) for mask, k in zip(own, keep, strict=True)]
        return dataclasses.replace(self, tool_mask=tool_mask)

    @staticmethod
    def concat(rollouts: list[Rollout], rows: list[int] | None = None) -> Rollout:
        """The rollouts one after the other (one agent's turns), optionally only `rows` of the result. Per-row fields
        are joined; `tool_mask` is all ones where a part had none."""
        sizes = [len(r.completion_ids) for r in rollouts]
        rows = list(range(sum(sizes))) if rows is None else rows

        def joined(name: str, fill=None) -> list | None:
            parts = [getattr(r, name) for r in rollouts]
            if all(part is None for part in parts):
                return None
            values = [v for part, n, r in zip(parts, sizes, rollouts) for v in (part if part is not None else fill(r))]
            return [values[k] for k in rows]

        ones = lambda r: [[1] * len(ids) for ids in r.completion_ids]  # noqa: E731
        extra = {}
        for key in rollouts[0].extra_fields:
            parts = [r.extra_fields.get(key) for r in rollouts]
            per_row = all(isinstance(p, list) and len(p) == n for p, n in zip(parts, sizes))
            extra[key] = [v for p in parts for v in p] if per_row else parts[0]
            if per_row:
                extra[key] = [extra[key][k] for k in rows]
        return Rollout(
            prompt_ids=joined("prompt_ids"),
            completion_ids=joined("completion_ids"),
            tool_mask=joined("tool_mask", ones),
            completions=joined("completions"),
            logprobs=joined("logprobs", lambda r: [None] * len(r.completion_ids)),
            extra_fields=extra,
            images=joined("images", lambda r: [None] * len(r.completion_ids)),
            tool_images=joined("tool_images") if all(len(r.tool_images) == n for r, n in zip(rollouts, sizes)) else [],
        )


@dataclass
class Replay:
    """What TRL's hooks return, inside one agent's pass, instead of computing it again.

    `completion_ids` (and `logprobs`) answer `_generate_single_turn` (this agent's rows of a batched generation);
    `rollout` answers `_generate` and `rewards` answers `_calculate_rewards` (the agent's generation and its credited
    joint rewards, while TRL's `_generate_and_score_completions` computes its advantages and log-probs).
    """

    completion_ids: list[list[int]] | None = None
    logprobs: list[list[float]] | None = None  # the sampled tokens' log-probs, with `completion_ids` (vLLM)
    rollout: Rollout | None = None
    rewards: torch.Tensor | None = None  # (rows, reward columns), gathered across processes as TRL's are


def loss_parts(inputs: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """Split a team batch into `(agent, batch)` parts by the keys' `agent_{i}/` prefix."""
    parts: dict[int, dict[str, Any]] = {}
    for key, value in inputs.items():
        agent, rest = key.split("/", 1)
        parts.setdefault(int(agent.removeprefix("agent_")), {})[rest] = value
    return list(parts.items())
