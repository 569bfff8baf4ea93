"""Agent state: which of `GRPOTrainer`'s attributes belong to one agent, and each agent's own values of them.

TRL's `GRPOTrainer` keeps one policy's state in its own attributes (tokenizer, generation config, reference model,
metric buffers, the entropy controller, ...). The team trainer runs TRL's code for agent i inside an *agent view*:
agent i's values of the `PER_AGENT` attributes are swapped in for the duration (`MultiAgentGRPOTrainer._agent_view`),
and swapped out after, so that nothing one agent's pass writes reaches another agent.

Every attribute that `GRPOTrainer` sets is sorted into exactly one of `PER_AGENT`, `SHARED` and `UNUSED_BY_TEAMS`
(each with the reason). `tests/test_trl_contract.py` lists the attributes of the installed TRL and fails on one that
is not sorted here, so a TRL upgrade that adds state fails in one named place instead of sharing it silently.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import json
import logging
import os
import types
import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from peft import PeftModel
from torch import nn
from transformers import GenerationConfig, PreTrainedModel
from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving
from trl.models.utils import prepare_deepspeed
from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

from ..tools.environments import TOOL_STATE
from . import sharding
from .arguments import AGENT_SETTINGS
from .modules import mixed_batch_refusal


class PolicyHost(Protocol):
    """What building the views reads from the trainer: TRL's own `PER_AGENT` attributes for agent 0 (read by name,
    `getattr`), and these."""

    args: Any  # the team's config (`MultiAgentGRPOConfig`): per-agent settings by index
    accelerator: Any
    tools: list  # TRL's: whether its policy uses tools
    temperature: float  # the active agent's (the trainer swaps it in per agent)
    is_deepspeed_enabled: bool
    is_fsdp_enabled: bool
    model_tags: list[str]  # the tags of every agent's model card


logger = logging.getLogger(__name__)

# Swapped in per agent. The first group is derived from the agent's model and tokenizer; `processing_class` is
# `Trainer`'s attribute, listed because TRL reads it as the policy's.
PER_AGENT: dict[str, str] = {
    "processing_class": "the agent's tokenizer or processor",
    "_tokenizer": "the agent's tokenizer",
    "_is_vlm": "whether the agent's processing class is a multimodal processor",
    "_image_pad_token_id": "the agent's image placeholder token",
    "_video_pad_token_id": "the agent's video placeholder token",
    "chat_template": "the agent's training chat template (with tools)",
    "eos_token_ids": "the agent's end-of-sequence tokens",
    "generation_config": "the agent's generation settings and special tokens",
    "generation_kwargs": "the agent's generation settings and special tokens",
    "max_completion_length": "the agent's completion length (a per-agent setting)",
    "temperature": "the agent's sampling temperature, also applied to its log-probs (a per-agent setting)",
    "top_p": "the agent's sampling setting (a per-agent setting)",
    "top_k": "the agent's sampling setting (a per-agent setting)",
    "min_p": "the agent's sampling setting (a per-agent setting)",
    "repetition_penalty": "the agent's sampling setting (a per-agent setting)",
    "beta": "the agent's KL coefficient (a per-agent setting)",
    "router_aux_loss_coef": "the agent's MoE router loss coefficient (from its model config)",
    "aux_loss_enabled": "whether the agent's model returns router logits",
    "ref_model": "the agent's reference policy",
    "_metrics": "the metrics TRL records for the agent (logged as agent_{i}/...)",
    "_logs": "TRL's completions-table buffer; the team's own table is the trainer's",
    "_pending_extra_logs": "log_extra values TRL flushes in the agent's pass (the joint pass flushes the trainer's)",
    "_pending_metrics": "log_metric values TRL flushes in the agent's pass (the joint pass flushes the trainer's)",
    "entropy_coef": "the agent's adaptive entropy coefficient",
    "_last_world_entropy": "the agent's entropy at its last optimizer step (adaptive entropy control)",
    "_entropy_window_stats": "the agent's entropy sums over the accumulation window (adaptive entropy control)",
    **TOOL_STATE,  # filled in by `tools.TeamTools.install`: TRL's tool-calling loop then runs per agent
}

# The team's: one value for all agents.
SHARED: dict[str, str] = {
    "accelerator": "one accelerator prepares the whole team",
    "args": "one config; per-agent settings are read from it by index",
    "state": "one trainer state (steps, epochs, logs)",
    "_signature_columns": "the dataset columns kept",
    "_dist": "collectives over the team's processes",
    "_step": "forward-backward passes of the team",
    "_buffered_inputs": "the team's generation batch, reused for num_iterations",
    "_current_train_step_time": "the team's step time",
    "_total_train_tokens": "tokens of the team's steps",
    "_has_async_funcs": "whether the joint reward functions are async",
    "async_loop": "event loop for async reward functions",
    "async_loop_thread": "event loop for async reward functions",
    "async_loop_ready_event": "event loop for async reward functions",
    "reward_funcs": "the joint reward functions (swapped for replayed columns in each agent's pass)",
    "reward_func_names": "names of the joint reward functions (swapped likewise)",
    "reward_weights": "weights of the joint reward functions (swapped likewise)",
    "reward_processing_classes": "tokenizers of reward models",
    "num_generations": "G, the group size every agent samples",
    "num_generations_eval": "G during evaluation",
    "num_iterations": "updates per generation batch",
    "chat_template_kwargs": "chat template arguments from the config",
    "pad_to_multiple_of": "padding from the config",
    "loss_type": "loss from the config",
    "epsilon_low": "clipping from the config",
    "epsilon_high": "clipping from the config",
    "importance_sampling_level": "loss setting from the config",
    "off_policy_mask_threshold": "loss setting from the config",
    "mask_truncated_completions": "loss setting from the config",
    "multi_objective_aggregation": "how reward functions combine, from the config",
    "scale_rewards": "advantage scaling from the config",
    "top_entropy_quantile": "loss setting from the config",
    "use_adaptive_entropy": "whether entropy control runs (its state is per agent)",
    "_entropy_bonus_enabled": "whether the entropy bonus applies (its coefficient is per agent)",
    "shuffle_dataset": "data order from the config",
    "log_completions": "logging setting from the config",
    "log_multimodal": "logging setting from the config",
    "log_unique_prompts": "logging setting from the config",
    "num_completions_to_print": "logging setting from the config",
    "commit_scheduler": "uploads of the team's completion logs",
    "max_tool_calling_iterations": "the tool-calling rounds every agent may take, from the config",
    "use_transformers_continuous_batching": "whether every agent generates through continuous batching",
    "continuous_batching_config": "the paged path's settings (sized per call on CPU: `generation`)",
}

# TRL's single-policy vLLM backend, which a team never builds (TRL is set up with `use_vllm=False`): the team's
# engines and their sync are `vllm.engine.TeamEngine`'s. The trainer turns `use_vllm` on only around TRL's scoring
# and loss, so that TRL's importance-sampling correction (read from the config's fields) runs for each agent.
UNUSED_BY_TEAMS: dict[str, str] = {
    "use_vllm": "vLLM (the team's engines: vllm.engine)",
    "vllm_generation": "vLLM (the team's engines: vllm.engine)",
    "vllm_mode": "vLLM (the team's engines: vllm.engine)",
    "vllm_gpu_memory_utilization": "vLLM (the team's engines: vllm.engine)",
    "vllm_tensor_parallel_size": "vLLM (the team's engines: vllm.engine)",
    "vllm_importance_sampling_correction": "vLLM importance sampling, the same for every agent",
    "vllm_importance_sampling_mode": "vLLM importance sampling, the same for every agent",
    "vllm_importance_sampling_clip_max": "vLLM importance sampling, the same for every agent",
    "vllm_importance_sampling_clip_min": "vLLM importance sampling, the same for every agent",
    "_last_loaded_step": "vLLM weight sync (the team's: trainer._vllm_step)",
}

# PER_AGENT attributes that every agent starts with empty (or at their initial value), agent 0 included: the
# trainer's own values are then the team's joint ones.
_FRESH = ("_metrics", "_logs", "_pending_extra_logs", "_pending_metrics", "_entropy_window_stats")


def initial_state(trainer: PolicyHost) -> dict[str, Any]:
    """The buffers and the entropy controller as `GRPOTrainer.__init__` leaves them, fresh for one agent."""
    state = {name: copy.deepcopy(getattr(trainer, name)) for name in _FRESH}
    state["entropy_coef"] = trainer.args.entropy_coef
    state["_last_world_entropy"] = float("inf")
    return state


def settings_state(trainer: PolicyHost, index: int, tokenizer, eos_token_ids: list[int]) -> dict[str, Any]:
    """Agent `index`'s per-agent settings (`arguments.AGENT_SETTINGS`), and its generation config built from them with
    its tokenizer's special tokens, the way `GRPOTrainer.__init__` builds its own from the config."""
    args = trainer.args
    settings = {name: args.agent_setting(name, index) for name in AGENT_SETTINGS if name != "generation_kwargs"}
    generation_kwargs = {
        "max_new_tokens": settings["max_completion_length"],
        "do_sample": True,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": eos_token_ids,
        "temperature": settings["temperature"],
        "top_p": settings["top_p"],
        "top_k": settings["top_k"],
        "min_p": settings["min_p"],
        "repetition_penalty": settings["repetition_penalty"],
        "cache_implementation": args.cache_implementation,
    }
    extra = args.agent_setting("generation_kwargs", index)
    if extra:
        generation_kwargs.update(extra)
    return {
        **settings,
        "generation_config": GenerationConfig(**generation_kwargs, disable_compile=True),
        "generation_kwargs": generation_kwargs,
    }


