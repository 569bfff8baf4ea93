"""Small helpers that any module of the package may use: this module imports nothing from the package."""

from __future__ import annotations

from typing import Any


def per_agent(name: str, value: Any, num_agents: int, single: type | None = None) -> list | None:
    """`value` for every agent: `None`, one value for all (a callable, or an instance of `single`), or one each.

    >>> per_agent("formatters", str, 2)
    [<class 'str'>, <class 'str'>]
    """
    if value is None:
        return None
    if (callable(value) and single is None) or (single is not None and isinstance(value, single)):
        return [value] * num_agents
    values = list(value)
    if len(values) != num_agents:
        raise ValueError(
            f"{len(values)} {name} were given for {num_agents} agents: pass one for all, or one per agent."
        )
    return values
