"""Joint rewards: binding a user's reward function to the agents' completions, reward processors, and credit.

A joint reward function scores tuples of completions, one completion per agent. Two calling conventions are
accepted and told apart from the function's signature:

- CoMLRL style, `f(completions1, completions2, ...)`: one list per agent, one float per joint sample.
- TRL style, `f(prompts, completions, **kwargs)`: `completions[j]` is the tuple of the N agents' completions of joint
  sample j (with one agent: the plain completion, exactly as in TRL); dataset columns arrive as keyword arguments;
  `None` means "no reward for this sample".
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from trl.trainer.utils import get_callable_name, is_async_callable

TRL_STYLE = "trl"
COMLRL_STYLE = "comlrl"


def reward_style(func: Callable, num_agents: int) -> str:
    """Tell which calling convention `func` follows, or raise a `TypeError` that says what fits.

    >>> reward_style(lambda prompts, completions, **kw: [0.0], num_agents=2)
    'trl'
    >>> reward_style(lambda c1, c2: [0.0], num_agents=2)
    'comlrl'
    """
    name = get_callable_name(func)
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError) as err:
        raise TypeError(f"Cannot read the signature of reward function '{name}'.") from err
    kinds = {p.kind for p in params}
    if any(p.name == "completions" and p.kind != p.VAR_POSITIONAL for p in params):
        return TRL_STYLE
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    if not positional and inspect.Parameter.VAR_POSITIONAL in kinds:
        return COMLRL_STYLE
    if not positional and inspect.Parameter.VAR_KEYWORD in kinds:  # f(**kwargs) takes TRL's keyword arguments
        return TRL_STYLE
    if positional and len(positional) == num_agents:
        return COMLRL_STYLE
    if positional:
        raise TypeError(
            f"Reward function '{name}' takes {len(positional)} completion arguments "
            f"({', '.join(p.name for p in positional)}) but there are {num_agents} agents. A CoMLRL-style reward "
            "takes "
            f"one list of completions per agent: f(completions1, ..., completions{num_agents}); or use the TRL style "
            "f(prompts, completions, **kwargs)."
        )
    raise TypeError(
        f"Reward function '{name}' fits neither reward convention. Use the CoMLRL style "
        f"f(completions1, ..., completions{num_agents}) with one list per agent, or the TRL style "
        "f(prompts, completions, **kwargs) where completions[j] is the tuple of the agents' completions."
    )


def check_rewards(values: Any, expected: int, name: str) -> list[float | None]:
    """Validate what a reward function returned: `expected` numbers (or `None`), none of them NaN or infinite.

    >>> check_rewards([1, 0.5, None], 3, "f")
    [1.0, 0.5, None]
    """
    try:
        values = list(values)
    except TypeError:
        raise TypeError(
            f"Reward function '{name}' returned {type(values).__name__}; it must return a list with one number (or "
            "None) per joint sample."
        ) from None
    if len(values) != expected:
        raise ValueError(
            f"Reward function '{name}' returned {len(values)} rewards but {expected} joint samples were scored; "
            "return exactly one reward per joint sample."
        )
    checked = []
    for j, value in enumerate(values):
        if value is None:
            checked.append(None)
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.item()
        if not isinstance(value, numbers.Real):
            raise TypeError(
                f"Reward function '{name}' returned {value!r} ({type(value).__name__}) for joint sample {j}; rewards "
                "must be real numbers, or None for 'no reward'."
            )
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(
                f"Reward function '{name}' returned {value} for joint sample {j}; rewards must be finite. Return None "
                "to mean 'no reward for this sample'."
            )
        checked.append(value)
    return checked


def bind_reward_funcs(
    reward_funcs, num_agents: int, reward_processing_classes=None, args=None, joint_text: Callable | None = None
) -> tuple[list, Any]:
    """The trainer's `reward_funcs`, and the `reward_processing_classes` to hand to TRL.

    Each user function is bound with `bind_reward`. A reward model (a model id or path, or an `nn.Module`) passes
    through to TRL with one agent; with several it becomes a `reward_models.JointRewardModel` that scores the text
    `joint_text` builds from each joint sample, with its tokenizer from `reward_processing_classes` (one for all
    functions, or one per function as in TRL; entries of plain functions are ignored). TRL then gets no processing
    classes: every function it sees is a callable.
    """
    if reward_funcs is None:
        raise ValueError("Pass a joint reward function: `reward_funcs=`.")
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if num_agents == 1:  # a team of one: TRL's own handling of reward models and their tokenizers
        classes = reward_processing_classes
    else:
        if reward_processing_classes is None:
            classes = [None] * len(funcs)
        elif isinstance(reward_processing_classes, (list, tuple)):
            classes = list(reward_processing_classes)
            if len(classes) != len(funcs):
                raise ValueError(
                    f"`reward_processing_classes` has {len(classes)} entries for {len(funcs)} reward functions: give "
                    "one per reward function (None for plain functions), or one tokenizer for all reward models."
                )
        else:
            classes = [reward_processing_classes] * len(funcs)
    bound = []
    for k, func in enumerate(funcs):
        if isinstance(func, (str, nn.Module)):
            if num_agents == 1:
                bound.append(func)
                continue
            from .reward_models import JointRewardModel  # loads transformers' auto classes only when needed

            init_kwargs = dict(getattr(args, "model_init_kwargs", None) or {})
            init_kwargs.setdefault("trust_remote_code", getattr(args, "trust_remote_code", False))
            bound.append(JointRewardModel(func, classes[k], joint_text, model_init_kwargs=init_kwargs))
        elif callable(func):
            bound.append(bind_reward(func, num_agents))
        else:
            raise TypeError(f"Reward functions must be callables, model ids or models; got {type(func).__name__}.")
    if joint_text is not None and not any(isinstance(f, (str, nn.Module)) for f in funcs):
        raise ValueError("`joint_text=` formats joint samples for reward models, but `reward_funcs` has none.")
    return bound, (classes if num_agents == 1 else None)


def bind_reward(func: Callable, num_agents: int) -> Callable:
    """Wrap a user reward function into TRL's reward signature, `f(prompts, completions, completion_ids, **kwargs)`.

    The trainer calls the wrapper with joint samples (`completions[j]` is a tuple of N completions when N > 1). The
    wrapper calls `func` in its own convention and validates what it returns. Async functions stay async, so that
    TRL runs them concurrently.
    """
    style = reward_style(func, num_agents)
    name = get_callable_name(func)

    def arguments(prompts, completions, kwargs) -> tuple[tuple, dict]:
        if style == COMLRL_STYLE:
            per_agent = [list(c) for c in zip(*completions)] if num_agents > 1 else [list(completions)]
            return tuple(per_agent), {}
        return (), {"prompts": prompts, "completions": completions, **kwargs}

    if is_async_callable(func):

        async def joint_reward(prompts, completions, **kwargs):
            args, kw = arguments(prompts, completions, kwargs)
            return check_rewards(await func(*args, **kw), len(completions), name)

    else:

        def joint_reward(prompts, completions, **kwargs):
            args, kw = arguments(prompts, completions, kwargs)
            return check_rewards(func(*args, **kw), len(completions), name)

    joint_reward.__name__ = name
    joint_reward.style = style
    return joint_reward


class RewardProcessor:
    """A function of one reward value, applied to the joint reward before advantages. Compose with `then`.

    >>> p = RewardProcessors.scale(100.0).then(RewardProcessors.shift(-1.0))
    >>> p(0.5)
    49.0
    """

    def __init__(self, func: Callable[[float], float], name: str):
        self.func = func
        self.name = name

    def __call__(self, reward: float) -> float:
        return self.func(reward)

    def then(self, other: Callable[[float], float]) -> RewardProcessor:
        """Return a processor that applies `self`, then `other`."""
        return RewardProcessor(lambda r: other(self(r)), f"{self.name} -> {getattr(other, 'name', other)}")

    def __repr__(self) -> str:
        return f"RewardProcessor({self.name})"


class RewardProcessors:
    """Ready reward processors (CoMLRL's names and more). Any `float -> float` callable works as a processor too."""

    @staticmethod
    def identity() -> RewardProcessor:
        """Leave the reward unchanged."""
        return RewardProcessor(lambda r: r, "identity")

    @staticmethod
    def scale(factor: float = 1.0) -> RewardProcessor:
        """Multiply the reward by `factor`.

        >>> RewardProcessors.scale(100.0)(0.25)
        25.0
        """
        return RewardProcessor(lambda r: r * factor, f"scale({factor})")

    @staticmethod
    def shift(value: float = 0.0) -> RewardProcessor:
        """Add `value` to the reward.

        >>> RewardProcessors.shift(-0.5)(1.0)
        0.5
        """
        return RewardProcessor(lambda r: r + value, f"shift({value})")

    @staticmethod
    def clip(min_value: float | None = None, max_value: float | None = None) -> RewardProcessor:
        """Clamp the reward to `[min_value, max_value]` (either bound may be `None`).

        >>> RewardProcessors.clip(0.0, 1.0)(3.0)
        1.0
        """
        lo = -math.inf if min_value is None else min_value
        hi = math.inf if max_value is None else max_value
        return RewardProcessor(lambda r: min(max(r, lo), hi), f"clip({min_value}, {max_value})")

    @staticmethod
    def compose(*processors: Callable[[float], float]) -> RewardProcessor:
        """Apply `processors` left to right.

        >>> RewardProcessors.compose(RewardProcessors.shift(1.0), RewardProcessors.scale(2.0))(0.0)
        2.0
        """
        return functools.reduce(lambda acc, p: acc.then(p), processors, RewardProcessors.identity())


def apply_processor(processor: Callable[[float], float], rewards: torch.Tensor) -> torch.Tensor:
    """Apply a per-value processor to a 1-D reward tensor; NaN ("no reward") stays NaN."""
    values = [math.nan if math.isnan(r) else float(processor(r)) for r in rewards.tolist()]
    return torch.tensor(values, dtype=rewards.dtype, device=rewards.device)


def cross_tuples(num_generations: int, num_agents: int) -> list[tuple[int, ...]]:
    """Indices of every joint tuple of one prompt group in `joint_mode="cross"`, agent 0's index slowest.

    >>> cross_tuples(2, 2)
    [(0, 0), (0, 1), (1, 0), (1, 1)]
    """
    return list(itertools.product(range(num_generations), repeat=num_agents))


def cross_credit(rewards: torch.Tensor, num_generations: int, num_agents: int, agent: int) -> torch.Tensor:
    """Credit each of `agent`'s completions with the mean reward of the cross tuples that contain it.

    Args:
        rewards: `(num_groups * G**N, F)` rewards of the cross tuples, groups in order, tuples as `cross_tuples`.
    Returns:
        `(num_groups * G, F)`: row `g * G + k` is the credit of the agent's k-th completion in group g (NaN-aware).

    >>> r = torch.tensor([[1.0], [2.0], [3.0], [4.0]])  # one group, G=2, N=2: tuples (0,0) (0,1) (1,0) (1,1)
    >>> cross_credit(r, 2, 2, agent=0).flatten().tolist(), cross_credit(r, 2, 2, agent=1).flatten().tolist()
    ([1.5, 3.5], [2.0, 3.0])
    """
    num_funcs = rewards.size(1)
    grid = rewards.view(-1, *([num_generations] * num_agents), num_funcs)  # (B, G, ..., G, F)
    other_dims = [1 + a for a in range(num_agents) if a != agent]
    credit = torch.nanmean(grid, dim=other_dims) if other_dims else grid  # (B, G, F)
    return credit.reshape(-1, num_funcs)
