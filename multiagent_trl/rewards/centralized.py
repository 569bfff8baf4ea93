"""Centralized collaboration: one model writes every role's output from one joint prompt, and its answer is split
into the roles for the reward, so the same joint reward functions score a centralized team and a decentralized one
side by side.

Three plain-data pieces, no model and no trainer:

- an adapter (`CentralizedComparatorAdapter`, the protocol): `build_prompt(item, role_prompts) -> str` writes the
  joint prompt from each role's own prompt; `parse_completion(completion, item, num_roles) -> list[str]` splits the
  joint answer, raising `CentralizedComparatorParseError` where it finds no role at all;
- `TaggedCentralizedComparatorAdapter`, CoMLRL 1.4.3's domain-neutral adapter: the roles answer in
  `<agent_i>...</agent_i>` sections (its prompt text, byte for byte, is the protocol);
- `CentralizedCollaboration`: the role formatters as one prompt formatter (`build_prompt`), and a joint reward
  function on the roles as a reward on the joint completion (calling it is scoring).

With the core trainer, a team of one writes for every role (TRL's GRPO on one model, `num_agents=1`):

```python
from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.rewards.centralized import CentralizedCollaboration, TaggedCentralizedComparatorAdapter


def length_ratio(completions1, completions2):  # the decentralized team's reward, unchanged
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


team = CentralizedCollaboration(TaggedCentralizedComparatorAdapter(), formatters=None, reward_func=length_ratio,
                                num_roles=2)
trainer = MultiAgentGRPOTrainer(
    model="Qwen/Qwen2.5-0.5B", reward_funcs=team, formatters=team.build_prompt, train_dataset=dataset,
    args=MultiAgentGRPOConfig(num_agents=1, output_dir="centralized"),
)
```

`multiagent_trl.comlrl.centralized.CentralizedMAGRPOTrainer` is the same with CoMLRL's names and defaults.
"""

from __future__ import annotations

import functools
import numbers
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from trl.trainer.utils import get_callable_name, is_async_callable

from ..common import per_agent
from .joint import ROWS_COLUMN, TRL_STYLE, bind_reward, reward_range


class CentralizedComparatorParseError(ValueError):
    """A joint completion has no role's section at all (CoMLRL's name; a `ValueError`)."""


@runtime_checkable
class CentralizedComparatorAdapter(Protocol):
    """What a centralized team needs from its domain: one joint prompt from the roles' prompts, and the roles'
    outputs from one joint completion."""

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """The one prompt that asks a model for every role's output (`agent_prompts`: each role's own prompt)."""
        ...

    def parse_completion(self, completion: str, batch_item: dict[str, Any], num_agents: int) -> Sequence[str]:
        """`num_agents` role outputs from one joint completion; raise `CentralizedComparatorParseError` where it
        holds none."""
        ...


@dataclass(frozen=True)
class TaggedCentralizedComparatorAdapter:
    """CoMLRL 1.4.3's default adapter: the joint prompt lists each role's prompt and asks for one
    `<agent_i>...</agent_i>` section per role.

    >>> adapter = TaggedCentralizedComparatorAdapter()
    >>> adapter.parse_completion("<AGENT_1> b </agent_1> <agent_0>a</agent_0>", {}, 3)
    ['a', 'b', '']
    """

    def build_prompt(self, batch_item: dict[str, Any], agent_prompts: Sequence[str]) -> str:
        """The joint prompt, CoMLRL's text exactly (a protocol shared with models trained there); ends with a
        newline. `batch_item` is not read."""
        count = len(agent_prompts)
        originals = "\n\n".join(f"Agent {i} original prompt:\n{prompt}" for i, prompt in enumerate(agent_prompts))
        sections = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(count))
        return (
            f"You are a centralized coordinator producing the separate outputs of {count} agents.\n"
            "\n"
            "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n"
            "do not merge them or add commentary outside the required tags.\n"
            "\n"
            f"{originals}\n"
            "\n"
            "Return exactly one section for each agent in this format:\n"
            f"{sections}\n"
        )

    def parse_completion(self, completion: str, batch_item: dict[str, Any], num_agents: int) -> list[str]:
        """Role i's output: the text of the first `<agent_i>...</agent_i>` section (tags case-insensitive, spaces
        allowed inside them), stripped; `""` for a role without one. Raises `CentralizedComparatorParseError` when
        no role has a section."""
        text = str(completion)
        outputs, found = [], False
        for i in range(num_agents):
            match = re.search(rf"<\s*agent_{i}\s*>(.*?)<\s*/\s*agent_{i}\s*>", text, flags=re.IGNORECASE | re.DOTALL)
            found = found or match is not None
            outputs.append(match.group(1).strip() if match else "")
        if not found:
            raise CentralizedComparatorParseError(
                f"The joint completion has no <agent_i>...</agent_i> section for any of the {num_agents} roles."
            )
        return outputs