def model_state(trainer: PolicyHost, index: int, model: PreTrainedModel | PeftModel, processing_class) -> dict:
    """Prepare agent `index`'s model the way `GRPOTrainer.__init__` prepares its policy, and return the agent's
    model- and tokenizer-derived `PER_AGENT` values, with its own settings."""
    args = trainer.args
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.get_text_config().pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    eos_token_ids = model.generation_config.eos_token_id
    eos_token_ids = (
        [] if eos_token_ids is None else [eos_token_ids] if isinstance(eos_token_ids, int) else eos_token_ids
    )
    if tokenizer.eos_token_id not in eos_token_ids:
        eos_token_ids = [tokenizer.eos_token_id, *eos_token_ids]
    if args.disable_dropout:
        disable_dropout_in_model(model)
    if isinstance(model, PeftModel) and args.gradient_checkpointing:
        model.enable_input_require_grads()  # as GRPOTrainer does for its PEFT model
    settings = settings_state(trainer, index, tokenizer, eos_token_ids)
    add_fused_lm_head(
        model.get_base_model() if isinstance(model, PeftModel) else model,
        temperature=settings["temperature"],
        cast_lm_head_to_fp32=args.cast_lm_head_to_fp32,
        outputs=("log_probs", "entropy"),
    )
    model.add_model_tags(trainer.model_tags)
    text_config = model.config.get_text_config()
    coef = args.router_aux_loss_coef
    router_aux_loss_coef = getattr(text_config, "router_aux_loss_coef", 0.0) if coef is None else coef
    return {
        "processing_class": processing_class,
        "_tokenizer": tokenizer,
        "_is_vlm": tokenizer is not processing_class,
        # Multimodal agents are agent 0's kind only (TRL resolves these ids for its policy).
        "_image_pad_token_id": None,
        "_video_pad_token_id": None,
        "chat_template": (
            get_training_chat_template(processing_class)
            if trainer.tools and not is_chat_template_prefix_preserving(processing_class)
            else None
        ),
        "eos_token_ids": eos_token_ids,
        **settings,
        "router_aux_loss_coef": router_aux_loss_coef,
        "aux_loss_enabled": hasattr(text_config, "output_router_logits") and router_aux_loss_coef != 0.0,
    }


