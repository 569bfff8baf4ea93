"""Per-agent devices: each agent's model (and its reference) on a device of its own, in one process.

With `agent_devices=["cuda:0", "cuda:1"]`, agent i's weights live on `agent_devices[i]`: a team whose agents do not
fit on one accelerator together still trains in a single process. `agent_devices` may also be one device for every
agent (`"cuda:1"`, or a list of one) or `"auto"` (`resolve_devices`). The trainer's tensors stay on the process's
device (`accelerator.device`); hooks on each agent move a forward's inputs to the agent's device and its outputs
back, so TRL's generation, log-probabilities and loss run unchanged, and autograd carries gradients across.

This is model parallelism across agents, not data parallelism: it is refused under a multi-process launch (use
Accelerate's placement there, one copy of the team per process).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def resolve_devices(spec: str | Sequence[str], num_agents: int | None, name: str) -> list[str]:
    """One device per agent from `spec`: one device for every agent (a name, or a list of one), one per agent, or
    `"auto"`: `cuda:0` ... `cuda:{N-1}` when there are at least N CUDA devices, every agent on `cuda:0` when there
    are fewer, the CPU without CUDA (CoMLRL's rule). With `num_agents=None` (not known yet) a list is returned as
    given and one device, or `"auto"`, as one entry. Entries are checked by `check_devices`.

    >>> resolve_devices("cpu", 2, "agent_devices")
    ['cpu', 'cpu']
    """
    specs = [spec] if isinstance(spec, str) else spec
    if not isinstance(specs, Sequence) or len(specs) == 0:
        raise ValueError(
            f"`{name}` is {'an empty list' if isinstance(specs, Sequence) else repr(spec)}: give one device for all "
            "agents (e.g. 'cuda:0'), 'auto', or a list with one device per agent."
        )
    count = num_agents if num_agents is not None else len(specs)
    if len(specs) == 1 and str(specs[0]).strip().lower() == "auto":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == 0:
            return ["cpu"] * count
        return [f"cuda:{i}" for i in range(count)] if available >= count else ["cuda:0"] * count
    if len(specs) == 1:
        return [str(specs[0])] * count
    if len(specs) != count:
        raise ValueError(
            f"`{name}` has {len(specs)} devices for {count} agents: give one device, 'auto', or a list of 1 or "
            f"{count} devices (one per agent)."
        )
    return [str(s) for s in specs]


def check_devices(
    devices: str | Sequence[str], name: str, num_agents: int | None, world_size: int
) -> list[torch.device]:
    """Parse and check a device specification (`resolve_devices`'s forms): one device per agent, each a device this
    machine has.

    >>> check_devices(["cpu", "cpu"], "agent_devices", 2, world_size=1)
    [device(type='cpu'), device(type='cpu')]
    """
    devices = resolve_devices(devices, num_agents, name)
    if world_size > 1:
        raise ValueError(
            f"`{name}` places each agent on its own device within one process; this run has {world_size} processes. "
            "Under `accelerate launch` / `torchrun`, leave `agent_devices` unset (each process holds the team on its "
            "own device), or launch a single process."
        )
    parsed = []
    for spec in devices:
        try:
            device = torch.device(spec)
        except (RuntimeError, TypeError) as err:
            raise ValueError(f"`{name}` entry {spec!r} is not a device name (e.g. 'cpu', 'cuda:1').") from err
        if device.type != "cpu":
            module = getattr(torch, device.type, None)
            available = module.device_count() if module is not None and module.is_available() else 0
            index = device.index if device.index is not None else 0
            if index >= available:
                raise ValueError(
                    f"`{name}` entry {spec!r} does not exist on this machine ({available} {device.type} devices "
                    f"visible). Use one of {['cpu'] + [f'{device.type}:{i}' for i in range(available)]}."
                )
        parsed.append(device)
    return parsed


def _to(value, device: torch.device):
    """`value` with its tensors (also inside tuples, lists, dicts and model outputs) on `device`; caches untouched."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, dict):  # ModelOutput is a dict too: assigning keeps its class
        for key in list(value.keys()):
            value[key] = _to(value[key], device)
        return value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to(v, device) for v in value)
    return value


def place_on(model: nn.Module, device: torch.device, home: torch.device) -> None:
    """Move `model` to `device`, and make its forward take inputs from, and return outputs to, `home`."""
    model.to(device)
    if device == home:
        return

    def inputs_to_device(module, args, kwargs):
        return _to(tuple(args), device), _to(dict(kwargs), device)

    def outputs_home(module, args, kwargs, output):
        return _to(output, home)

    model.register_forward_pre_hook(inputs_to_device, with_kwargs=True)
    model.register_forward_hook(outputs_home, with_kwargs=True)


def place_agents(
    team: nn.Module,
    ref_models: Sequence[nn.Module | None],
    devices: str | Sequence[str],
    reference_devices: str | Sequence[str] | None,
    home: torch.device,
    world_size: int,
) -> None:
    """Put each agent of `team` (and its reference model, `ref_models[i]`) on its device, with inputs and outputs
    moved from and to `home` (the process's device), and mark the team as placed by the user so that Trainer and
    Accelerate do not move it back onto one device (the trainer must not either: `is_model_parallel`)."""
    num_agents = len(ref_models)
    agent_devices = check_devices(devices, "agent_devices", num_agents, world_size)
    ref_devices = agent_devices
    if reference_devices is not None:
        ref_devices = check_devices(reference_devices, "reference_devices", num_agents, 1)
    if len(team.models()) != num_agents:
        raise ValueError(
            "`agent_devices` needs one model per agent; agents that share one base model (one LoRA adapter each) "
            "live on the base's device. Pass a list of models, or drop `agent_devices`."
        )
    for i, model in enumerate(team.models()):
        place_on(model, agent_devices[i], home)
        if ref_models[i] is not None:
            place_on(ref_models[i], ref_devices[i], home)
    # Trainer and Accelerate read an `hf_device_map` with several entries as "placed by the user": they then neither
    # move the model to one device nor wrap it for data parallelism.
    team.hf_device_map = {f"agents.{i}": str(d) for i, d in enumerate(agent_devices)}