def check_adapter(adapter: Any, argument: str = "centralized_adapter") -> None:
    """Raise a `TypeError` unless `adapter` has callable `build_prompt` and `parse_completion` (`argument`: the
    name the user gave it under, for the message)."""
    for name in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, name, None)):
            raise TypeError(
                f"`{argument}` ({type(adapter).__name__}) has no callable `{name}`: an adapter needs "
                "`build_prompt(item, agent_prompts) -> str` and `parse_completion(completion, item, num_agents) -> "
                "list[str]` (TaggedCentralizedComparatorAdapter() is CoMLRL's)."
            )


class CentralizedCollaboration:
    """A team's task for one model writing every role: the roles' formatters as one prompt formatter, and a joint
    reward function on the roles as a reward function on the joint completion.

    Args:
        adapter: A `CentralizedComparatorAdapter` (`TaggedCentralizedComparatorAdapter()`, CoMLRL's).
        formatters: Each role's formatter, `formatter(row) -> prompt` (one for all, or one per role); `None` reads
            the row's `"prompt"` (`""` without one), as CoMLRL.
        reward_func: The joint reward of the roles' outputs, in either convention of `rewards.joint` (CoMLRL's
            `f(completions1, ..., completionsR)`, with `batch_items=`/`prompts=` where it names them; or TRL's
            `f(prompts, completions, **kwargs)` with `completions[j]` the tuple of the roles' outputs). It is called
            once per joint completion, and must return exactly one number (or `None`, "no reward") for it.
        num_roles: How many roles the model writes.

    Calling the collaboration, `collaboration(joint_completions, prompts=None, batch_items=rows)`, returns one reward
    per joint completion: each is split with the adapter (a completion without any section is every role's `""`, and
    is still rewarded, as CoMLRL does) and the roles are scored with `reward_func` on the completion's row. Its
    signature is the CoMLRL convention of a team of one, so the core trainer hands it the rows. `reward_range` is the
    user function's.
    """

    def __init__(self, adapter, formatters, reward_func: Callable, num_roles: int):
        check_adapter(adapter)
        if not isinstance(num_roles, int) or isinstance(num_roles, bool) or num_roles < 1:
            raise ValueError(f"`num_roles` must be a positive integer, got {num_roles!r}.")
        if not callable(reward_func):
            raise TypeError(f"`reward_func` must be callable, got {reward_func!r}.")
        if is_async_callable(reward_func):
            raise TypeError("`reward_func` is async: a centralized team's reward is called once per joint completion.")
        self.adapter, self.num_roles, self.reward_func = adapter, num_roles, reward_func
        self.formatters = per_agent("formatters", formatters, num_roles) or [_row_prompt] * num_roles
        if any(not callable(f) for f in self.formatters):
            raise TypeError(f"`formatters` must be callables, `formatter(row) -> prompt`; got {formatters!r}.")
        # Read the convention now (a bad signature raises here); a number alone is a list of one, as CoMLRL reads it.
        self._bound = bind_reward(_number_as_list(reward_func), num_roles)
        self.reward_range = reward_range(reward_func)
        self.__name__ = get_callable_name(reward_func)  # logged as the user's reward (`rewards/<name>/mean`)

    def role_prompts(self, item: dict[str, Any]) -> list:
        """Each role's own prompt for `item`."""
        return [formatter(item) for formatter in self.formatters]

    def build_prompt(self, item: dict[str, Any]) -> str:
        """The joint prompt of `item` (a formatter for the model that writes every role). Raises a `ValueError`
        where the adapter builds an empty or non-string prompt."""
        prompt = self.adapter.build_prompt(item, self.role_prompts(item))
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"The centralized adapter built {prompt!r} for a row: it must build a non-empty prompt.")
        return prompt

    def split(self, completion: str, item: dict[str, Any]) -> list[str]:
        """The roles' outputs of one joint completion: every role `""` where the adapter finds none."""
        try:
            outputs = self.adapter.parse_completion(completion, item, self.num_roles)
        except CentralizedComparatorParseError:
            outputs = [""] * self.num_roles
        if isinstance(outputs, (str, bytes)):
            raise TypeError("The centralized adapter's `parse_completion` returned a string; it must return a list.")
        outputs = list(outputs)
        if len(outputs) != self.num_roles:
            raise ValueError(
                f"The centralized adapter's `parse_completion` returned {len(outputs)} outputs for {self.num_roles} "
                "roles: it must return one per role."
            )
        if not all(isinstance(output, str) for output in outputs):
            raise TypeError("The centralized adapter's `parse_completion` must return strings only.")
        return outputs

    def __call__(self, joint_completions, *, prompts=None, batch_items=None) -> list[float | None]:
        # `prompts` (the joint prompts) is accepted as CoMLRL passes it; the roles' reward gets the roles' prompts.
        completions = list(joint_completions)
        if not batch_items:
            raise ValueError("A centralized reward needs `batch_items`: each joint completion's dataset row.")
        if len(batch_items) not in (1, len(completions)):
            raise ValueError(
                f"{len(completions)} joint completions but {len(batch_items)} `batch_items`: give one row for all, "
                "or one per completion."
            )
        return [self.score(c, batch_items[0 if len(batch_items) == 1 else j]) for j, c in enumerate(completions)]

    def score(self, completion: str, item: dict[str, Any]) -> float | None:
        """The reward of one joint completion on its row `item`."""
        outputs, role_prompts = self.split(completion, item), self.role_prompts(item)
        joint = self.num_roles > 1  # with one role the reward sees plain values, as a team of one
        kwargs = {ROWS_COLUMN: [item]}
        if self._bound.style == TRL_STYLE:  # TRL's keywords: the row's columns (not its prompt), one value each
            kwargs = {key: [value] for key, value in item.items() if key != "prompt"}
        values = self._bound(
            [tuple(role_prompts) if joint else role_prompts[0]], [tuple(outputs) if joint else outputs[0]], **kwargs
        )
        if self._bound.agent_rewards is not None:
            self._bound.agent_rewards = None
            raise ValueError(
                f"Reward function '{self.__name__}' returned one reward per role; a centralized team's reward must "
                "return one joint reward per joint completion."
            )
        return values[0]

    def split_eval(self, joint_turns: Sequence[Sequence[Sequence[str]]], items: Sequence[dict]) -> list[list[list]]:
        """Evaluation's joint completions, `[1][item][turn]` (one writer), as the roles' outputs `[role][item][turn]`
        (what CoMLRL's `eval_logger` receives)."""
        if len(joint_turns) != 1 or len(joint_turns[0]) != len(items):
            raise ValueError("Centralized evaluation outputs must be one writer's, one list of turns per row.")
        outputs = [[] for _ in range(self.num_roles)]
        for turns, item in zip(joint_turns[0], items, strict=True):
            rows = [self.split(completion, item) for completion in turns]  # (turns, roles)
            for role in range(self.num_roles):
                outputs[role].append([row[role] for row in rows])
        return outputs


def _number_as_list(func: Callable) -> Callable:
    """`func`, returning `[x]` where it returns a number `x` (the same signature, name and attributes)."""

    @functools.wraps(func)
    def wrapped(*args, **kwargs):
        value = func(*args, **kwargs)
        if isinstance(value, numbers.Real) or (isinstance(value, torch.Tensor) and value.dim() == 0):
            return [value]
        return value

    return wrapped


def _row_prompt(item: dict[str, Any]) -> str:
    """CoMLRL's default role formatter: the row's `"prompt"`, `""` without one."""
    return item.get("prompt", "")
