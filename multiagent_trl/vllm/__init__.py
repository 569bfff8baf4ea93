"""vLLM generation for teams: one engine (or server) for a LoRA team, one per separate model (`engine`, `server`,
and `worker`, the code that runs inside vLLM's workers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def team_generator(team, args, processing_classes: list, rollout_funcs: Sequence[Callable | None]):
    """The team's vLLM engines (`vllm_mode="colocate"`) or servers (`"server"`), started for `team`. vLLM is imported
    only here, when it is used."""
    from .engine import TeamEngine
    from .server import TeamServers

    if any(f is not None for f in rollout_funcs):
        raise NotImplementedError(
            "`rollout_func` with `use_vllm=True` is not supported for teams: TRL's rollout helpers call its own "
            "single-policy engine. Generate with the team's engines (drop `rollout_func`), or set `use_vllm=False`."
        )
    return (TeamServers if args.vllm_mode == "server" else TeamEngine)(team, args, processing_classes)
