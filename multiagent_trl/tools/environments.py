"""Tools, environments and custom rollouts for teams: TRL's own tool-calling loop, run for each agent in its view.

TRL's `GRPOTrainer` keeps one policy's tools in its attributes (`tools`, the per-rollout tool dicts, the environment
pool, ...) and runs its tool-calling loop (`_tool_call_loop`) inside `_generate`. A team trainer generates for each
agent inside that agent's *view* (see `team.views`), so giving every agent its own values of those attributes
(`TOOL_STATE`) is enough for TRL's parser and loop to run per agent, with the agent's tokenizer, tools and
`max_tool_calling_iterations`, and to mask the tool results out of the agent's loss (`tool_mask`).

What a team accepts (the trainer's `tools=`, `environment_factory=` and `rollout_func=` arguments):

- `tools`: one list of callables for every agent, or one list per agent (`None` or `[]` for an agent without).
- `environment_factory`: one factory (each agent gets its own environment per rollout, as in TRL), one factory per
  agent (`None` for an agent without), or `shared_environment(factory)`: one environment per joint trajectory that
  every agent acts in (see `shared_environment`).
- `rollout_func`: one for every agent, or one per agent; TRL calls it as `rollout_func(prompts, trainer)` inside the
  agent's view, so `trainer.processing_class` and the agent's settings are the agent's.

Environment rewards: an environment with `get_reward()` adds a reward source (weight 1, as in TRL). A shared
environment's `get_reward()` is the joint reward of its trajectory; with one environment per agent, each agent's
`get_reward()` is that agent's own reward (the trainer's per-agent rewards). Reward functions also receive
`environments=`, whose j-th entry is joint sample j's shared environment, or the tuple of the agents' environments.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    supports_tool_calling,
)
from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

from ..rewards.joint import bind_reward

logger = logging.getLogger(__name__)

# The trainer's attributes that `TeamTools.install` may replace: TRL's event loop, and the reward functions.
TOOL_HOST_STATE = (
    "async_loop",
    "async_loop_thread",
    "async_loop_ready_event",
    "reward_funcs",
    "reward_func_names",
    "reward_processing_classes",
    "reward_weights",
)

# TRL's tool and environment attributes, each agent's own in a team (`team.views.PER_AGENT` includes them).
TOOL_STATE: dict[str, str] = {
    "tools": "the agent's tools (its standalone tools and its environment's methods)",
    "_standalone_tools": "the agent's tools that are not an environment's methods",
    "_sync_tool_dicts": "the agent's tools by name, one dict per rollout of the batch",
    "_async_tool_dicts": "the agent's async tools by name, one dict per rollout of the batch",
    "environment_factories": "the agent's environment factory (a shared environment is every agent's)",
    "_multi_environment": "whether the agent routes rows to several environments (a team of one only)",
    "_env_tools": "the tools each of the agent's environments exposes, rendered into its prompts",
    "_environment_pool": "the agent's reusable environment instances",
    "environments": "the agent's environment of each rollout of the batch",
    "_batch_environments": "which environment each of the agent's rollouts uses",
    "rollout_func": "the agent's custom rollout",
}
# What TRL's `_generate_and_score_completions` must not redo when it replays an agent's rollout: draw and reset the
# environments (that would wipe the state the trajectory left) and build new tool dicts.
REPLAY_STATE = {"tools": [], "environment_factories": None, "environments": None}


@dataclasses.dataclass(frozen=True)
class SharedEnvironment:
    """`environment_factory=shared_environment(factory)`: see `shared_environment`."""

    factory: Callable[[], Any]

    def __call__(self) -> Any:
        return self.factory()


def shared_environment(factory: Callable[[], Any]) -> SharedEnvironment:
    """One environment per joint trajectory, that every agent of the team acts in.

    The interface of the environment `factory()` returns:

    - `reset(**row) -> str | list[str] | None`: called once per joint trajectory (the j-th completions of every agent
      for one dataset row), with the row's columns. A string is appended to every agent's last prompt message, a
      list gives one string per agent, `None` changes no prompt.
    - Public methods are tools, offered to every agent (type hints and a docstring with `Args:`, as TRL's tools). A
      method with an `agent: int` parameter receives the index of the agent that called it; that parameter is
      hidden from the model's tool schema.
    - `get_reward() -> float` (optional): the joint reward of the trajectory, once every agent is done.

    Example:

    ```python
    class Counter:
        def reset(self, **row):
            self.calls = []

        def add(self, n: int, agent: int) -> int:
            '''Add n to the shared total.

            Args:
                n: How much to add.
            '''
            self.calls.append((agent, n))
            return sum(k for _, k in self.calls)

        def get_reward(self) -> float:
            return float(len({a for a, _ in self.calls}))  # 2.0 when both agents acted


    trainer = MultiAgentGRPOTrainer(model=..., reward_funcs=..., environment_factory=shared_environment(Counter))
    ```
    """
    if not callable(factory):
        raise TypeError(f"`shared_environment` takes an environment factory (a callable), not {type(factory)}.")
    return SharedEnvironment(factory)


def tool_methods(environment: Any) -> list[Callable]:
    """An environment's tools: its public methods other than `reset` and `get_reward`, as TRL lists them."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def agent_tool(method: Callable, agent: int) -> Callable:
    """`method` for agent `agent`: its `agent` parameter, if it has one, is filled in and hidden from the schema.

    >>> class Env:
    ...     def move(self, step: int, agent: int) -> str:
    ...         '''Move.
    ...
    ...         Args:
    ...             step: How far.
    ...         '''
    ...         return f"agent {agent} moved {step}"
    >>> tool = agent_tool(Env().move, 1)
    >>> tool(step=2), list(inspect.signature(tool).parameters)
    ('agent 1 moved 2', ['step'])
    """
    signature = inspect.signature(method)
    if "agent" not in signature.parameters:
        return method
    if inspect.iscoroutinefunction(method):

        async def tool(*args, **kwargs):
            return await method(*args, agent=agent, **kwargs)

    else:

        def tool(*args, **kwargs):
            return method(*args, agent=agent, **kwargs)

    functools.update_wrapper(tool, method)
    del tool.__wrapped__  # else `inspect.signature` follows it back to the parameter we hide
    tool.__signature__ = signature.replace(parameters=[p for n, p in signature.parameters.items() if n != "agent"])
    tool.__annotations__ = {k: v for k, v in getattr(method, "__annotations__", {}).items() if k != "agent"}
    return tool


def _per_agent(name: str, value, num_agents: int, is_one: Callable[[Any], bool]) -> list:
    """`value` for each agent: one for all (`is_one(value)`), or a list with one per agent."""
    if value is None or is_one(value):
        return [value] * num_agents
    values = list(value)
    if len(values) != num_agents:
        raise ValueError(
            f"`{name}` has {len(values)} entries for {num_agents} agents: pass one for every agent, or a list with "
            "one per agent (None for an agent without)."
        )
    return values


def _is_tool_list(value) -> bool:
    return isinstance(value, (list, tuple)) and all(callable(t) for t in value)


@dataclasses.dataclass
class TeamTools:
    """Each agent's tools, environment factory and rollout function, and the team's shared environments.

    With one agent, TRL's `GRPOTrainer.__init__` sets everything up (`trl_owned`); the team only prepares each batch
    (TRL does it at the top of `_generate_and_score_completions`, which a team runs after generation).
    """

    tools: list[list[Callable]]
    factories: list[Callable | None]
    rollout_funcs: list[Callable | None]
    trl_owned: bool = False
    shared: SharedEnvironment | None = None
    shared_pool: list = dataclasses.field(default_factory=list)
    shared_probe: Any = None

    @classmethod
    def from_arguments(cls, kwargs: dict, num_agents: int, args) -> TeamTools:
        """Read (and, for a team, take out of `kwargs`, which go on to `GRPOTrainer.__init__`) the tool arguments."""
        if num_agents == 1:
            return cls([], [], [], trl_owned=True)
        tools = _per_agent("tools", kwargs.pop("tools", None), num_agents, _is_tool_list)
        factory = kwargs.pop("environment_factory", None)
        if isinstance(factory, dict):
            raise NotImplementedError(
                "A dict `environment_factory` (rows routed to environments by their `environment` column) works with "
                "one agent only; with several, pass one factory for every agent, one per agent, or "
                "`shared_environment(factory)`."
            )
        shared = factory if isinstance(factory, SharedEnvironment) else None
        factories = _per_agent("environment_factory", factory, num_agents, callable)
        rollout_funcs = _per_agent("rollout_func", kwargs.pop("rollout_func", None), num_agents, callable)
        for name, values in (("tools", tools), ("environment_factory", factories), ("rollout_func", rollout_funcs)):
            for i, value in enumerate(values):
                if name == "tools" and value is not None and not _is_tool_list(value):
                    raise TypeError(f"`tools` for agent {i} must be a list of callables; got {value!r}.")
                if name != "tools" and value is not None and not callable(value):
                    raise TypeError(f"`{name}` for agent {i} must be a callable; got {type(value).__name__}.")
        team = cls([list(t or []) for t in tools], factories, rollout_funcs, shared=shared)
        if any(f is not None for f in factories) and args.joint_mode != "aligned":
            raise ValueError(
                "Environments hold one trajectory per joint sample: set `joint_mode='aligned'` (cross tuples mix the "
                "agents' trajectories)."
            )
        return team

    @property
    def uses_tools(self) -> bool:
        return any(self.tools) or any(f is not None for f in self.factories)

    # ------------------------------------------------------------------ construction

    def install(self, views: list[dict[str, Any]], state: dict[str, Any], args) -> dict[str, Any]:
        """Fill every agent's view with its `TOOL_STATE` (for a team of one, the values TRL set up), and prepare each
        tool-using agent's tokenizer for TRL's parser. `state` holds the trainer's `TOOL_STATE` and `TOOL_HOST_STATE`
        values; returns the trainer's new values of them (every `TOOL_STATE` attribute exists, `None` where TRL sets it
        only per batch; TRL's event loop for async tools; the environments' rewards as one more reward function).
        With tools, several agents generate one at a time (`args.generation_mode`)."""
        updates = {name: state.get(name) for name in TOOL_STATE}
        if self.trl_owned:
            for name in TOOL_STATE:
                views[0][name] = state.get(name)
            return updates
        num_agents = len(views)
        if self.shared is not None:
            self.shared_probe = self.shared()
            self.shared_pool = [self.shared_probe]
        env_rewards = []
        for i, view in enumerate(views):
            factory, standalone = self.factories[i], self.tools[i]
            methods, pool = [], []
            if factory is not None:
                probe = self.shared_probe if self.shared is not None else factory()
                if not callable(getattr(probe, "reset", None)):
                    raise ValueError(
                        f"The environment of agent {i} ({type(probe).__name__}) must define a callable `reset`."
                    )
                methods = [agent_tool(m, i) for m in tool_methods(probe)]
                pool = [] if self.shared is not None else [probe]
                if callable(getattr(probe, "get_reward", None)):
                    env_rewards.append(type(probe).__name__)
            agent_tools = standalone + methods
            view.update(
                tools=agent_tools,
                _standalone_tools=standalone,
                _sync_tool_dicts=[],
                _async_tool_dicts=[],
                environment_factories=None if factory is None else {None: factory},
                _multi_environment=False,
                _env_tools={} if factory is None else {None: agent_tools},
                _environment_pool={} if factory is None else {None: pool},
                environments=None,
                _batch_environments=None,
                rollout_func=self.rollout_funcs[i],
            )
            if agent_tools:
                view["chat_template"] = _prepare_tokenizer(view["processing_class"], i)
        asynchronous = any(inspect.iscoroutinefunction(t) for tools in self.tools for t in tools) or any(
            inspect.iscoroutinefunction(m) for view in views for m in view["tools"]
        )
        if asynchronous and state.get("async_loop") is None:
            updates.update(zip(("async_loop_thread", "async_loop", "async_loop_ready_event"), event_loop()))
        if env_rewards:
            reward = _environment_reward(self.shared is not None, env_rewards, num_agents)
            weights = state["reward_weights"]
            updates.update(
                reward_funcs=[*state["reward_funcs"], reward],
                reward_func_names=[*state["reward_func_names"], reward.__name__],
                reward_processing_classes=[*state["reward_processing_classes"], None],
                reward_weights=torch.cat([weights, torch.ones(1, dtype=weights.dtype)]),
            )
        if self.uses_tools and num_agents > 1 and args.generation_mode == "batched":
            # TRL's tool loop generates again after each tool result, one agent's rows at a time.
            logger.warning("With tools, the agents generate one at a time (`generation_mode='per_agent'`).")
            args.generation_mode = "per_agent"
        return updates

    # ------------------------------------------------------------------ each batch

    def begin_batch(
        self, views: list[dict[str, Any]], inputs: list[dict], agent_inputs: list[list[dict]]
    ) -> tuple[list[list[dict]], list | None]:
        """Draw and reset each rollout's environments and build its tool dicts in the agents' `views`, as TRL does at
        the top of `_generate_and_score_completions` (which a team runs after generating). Returns the agents' rows,
        with each environment's `reset` observation appended to its agent's prompt, and what reward functions get as
        `environments=` (`None`: nothing new)."""
        if not any(view["tools"] or view["environment_factories"] for view in views):
            return agent_inputs, None
        shared_envs = self._draw_shared(inputs) if self.shared is not None else None
        observations = None
        if shared_envs is not None:  # reset once per joint trajectory, whatever the number of agents
            observations = [environment.reset(**row) for environment, row in zip(shared_envs, inputs)]
        agent_inputs = [list(rows) for rows in agent_inputs]
        for i, view in enumerate(views):
            if view["environment_factories"] is None:
                environments = None
            elif shared_envs is not None:
                environments = shared_envs
                view["_batch_environments"] = [None] * len(inputs)
            else:
                environments = _draw(view, agent_inputs[i])
            view["environments"] = environments
            _bind_tools(view, i, environments, len(inputs))
            if environments is None:
                continue
            for k, row in enumerate(agent_inputs[i]):
                if shared_envs is not None:
                    observation = observations[k]
                    if isinstance(observation, (list, tuple)):
                        observation = observation[i]
                else:
                    routed = view["_multi_environment"]  # the routing column is not the environment's
                    reset_row = {c: v for c, v in row.items() if not routed or c != "environment"}
                    observation = environments[k].reset(**reset_row)
                if observation is not None:
                    agent_inputs[i][k] = {**row, "prompt": _with_observation(row["prompt"], observation)}
        return agent_inputs, _published_environments(views, shared_envs, len(inputs))

    def begin_turn(self, views: list[dict[str, Any]], sources: list[list[int]], branch: bool) -> list | None:
        """Before a later turn of a multi-turn rollout: agent i's row k continues the environment of the previous
        turn's row `sources[i][k]`. Where a node branches into several rows (`branch`: a tree, whose siblings act on
        their own), each row gets its own deep copy of that environment, so no two rows share one state; a linear
        trajectory carries its environment on. Each row's tool dicts are bound to its environment. Returns what reward
        functions get as `environments=` (`None`: nothing new)."""
        if not any(view["tools"] or view["environment_factories"] for view in views):
            return None

        def follow(environments: list | None, rows: list[int]) -> list | None:
            if environments is None:
                return None
            if not branch:
                return [environments[k] for k in rows]
            try:
                return [copy.deepcopy(environments[k]) for k in rows]
            except Exception as err:
                name = type(environments[rows[0]]).__name__
                raise TypeError(
                    "A tree rollout gives each of a node's samples its own copy of "
                    f"the environment it continues, but `copy.deepcopy` failed on {name}: make it deep-copyable, or "
                    "use `rollout='linear'` (each trajectory keeps its environment)."
                ) from err

        shared_envs = follow(views[0]["environments"], sources[0]) if self.shared is not None else None
        for i, view in enumerate(views):
            environments = shared_envs if shared_envs is not None else follow(view["environments"], sources[i])
            view["environments"] = environments
            if environments is not None:
                view["_batch_environments"] = [None] * len(sources[i])
            _bind_tools(view, i, environments, len(sources[i]))
        return _published_environments(views, shared_envs, len(sources[0]))

    def _draw_shared(self, inputs: list[dict]) -> list:
        while len(self.shared_pool) < len(inputs):
            self.shared_pool.append(self.shared())
        return self.shared_pool[: len(inputs)]


def _bind_tools(view: dict, agent: int, environments: list | None, rows: int) -> None:
    """Agent `agent`'s tool dicts, one per rollout row, as TRL builds them: its standalone tools and its row's
    environment methods (bound to the agent's index)."""
    if not view["tools"]:
        return
    view["_sync_tool_dicts"], view["_async_tool_dicts"] = [], []
    for k in range(rows):
        methods = [] if environments is None else [agent_tool(m, agent) for m in tool_methods(environments[k])]
        sync, asynchronous = {}, {}
        for tool in view["_standalone_tools"] + methods:
            (asynchronous if inspect.iscoroutinefunction(tool) else sync)[tool.__name__] = tool
        view["_sync_tool_dicts"].append(sync)
        view["_async_tool_dicts"].append(asynchronous)


def _published_environments(views: list[dict[str, Any]], shared_envs: list | None, rows: int) -> list | None:
    """What reward functions get as `environments=` (and an environment's `get_reward` reads): the shared
    environments, the agent's own (a team of one), or per joint sample the tuple of the agents' environments."""
    if shared_envs is not None:
        return shared_envs
    if len(views) == 1:
        return views[0]["environments"]
    if any(view["environments"] is not None for view in views):
        return list(zip(*[view["environments"] or [None] * rows for view in views]))
    return None


def _draw(view: dict, rows: list[dict]) -> list:
    """One pooled environment instance per rollout (created only when the batch needs more than exist)."""
    names = [row.get("environment") if view["_multi_environment"] else None for row in rows]
    for name in set(names):
        if name not in view["environment_factories"]:
            raise ValueError(
                f"Example has `environment={name!r}`, which is not among the environments passed to "
                f"`environment_factory`. Expected one of: {list(view['environment_factories'])}."
            )
    view["_batch_environments"] = names
    environments, cursor = [], {}
    for name in names:
        pool, k = view["_environment_pool"][name], cursor.get(name, 0)
        if k == len(pool):
            pool.append(view["environment_factories"][name]())
        cursor[name] = k + 1
        environments.append(pool[k])
    return environments


def _with_observation(prompt, observation):
    """`prompt` (a conversation) with `observation` appended to its last message, left untouched otherwise."""
    if not isinstance(prompt, list):
        raise ValueError(
            "Environments append their `reset` observation to a conversation: give the agents conversational prompts "
            "(lists of messages), or return None from `reset`."
        )
    prompt = copy.deepcopy(prompt)
    content = prompt[-1]["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    prompt[-1] = {**prompt[-1], "content": content + observation}
    return prompt


def _prepare_tokenizer(processing_class, agent: int) -> str | None:
    """Make agent `agent`'s tokenizer parse tool calls, as `GRPOTrainer.__init__` does for its policy's; return the
    agent's training chat template (`None`: its own)."""
    if not supports_tool_calling(processing_class):
        raise ValueError(
            f"Agent {agent} has tools, but its chat template cannot render a tool-calling conversation (user -> "
            "assistant with tool_calls -> tool). Give that agent a tokenizer whose template supports tools, or no "
            "tools."
        )
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(processing_class)
        except ValueError as err:
            raise ValueError(
                f"Agent {agent} has tools, but TRL does not know how to parse tool calls from its chat template: set "
                "`response_template` on its tokenizer (see the Transformers response-parsing docs)."
            ) from err
    if is_chat_template_prefix_preserving(processing_class):
        return None
    return get_training_chat_template(processing_class)


def event_loop() -> tuple:
    """TRL's daemon event loop for async tools, started (`(thread, loop, ready_event)`, TRL's three attributes), for a
    trainer that has none from async reward functions."""
    thread, loop, ready = start_event_loop_in_daemon(name="MultiAgentGRPOTrainer-AsyncLoop")
    ready.wait()
    atexit.register(shutdown_event_loop_in_daemon, thread, loop)
    return thread, loop, ready


def _environment_reward(shared: bool, names: list[str], num_agents: int) -> Callable:
    """The environments' `get_reward` as one joint reward function (weight 1, as in TRL): the shared environment's
    joint reward, or each agent's environment's reward for that agent (`None` for an agent without one)."""

    def environment_reward(prompts, completions, environments, **kwargs):
        if shared:
            return [environment.get_reward() for environment in environments]
        return [
            [e.get_reward() if callable(getattr(e, "get_reward", None)) else None for e in joint]
            for joint in environments
        ]

    environment_reward.__name__ = "_".join(dict.fromkeys(names))
    return bind_reward(environment_reward, num_agents)


__all__: Sequence[str] = ("TeamTools", "TOOL_STATE", "REPLAY_STATE", "SharedEnvironment", "shared_environment")
