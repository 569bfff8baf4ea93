"""Value models: a scalar head on a causal LM's last hidden state, the critics of the actor-critic family.

- `ValueHead`: hidden states `(..., H)` to values `(..., 1)`: `Linear(H, 1)`, or `Linear(H, h) -> Tanh ->
  Linear(h, 1)` with `hidden_dim=h`; weights drawn from N(0, 0.02), biases zero.
- `CausalLMWithValueHead`: a causal LM and (optionally) a head. `forward` returns the LM's logits and one value per
  position. It behaves like CoMLRL 1.4.3's class of the same name, so the same object serves as an IAC agent with
  its own head (`use_separate_critic=False`), an IAC critic, MAAC's joint critic, or an actor without a head; and it
  saves like CoMLRL: the LM's folder plus `value_head.pt`, a state dict with CoMLRL's keys, so heads load both ways.
- `AdapterValueModel` (not in CoMLRL): a critic that is one LoRA adapter of a `PeftModel` plus a head. A LoRA team's
  N actors and its critic then share one frozen base: one base model in memory for the whole team.

Every critic here answers `values(input_ids, attention_mask) -> (B, T)`; which position is V(prompt) or
Q(prompt, completion) is the estimators' business (`estimators.value_positions`).
"""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
from peft import PeftModel, set_peft_model_state_dict
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

VALUE_HEAD_FILE = "value_head.pt"  # CoMLRL's name, next to the LM's (or the adapter's) files


def hidden_size_of(config) -> int:
    """The width H of a model's last hidden state: `hidden_size` (or GPT-2's `n_embd`) of its text config.

    >>> from transformers import Qwen2Config
    >>> hidden_size_of(Qwen2Config(hidden_size=64))
    64
    """
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
    if size is None:
        raise ValueError(
            f"Cannot put a value head on a {type(config).__name__} model: its config has no `hidden_size` (or "
            "`n_embd`) to size the head with."
        )
    return int(size)


