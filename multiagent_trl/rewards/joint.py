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
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch import nn
from trl.trainer.utils import get_callable_name, is_async_callable

TRL_STYLE = "trl"
COMLRL_STYLE = "comlrl"

ROWS_COLUMN = "batch_items"  # the column the trainer adds to the rows when a function takes CoMLRL's `batch_items`

# How a CoMLRL-style function takes the completions (CoMLRL's `call_reward_function` conventions).
PER_AGENT_LISTS = "f(completions1, ..., completionsN)"
PROMPTS_FIRST = "f(prompts, completions1, ..., completionsN)"
NESTED = "f([completions1, ..., completionsN])"
VARARGS = "f(*completions)"


def reward_style(func: Callable, num_agents: int) -> str:
    """Tell which calling convention `func` follows, or raise a `TypeError` that says what fits.

    >>> reward_style(lambda prompts, completions, **kw: [0.0], num_agents=2)
    'trl'
    >>> reward_style(lambda c1, c2: [0.0], num_agents=2)
    'comlrl'
    """
    return _convention(func, num_agents)[0]


def _signature(func: Callable) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError) as err:
        raise TypeError(f"Cannot read the signature of reward function '{get_callable_name(func)}'.") from err


def _convention(func: Callable, num_agents: int) -> tuple[str, str | None, set[str]]:
    """`(style, how the completions are passed, keywords passed)` for `func`, read from its signature: TRL's
    `f(prompts, completions, **kwargs)`, else CoMLRL's (`comlrl_passing`)."""
    params = _signature(func)
    names = {p.name for p in params}
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
    positional = _completion_parameters(params)
    named_completions = any(p.name == "completions" and p.kind != p.VAR_POSITIONAL for p in params)
    # `f(completions)` alone, with several agents, is CoMLRL's single parameter (the list of per-agent lists); with
    # TRL's other keywords (or `**kwargs`), it is TRL's.
    if named_completions and (num_agents == 1 or var_keyword or "prompts" in names or len(positional) != 1):
        return TRL_STYLE, None, {"batch_items"} & names  # a named `batch_items` gets the rows, as in CoMLRL
    if not positional and not var_positional and var_keyword:  # f(**kwargs) takes TRL's keyword arguments
        return TRL_STYLE, None, set()
    return (COMLRL_STYLE, *comlrl_passing(func, num_agents))


def _completion_parameters(params: list[inspect.Parameter]) -> list[inspect.Parameter]:
    """The required positional parameters that take completions: `batch_items` (and `prompts` other than first) are
    passed by keyword, so they are not completion arguments."""
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return [p for k, p in enumerate(positional) if p.name != "batch_items" and (p.name != "prompts" or k == 0)]


def comlrl_passing(func: Callable, num_agents: int) -> tuple[str, set[str]]:
    """How a CoMLRL-style reward `func` takes one call's completions, and which keywords it is passed, read from its
    signature as CoMLRL's `call_reward_function` reads it; a `TypeError` that says what fits when nothing does.

    The completions: `PER_AGENT_LISTS` (N required positional parameters), `PROMPTS_FIRST` (N + 1, the first not
    named `completion...`), `NESTED` (1, with N > 1: one list of the N lists) or `VARARGS` (`*args`). The keywords:
    `batch_items` (the dataset rows) and `prompts`, where the signature names them or takes `**kwargs`; a
    `batch_items=None` parameter is a keyword, never a completion list. `comlrl_arguments` builds a call from them.

    >>> comlrl_passing(lambda completions1, completions2, batch_items=None: [0.0], 2)
    ('f(completions1, ..., completionsN)', {'batch_items'})
    """
    name = get_callable_name(func)
    params = _signature(func)
    names = {p.name for p in params}
    var_keyword = any(p.kind == p.VAR_KEYWORD for p in params)
    var_positional = any(p.kind == p.VAR_POSITIONAL for p in params)
    positional = _completion_parameters(params)
    keywords = {k for k in ("batch_items", "prompts") if k in names or var_keyword}
    if not positional and var_positional:
        return VARARGS, keywords
    if len(positional) == num_agents:
        return PER_AGENT_LISTS, keywords
    if len(positional) == 1 and num_agents > 1:
        return NESTED, keywords
    if len(positional) == num_agents + 1 and not positional[0].name.startswith("completion"):
        return PROMPTS_FIRST, keywords - {"prompts"}
    if positional:
        raise TypeError(
            f"Reward function '{name}' takes {len(positional)} completion arguments "
            f"({', '.join(p.name for p in positional)}) but there are {num_agents} agents. A CoMLRL-style reward "
            f"takes one list of completions per agent: f(completions1, ..., completions{num_agents}) (or "
            f"f(prompts, completions1, ..., completions{num_agents})); or use the TRL style "
            "f(prompts, completions, **kwargs)."
        )
    raise TypeError(
        f"Reward function '{name}' fits neither reward convention. Use the CoMLRL style "
        f"f(completions1, ..., completions{num_agents}) with one list per agent, or the TRL style "
        "f(prompts, completions, **kwargs) where completions[j] is the tuple of the agents' completions."
    )


