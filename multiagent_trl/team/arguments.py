"""The trainer's arguments, checked before anything is built: one value per agent, the datasets' prompts, and the
settings a team cannot combine. Each error names the argument and the fix."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# GRPOConfig fields that take one value for all agents or a list with one value per agent. Each agent's value is
# resolved once into its view (`views.settings_state`); TRL's code then reads a plain value, as for one policy.
AGENT_SETTINGS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "max_completion_length",
    "generation_kwargs",
    "beta",
)


def check_prompt_column(name: str, dataset: Any, formatters: Sequence[Callable] | None) -> None:
    """A dataset (or each of a dict of datasets) needs a 'prompt' column unless formatters build the prompts."""
    if dataset is None or formatters is not None:
        return
    datasets = dataset.values() if isinstance(dataset, dict) else [dataset]
    for ds in datasets:
        columns = getattr(ds, "column_names", None)
        if columns is not None and "prompt" not in columns:
            raise ValueError(
                f"`{name}` has no 'prompt' column (columns: {columns}). Add one, or pass `formatters=` to build each "
                "agent's prompt from a row."
            )


def check_callables(
    formatters: Sequence[Callable] | None,
    reward_processor: Callable | None,
    external_transition: Callable | None,
    num_turns: int,
) -> None:
    """The user's functions are functions, and several turns have a transition."""
    if any(not callable(f) for f in formatters or []):
        bad = next(f for f in formatters if not callable(f))
        raise TypeError(f"`formatters` must be callables, `formatter(row) -> prompt`; got {bad!r}.")
    if reward_processor is not None and not callable(reward_processor):
        raise TypeError(f"`reward_processor` must be a callable, `float -> float`; got {reward_processor!r}.")
    if num_turns > 1 and external_transition is None:
        raise ValueError(
            f"`num_turns={num_turns}` needs `external_transition=`, a function `(row, histories, turn)` that returns "
            "each agent's next prompt; or set `num_turns=1`."
        )


def check_team_arguments(args, num_agents: int, scheduler: Any, continued_adapters: bool, betas: list[float]) -> None:
    """What a team cannot combine: per-agent learning rates of the wrong count or with a user's scheduler, and a KL
    reference for adapters the team continues from."""
    if args.agent_learning_rates is not None and len(args.agent_learning_rates) != num_agents:
        raise ValueError(
            f"`agent_learning_rates` has {len(args.agent_learning_rates)} values for {num_agents} agents: give "
            "one learning rate per agent."
        )
    if scheduler is not None and args.agent_learning_rates is not None:
        raise ValueError(
            "`agent_learning_rates` splits the optimizer into one group per agent, which the learning-rate "
            "scheduler given in `optimizers=` was not built for. Give your optimizer one parameter group per "
            "agent with its own `lr` instead, or pass only the optimizer (`optimizers=(optimizer, None)`): the "
            "trainer then builds the schedule (`lr_scheduler_type`) over the agents' groups."
        )
    if continued_adapters and any(beta != 0.0 for beta in betas):
        # TRL's reference for a trained adapter is a frozen copy of it; on one base, each agent would need its own
        # copy, selected in its reference pass. Not built yet: refuse rather than use the bare base.
        raise NotImplementedError(
            "`beta != 0` with a LoRA team continued from trained adapters (a PeftModel with adapters `agent_0` "
            "...) is not supported yet: each agent's KL reference would be its starting adapter. Set `beta=0`, "
            "or pass one PeftModel per agent (a list; each keeps a frozen copy of its adapter as reference)."
        )


def check_shared_tokenizer(shared_base: bool, processing_classes: list) -> None:
    """Adapters on one base share its tokenizer."""
    if shared_base and len(set(map(id, processing_classes))) > 1:
        raise ValueError("Agents that share one base model share its tokenizer: pass one `processing_class`.")