class ValueHead(nn.Module):
    """One value per hidden state: `(..., H) -> (..., 1)`.

    Args:
        hidden_size: H, the width of the hidden states it reads.
        hidden_dim: With a positive value h, a hidden layer: `Linear(H, h) -> Tanh -> Linear(h, 1)`; `None` or 0
            (the default): `Linear(H, 1)`.

    Example:
        >>> head = ValueHead(8, hidden_dim=4)
        >>> head(torch.zeros(2, 3, 8)).shape
        torch.Size([2, 3, 1])
        >>> sorted(head.state_dict())  # CoMLRL's keys
        ['pre_projection.0.bias', 'pre_projection.0.weight', 'value_projection.bias', 'value_projection.weight']
    """

    def __init__(self, hidden_size: int, hidden_dim: int | None = None):
        super().__init__()
        if hidden_dim is not None and hidden_dim < 0:
            raise ValueError(f"A value head's hidden_dim must be positive, or None/0 for none; got {hidden_dim}.")
        # The attribute names are the keys of CoMLRL's `value_head.pt`, so that heads saved by either library load
        # into the other; the layers are built in CoMLRL's order, so that the same seed draws the same head.
        self.pre_projection = nn.Sequential(nn.Linear(hidden_size, hidden_dim), nn.Tanh()) if hidden_dim else None
        self.value_projection = nn.Linear(hidden_dim or hidden_size, 1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every weight from N(0, 0.02) and zero every bias: small initial values, so that early TD errors
        are about the rewards, not about a random head."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                nn.init.zeros_(module.bias)

    @property
    def hidden_dim(self) -> int | None:
        """The hidden layer's width, or `None` for a single linear layer."""
        return None if self.pre_projection is None else self.pre_projection[0].out_features

    @staticmethod
    def hidden_dim_in(state_dict: dict[str, torch.Tensor]) -> int | None:
        """The `hidden_dim` of the head that `state_dict` (a `value_head.pt`) was saved from."""
        weight = state_dict.get("pre_projection.0.weight")
        return None if weight is None else int(weight.shape[0])

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.pre_projection is not None:
            hidden_states = self.pre_projection(hidden_states)
        return self.value_projection(hidden_states)


@dataclass
class ValueModelOutput(ModelOutput):
    """What `CausalLMWithValueHead.forward` returns.

    Attributes:
        logits: `(B, T, V)` the LM's logits.
        values: `(B, T)` one value per position, in the head's dtype; `None` without a head or with
            `output_values=False`.
        hidden_states: The LM's hidden states, every layer (a tuple), when values or `output_hidden_states` were
            asked for; CoMLRL gives the last layer alone when it computes values and the tuple otherwise.
        past_key_values: The LM's cache, when `use_cache`.
    """

    logits: torch.Tensor | None = None
    values: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    past_key_values: object | None = None


class CausalLMWithValueHead(nn.Module):
    """A causal language model with a value head on its last hidden state (CoMLRL's model of the same name).

    Args:
        model: The causal LM (a `PreTrainedModel`, or a `PeftModel` wrapping one).
        value_head_hidden_dim: The head's hidden layer width (`ValueHead`'s `hidden_dim`); `None`: no hidden layer.
        attach_value_head: `False` for an actor without a head (CoMLRL wraps every actor, with or without one).

    The head takes the backbone's dtype, as in CoMLRL (a bf16 head on a bf16 model), and its device.

    Example:
        >>> from transformers import AutoModelForCausalLM
        >>> from multiagent_trl.testing import tiny_model_path
        >>> critic = CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_model_path()))
        >>> ids = torch.tensor([[1, 2, 3, 4]])
        >>> out = critic(input_ids=ids)
        >>> out.logits.shape[:2], out.values.shape
        (torch.Size([1, 4]), torch.Size([1, 4]))
        >>> torch.allclose(critic.values(ids), out.values)  # without the LM head's logits
        True
    """

    def __init__(
        self, model: PreTrainedModel | PeftModel, value_head_hidden_dim: int | None = None, attach_value_head=True
    ):
        super().__init__()
        self.model = model
        self.value_head: ValueHead | None = None
        if attach_value_head:
            self.value_head = ValueHead(hidden_size_of(model.config), value_head_hidden_dim)
            first = next(model.parameters(), None)
            if first is not None:
                self.value_head.to(device=first.device, dtype=first.dtype)
        self._skips_logits: bool | None = None  # whether `values` may pass `logits_to_keep=1` (read once)

    # ---- forward passes

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        output_values: bool = True,
        **kwargs,
    ) -> ValueModelOutput:
        """Run the LM on `input_ids` `(B, T)`; with a head and `output_values`, also a value per position `(B, T)`.

        Other keyword arguments (`position_ids`, `past_key_values`, `use_cache`, ...) go to the LM as they are.
        """
        with_values = output_values and self.value_head is not None
        output_hidden_states = bool(kwargs.pop("output_hidden_states", False)) or with_values
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **kwargs,
        )
        values = self._head(outputs.hidden_states[-1]) if with_values else None
        return ValueModelOutput(
            logits=outputs.logits,
            values=values,
            hidden_states=outputs.hidden_states if output_hidden_states else None,
            past_key_values=getattr(outputs, "past_key_values", None),
        )

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Values only, `(B, T)`: the LM's head computes one position's logits instead of all of them, which for
        a critic saves the `(B, T, vocabulary)` tensor (the values are the same: the head reads the hidden state
        under the LM head)."""
        if self.value_head is None:
            raise ValueError("This model has no value head (it was built with `attach_value_head=False`).")
        if self._skips_logits is None:
            base = self.model.get_base_model() if isinstance(self.model, PeftModel) else self.model
            self._skips_logits = "logits_to_keep" in inspect.signature(base.forward).parameters
        if self._skips_logits:
            kwargs.setdefault("logits_to_keep", 1)
        outputs = self.model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, return_dict=True, **kwargs
        )
        return self._head(outputs.hidden_states[-1])

    def _head(self, last_hidden: torch.Tensor) -> torch.Tensor:
        weight = self.value_head.value_projection.weight
        # A model split over devices ends on its last one; mixed dtypes only when the caller cast one of them.
        return self.value_head(last_hidden.to(device=weight.device, dtype=weight.dtype)).squeeze(-1)  # (B, T)

    def generate(self, *args, **kwargs):
        """The LM's `generate` (the head takes no part in generation)."""
        return self.model.generate(*args, **kwargs)

    # ---- what Trainer and Accelerate read from a model

    @property
    def config(self):
        return self.model.config

    @property
    def generation_config(self):
        return self.model.generation_config

    def gradient_checkpointing_enable(self, *args, **kwargs) -> None:
        self.model.gradient_checkpointing_enable(*args, **kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.model.gradient_checkpointing_disable()

    # ---- files: the LM's folder plus `value_head.pt`, as CoMLRL's `save_model` lays them out

    def save_pretrained(self, directory: str, state_dict: dict | None = None, **kwargs) -> None:
        """Write the LM with its own `save_pretrained` (extra keyword arguments go there) and the head to
        `directory/value_head.pt`.

        Args:
            directory: The folder; created if needed.
            state_dict: This module's full state dict when an engine (FSDP, DeepSpeed) gathered it; its `model.`
                and `value_head.` entries go to the LM and the head.
        """
        os.makedirs(directory, exist_ok=True)
        head_state = None
        if state_dict is not None:
            kwargs["state_dict"] = _with_prefix(state_dict, "model.")
            head_state = _with_prefix(state_dict, "value_head.")
        self.model.save_pretrained(directory, **kwargs)
        if self.value_head is not None:
            head_state = head_state or self.value_head.state_dict()
            torch.save({k: v.detach().cpu() for k, v in head_state.items()}, os.path.join(directory, VALUE_HEAD_FILE))

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        value_head_hidden_dim: int | None = None,
        attach_value_head: bool | None = None,
        **model_kwargs,
    ) -> CausalLMWithValueHead:
        """Load a model saved by `save_pretrained` (or by CoMLRL's `save_model`), or any causal LM.

        Args:
            path: A folder (or a hub id) that `AutoModelForCausalLM.from_pretrained` loads; its `value_head.pt`,
                if any, is the head.
            value_head_hidden_dim: For a fresh head; a saved head's own size wins, and a different value raises.
            attach_value_head: `None` (default): a head when `path` has one; `True`: a head in any case (a fresh
                one when `path` has none, for a critic started from a plain LM); `False`: none.
            model_kwargs: For `AutoModelForCausalLM.from_pretrained` (`dtype`, `attn_implementation`, ...).
        """
        model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
        head_file = os.path.join(path, VALUE_HEAD_FILE)
        has_head = os.path.isfile(head_file)
        attach = has_head if attach_value_head is None else attach_value_head
        state = torch.load(head_file, map_location="cpu", weights_only=True) if attach and has_head else None
        if state is not None:
            saved = ValueHead.hidden_dim_in(state)
            if value_head_hidden_dim and value_head_hidden_dim != saved:
                raise ValueError(
                    f"{head_file} holds a value head with hidden_dim={saved}, not value_head_hidden_dim="
                    f"{value_head_hidden_dim}: leave value_head_hidden_dim unset to load it."
                )
            value_head_hidden_dim = saved
        wrapper = cls(model, value_head_hidden_dim=value_head_hidden_dim, attach_value_head=attach)
        if state is not None:
            wrapper.value_head.load_state_dict(state)
        return wrapper


