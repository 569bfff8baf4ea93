"""Loading a team: the agents' models, their tokenizers, their LoRA adapters and their reference copies.

A model id or path is loaded exactly as `GRPOTrainer` loads its own (`create_model_from_path` with
`model_init_kwargs`), so that a team of one matches it; a local folder saved with `save_pretrained` loads the same
way as a Hub id.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from peft import PeftConfig, PeftModel, get_peft_model
from torch import nn
from transformers import AutoProcessor, PreTrainedModel, PreTrainedTokenizerBase, set_seed
from trl.trainer.utils import create_model_from_path

from ..common import per_agent
from .arguments import check_shared_tokenizer, check_team_arguments
from .reference_sync import check_reference_sync

if TYPE_CHECKING:  # the trainer's config, above this package: named in annotations only
    from ..config import MultiAgentGRPOConfig


@dataclass
class LoadedTeam:
    """The agents as loaded, before the trainer prepares them."""

    models: list  # one per agent, or the one shared base (a PeftModel with one adapter per agent)
    processing_classes: list  # one per model
    shared_base: bool  # a LoRA team: one base, one adapter per agent
    num_agents: int
    betas: list[float]  # each agent's KL coefficient


def load_team(model, args: MultiAgentGRPOConfig, peft_config, processing_class, quantization_config, scheduler):
    """Load the agents (`model=`, `peft_config=`, `processing_class=` as the trainer takes them): one base with one
    adapter per agent, or one model per agent (each with its own adapter if asked), and their tokenizers. Settles
    `args.num_agents` and checks what depends on it, before anything else is built."""
    # PEFT draws adapter weights from the global generator, so seed first, as GRPOTrainer does.
    set_seed(args.seed)
    check_peft_arguments(model, peft_config)
    adapter_names = agent_adapter_names(model, args.num_agents)  # a LoRA team's trained adapters, if given
    shared_base = adapter_names is not None or (
        peft_config is not None and isinstance(model, (str, os.PathLike, nn.Module))
    )
    models = load_agents(model, args, quantization_config, copies=not shared_base)
    if adapter_names is not None:
        args.num_agents = len(adapter_names)
    num_agents = args.num_agents = (args.num_agents or 1) if shared_base else len(models)
    args.check_agent_settings(num_agents)  # before anything reads an agent's value
    args.check_rollout_size(num_agents)  # the config counted `num_agents=None` as one agent
    betas = [args.agent_setting("beta", i) for i in range(num_agents)]
    check_team_arguments(args, num_agents, scheduler, adapter_names is not None, betas)
    trained_adapters = [m for m, beta in zip(models, betas) if isinstance(m, PeftModel) and beta != 0.0]
    models = add_adapters(models, per_agent("peft_config", peft_config, num_agents, PeftConfig), shared_base)
    for agent in trained_adapters:
        add_reference_adapter(agent)
    check_reference_sync(args, models)
    processing_classes = load_processing_classes(processing_class, models, args)
    check_shared_tokenizer(shared_base, processing_classes)
    return LoadedTeam(models, processing_classes, shared_base, num_agents, betas)


def load_agents(model, args: MultiAgentGRPOConfig, quantization_config, copies: bool) -> list[PreTrainedModel]:
    """The agents' models: one per agent, or with `copies=False` one model (the base the agents' adapters share).

    `model` is a model id or path (loaded `args.num_agents` times), one model, or a list with one model or id per
    agent.
    """
    if isinstance(model, (str, os.PathLike)):
        entries = [model] * ((args.num_agents or 1) if copies else 1)
    elif isinstance(model, nn.Module):
        if copies and args.num_agents not in (None, 1):
            fix = (
                "name its adapters `agent_0` ... `agent_{N-1}` (one per agent, on this one base)"
                if isinstance(model, PeftModel)
                else "a `peft_config` to train one adapter per agent on this model"
            )
            raise ValueError(
                f"One model object was given with `num_agents={args.num_agents}`. Pass a list of {args.num_agents} "
                f"models, a model id or path (loaded once per agent), or {fix}."
            )
        entries = [model]
    else:
        entries = list(model)
        if not entries:
            raise ValueError("The list of agents is empty: pass at least one model or model id.")
        if args.num_agents is not None and args.num_agents != len(entries):
            raise ValueError(
                f"{len(entries)} agents were given but `num_agents={args.num_agents}`: make them agree (or leave "
                "`num_agents` unset to use the number of agents given)."
            )
    models = []
    for entry in entries:
        if isinstance(entry, (str, os.PathLike)):
            init_kwargs = dict(args.model_init_kwargs or {})
            if quantization_config is not None:
                init_kwargs["quantization_config"] = quantization_config
            if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
                init_kwargs["device_map"] = None
            init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
            entry = create_model_from_path(str(entry), **init_kwargs)
        elif not isinstance(entry, (PreTrainedModel, PeftModel)):
            raise TypeError(
                "Each agent must be a model id, a path, a transformers PreTrainedModel or a PeftModel; got "
                f"{type(entry).__name__}."
            )
        models.append(entry)
    if len({id(m) for m in models}) != len(models):
        raise ValueError(
            "The same model object was given for several agents; agents must not share weights. Pass separate copies "
            "(or a model id or path, which is loaded once per agent)."
        )
    return models


def check_peft_arguments(model, peft_config) -> None:
    """Refuse a `PeftModel` agent together with a `peft_config` for it, as `GRPOTrainer` does: a second adapter
    would be added beside the one the model carries, trainable but owned by no agent."""
    if peft_config is None or isinstance(model, (str, os.PathLike)):
        return
    models = [model] if isinstance(model, nn.Module) else list(model)
    configs = [peft_config] * len(models) if isinstance(peft_config, PeftConfig) else list(peft_config)
    for i, (agent, config) in enumerate(zip(models, configs)):
        if isinstance(agent, PeftModel) and config is not None:
            which = "`model`" if isinstance(model, nn.Module) else f"Agent {i} in `model`"
            raise ValueError(
                f"{which} is a PeftModel (adapters {list(agent.peft_config)}) and `peft_config` asks for a new "
                "adapter on it. To continue training its adapters, drop `peft_config` (on one base, name them "
                "`agent_0` ... `agent_{N-1}`: one per agent); to train new adapters, `merge_and_unload()` the model "
                "first and pass the result with `peft_config`."
            )


def agent_adapter_names(model, num_agents: int | None) -> list[str] | None:
    """The agents' adapter names when `model` is one `PeftModel` whose adapters are named `agent_0` ...
    `agent_{N-1}` (a LoRA team continued from trained adapters, on one base); `None` for any other `model`.

    The adapters must be exactly those, N being `num_agents` when it is set.
    """
    if not isinstance(model, PeftModel) or not any(name.startswith("agent_") for name in model.peft_config):
        return None
    present = list(model.peft_config)
    count = num_agents if num_agents is not None else len(present)
    expected = [f"agent_{i}" for i in range(count)]
    if sorted(present) != sorted(expected):
        raise ValueError(
            f"The PeftModel holds the adapters {present}; a LoRA team continued from trained adapters needs exactly "
            f"one per agent, named {expected}. Load each agent's adapter under its name "
            "(`PeftModel.from_pretrained(base, path_0, adapter_name='agent_0')`, then "
            "`model.load_adapter(path_i, adapter_name='agent_i')`), and delete any other (`delete_adapter`)."
        )
    return expected


def load_processing_classes(processing_class, models: Sequence[nn.Module], args: MultiAgentGRPOConfig) -> list:
    """One tokenizer (or processor) per model: the one given for all, one given per agent, or each model's own."""
    if processing_class is None or isinstance(processing_class, PreTrainedTokenizerBase):
        processing_classes = [processing_class] * len(models)
    else:
        processing_classes = list(processing_class)
        if len(processing_classes) != len(models):
            raise ValueError(
                f"{len(processing_classes)} tokenizers (`processing_class`) were given for {len(models)} agents: "
                "pass one tokenizer for all, or one per agent."
            )
    return [
        pc
        if pc is not None
        else AutoProcessor.from_pretrained(
            m.config.name_or_path,
            truncation_side="left",
            padding_side="left",
            trust_remote_code=args.trust_remote_code,
        )
        for pc, m in zip(processing_classes, models, strict=True)
    ]