def comlrl_arguments(
    passing: str, keywords: set[str], prompts: list, per_agent: list[list], rows: list | None
) -> tuple[tuple, dict]:
    """The positional and keyword arguments of one call of a CoMLRL-style reward, as `comlrl_passing` read it:
    `per_agent` holds one list of completions per agent, `prompts` and `rows` (the dataset rows, `batch_items`) what
    the call's samples were prompted with.

    >>> comlrl_arguments("f(completions1, ..., completionsN)", {"batch_items"}, ["p"], [["a"], ["b"]], [{"x": 1}])
    ((['a'], ['b']), {'batch_items': [{'x': 1}]})
    """
    args = {PER_AGENT_LISTS: per_agent, VARARGS: per_agent, NESTED: [per_agent]}.get(passing, [prompts, *per_agent])
    kw = {"prompts": prompts} if "prompts" in keywords else {}
    if "batch_items" in keywords:
        kw["batch_items"] = rows
    return tuple(args), kw


def tensor_values(values: torch.Tensor, name: str) -> list | float:
    """The values of a tensor a reward function returned (`tolist()`), or a `ValueError` naming the function when it
    holds none (a tensor on the meta device).

    >>> tensor_values(torch.tensor([1.0, 2.0]), "f")
    [1.0, 2.0]
    """
    if values.is_meta:
        raise ValueError(
            f"Reward function '{name}' returned a tensor on the meta device, which holds no values: compute the "
            "rewards on a real device (a model loaded with `device_map='meta'` or under `init_empty_weights` has no "
            "weights), or return plain numbers."
        )
    return values.detach().cpu().tolist()


def check_rewards(values: Any, expected: int, name: str, num_agents: int = 1) -> list:
    """Validate what a reward function returned: `expected` numbers (or `None`), none of them NaN or infinite; or,
    with several agents, `expected` rows of `num_agents` numbers (one reward per agent). A tensor is read as its
    values.

    >>> check_rewards([1, 0.5, None], 3, "f")
    [1.0, 0.5, None]
    >>> check_rewards(torch.tensor([[1.0, 0.0], [0.5, 0.5]]), 2, "f", num_agents=2)
    [[1.0, 0.0], [0.5, 0.5]]
    """
    if isinstance(values, torch.Tensor):
        values = tensor_values(values, name)
        values = values if isinstance(values, list) else [values]
    try:
        if isinstance(values, (str, bytes, dict)):  # iterable, but not rewards
            raise TypeError
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
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        if num_agents > 1 and isinstance(value, (list, tuple)):
            if len(value) != num_agents:
                raise ValueError(
                    f"Reward function '{name}' returned {len(value)} values for joint sample {j}; return one reward "
                    f"per joint sample, or one per agent ({num_agents})."
                )
            checked.append([_check_value(v, name, j) for v in value])
        else:
            checked.append(_check_value(value, name, j))
    if num_agents > 1 and any(isinstance(v, list) for v in checked) and not all(isinstance(v, list) for v in checked):
        raise ValueError(
            f"Reward function '{name}' returned per-agent rewards for some joint samples only; return one reward per "
            f"joint sample everywhere, or {num_agents} everywhere."
        )
    return checked


def _check_value(value, name: str, j: int) -> float | None:
    if value is None:
        return None
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
    return value