def _with_prefix(state_dict: dict, prefix: str) -> dict:
    """The entries of `state_dict` under `prefix`, with the prefix removed."""
    return {k.removeprefix(prefix): v for k, v in state_dict.items() if k.startswith(prefix)}


class AdapterValueModel(nn.Module):
    """A critic that is one adapter of a `PeftModel` plus a value head: values with that adapter active.

    With the critic's adapter on a LoRA team's base, the team's actors and its critic share one frozen base. With an
    agent's own adapter, it is that agent's value head (CoMLRL's `use_separate_critic=False`): values train the
    agent's adapter too.

    The `PeftModel` is held, not registered as a submodule: it (the base and every adapter) belongs to its owner,
    the LoRA team, and registering it twice would put the shared base twice in every state dict and checkpoint. So
    this module's own `parameters()` are the head's; `trainable_parameters()` adds the adapter's, and
    `accelerator.prepare` (DDP, FSDP) should wrap the module that owns the `PeftModel` (the team, holding this critic
    as a submodule), so that the adapter's gradients are synchronized too.

    Each forward leaves the critic's adapter active: with activation checkpointing, the backward recomputes the
    forward with whatever adapter is active then, so run the critic's backward before another adapter's forward
    (one backward per adapter, as the team's loss does).

    Args:
        peft_model: The `PeftModel` holding an adapter named `adapter_name`.
        adapter_name: The critic's adapter (or an agent's, for a value head on the agent).
        value_head_hidden_dim: As `ValueHead`'s `hidden_dim`.

    Example:
        >>> from peft import LoraConfig, get_peft_model
        >>> from transformers import AutoModelForCausalLM
        >>> from multiagent_trl.testing import tiny_model_path
        >>> lora = LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
        >>> base = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_path()), lora, "agent_0")
        >>> _ = base.add_adapter("critic", lora)
        >>> critic = AdapterValueModel(base, "critic")
        >>> critic(torch.tensor([[1, 2, 3]])).shape
        torch.Size([1, 3])
    """

    def __init__(self, peft_model: PeftModel, adapter_name: str, value_head_hidden_dim: int | None = None):
        super().__init__()
        if not isinstance(peft_model, PeftModel):
            raise TypeError(f"AdapterValueModel needs a peft.PeftModel; got {type(peft_model).__name__}.")
        if adapter_name not in peft_model.peft_config:
            raise ValueError(
                f"The PEFT model has no adapter named '{adapter_name}'; it has {list(peft_model.peft_config)}. Add "
                f"one first: `peft_model.add_adapter('{adapter_name}', lora_config)`."
            )
        self.__dict__["peft_model"] = peft_model  # held, not registered (see the class docstring)
        self.adapter_name = adapter_name
        self.value_head = ValueHead(hidden_size_of(peft_model.config), value_head_hidden_dim)
        first = next(peft_model.parameters())
        self.value_head.to(device=first.device, dtype=first.dtype)
        marker = f".{adapter_name}."
        self._adapter_parameters = [p for n, p in peft_model.named_parameters() if marker in n]
        self._skips_logits = "logits_to_keep" in inspect.signature(peft_model.get_base_model().forward).parameters

    def adapter_parameters(self) -> list[nn.Parameter]:
        """The critic adapter's parameters (in the `PeftModel`, not in this module)."""
        return list(self._adapter_parameters)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """What a critic optimizer updates: the adapter's parameters, then the head's."""
        return [*self._adapter_parameters, *self.value_head.parameters()]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        """Values `(B, T)` of `input_ids` `(B, T)` with the critic's adapter active."""
        return self.values(input_ids, attention_mask, **kwargs)

    def values(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
        model = self.peft_model
        if model.active_adapter != self.adapter_name:
            model.set_adapter(self.adapter_name)
        if torch.is_grad_enabled():
            # PEFT's `set_adapter` freezes every other adapter, and leaving `disable_adapter` (TRL's reference pass)
            # re-freezes even the active one: re-enable this adapter's gradients (the team does the same for its own).
            for p in self._adapter_parameters:
                if not p.requires_grad:
                    p.requires_grad_(True)
        if self._skips_logits:
            kwargs.setdefault("logits_to_keep", 1)  # the critic needs no vocabulary-sized logits
        outputs = model(
            input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, return_dict=True, **kwargs
        )
        weight = self.value_head.value_projection.weight
        return self.value_head(outputs.hidden_states[-1].to(device=weight.device, dtype=weight.dtype)).squeeze(-1)

    # ---- files: the adapter's files (`PeftModel.from_pretrained` loads them) plus `value_head.pt`

    def save_pretrained(self, directory: str) -> None:
        """Write the critic's adapter and `value_head.pt` to `directory`."""
        os.makedirs(directory, exist_ok=True)
        # PEFT writes an adapter not named "default" into a subfolder named after it: save to a temporary folder
        # beside `directory` and move the files up.
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(directory))) as tmp:
            self.peft_model.save_pretrained(tmp, selected_adapters=[self.adapter_name])
            written = tmp if self.adapter_name == "default" else os.path.join(tmp, self.adapter_name)
            for name in os.listdir(written):
                shutil.move(os.path.join(written, name), os.path.join(directory, name))
        state = {k: v.detach().cpu() for k, v in self.value_head.state_dict().items()}
        torch.save(state, os.path.join(directory, VALUE_HEAD_FILE))

    def load_pretrained(self, directory: str) -> None:
        """Load the adapter and head that `save_pretrained` wrote to `directory` into this critic."""
        weights = os.path.join(directory, "adapter_model.safetensors")
        head_file = os.path.join(directory, VALUE_HEAD_FILE)
        for path in (weights, head_file):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"No {os.path.basename(path)} in {directory}: not a saved adapter critic.")
        result = set_peft_model_state_dict(self.peft_model, load_file(weights), adapter_name=self.adapter_name)
        if result.unexpected_keys:
            raise ValueError(
                f"The adapter in {directory} does not fit adapter '{self.adapter_name}': unexpected keys "
                f"{result.unexpected_keys[:3]}."
            )
        state = torch.load(head_file, map_location="cpu", weights_only=True)
        if ValueHead.hidden_dim_in(state) != self.value_head.hidden_dim:
            raise ValueError(
                f"{head_file} holds a value head with hidden_dim={ValueHead.hidden_dim_in(state)}; this critic's has "
                f"{self.value_head.hidden_dim}."
            )
        self.value_head.load_state_dict(state)