def add_adapters(models: list, peft_configs: list[PeftConfig] | None, shared_base: bool) -> list:
    """Put the agents' LoRA adapters on: on a shared base, one adapter per agent named `agent_{i}` (returns the one
    `PeftModel`); otherwise an adapter on each model that is not a `PeftModel` already.

    Each adapter gets its own copy of its config: PEFT writes into the config it is given (for example
    `base_model_name_or_path`), so one object shared by several agents would carry the last agent's values.
    """
    if peft_configs is None:
        return models
    peft_configs = [copy.deepcopy(c) for c in peft_configs]
    if shared_base:
        team = get_peft_model(models[0], peft_configs[0], adapter_name="agent_0")
        for i, config in enumerate(peft_configs[1:], start=1):
            team.add_adapter(f"agent_{i}", config)
        return [team]
    return [m if isinstance(m, PeftModel) else get_peft_model(m, c) for m, c in zip(models, peft_configs)]


def add_reference_adapter(model: PeftModel) -> None:
    """Give an agent that arrived as a `PeftModel` (an adapter already trained) a frozen copy of its adapter, named
    `ref`, as its KL reference: what `GRPOTrainer.__init__` does for such a model when `beta != 0`. (An adapter the
    trainer creates starts at the base's behaviour, so its reference is the base with the adapter disabled.)"""
    name = model.active_adapter
    model.add_adapter("ref", copy.deepcopy(model.peft_config[name]))
    for param_name, param in model.named_parameters():
        if f".{name}." in param_name:
            model.get_parameter(param_name.replace(f".{name}.", ".ref.")).data.copy_(param.data)


def reference_copies(models: list, betas: float | Sequence[float]) -> list[nn.Module | None]:
    """Each full-model agent's reference: a copy of its initial weights (`None` where its beta is 0, and for adapter
    agents, whose reference is their base or their `ref` adapter). `betas`: one for all, or one per model.

    Copied here, before TRL patches the forward (a copy made after would call the original model's forward), and
    not reloaded from a path as TRL does: an in-memory model has none.
    """
    betas = [betas] * len(models) if isinstance(betas, (int, float)) else list(betas)
    return [
        copy.deepcopy(m) if beta != 0.0 and not isinstance(m, PeftModel) else None
        for m, beta in zip(models, betas, strict=True)
    ]