def prepare_reference(trainer: PolicyHost, ref_model: PreTrainedModel | None, temperature: float) -> nn.Module | None:
    """Prepare one agent's reference model as `GRPOTrainer.__init__` prepares its own (log-probs at the agent's
    `temperature`)."""
    if ref_model is None:
        return None
    if trainer.args.disable_dropout:
        disable_dropout_in_model(ref_model)
    add_fused_lm_head(ref_model, temperature=temperature, cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32)
    if trainer.is_deepspeed_enabled:
        return prepare_deepspeed(ref_model, trainer.accelerator)
    if trainer.is_fsdp_enabled:
        return sharding.prepare_reference(ref_model, trainer.accelerator)
    return trainer.accelerator.prepare_model(ref_model, evaluation_mode=True)


def agent_views(
    trainer: PolicyHost, models: list, processing_classes: list, ref_models: list, shared_base: bool
) -> list[dict[str, Any]]:
    """One `PER_AGENT` dict per agent. `GRPOTrainer.__init__` has prepared `models[0]` (and, on a shared base, every
    agent's model) with agent 0's settings: agent 0 takes the trainer's values, agents on the shared base take them
    with their own settings, and the other agents are prepared here."""
    # The tool state is filled in afterwards (`tools.TeamTools.install`); TRL sets some of it only per batch.
    prepared = {name: getattr(trainer, name) for name in PER_AGENT if name not in TOOL_STATE}
    views = []
    for i, (model, processing_class, ref_model) in enumerate(zip(models, processing_classes, ref_models, strict=True)):
        if i == 0:
            view = dict(prepared)
        elif shared_base:
            view = {**prepared, **settings_state(trainer, i, prepared["_tokenizer"], prepared["eos_token_ids"])}
        else:
            view = model_state(trainer, i, model, processing_class)
        view["beta"] = trainer.args.agent_setting("beta", i)  # TRL was shown beta=0 (see the trainer's __init__)
        view["ref_model"] = prepare_reference(trainer, ref_model, view["temperature"])
        view.update(initial_state(trainer))
        views.append(view)
    if shared_base:
        temperatures = [view["temperature"] for view in views]
        if len(set(temperatures)) > 1:
            switch_temperatures(trainer, models[0].get_base_model(), temperatures)
        if trainer.args.generation_mode == "batched" and not same_generation_settings(views):
            logger.warning(
                "The agents' generation settings differ (%s), so the LoRA team generates one agent at a time instead "
                "of in one mixed-adapter batch (`generation_mode='batched'`).",
                ", ".join(trainer.args.per_agent_settings()),
            )
        elif trainer.args.generation_mode == "batched" and len(views) > 1:
            refusal = mixed_batch_refusal(models[0])
            if refusal is not None:
                logger.warning(
                    "The LoRA team generates one agent at a time instead of in one mixed-adapter batch "
                    "(`generation_mode='batched'`): %s.",
                    refusal,
                )
    return views