def model_config_of(source: str | os.PathLike, setting: str) -> PretrainedConfig:
    """The transformers config of the model id or folder `source`, or a `ValueError` naming the setting that gave it
    when it is none (a missing folder, a folder without a saved model, a malformed id): raised before any loading."""
    try:
        return AutoConfig.from_pretrained(str(source))
    except (OSError, ValueError) as error:
        raise ValueError(
            f"`{setting}={str(source)!r}` is not a model id or a folder holding a saved model ({error}). Give a "
            "causal LM's id or folder (with its config.json), or a model object."
        ) from error


def critic_load_kwargs(model_config: dict, critic_kwargs: dict | None) -> dict:
    """`from_pretrained` arguments of critics given by name: `critic_model_kwargs`, with the dtype and attention
    implementation of `model_config` where they do not say."""
    kwargs = dict(critic_kwargs or {})
    if not isinstance(kwargs, dict):
        raise ValueError(f"`model_config['critic_model_kwargs']` must be a dict, got {type(critic_kwargs).__name__}.")
    dtype = kwargs.pop("torch_dtype", None) or kwargs.pop("dtype", None)
    dtype = dtype or model_config.get("torch_dtype") or model_config.get("dtype")
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if dtype is not None:
        kwargs["dtype"] = dtype
    if "attn_implementation" in model_config:
        kwargs.setdefault("attn_implementation", model_config["attn_implementation"])
    return kwargs


