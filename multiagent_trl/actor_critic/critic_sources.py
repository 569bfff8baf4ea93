"""`critic_sources`: each separate critic's starting model, from the arguments that name it.

`ActorCriticTrainer` reads `critic_model`; CoMLRL's trainers also take `critics` (a list, one per critic). Both resolve
here, with one set of checks, before any model is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from torch import nn


def critic_sources(
    count: int,
    critic_model: Any = None,
    critics: Sequence[Any] | None = None,
    agents: Sequence[Any] | None = None,
    joint: bool = False,
) -> list:
    """The starting model of each of `count` critics (ids, paths or model objects), in critic order.

    Args:
        count: How many critics there are: one per agent, or 1 for a joint critic.
        critic_model: One source for every critic (an id or path, loaded once per critic; a model object only when
            there is one critic), or a list of one per critic.
        critics: A list of one source per critic (CoMLRL's `critics=`). Given with `critic_model`, both must name
            the same models.
        agents: The agents' sources, in order: used when neither of the above is given (each critic starts from its
            agent's id or path; a joint critic from agent 0's).
        joint: Whether the one critic is a joint critic (it changes only the wording of the errors).

    Raises:
        ValueError: A list of the wrong length, `critic_model` and `critics` that disagree, one model object for
            several critics, or no source at all.
    """
    per_critic = "one joint critic" if joint else f"one critic per agent ({count})"
    if critics is not None:
        critics = list(critics)
        if len(critics) != count:
            raise ValueError(f"`critics` holds {len(critics)} model(s), but this trainer has {per_critic}.")
        if critic_model is not None:
            given = list(critic_model) if isinstance(critic_model, (list, tuple)) else [critic_model] * count
            if given != critics:
                raise ValueError(f"`critic_model` and `critics` conflict: {critic_model!r} != {critics!r}; pass one.")
        sources = critics
    elif isinstance(critic_model, (list, tuple)):
        if len(critic_model) != count:
            raise ValueError(
                f"`critic_model` lists {len(critic_model)} models, but this trainer has {per_critic}: give one for "
                "all, or one each."
            )
        sources = list(critic_model)
    elif critic_model is not None:
        if isinstance(critic_model, nn.Module) and count > 1:
            raise ValueError(
                f"`critic_model` is one model object, but there are {count} critics: pass an id or path (loaded once "
                "per critic) or one model per critic (a list)."
            )
        sources = [critic_model] * count
    elif agents is not None:
        sources = [_agent_source(agent) for agent in list(agents)[:count]]
    else:
        raise ValueError("No critic model was given: pass `critic_model=` (an id, a path or a model per critic).")
    models = [id(s) for s in sources if isinstance(s, nn.Module)]
    if len(set(models)) != len(models):
        raise ValueError("The same model object is given for several critics: give each critic its own.")
    return sources


def _agent_source(agent: Any) -> str | os.PathLike:
    """An agent's id or path, for a critic that starts from a copy of the agent."""
    if isinstance(agent, (str, os.PathLike)):
        return agent
    config = getattr(agent, "config", None)
    path = getattr(config, "_name_or_path", "") if config is not None else ""
    if not path:
        raise ValueError(
            "The critics start from the agents' models by default, but an agent was given as a model with no id or "
            "path to load a copy from: pass `critic_model=` (an id, a path or a model per critic)."
        )
    return path
