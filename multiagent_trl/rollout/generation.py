"""Faster generation for teams: continuous batching (transformers' paged path) and compiled decoding.

Two options, both off by default, each checked against the plain path's greedy tokens in `tests/test_generation.py`:

- `use_transformers_continuous_batching=True` (TRL's field): each agent generates through `generate_batch`, which
  schedules requests over a paged KV cache instead of one padded batch. A team of separate models makes one call per
  agent. A LoRA team in `generation_mode="batched"` makes one call per agent too, each under that agent's adapter:
  the paged path packs every scheduled request's tokens into one flat sequence and picks the requests of each step
  itself, so the rows of an agent are not known in advance, which the batched per-row LoRA update
  (`team._AgentRowsLora`) and PEFT's `adapter_names=` both need. On CPU, the paged cache is sized from the workload
  (`sized_continuous_batching_config`) unless `transformers_continuous_batching_config` sizes it: the default sizing
  reads a fraction of the machine's free memory and fills tensors of that size at every call (about 10 s measured
  on the development machine for the tiny model).
- `compile_generation=True` (the team's field): a static KV cache and `torch.compile` of the decoding step, through
  `generate`'s own auto-compilation (`GenerationConfig.compile_config`), which TRL switches off
  (`disable_compile=True`). transformers compiles a model once and keeps it (`model._compiled_call`), so each agent's
  model is compiled once, at its first generation, and recompiled only when shapes change beyond what dynamic
  shapes cover. transformers auto-compiles on accelerators only; the team asks for it on every device
  (`CompileConfig._compile_all_devices`), since inductor compiles for CPUs too.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import math
from typing import TYPE_CHECKING, Any

import torch
from transformers import CompileConfig, GenerationConfig

from .sampling import use_top_k_top_p

if TYPE_CHECKING:
    from transformers.generation import ContinuousBatchingConfig


def compiled(config: GenerationConfig, compile_kwargs: dict[str, Any] | None = None) -> GenerationConfig:
    """A copy of `config` that decodes with a static KV cache and a compiled decoding step.

    Args:
        config: The agent's generation config (TRL's, with `disable_compile=True`).
        compile_kwargs: `torch.compile` arguments (`CompileConfig` fields: `backend`, `mode`, `dynamic`,
            `fullgraph`, ...). `None` uses inductor with dynamic shapes left to torch, and graph breaks allowed.

    Returns:
        The new config; `config` is unchanged.
    """
    config = copy.deepcopy(config)
    config.cache_implementation = config.cache_implementation or "static"
    config.disable_compile = False
    compile_config = CompileConfig(**{"fullgraph": False, "dynamic": None, **(compile_kwargs or {})})
    # transformers auto-compiles `generate` on accelerators only; this flag (the one it reads) allows CPUs too.
    compile_config._compile_all_devices = True
    config.compile_config = compile_config
    return config


def configure_decoding(views: list[dict[str, Any]], models: list, args) -> GenerationConfig:
    """Apply the team's decoding options (`args.compile_generation`) to every agent's generation config in `views`,
    and let each of `models` (the agents' models) sample top-k then top-p without sorting the vocabulary
    (`sampling.use_top_k_top_p`: the same tokens). Returns agent 0's generation config (called once, at
    construction)."""
    for model in models:
        use_top_k_top_p(model)
    if args.compile_generation:
        for view in views:
            view["generation_config"] = compiled(view["generation_config"], args.compile_generation_kwargs)
    return views[0]["generation_config"]


def sized_continuous_batching_config(
    config: ContinuousBatchingConfig | None,
    inputs: list[list[int]],
    generation_config: GenerationConfig | None,
    device: torch.device,
) -> ContinuousBatchingConfig | None:
    """The continuous batching config for one `generate_batch` call on `device`.

    On an accelerator, or when the config already sets `num_blocks` or `max_batch_tokens`, `config` as it is. On a
    CPU otherwise, a copy whose paged cache holds exactly this call's requests (every prompt plus its
    `max_new_tokens`) and whose batches may hold every prompt at once: the default sizing would fill a cache of a
    fraction of the machine's memory at each call.
    """
    from transformers.generation import ContinuousBatchingConfig

    config = config if config is not None else ContinuousBatchingConfig()
    if device.type != "cpu" or config.num_blocks is not None or config.max_batch_tokens is not None or not inputs:
        return config
    max_new_tokens = getattr(generation_config, "max_new_tokens", None) or 0
    returns = getattr(generation_config, "num_return_sequences", None) or 1
    pages = math.ceil((max(map(len, inputs)) + max_new_tokens + 1) / config.page_size)
    return dataclasses.replace(
        config,
        num_blocks=len(inputs) * returns * pages + 1,
        max_batch_tokens=max(sum(map(len, inputs)), len(inputs) * returns),
    )


@torch.no_grad()
def generate_batch(model, inputs: list[list[int]], **kwargs) -> dict:
    """`model.generate_batch(inputs, **kwargs)` (transformers' continuous batching), with the paged cache sized by
    `sized_continuous_batching_config`. Returns the outputs by request id, in the order of `inputs`."""
    device = next(model.parameters()).device
    kwargs["continuous_batching_config"] = sized_continuous_batching_config(
        kwargs.get("continuous_batching_config"), inputs, kwargs.get("generation_config"), device
    )
    # The manager runs `gc.collect()` twice when it stops, each a full pass over every object of the process (most of
    # a call's time on a CPU, and more the larger the process). Freezing the objects that exist before the call
    # leaves those passes only the call's own objects; anything older that became garbage meanwhile goes at Python's
    # next automatic collection after `unfreeze`.
    gc.freeze()
    try:
        return model.generate_batch(inputs, **kwargs)
    finally:
        gc.unfreeze()
