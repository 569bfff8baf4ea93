"""One generation batch for the whole team: each agent's rows run through that agent's own weights.

With `generation_mode="batched"` and the same generation settings for every agent, a team generates for all its
agents in one `generate` call. The batch holds agent 0's rows, then agent 1's, and so on, contiguous. Decoding is
bound by per-step latency (Python and framework overhead on a CPU, kernel launches on a GPU) more than by
arithmetic, so one decoding loop over N*B rows costs less than N loops over B rows.

- `AgentRowsModels` (separate models of one architecture and config): `generate` runs agent 0's model, in which
  every module that owns parameters splits its input by rows and runs each agent's own module on that agent's
  rows. Everything else (attention, rotary embeddings, the KV cache, the sampling loop) runs once for all rows: it
  has no weights, and its buffers are the same in every agent (checked by `same_architecture`). Each agent's
  modules see exactly the shapes they would see alone, so its rows get the tokens that a call of its own gives.
- `AgentRowsLora` (LoRA adapters on one base): the base runs once for all rows, and each LoRA layer adds each
  agent's update to that agent's rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from peft import PeftModel
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn
from transformers import PreTrainedModel

# Config entries that do not change what a model's modules compute: where it came from, and `use_cache`, which TRL
# switches off on the model it is given (the team's first agent) and `generate` sets for itself.
_NOT_COMPUTED = ("_name_or_path", "name_or_path", "transformers_version", "_commit_hash", "use_cache")


def same_architecture(models: Sequence[nn.Module]) -> bool:
    """Whether `AgentRowsModels` can run `models` as one: plain transformers models (not PEFT-wrapped) of one class
    and config, with the same parameter names, shapes, dtypes and device, the same buffers, no parameter owned by
    the model's root module, and no sharded (FSDP) or offloaded parameter."""
    first = models[0]
    if not all(isinstance(m, PreTrainedModel) and not isinstance(m, PeftModel) for m in models):
        return False
    if any(type(m) is not type(first) for m in models) or any(True for _ in first.parameters(recurse=False)):
        return False

    def config(model):
        values = model.config.to_dict()
        return {k: v for k, v in values.items() if k not in _NOT_COMPUTED}

    def layout(model):
        return [(n, p.shape, p.dtype, p.device, type(p.data)) for n, p in model.named_parameters()]

    reference = layout(first)
    if any(p.device.type == "meta" or type(p.data) is not torch.Tensor for p in first.parameters()):
        return False
    buffers = dict(first.named_buffers())
    for model in models[1:]:
        if config(model) != config(first) or layout(model) != reference:
            return False
        if model.generation_config.to_diff_dict() != first.generation_config.to_diff_dict():
            return False
        other = dict(model.named_buffers())
        if other.keys() != buffers.keys() or not all(torch.equal(other[k], v) for k, v in buffers.items()):
            return False
    return True


class AgentRowsModels:
    """Within the block, agent 0's model computes a batch whose rows belong to `models` in turn (`rows_per_agent`
    each, contiguous): every module of agent 0 that owns parameters (the outermost such, if they nest) splits its
    inputs by rows, runs each agent's own module on that agent's part, and concatenates the results.

    Args:
        models: The agents' models; `same_architecture(models)` must hold.
        rows_per_agent: Each agent's number of rows in the batch.
    """

    def __init__(self, models: Sequence[nn.Module], rows_per_agent: Sequence[int]):
        self.models = list(models)
        self.rows = list(rows_per_agent)
        self.total_rows = sum(self.rows)
        self.saved: list[tuple[nn.Module, object]] = []

    def _forward(self, name: str, module: nn.Module, others: list[nn.Module]):
        """The forward of agent 0's module `name` for the whole batch."""
        # Agent 0's own forward as it was (an instance attribute if Accelerate's hooks wrapped it); the other
        # agents' modules are called, hooks included, as they would be alone.
        forwards = [module.forward, *others]

        def forward(x, *args, **kwargs):
            if not isinstance(x, torch.Tensor) or x.shape[0] % self.total_rows:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise RuntimeError(
                    f"Batched generation of separate agents: module '{name}' got an input of shape {got}, which "
                    f"does not split into the batch's {self.total_rows} rows. Set `generation_mode='per_agent'`."
                )
            per_row = x.shape[0] // self.total_rows
            sizes = [rows * per_row for rows in self.rows]

            def split(value):
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape[0] == x.shape[0]:
                    return value.split(sizes)
                return [value] * len(sizes)

            if not args and not kwargs:  # the common case (linear layers, norms, embeddings), run every step
                outputs = [f(part) for f, part in zip(forwards, x.split(sizes))]
            else:
                parts = [split(a) for a in (x, *args)]
                keyword_parts = {k: split(v) for k, v in kwargs.items()}
                outputs = [
                    f(*(p[i] for p in parts), **{k: v[i] for k, v in keyword_parts.items()})
                    for i, f in enumerate(forwards)
                ]
            if isinstance(outputs[0], torch.Tensor):
                return torch.cat(outputs)
            if isinstance(outputs[0], tuple) and all(isinstance(t, torch.Tensor) for t in outputs[0]):
                return tuple(torch.cat(parts) for parts in zip(*outputs))
            raise RuntimeError(
                f"Batched generation of separate agents: module '{name}' returned a {type(outputs[0]).__name__}, "
                "not tensors to concatenate. Set `generation_mode='per_agent'`."
            )

        return forward

    def __enter__(self) -> None:
        others = [dict(m.named_modules()) for m in self.models[1:]]
        owners: tuple[str, ...] = ()
        for name, module in self.models[0].named_modules():
            if name.startswith(owners) or not any(True for _ in module.parameters(recurse=False)):
                continue
            owners += (name + ".",)
            self.saved.append((module, module.__dict__.get("forward")))
            module.forward = self._forward(name, module, [modules[name] for modules in others])

    def __exit__(self, *exc) -> None:
        for module, forward in self.saved:
            if forward is None:
                del module.forward
            else:
                module.forward = forward
        self.saved.clear()


