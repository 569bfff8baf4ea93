"""The N agent policies as one `torch.nn.Module`.

The HF `Trainer`, Accelerate, DDP, FSDP and DeepSpeed each expect one model: one `prepare`, one optimizer, one
state dict. A team is that model. `forward` and `generate` run the *active* agent, chosen with `team.use(i)`;
routing inside `forward` (rather than calling an agent directly) keeps DDP's gradient hooks in the path when the
team is wrapped.

Two kinds, one interface (`use`, `agent_parameters`, `save_agent`, `load_agent`):

- `AgentTeam`: separate models (`agents.0`, `agents.1`, ...), of any sizes and architectures, each optionally a
  `PeftModel` with its own adapter.
- `LoraAgentTeam`: one base model wrapped by PEFT with one LoRA adapter per agent (`agent_0`, `agent_1`, ...): one
  base in memory, and the reference policy for free (the base with adapters disabled).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from peft import PeftModel, set_peft_model_state_dict
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.other import AuxiliaryTrainingWrapper
from safetensors.torch import load_file
from torch import nn
from transformers import PreTrainedModel

from ..rollout import generation
from .agent_rows import AgentRowsLora, AgentRowsModels, same_architecture


class AgentTeam(nn.Module):
    """N separate causal language models trained together; `forward` and `generate` run the active agent.

    Args:
        agents: One model per agent (a `PreTrainedModel`, or a `PeftModel` wrapping one).

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> from multiagent_trl.testing import tiny_model_path
        >>> team = AgentTeam([AutoModelForCausalLM.from_pretrained(tiny_model_path()) for _ in range(2)])
        >>> with team.use(1):
        ...     team.active
        1
    """

    def __init__(self, agents: Sequence[PreTrainedModel | PeftModel]):
        super().__init__()
        if len(agents) == 0:
            raise ValueError("A team needs at least one agent.")
        self.agents = nn.ModuleList(agents)
        self.active = 0
        self._batch_rows: list[int] | None = None

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @contextmanager
    def use(self, index: int) -> Iterator[None]:
        """Make agent `index` the one that `forward` and `generate` run, for the duration of the block."""
        if not 0 <= index < self.num_agents:
            raise IndexError(f"Agent index {index} is out of range for a team of {self.num_agents} agents.")
        previous, self.active = self.active, index
        try:
            yield
        finally:
            self.active = previous

    def active_model(self) -> nn.Module:
        """The module that runs the active agent."""
        return self.agents[self.active]

    def models(self) -> list[nn.Module]:
        """The distinct underlying models (one per agent here; one shared base for a LoRA team)."""
        return list(self.agents)

    def agent_parameters(self, index: int) -> list[nn.Parameter]:
        """The trainable parameters of agent `index`."""
        return [p for p in self.agents[index].parameters() if p.requires_grad]

    def keep_adapters_trainable(self) -> None:
        """Undo PEFT's freezing of agents' adapters (a LoRA team's); separate models keep what their owner froze."""

    def save_agent(self, index: int, directory: str, state_dict: dict | None = None, merged: bool = False) -> None:
        """Save agent `index` to `directory`, loadable with `from_pretrained` (PEFT's, for an adapter); with
        `merged=True`, an adapter agent is also saved merged into its base, to `directory/merged`."""
        agent = self.agents[index]
        if state_dict is not None:  # gathered by an engine (FSDP, DeepSpeed) for the whole team
            prefix = f"agents.{index}."
            state_dict = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
        agent.save_pretrained(directory, state_dict=state_dict)
        if merged and isinstance(agent, PeftModel):
            copy.deepcopy(agent).merge_and_unload().save_pretrained(os.path.join(directory, "merged"))

    def load_agent(self, index: int, directory: str) -> None:
        """Load agent `index`'s weights from a folder written by `save_agent` (resuming a checkpoint)."""
        agent = self.agents[index]
        if isinstance(agent, PeftModel):
            _load_adapter(agent, directory, "default")
        else:
            loaded = type(agent).from_pretrained(directory, dtype=agent.dtype)
            agent.load_state_dict(loaded.state_dict())

    def forward(self, *args, **kwargs):
        return self.active_model()(*args, **kwargs)

    def batches_generation(self) -> bool:
        """Whether `mixed_batch` can generate for every agent in one call: the agents are plain models of one
        architecture and config, on one device and unsharded (`agent_rows.same_architecture`)."""
        return self.num_agents > 1 and same_architecture(self.agents)

    @contextmanager
    def mixed_batch(self, rows_per_agent: Sequence[int]) -> Iterator[None]:
        """Generate for all agents in one call: the batch holds agent 0's `rows_per_agent[0]` rows, then agent 1's,
        ..., and each row is generated with its agent's weights (`agent_rows`)."""
        self._batch_rows = list(rows_per_agent)
        try:
            yield
        finally:
            self._batch_rows = None

    @torch.no_grad()
    def generate(self, *args, **kwargs):
        if self._batch_rows is None:
            return self.active_model().generate(*args, **kwargs)
        with AgentRowsModels(self.agents, self._batch_rows):
            return self.agents[0].generate(*args, **kwargs)

    @torch.no_grad()
    def generate_batch(self, inputs: list[list[int]], **kwargs) -> dict:
        """Continuous batching (transformers' `generate_batch`, TRL's `use_transformers_continuous_batching`) for the
        active agent or, inside `mixed_batch`, for every agent: one `generate_batch` call per agent, since the paged
        path chooses the rows of each step itself (see `multiagent_trl.rollout.generation`). Returns the outputs in the
        order of `inputs`."""
        if self._batch_rows is None:
            return generation.generate_batch(self.active_model(), inputs, **kwargs)
        if sum(self._batch_rows) != len(inputs):
            raise RuntimeError(f"A mixed-agent batch has {sum(self._batch_rows)} rows, but got {len(inputs)} prompts.")
        outputs, start = {}, 0
        for index, rows in enumerate(self._batch_rows):
            with self.use(index):
                agent_outputs = generation.generate_batch(self.active_model(), inputs[start : start + rows], **kwargs)
            # Request ids restart at every call: prefix them, so that no agent's output replaces another's.
            outputs.update({f"agent_{index}/{key}": value for key, value in agent_outputs.items()})
            start += rows
        return outputs

    def agent_module(self) -> nn.Module:
        """The module that holds the active agent, as it is: unlike `active_model`, reading it changes nothing."""
        return self.agents[self.active]

    # What Trainer, TRL and PEFT helpers read from "the model" is the active agent's; reading never switches an
    # adapter or a parameter's `requires_grad`.
    @property
    def config(self):
        return self.agent_module().config

    @property
    def generation_config(self):
        return self.agent_module().generation_config

    @generation_config.setter
    def generation_config(self, value):
        self.agent_module().generation_config = value

    @property
    def dtype(self) -> torch.dtype:
        return self.agent_module().dtype

    @property
    def lm_head(self) -> nn.Module:
        """The active agent's output layer (TRL's continuous-batching path casts it, with `cast_lm_head_to_fp32`)."""
        return self.agent_module().get_output_embeddings()

    @property
    def peft_config(self) -> dict:
        return getattr(self.agent_module(), "peft_config", {})

    # TRL's `use_adapter(model, name)` runs the reference pass of an agent that came with a trained adapter (TRL's
    # `ref` copy of it) through these.
    @property
    def active_adapter(self) -> str:
        return self.active_model().active_adapter

    def set_adapter(self, adapter_name: str) -> None:
        self.active_model().set_adapter(adapter_name)

    def disable_adapter(self):
        """Run the active agent without its adapter (its reference policy), as `PeftModel.disable_adapter`."""
        return self.active_model().disable_adapter()

    # Activation (gradient) checkpointing applies to every model; transformers 5 calls the `activation_*` names,
    # TRL the `gradient_*` ones.
    @property
    def is_activation_checkpointing(self) -> bool:
        return any(getattr(model, "is_activation_checkpointing", False) for model in self.models())

    is_gradient_checkpointing = is_activation_checkpointing

    def activation_checkpointing_enable(self, *args, **kwargs) -> None:
        for model in self.models():
            _enable_checkpointing(model, "activation_checkpointing_enable", *args, **kwargs)

    def activation_checkpointing_disable(self) -> None:
        for model in self.models():
            model.activation_checkpointing_disable()

    def gradient_checkpointing_enable(self, *args, **kwargs) -> None:
        for model in self.models():
            _enable_checkpointing(model, "gradient_checkpointing_enable", *args, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        for model in self.models():
            model.gradient_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        for model in self.models():
            model.enable_input_require_grads()


class LoraAgentTeam(AgentTeam):
    """N agents as N LoRA adapters (`agent_0`, ...) on one shared, frozen base model.

    Each forward switches PEFT to the active agent's adapter. PEFT's `set_adapter` (and leaving `disable_adapter`)
    freezes every other adapter, which would silently drop them from the optimizer and from backward; the team
    keeps all agents' adapters trainable. PEFT's active adapter stays at the last forward's, so that activation
    checkpointing recomputes with the right adapter during that agent's backward.

    Generation for all agents at once (`mixed_batch`) adds each agent's LoRA update to its own rows, which are
    contiguous: with plain LoRA on linear layers and equal shapes, one batched matmul per layer for all agents
    (`agent_rows.AgentRowsLora`); otherwise PEFT's mixed-adapter batch, which gathers and scatters the rows of every
    adapter in every layer at every decoding step.

    Args:
        model: A `PeftModel` holding one adapter per name in `adapter_names`.
        adapter_names: The agents' adapter names, in agent order.
    """

    def __init__(self, model: PeftModel, adapter_names: Sequence[str]):
        nn.Module.__init__(self)
        missing = [name for name in adapter_names if name not in model.peft_config]
        if missing:
            raise ValueError(f"The PEFT model has no adapter named {missing}; it has {list(model.peft_config)}.")
        self.peft_model = model
        self.adapter_names = list(adapter_names)
        self.active = 0
        self._batch_rows: list[int] | None = None
        self._agent_parameters: dict[int, list[nn.Parameter]] = {}
        model.set_requires_grad(self.adapter_names, requires_grad=True)
        self.refresh_parameters()

    def refresh_parameters(self) -> None:
        """Index the adapters' parameters again, after something replaced them (FSDP sharding)."""
        # Every parameter that belongs to an agent's adapter (a name component is the adapter's name): what
        # `set_requires_grad` makes trainable, kept to undo PEFT's freezing without walking the model each forward.
        # Chosen by name, not by `requires_grad`, which PEFT may have turned off when sharding calls this.
        names = set(self.adapter_names)
        self._adapter_parameter_list = [
            p for n, p in self.peft_model.named_parameters() if names.intersection(n.split("."))
        ]
        self._agent_parameters.clear()

    @property
    def num_agents(self) -> int:
        return len(self.adapter_names)

    @property
    def max_rank(self) -> int:
        """The largest LoRA rank among the agents' adapters (what an engine serving them all must take)."""
        return max(self.peft_model.peft_config[name].r for name in self.adapter_names)

    def keep_adapters_trainable(self) -> None:
        """Make every agent's adapter trainable again where PEFT froze it (`set_adapter`, leaving `disable_adapter`,
        an adapter critic's pass)."""
        for p in self._adapter_parameter_list:
            if not p.requires_grad:
                p.requires_grad_(True)

    def active_model(self) -> PeftModel:
        name = self.adapter_names[self.active]
        if self.peft_model.active_adapter != name:
            self.peft_model.set_adapter(name)
        if torch.is_grad_enabled():
            self.keep_adapters_trainable()
        return self.peft_model

    def agent_module(self) -> PeftModel:
        return self.peft_model

    def models(self) -> list[nn.Module]:
        return [self.peft_model]

    def agent_parameters(self, index: int) -> list[nn.Parameter]:
        if index not in self._agent_parameters:  # the adapters' parameters stay the same objects (loading copies)
            marker = f".{self.adapter_names[index]}."
            self._agent_parameters[index] = [p for n, p in self.peft_model.named_parameters() if marker in n]
        return self._agent_parameters[index]

    def batches_generation(self) -> bool:
        """A LoRA team generates for all its agents in one call (`mixed_batch`, in eval mode: PEFT refuses
        mixed-adapter batches in training mode, and the per-row LoRA update skips dropout), unless PEFT refuses its
        adapters a mixed-adapter batch (`mixed_batch_refusal`)."""
        return self.num_agents > 1 and mixed_batch_refusal(self.peft_model) is None

    @torch.no_grad()
    def generate(self, *args, **kwargs):
        if self._batch_rows is None:
            return self.active_model().generate(*args, **kwargs)
        was_training = self.peft_model.training
        self.peft_model.eval()
        try:
            layers = self._agent_rows_layers(kwargs)
            if layers is None:  # PEFT's general mixed-adapter batch
                names = [name for name, n in zip(self.adapter_names, self._batch_rows) for _ in range(n)]
                return self.peft_model.generate(*args, adapter_names=names, **kwargs)
            with AgentRowsLora(layers, self.adapter_names, self._batch_rows):
                return self.peft_model.generate(*args, **kwargs)
        finally:
            self.peft_model.train(was_training)
            self.keep_adapters_trainable()

    def _agent_rows_layers(self, generate_kwargs: dict) -> list[LoraLinear] | None:
        """The LoRA layers, if `AgentRowsLora` can run this mixed batch: plain LoRA on linear layers, no adapter
        merged or disabled, no per-adapter module copies (`modules_to_save`), one output row per input row."""
        config = generate_kwargs.get("generation_config") or self.peft_model.generation_config
        for key in ("num_beams", "num_return_sequences"):
            if (generate_kwargs.get(key) or getattr(config, key, None) or 1) != 1:
                return None
        layers = []
        for module in self.peft_model.modules():
            if isinstance(module, AuxiliaryTrainingWrapper):
                return None
            if isinstance(module, BaseTunerLayer):
                if type(module) is not LoraLinear or module.merged or module.disable_adapters:
                    return None
                if any(module.lora_variant.get(name) or module.use_dora.get(name) for name in self.adapter_names):
                    return None
                layers.append(module)
        return layers

    def save_agent(self, index: int, directory: str, state_dict: dict | None = None, merged: bool = False) -> None:
        """Save agent `index`'s adapter to `directory` (`PeftModel.from_pretrained(base, directory)` loads it);
        with `merged=True`, also a full model with the adapter merged in, to `directory/merged`."""
        name = self.adapter_names[index]
        # PEFT writes a non-default adapter into a subfolder named after it: save next to `directory` so that the
        # subfolder is `directory` itself.
        parent, leaf = os.path.split(os.path.abspath(directory))
        if leaf != name:
            raise ValueError(f"Adapter '{name}' must be saved to a folder named '{name}', got {directory}.")
        if state_dict is not None:  # gathered by an engine (FSDP, DeepSpeed) for the whole team
            state_dict = {k.removeprefix("peft_model."): v for k, v in state_dict.items()}
        self.peft_model.save_pretrained(parent, selected_adapters=[name], state_dict=state_dict)
        if merged:
            model = copy.deepcopy(self.peft_model)
            model.set_adapter(name)
            model.merge_and_unload(adapter_names=[name]).save_pretrained(os.path.join(directory, "merged"))

    def load_agent(self, index: int, directory: str) -> None:
        _load_adapter(self.peft_model, directory, self.adapter_names[index])
        self.keep_adapters_trainable()


def mixed_batch_refusal(model: PeftModel) -> str | None:
    """Why PEFT refuses `model` a mixed-adapter batch (`generate(..., adapter_names=...)`), or `None` if it does not:
    an adapter with DoRA (PEFT 0.21: "Cannot pass `adapter_names` when DoRA is enabled") or an adapter merged into
    the base. A LoRA team then generates one agent at a time."""
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            if any(getattr(module, "use_dora", {}).values()):
                return "an adapter uses DoRA (`use_dora=True`), which PEFT's mixed-adapter batches do not support"
            if module.merged:
                return "an adapter is merged into the base, which PEFT's mixed-adapter batches do not support"
    return None


def _enable_checkpointing(model: nn.Module, method: str, *args, **kwargs) -> None:
    """`model.<method>(...)`, keeping one input-embedding hook of `enable_input_require_grads`.

    transformers (5.24) registers a new hook at every enable and its disable leaves them in place; TRL switches
    checkpointing off and back on around every generation and scoring pass, so the hooks would grow by two per model
    and step, each one run at every forward of the embeddings (every decoding step), and each a new guard failure,
    so a recompile, for compiled decoding.
    """
    had_hooks = bool(getattr(model, "_require_grads_hooks", None))
    if had_hooks:
        model.disable_input_require_grads()
    getattr(model, method)(*args, **kwargs)
    if had_hooks and not getattr(model, "_require_grads_hooks", None):  # the enable did not add it back: restore it
        model.enable_input_require_grads()


def _load_adapter(model: PeftModel, directory: str, adapter_name: str) -> None:
    weights = os.path.join(directory, "adapter_model.safetensors")
    if not os.path.isfile(weights):
        raise FileNotFoundError(f"No adapter weights at {weights}.")
    result = set_peft_model_state_dict(model, load_file(weights), adapter_name=adapter_name)
    if result.unexpected_keys:
        raise ValueError(
            f"Adapter weights in {directory} do not fit adapter '{adapter_name}': "
            f"unexpected keys {result.unexpected_keys[:3]}..."
        )