def as_critic(source, hidden_dim: int | None, load_kwargs: dict, setting: str) -> CausalLMWithValueHead:
    """A critic from any source CoMLRL accepts: an id or path (a `value_head.pt` there is loaded), a causal LM (a
    new head), or a CoMLRL or multiagent_trl `CausalLMWithValueHead` (its weights). `setting` names the argument in
    errors; `load_kwargs` go to `from_pretrained` (`critic_load_kwargs`)."""
    if isinstance(source, CausalLMWithValueHead):
        return source
    if type(source).__name__ == "CausalLMWithValueHead":  # CoMLRL's own class: the same layout
        critic = CausalLMWithValueHead(source.model, hidden_dim or head_hidden_dim(source.value_head))
        if source.value_head is not None:
            critic.value_head.load_state_dict(source.value_head.state_dict())
        return critic
    if isinstance(source, torch.nn.Module):
        return CausalLMWithValueHead(source, hidden_dim)
    model_config_of(source, setting)  # a ValueError naming the setting, not the Hub's about a repo id
    return CausalLMWithValueHead.from_pretrained(
        str(source), value_head_hidden_dim=hidden_dim, attach_value_head=True, **load_kwargs
    )


def head_hidden_dim(head) -> int | None:
    """The hidden width of a value head (`None`: a linear head)."""
    pre = getattr(head, "pre_projection", None)
    return None if pre is None else pre[0].out_features


def split_value_model(agent: Any) -> tuple[Any, nn.Module | None]:
    """An agent given with a value head (this library's `CausalLMWithValueHead` or CoMLRL's, told by its class name
    and layout): `(its LM, its head or None)`; any other agent: `(agent, None)`."""
    wrapped = isinstance(agent, CausalLMWithValueHead) or (
        type(agent).__name__ == "CausalLMWithValueHead" and hasattr(agent, "model")
    )
    if not wrapped:
        return agent, None
    return agent.model, getattr(agent, "value_head", None)