class AgentRowsLora:
    """Within the block, each LoRA layer computes its base output and adds each agent's LoRA update to that agent's
    rows of the batch (contiguous, in agent order), instead of PEFT's active adapter.

    With equal rows per agent and adapters of equal rank, bias-free, in every layer: the agents' A and B matrices
    are stacked once for the block (the scaling folded into B), and each layer adds one `bmm` pair for all agents.
    Otherwise each agent's slice of rows goes through its own A and B. Dropout is skipped: generation runs in eval
    mode. Adapter layers are switched off for the block (PEFT then computes the base output only) and back on after.
    """

    def __init__(self, layers: list[LoraLinear], adapter_names: list[str], rows_per_agent: list[int]):
        self.layers = layers
        self.total_rows = sum(rows_per_agent)
        bounds = torch.tensor([0, *rows_per_agent]).cumsum(0).tolist()
        self.slices = {name: slice(start, end) for name, start, end in zip(adapter_names, bounds[:-1], bounds[1:])}
        self.equal_rows = len(set(rows_per_agent)) == 1
        self.handles = []

    def _update(self, layer: LoraLinear):
        """The forward hook of one layer: adds the agents' LoRA updates to its base output."""
        names = [
            name for name in self.slices if name in layer.lora_A and self.slices[name].stop > self.slices[name].start
        ]
        stacked = None
        if (
            self.equal_rows
            and len(names) == len(self.slices)
            and len({layer.lora_A[name].weight.shape for name in names}) == 1
            and all(layer.lora_B[name].bias is None for name in names)
        ):
            a = torch.stack([layer.lora_A[name].weight.t() for name in names])  # (agents, in, r)
            # (agents, r, out), with the scaling folded in
            b = torch.stack([layer.lora_B[name].weight.t() * layer.scaling[name] for name in names])
            stacked = (a, b)

        def hook(module, args, kwargs, output):
            x = args[0] if args else kwargs["x"]
            if x.shape[0] != self.total_rows:
                raise RuntimeError(f"A mixed-agent batch has {self.total_rows} rows, but a layer got {x.shape[0]}.")
            if stacked is not None:
                a, b = stacked
                rows = x.to(a.dtype).reshape(a.shape[0], -1, x.shape[-1])  # (agents, rows per agent * tokens, in)
                return output.add_(torch.bmm(torch.bmm(rows, a), b).view_as(output).to(output.dtype))
            for name in names:
                part = self.slices[name]
                lora_a, lora_b = module.lora_A[name], module.lora_B[name]
                update = lora_b(lora_a(x[part].to(lora_a.weight.dtype))) * module.scaling[name]
                output[part] += update.to(output.dtype)
            return output

        return hook

    def __enter__(self) -> None:
        for layer in self.layers:
            self.handles.append(layer.register_forward_hook(self._update(layer), with_kwargs=True))
            layer.enable_adapters(False)

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()
        for layer in self.layers:
            layer.enable_adapters(True)  # PEFT leaves only the active adapter trainable; the team restores the rest