def reward_range(func: Callable) -> tuple[float, float] | None:
    """The raw range `(minimum, maximum)` a reward function declares in its `reward_range` attribute (CoMLRL's
    `set_reward_range`), checked; `None` when it declares none. The trainer refuses a reward outside it.

    >>> def f(c1, c2): ...
    >>> f.reward_range = (0, 1)
    >>> reward_range(f)
    (0.0, 1.0)
    """
    declared = getattr(func, "reward_range", None)
    if declared is None:
        return None
    name = get_callable_name(func)
    if isinstance(declared, (str, bytes)) or not isinstance(declared, Sequence) or len(declared) != 2:
        raise ValueError(f"`{name}.reward_range` must be a pair (minimum, maximum); got {declared!r}.")
    low, high = (float(v) for v in declared)
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise ValueError(f"`{name}.reward_range` must be finite with minimum < maximum; got {declared!r}.")
    return low, high


def bind_reward_funcs(
    reward_funcs,
    num_agents: int,
    reward_processing_classes=None,
    args=None,
    joint_text: Callable | None = None,
    per_sample: bool = False,
) -> tuple[list, Any]:
    """The trainer's `reward_funcs`, and the `reward_processing_classes` to hand to TRL.

    Each user function is bound with `bind_reward` (`per_sample`: CoMLRL's calling of CoMLRL-style functions). A
    reward model (a model id or path, or an `nn.Module`) passes through to TRL with one agent; with several it becomes
    a `reward_models.JointRewardModel` that scores the text `joint_text` builds from each joint sample, with its
    tokenizer from `reward_processing_classes` (one for all functions, or one per function as in TRL; entries of
    plain functions are ignored). TRL then gets no processing classes: every function it sees is a callable.
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
        if getattr(func, "scores_joint_samples", False):  # a module that is a joint reward function itself
            bound.append(bind_joint_scorer(func, num_agents))
        elif isinstance(func, (str, nn.Module)):
            if num_agents == 1:
                bound.append(func)
                continue
            from .models import JointRewardModel  # loads transformers' auto classes only when needed

            init_kwargs = dict(getattr(args, "model_init_kwargs", None) or {})
            init_kwargs.setdefault("trust_remote_code", getattr(args, "trust_remote_code", False))
            bound.append(JointRewardModel(func, classes[k], joint_text, model_init_kwargs=init_kwargs))
        elif callable(func):
            bound.append(bind_reward(func, num_agents, per_sample))
        else:
            raise TypeError(
                f"`reward_funcs` must be callables, model ids or models (one, or a list); got a "
                f"{type(func).__name__} ({func!r})."
            )
    if joint_text is not None and not any(
        isinstance(f, (str, nn.Module)) and not getattr(f, "scores_joint_samples", False) for f in funcs
    ):
        raise ValueError("`joint_text=` formats joint samples for reward models, but `reward_funcs` has none.")
    return bound, (classes if num_agents == 1 else None)


def bind_joint_scorer(model: Callable, num_agents: int) -> Callable:
    """A model that scores joint samples itself (`scores_joint_samples = True`, e.g.
    `preference.reward_model.JointRewardModel`, which reads its own joint text) as TRL's reward signature.

    It is called once per batch as `model(prompts=..., completions=...)`, each entry the tuple of the agents' prompts
    or completions (a team of one gets one-element tuples); its scores must be finite. TRL sees a plain function, so
    it neither tokenizes for the model nor reads `.logits`.
    """
    from .models import check_model_rewards  # loads transformers' auto classes only when needed

    name = getattr(model, "__name__", type(model).__name__)

    def joint_reward(prompts, completions, **kwargs):
        if num_agents == 1:
            prompts, completions = [(p,) for p in prompts], [(c,) for c in completions]
        values = list(model(prompts=list(prompts), completions=list(completions)))
        check_model_rewards(values, name)
        return values

    joint_reward.__name__ = name
    joint_reward.style = TRL_STYLE
    joint_reward.agent_rewards = None
    joint_reward.wants_rows = False
    return joint_reward


def bind_reward(func: Callable, num_agents: int, per_sample: bool = False) -> Callable:
    """Wrap a user reward function into TRL's reward signature, `f(prompts, completions, completion_ids, **kwargs)`.

    The trainer calls the wrapper with joint samples (`completions[j]` is a tuple of N completions when N > 1). The
    wrapper calls `func` in its own convention and validates what it returns. Async functions stay async, so that
    TRL runs them concurrently.

    With `per_sample=True`, a CoMLRL-style function is called as CoMLRL 1.4.3 calls it: once per joint sample, each
    agent's list holding that sample's one completion (and `batch_items`, `prompts` one row long), and the first
    value it returns is the sample's reward (a number alone counts as a list of one).

    A function may return one reward per agent for each joint sample (rows of N numbers or `None`, or an `(S, N)`
    tensor): the wrapper then returns their `team_reward` to TRL (for logs) and keeps the per-agent values in its
    `agent_rewards` attribute until `pop_agent_rewards` takes them.
    """
    style, passing, keywords = _convention(func, num_agents)
    name = get_callable_name(func)
    bounds = reward_range(func)

    def arguments(prompts, completions, kwargs) -> tuple[tuple, dict]:
        if style == TRL_STYLE:
            return (), {"prompts": prompts, "completions": completions, **kwargs}
        per_agent = [list(c) for c in zip(*completions)] if num_agents > 1 else [list(completions)]
        # CoMLRL's prompt of a joint sample is agent 0's (the one its formatter built).
        prompts = [p[0] for p in prompts] if num_agents > 1 else list(prompts)
        # The dataset rows, one per joint sample: the trainer adds them for a function that takes `batch_items`.
        return comlrl_arguments(passing, keywords, prompts, per_agent, kwargs.get(ROWS_COLUMN))

    def finish(values, expected: int) -> list:
        checked = check_rewards(values, expected, name, num_agents)
        if bounds is not None:
            flat = [v for row in checked for v in (row if isinstance(row, list) else [row]) if v is not None]
            outside = [v for v in flat if not bounds[0] <= v <= bounds[1]]
            if outside:
                raise ValueError(
                    f"Reward function '{name}' returned {outside[0]}, outside its declared reward_range {bounds}."
                )
        if checked and isinstance(checked[0], list):
            joint_reward.agent_rewards = checked
            return [team_reward(row) for row in checked]
        return checked

    one_per_sample = per_sample and style == COMLRL_STYLE

    def calls(prompts, completions, kwargs) -> list[tuple[tuple, dict]]:
        """The calls to make: one for the batch, or one per joint sample."""
        if not one_per_sample:
            return [arguments(prompts, completions, kwargs)]
        return [
            arguments(
                prompts[j : j + 1], completions[j : j + 1], {ROWS_COLUMN: kwargs.get(ROWS_COLUMN, [])[j : j + 1]}
            )
            for j in range(len(completions))
        ]

    def values(results: list) -> Any:
        """What the calls returned, as one batch's rewards: with one call per sample, each call's first value."""
        if not one_per_sample:
            return results[0]
        out = []
        for j, result in enumerate(results):
            result = result.tolist() if isinstance(result, torch.Tensor) else result
            if isinstance(result, (list, tuple)) and len(result) == 0:
                raise ValueError(f"Reward function '{name}' returned no value for joint sample {j}.")
            out.append(result[0] if isinstance(result, (list, tuple)) else result)
        return out

    if is_async_callable(func):

        async def joint_reward(prompts, completions, **kwargs):
            results = [await func(*args, **kw) for args, kw in calls(prompts, completions, kwargs)]
            return finish(values(results), len(completions))

    else:

        def joint_reward(prompts, completions, **kwargs):
            results = [func(*args, **kw) for args, kw in calls(prompts, completions, kwargs)]
            return finish(values(results), len(completions))

    joint_reward.__name__ = name
    joint_reward.style = style
    joint_reward.agent_rewards = None
    joint_reward.wants_rows = "batch_items" in keywords
    return joint_reward


def team_reward(row: list[float | None]) -> float | None:
    """The team's reward of one joint sample scored per agent: the mean over the agents that were scored; `None` (no
    reward) where none was. An agent's `None` is no signal for it, not a 0 for the team.

    >>> team_reward([1.0, None]), team_reward([1.0, 2.0]), team_reward([None, None])
    (1.0, 1.5, None)
    """
    scored = [v for v in row if v is not None]
    return sum(scored) / len(scored) if scored else None


def credit_columns(rewards_per_func, joint, agent_rewards, processor, weights) -> list[torch.Tensor]:
    """The reward columns each agent is credited with, `(rows, F)` each (or `(rows, 1)` after a processor): the
    joint rewards, or each agent's own (`agent_rewards`, `(rows, F, N)`) where a function returned one per agent."""
    num_agents = 1 if agent_rewards is None else agent_rewards.size(2)
    columns = [rewards_per_func if agent_rewards is None else agent_rewards[..., i] for i in range(num_agents)]
    if processor is not None:  # the processor applies to each agent's weighted reward, as to the joint one
        columns = [
            joint.unsqueeze(1)
            if agent_rewards is None
            else apply_processor(processor, weighted_sum(c, weights))[:, None]
            for c in columns
        ]
    return columns