def same_generation_settings(views: list[dict[str, Any]]) -> bool:
    """Whether every agent generates with the same settings, so that one `generate` call can serve them all."""
    return all(view["generation_kwargs"] == views[0]["generation_kwargs"] for view in views[1:])


def switch_temperatures(trainer: PolicyHost, base: PreTrainedModel, temperatures: list[float]) -> None:
    """Agents on one shared base with different temperatures: TRL divides the logits by the temperature inside the
    base's patched forward (`add_fused_lm_head`), once for all agents. Patch the base once per temperature and let its
    forward pick the one of the agent whose view is active (the trainer's `temperature`)."""
    agent_0_forward = base.forward  # TRL's patch, at agent 0's temperature
    patched = {}
    for temperature in dict.fromkeys(temperatures):
        # Each patch wraps TRL's: its log-prob path is its own, its plain path (generation) falls through to TRL's.
        base.forward = agent_0_forward
        add_fused_lm_head(
            base,
            temperature=temperature,
            cast_lm_head_to_fp32=trainer.args.cast_lm_head_to_fp32,
            outputs=("log_probs", "entropy"),
        )
        patched[temperature] = base.forward
    owner = weakref.ref(trainer)

    @functools.wraps(type(base).forward)  # `generate` validates its keyword arguments against this signature
    def forward(self, *args, **kwargs):
        trainer = owner()
        return patched[trainer.temperature if trainer is not None else temperatures[0]](*args, **kwargs)

    base.forward = types.MethodType(forward, base)


