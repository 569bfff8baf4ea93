"""Sharded engines for teams: FSDP2 (torch's `fully_shard`) per agent, and the check that the engine asked for is the
one running (never a silent fallback).

What each library does with a launch config that asks for FSDP (`distributed_type: FSDP`, which `accelerate launch`
turns into `ACCELERATE_USE_FSDP=true`), read in accelerate 1.16 / transformers 5.24 / torch 2.13:

- `PartialState` (accelerate `state.py`, `_prepare_backend`) picks the backend from the visible accelerator. With no
  GPU and no `cpu=True`, there is none: the state is `DistributedType.NO` with `num_processes == 1`, although the
  launcher started several processes (and `PartialState` even initialized their process group). Each process then
  trains the whole team alone, and all of them write the same output folder.
- transformers' `TrainingArguments._setup_devices` passes `cpu=True` only for `use_cpu=True` or
  `ACCELERATE_USE_CPU=true`. The processes then form a `MULTI_CPU` (gloo) group, but `AcceleratorState.__init__`
  turns a state into `DistributedType.FSDP` only from an accelerator type (`MULTI_GPU`, `MULTI_XPU`, ...), never
  from `MULTI_CPU`: the FSDP plugin is dropped, and the run is plain data parallelism.
- torch's `fully_shard` itself runs on CPU over gloo (all-gather, reduce-scatter, DTensor state dicts).

So on CPU, `fsdp_on_cpu` lets Accelerate build its FSDP state from a `MULTI_CPU` group (the device stays `cpu`), and
`check_engine` raises whenever the trainer ends up in another mode than the one asked for. DeepSpeed is never set up
on CPU by Accelerate (`ACCELERATE_USE_DEEPSPEED` is read only `if not cpu`): asking for it there is an error.

`shard_team` wraps a team for FSDP2: each agent's decoder layers are FSDP units, each agent (its embeddings, final
norm and head) is one more unit, and the team is the root; an agent's forward and backward therefore gather only its
own shards. A LoRA team shards its one base model once. Accelerate's own `fsdp2_prepare_model` wraps each agent
(so mixed precision, `cpu_ram_efficient_loading` and tied weights behave as for one model), and then sees an already
sharded team when the Trainer prepares it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType
from torch import nn

FSDP_FIX = (
    "On a machine without GPUs, launch with `ACCELERATE_USE_CPU=true accelerate launch --config_file "
    "examples/accelerate_configs/fsdp.yaml ...` (or set `use_cpu=True`) so that the processes form one gloo group."
)


def requested_engine(args) -> str | None:
    """The sharded engine that the launch config or the training arguments ask for: `"fsdp"`, `"deepspeed"`, or
    `None` (plain data parallelism or a single process).

    `accelerate launch` with `distributed_type: FSDP` sets `ACCELERATE_USE_FSDP=true`, with `DEEPSPEED`
    `ACCELERATE_USE_DEEPSPEED=true`; `TrainingArguments(fsdp=...)` and `TrainingArguments(deepspeed=...)` ask directly.
    """
    if getattr(args, "deepspeed", None) or _env_flag("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    if getattr(args, "fsdp", None) or _env_flag("ACCELERATE_USE_FSDP"):
        return "fsdp"
    return None


def check_launch(args) -> None:
    """Raise, before any model is loaded, if the processes that were launched do not form one distributed run.

    Args:
        args: The `TrainingArguments`; reading `args.distributed_state` sets up the process group.

    Raises:
        RuntimeError: `WORLD_SIZE` processes were launched but Accelerate counts another number, or DeepSpeed was
            asked for on CPU.
    """
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    state = args.distributed_state
    engine = requested_engine(args)
    if launched > 1 and state.num_processes != launched:
        raise RuntimeError(
            f"{launched} processes were launched (WORLD_SIZE={launched}), but Accelerate set up "
            f"{state.num_processes} (distributed type {state.distributed_type.value}): no accelerator device is "
            "visible, so each process would train the whole team alone and all would write the same output folder. "
            + (FSDP_FIX if engine != "deepspeed" else "DeepSpeed needs GPUs; on CPU, use FSDP or DDP instead.")
        )
    if engine == "deepspeed" and state.distributed_type == DistributedType.MULTI_CPU:
        raise RuntimeError(
            "DeepSpeed was asked for (ACCELERATE_USE_DEEPSPEED or `deepspeed=`), but the processes run on CPU, where "
            "Accelerate does not set DeepSpeed up (it reads ACCELERATE_USE_DEEPSPEED only without `cpu`). Launch on "
            "GPUs, or use `examples/accelerate_configs/fsdp.yaml` (FSDP2 runs on CPU over gloo)."
        )


@contextmanager
def fsdp_on_cpu(args) -> Iterator[None]:
    """While the Trainer creates its `Accelerator`: when FSDP is asked for and the processes form a CPU (gloo)
    group, present that group to Accelerate as a multi-device one, so that `AcceleratorState` attaches the FSDP
    plugin (it does so only for accelerator types). The device stays `cpu`; afterwards the state reads `FSDP`.

    Args:
        args: The `TrainingArguments`.
    """
    state = PartialState()
    if requested_engine(args) != "fsdp" or state.distributed_type != DistributedType.MULTI_CPU:
        yield
        return
    PartialState._shared_state["distributed_type"] = DistributedType.MULTI_GPU
    try:
        yield
    finally:  # AcceleratorState has set FSDP; if creating the Accelerator failed, undo
        if PartialState._shared_state.get("distributed_type") == DistributedType.MULTI_GPU:
            PartialState._shared_state["distributed_type"] = DistributedType.MULTI_CPU


def check_engine(accelerator: Accelerator, args) -> None:
    """Raise if the launch config or `args` asked for FSDP or DeepSpeed and the accelerator is not in that mode.

    Raises:
        RuntimeError: naming what was asked, what was set up, and what to change.
    """
    engine = requested_engine(args)
    state = accelerator.state
    if engine == "fsdp":
        if state.distributed_type != DistributedType.FSDP:
            raise RuntimeError(
                f"FSDP was asked for (ACCELERATE_USE_FSDP or `fsdp=`), but Accelerate set up "
                f"{state.distributed_type.value} with {state.num_processes} process(es). {FSDP_FIX}"
            )
        if state.fsdp_plugin.fsdp_version != 2:
            raise RuntimeError(
                "Teams are sharded with FSDP2 only (each agent its own units): set `fsdp_version: 2` in the "
                "Accelerate config, or `fsdp_config={'version': 2}`."
            )
        if getattr(args, "save_merged_models", False):
            raise NotImplementedError(
                "`save_merged_models=True` is not supported under FSDP yet (merging copies a sharded model): save the "
                "adapters, then merge them with `PeftModel.from_pretrained(base, folder).merge_and_unload()`."
            )
    elif engine == "deepspeed" and state.distributed_type != DistributedType.DEEPSPEED:
        raise RuntimeError(
            f"DeepSpeed was asked for (ACCELERATE_USE_DEEPSPEED or `deepspeed=`), but Accelerate set up "
            f"{state.distributed_type.value}. DeepSpeed needs GPUs and `pip install multiagent-trl[deepspeed]`."
        )


def is_fsdp2(accelerator: Accelerator) -> bool:
    """Whether the accelerator shards with FSDP2."""
    return (
        accelerator.state.distributed_type == DistributedType.FSDP and accelerator.state.fsdp_plugin.fsdp_version == 2
    )


def shard_team(team: nn.Module, accelerator: Accelerator) -> nn.Module:
    """Shard a team with FSDP2, in place: every distinct model of the team (each agent, or a LoRA team's one base)
    is wrapped by Accelerate's `fsdp2_prepare_model` (its decoder layers are units, the rest of it one more), then
    the team itself becomes the root unit, which holds no parameters of its own.

    Args:
        team: An `AgentTeam` or `LoraAgentTeam`.
        accelerator: The trainer's accelerator, in FSDP2 mode.

    Returns:
        The team (now also a `FSDPModule`).
    """
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    if isinstance(team, FSDPModule):
        return team
    for model in team.models():
        fsdp2_prepare_model(accelerator, model)
    plugin = accelerator.state.fsdp_plugin
    fully_shard(
        team,
        offload_policy=plugin.cpu_offload,
        mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy(),
    )
    team.generate = _generate_unsharded(team, team.generate)
    # FSDP's root is the first unit to run forward; generation runs the team's `generate`, not its `forward`, so it
    # must be a forward method of the root too (else the active agent becomes a root of its own, and the team's
    # first training forward fails).
    register_fsdp_forward_method(team, "generate")
    refresh = getattr(team, "refresh_parameters", None)
    if refresh is not None:  # sharding replaced every parameter by a sharded one
        refresh()
    return team


def _generate_unsharded(team: nn.Module, generate):
    """`team.generate`, with the generating model's parameters gathered once for the whole call: one all-gather per
    unit instead of one per unit and decoding step, and plain tensors for the LoRA team's batched generation (which
    stacks the agents' adapter weights before the first step). A team of separate agents gathers the active agent
    only; a LoRA team, its one base."""

    def generate_unsharded(*args, **kwargs):
        models = team.models()
        model = models[0] if len(models) == 1 else team.agents[team.active]
        with unsharded(model):
            return generate(*args, **kwargs)

    return generate_unsharded


@contextmanager
def unsharded(model: nn.Module) -> Iterator[None]:
    """Within the block, every FSDP unit of `model` holds its full parameters (gathered on entry, not released after
    each forward); they are sharded again on exit."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    # What each unit does after forward (Accelerate sets it per unit: layers reshard, the tail and root do not). The
    # public setter takes one bool for all of a unit's groups; the value set is kept on its groups.
    saved = [[g.post_forward_mesh_info for g in _param_groups(m)] for m in units]
    for m in units:
        m.set_reshard_after_forward(False, recurse=False)
        m.unshard()
    try:
        yield
    finally:
        for m, infos in zip(units, saved):
            m.reshard()
            for group, info in zip(_param_groups(m), infos):
                group.post_forward_mesh_info = info


def _param_groups(unit: nn.Module) -> list:
    """An FSDP unit's parameter groups: a list from torch 2.12 on (`_fsdp_param_groups`); torch 2.11 keeps one group
    or none (`_fsdp_param_group`)."""
    state = unit._get_fsdp_state()
    if hasattr(state, "_fsdp_param_groups"):
        return state._fsdp_param_groups
    return [] if state._fsdp_param_group is None else [state._fsdp_param_group]


def prepare_reference(model: nn.Module, accelerator: Accelerator) -> nn.Module:
    """Shard a reference model like its agent (its own FSDP root, frozen, in eval mode).

    Accelerate's preparation (not a bare `fully_shard`) is needed with `cpu_ram_efficient_loading`: only the main
    process loaded real weights, and they are broadcast from it while sharding.
    """
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model

    model.requires_grad_(False)
    model = fsdp2_prepare_model(accelerator, model)
    model.eval()
    return model


def clip_grad_norm_(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` that also takes FSDP2's sharded (DTensor) gradients: the norm is over the
    full gradients (reduced across ranks), and it is returned as a plain tensor."""
    from torch.distributed.tensor import DTensor

    parameters = [p for p in parameters if p.grad is not None]
    if not parameters:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, norm)
    return norm


def parameter_bytes(module: nn.Module) -> int:
    """Bytes of `module`'s parameters, unsharded (a parameter shared by two modules, as tied embeddings, counts
    once)."""
    return sum(p.numel() * p.element_size() for p in module.parameters())


def local_parameter_bytes(module: nn.Module) -> int:
    """Bytes of parameters this process holds for `module`: the local shards of sharded parameters."""
    from torch.distributed.tensor import DTensor

    total = 0
    for p in module.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The full (gathered) state dict of a possibly sharded module, on every process, on CPU."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import FSDPModule

    if not any(isinstance(m, FSDPModule) for m in module.modules()):
        return {k: v.detach().cpu() for k, v in module.state_dict().items()}
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))


def load_checkpoint(accelerator: Accelerator, team: nn.Module, folder: str) -> None:
    """Resume a sharded team from a Trainer checkpoint: the team's state as the Trainer saved it for FSDP
    (`pytorch_model_fsdp*`, written with the optimizer's), loaded into every process's shards."""
    from accelerate.utils import load_fsdp_model

    if not any(name.startswith("pytorch_model_fsdp") for name in os.listdir(folder)):
        raise FileNotFoundError(
            f"Checkpoint {folder} holds no FSDP model state (pytorch_model_fsdp*): it was not written under FSDP. "
            "Resume it with the engine that wrote it."
        )
    load_fsdp_model(accelerator.state.fsdp_plugin, accelerator, team, folder)


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")