def weighted_sum(rewards_per_func: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The weighted sum of the reward functions' columns, `(rows, F) -> (rows,)`; NaN where none scored (as TRL)."""
    total = (rewards_per_func * weights.to(rewards_per_func.device)).nansum(dim=1)
    total[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan
    return total


def pop_agent_rewards(
    reward_funcs: Sequence, rewards_per_func: torch.Tensor, num_agents: int, accelerator: Accelerator
) -> torch.Tensor | None:
    """Each agent's own rewards `(rows, F, N)` (gathered), from the functions that returned one per agent in their
    last call, and the joint reward (`rewards_per_func`, gathered) broadcast for the others. `None` when no function
    returned per-agent rewards on any process (and always for a team of one)."""
    if num_agents == 1:
        return None
    local_rows = len(rewards_per_func) // accelerator.num_processes
    start = accelerator.process_index * local_rows
    local = rewards_per_func[start : start + local_rows].unsqueeze(2).repeat(1, 1, num_agents)  # (rows, F, N)
    found = torch.zeros(1, device=rewards_per_func.device)
    for k, func in enumerate(reward_funcs):
        values = getattr(func, "agent_rewards", None)
        if values is not None:
            func.agent_rewards = None
            values = [[math.nan if v is None else v for v in row] for row in values]
            local[:, k] = torch.tensor(values, dtype=local.dtype, device=local.device)
            found += 1
    if accelerator.gather(found).sum() == 0:  # the same answer on every process, so all gather or none
        return None
    return accelerator.gather(local)


def with_rows(reward_funcs: Sequence, rows: list[dict]) -> list[dict]:
    """`rows`, each also holding itself under `ROWS_COLUMN` when a function takes CoMLRL's `batch_items=` (TRL hands
    the functions the rows' columns, not the rows)."""
    if not any(getattr(f, "wants_rows", False) for f in reward_funcs):
        return rows
    return [{**row, ROWS_COLUMN: row} for row in rows]


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
    """Apply a per-value processor to a 1-D reward tensor; NaN ("no reward") stays NaN. A processor that turns a
    reward into NaN or an infinity raises (TRL would read NaN as "no reward", and an infinity breaks the group's
    advantages).

    >>> apply_processor(RewardProcessors.scale(2.0), torch.tensor([1.0, float("nan")])).tolist()
    [2.0, nan]
    """
    values = []
    for j, reward in enumerate(rewards.tolist()):
        value = math.nan if math.isnan(reward) else float(processor(reward))
        if not math.isfinite(value) and not math.isnan(reward):
            name = getattr(processor, "name", None) or get_callable_name(processor)
            raise ValueError(
                f"Reward processor '{name}' returned {value} for joint sample {j} (reward {reward}); processed "
                "rewards must be finite."
            )
        values.append(value)
    return torch.tensor(values, dtype=rewards.dtype, device=rewards.device)


def flush_reward_logs(
    pending: dict[str, list],
    extra: dict[str, list],
    metrics: dict[str, list],
    accelerator: Accelerator,
    prefix: str,
    num_rows: int,
) -> dict[str, list]:
    """What the reward functions recorded during the joint pass with TRL's `log_metric` and `log_extra`: the metrics
    under the joint names (averaged across processes, as TRL does); the extra columns gathered, returned for the
    completions table. TRL flushes these buffers in its own pass, which here runs per agent: left to it, they would
    land under agent 0's names, and the columns in no table. `pending` and `extra` (TRL's `_pending_metrics` and
    `_pending_extra_logs`) are emptied; the metrics are appended to `metrics` (TRL's `_metrics[mode]`) under
    `prefix`."""
    for name in sorted(set(gather_object(list(pending)))):  # the same order on every process
        values = pending.get(name, [])
        stats = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=accelerator.device)
        total, count = accelerator.gather(stats).view(-1, 2).sum(dim=0).tolist()
        metrics[prefix + name].append(total / count)
    columns = sorted(set(gather_object(list(extra))))
    extras = {column: gather_object(extra.get(column, [None] * num_rows)) for column in columns}
    pending.clear()
    extra.clear()
    return extras