# What a checkpoint keeps of each agent's state beyond its weights (TRL saves its controller's state for one policy).
ENTROPY_STATE_FILE = "agent_entropy_ctrl_state.json"


def save_entropy_states(views: list[dict[str, Any]], checkpoint_dir: str) -> None:
    """Write every agent's adaptive entropy controller state into `checkpoint_dir`."""
    states = [{"entropy_coef": v["entropy_coef"], "last_world_entropy": v["_last_world_entropy"]} for v in views]
    with open(os.path.join(checkpoint_dir, ENTROPY_STATE_FILE), "w") as f:
        json.dump(states, f)


def load_entropy_states(views: list[dict[str, Any]], checkpoint_dir: str) -> None:
    """Restore what `save_entropy_states` wrote (a checkpoint without the file leaves the controllers as they are)."""
    path = os.path.join(checkpoint_dir, ENTROPY_STATE_FILE)
    if not os.path.isfile(path):
        return
    with open(path) as f:
        states = json.load(f)
    if len(states) != len(views):
        raise ValueError(f"{path} holds {len(states)} agents' entropy state; this team has {len(views)} agents.")
    for view, state in zip(views, states):
        view["entropy_coef"], view["_last_world_entropy"] = state["entropy_coef"], state["last_world_entropy"]


def merge_agent_metrics(views: list[dict[str, Any]], metrics: dict[str, list], mode: str, prefixes: list[str]) -> None:
    """Move what TRL recorded in each agent's view (`_metrics[mode]`) into the team's `metrics`, under the agent's
    prefix (`agent_{i}/`, or none for a team of one)."""
    for view, prefix in zip(views, prefixes, strict=True):
        for key, values in view["_metrics"][mode].items():
            if key == "num_tokens":  # TRL's counter is the trainer's, shared by all agents: log it once
                metrics[key] = values
            elif prefix or key not in metrics:  # a team of one: the joint values are the agent's
                metrics[prefix + key].extend(values)
        view["_metrics"][mode].clear()


@contextlib.contextmanager
def metrics_aside(views: list[dict[str, Any]]) -> Iterator[list[dict[str, list]]]:
    """Inside the block, each agent's view records its metrics into fresh dicts, yielded (one per agent); its own come
    back after it. For sampling outside a training step (preference pairs), whose completion lengths and rewards must
    not land in the next training log."""
    saved = [view["_metrics"] for view in views]
    fresh = [{"train": collections.defaultdict(list), "eval": collections.defaultdict(list)} for _ in views]
    for view, metrics in zip(views, fresh, strict=True):
        view["_metrics"] = metrics
    try:
        yield fresh
    finally:
        for view, metrics in zip(views, saved, strict=True):
            view["_metrics"] = metrics


@contextlib.contextmanager
def swapped(obj: Any, **attributes) -> Iterator[None]:
    """Inside the block, `obj`'s `attributes` hold the given values; their own values come back after it."""
    saved = {name: getattr(obj, name) for name in attributes}
    for name, value in attributes.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)
