"""`ActorCriticTrainer`: the team trainer with a learned critic in place of GRPO's group baseline (IAC and MAAC).

How one generation batch flows:

1. The team core plays the batch: every agent generates, the joint reward scores each joint sample, and TRL's own
   scoring runs per agent (`MultiAgentGRPOTrainer._score_agents`).
2. `_score_agents` (here) then replaces each agent's advantages: the critic's value V_old of every row is computed
   once, without gradient, on the rollout; the target y is the reward the row is credited with; the advantage is
   `y - V_old`, standardized over the agent's rows of the whole generation batch (`estimators.advantages`; per turn
   in a multi-turn rollout, where y is the TD target `r_t + discount * V_old(t + 1)`, `bootstrapped_targets`). The
   values and targets are stored in the batch under the agent's `agent_{i}/` prefix, so that they travel with their
   rows through TRL's shuffling and splitting into optimizer steps.
3. `_compute_loss` runs the core's loss (each agent's TRL GRPO loss, on these advantages), then each critic's value
   loss `value_loss_coef * mean((y - v)^2)` (`estimators.value_loss`); one backward per forward, as the core does.

The critics live inside the team, the one module that Trainer and Accelerate see (`CriticRouting`): one
`prepare` (DDP, devices), one state dict, one optimizer, with a parameter group per critic at
`critic_learning_rate` (AdamW's state is per parameter, so this equals a separate optimizer per critic) and each
critic's gradients clipped on their own.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from peft import PeftConfig, PeftModel
from torch import nn
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from trl.trainer.utils import add_fused_lm_head, disable_dropout_in_model

from ..rewards.joint import weighted_sum
from ..team.optim import ParameterGroup, check_finite_loss
from ..trainer import MultiAgentGRPOTrainer
from .config import ActorCriticConfig
from .critic_sources import critic_sources
from .estimators import (
    advantages,
    bootstrapped_targets,
    joint_critic_text,
    value_loss,
    value_positions,
    values_at,
)
from .samples import RolloutSample, episode_samples
from .value_model import (
    VALUE_HEAD_FILE,
    AdapterValueModel,
    CausalLMWithValueHead,
    model_config_of,
    split_value_model,
)
from .value_norm import ValueNormalizer

# Keys `_score_agents` adds to each agent's part of the batch; `_compute_loss` takes them out before TRL's loss.
CRITIC_KEYS = ("old_values", "value_targets", "critic_positions", "critic_input_ids", "critic_attention_mask")
CRITIC_FOLDER = "critic"
CRITIC_SETTINGS_FILE = "critics.json"  # at the checkpoint's root: what its critics are (`critic_settings`)
VALUE_NORM_FILE = "value_norm.pt"  # at the checkpoint's root: each critic's `ValueNormalizer` statistics


class CriticRouting:
    """Mixed into the team's class by `attach_critics`: the team also holds `critics`, and inside
    `team.use_critic(k)` its `forward` returns critic k's values `(B, T)` instead of running the active agent.

    Routing through the team's `forward` keeps a critic's forward inside the module Accelerate wrapped, so that DDP
    sees it (a forward of a submodule outside the wrapper would leave DDP's reducer waiting for its gradients).
    """

    critic_index: int | None = None

    @contextmanager
    def use_critic(self, index: int) -> Iterator[None]:
        """Make critic `index` the one `forward` runs, for the duration of the block."""
        if not 0 <= index < len(self.critics):
            raise IndexError(f"Critic index {index} is out of range for {len(self.critics)} critics.")
        previous, self.critic_index = self.critic_index, index
        try:
            yield
        finally:
            self.critic_index = previous

    def forward(self, *args, **kwargs):
        if self.critic_index is None:
            return super().forward(*args, **kwargs)
        critic = self.critics[self.critic_index]
        device = critic.value_head.value_projection.weight.device
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        return critic.values(*[a.to(device) for a in args], **moved)


_ROUTED_CLASSES: dict[type, type] = {}


def attach_critics(team: nn.Module, critics: Sequence[nn.Module]) -> nn.Module:
    """Register `critics` in `team` (as `team.critics`) and let its `forward` route to them (`CriticRouting`).

    The team's class is swapped for a subclass with the routing mixed in, so that everything the core does with the
    team (agents, adapters, saving, generation) is unchanged.
    """
    cls = type(team)
    if not issubclass(cls, CriticRouting):
        if cls not in _ROUTED_CLASSES:
            _ROUTED_CLASSES[cls] = type(f"{cls.__name__}WithCritics", (CriticRouting, cls), {})
        team.__class__ = _ROUTED_CLASSES[cls]
    team.critics = nn.ModuleList(critics)
    return team


def held_backbone(critic: CausalLMWithValueHead) -> CausalLMWithValueHead:
    """`critic` with its LM held but not registered: a value head on an agent's own model, whose backbone belongs to
    the team's agent (registered twice, it would appear twice in every state dict and checkpoint)."""
    model = critic.model
    del critic.model  # unregistered: `nn.Module.__delattr__` drops it from the submodules
    object.__setattr__(critic, "model", model)  # a plain attribute (`nn.Module.__setattr__` would register it)
    return critic


class ActorCriticTrainer(MultiAgentGRPOTrainer):
    """Train N agents with a learned critic as baseline: independent critics (IAC) or one joint critic (MAAC).

    Takes every `MultiAgentGRPOTrainer` argument; `args` is an `ActorCriticConfig`. What differs, and why:

    - `__init__`: builds the critics (`args.critic_kind`: separate models, value heads on the agents, or LoRA adapters
      on the team's base) and registers them in the team module (`attach_critics`).
    - `_score_agents`: replaces GRPO's group-relative advantages with `y - V_old` (see the module docstring).
    - `_compute_loss`: adds each critic's value loss to the agents' GRPO losses; logs `agent_{i}/value_loss`.
    - `create_optimizer`, `_clip_grad_norm`: a parameter group per critic at `critic_learning_rate`; per-critic
      clipping, logged as `agent_{i}/critic_grad_norm` (`critic/grad_norm` for a joint critic).
    - `_get_train_sampler`: every item is trained each epoch; the last generation batch is completed with items from
      the start of the epoch's order (TRL's sampler drops the items that do not fill it; `rollout.buffers`).
    - `_save`, `_load_from_checkpoint`: critics saved beside the agents: `agent_{i}/critic/` (IAC) or `critic/` (a
      joint critic), a model folder (or an adapter folder) plus `value_head.pt`; a value head on the agent as
      `agent_{i}/value_head.pt`.

    Args:
        model, reward_funcs, args, train_dataset, eval_dataset, processing_class, callbacks, optimizers, peft_config:
            As in `MultiAgentGRPOTrainer`.
            An agent may also be a `CausalLMWithValueHead`: its LM is trained, and with `critic_kind="head"` its
            critic starts from the head it carries.
        critic_model (`str`, `PreTrainedModel`, `CausalLMWithValueHead`, or a list of them, *optional*):
            With `critic_kind="model"`: the critics' starting models, one for all (an id or path, loaded once per
            critic) or one per critic (per agent, or one for a joint critic). A model without a value head gets a
            new one (a `value_head.pt` in its folder is loaded). `None`: each agent's own starting model (its id or
            path). An IAC critic reads its agent's token ids, so it must share the agent's tokenizer.
        critic_processing_class (tokenizer, or one per critic, *optional*):
            The critics' tokenizers: a joint critic tokenizes its text with it; an IAC critic's is only compared with
            its agent's. `None`: loaded from the critic's id or path (for a joint critic given as a model without one,
            agent 0's).
        critic_peft_config (`PeftConfig`, *optional*):
            With `critic_kind="adapter"`: the critic adapters' LoRA config; `None` uses the agents' (`peft_config`).
        rollout_metrics (callable, *optional*):
            `rollout_metrics(samples) -> dict`, called once per dataset item of every played batch with that item's
            `RolloutSample`s (every agent, every turn played); the mean over the items of each numeric value is
            logged under its own name (CoMLRL's `metrics_callback`).
        **kwargs:
            Other `MultiAgentGRPOTrainer` arguments (`reward_processor`, `formatters`, ...).

    Example:

    ```python
    from datasets import Dataset
    from multiagent_trl.actor_critic.config import ActorCriticConfig
    from multiagent_trl.actor_critic.trainer import ActorCriticTrainer
    from multiagent_trl.testing import tiny_model_path

    def ratio_reward(completions1, completions2):
        return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(completions1, completions2)]

    trainer = ActorCriticTrainer(
        model=tiny_model_path(),
        reward_funcs=ratio_reward,
        args=ActorCriticConfig(output_dir="out", num_agents=2, num_generations=1, max_steps=10),
        train_dataset=Dataset.from_dict({"prompt": ["Tell a story:"] * 8}),
    )
    trainer.train()
    trainer.save_model("out/final")  # out/final/agent_0/ (+ critic/), out/final/agent_1/ (+ critic/)
    ```
    """

    _tag_names = ["trl", "multiagent-trl", "actor-critic"]
    _name = "ActorCritic"
    # Set (to 1.0, CoMLRL's) to score the agents' log-probabilities at this temperature instead of the sampling one.
    logprob_temperature: float | None = None
    # True: every optimizer step's policy gradient is taken at the current weights with no importance ratio to the
    # rollout policy (CoMLRL's one-pass policy gradient), even when a generation batch spans several steps.
    reinforce_each_step = False
    covers_every_item = True  # every item trained each epoch, the last generation batch completed (`rollout.buffers`)

    def __init__(
        self,
        model: str | PreTrainedModel | Sequence[str | PreTrainedModel] | None = None,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: ActorCriticConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        callbacks=None,
        optimizers=(None, None),
        peft_config: PeftConfig | Sequence[PeftConfig] | None = None,
        *,
        critic_model: Any = None,
        critic_processing_class: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        critic_peft_config: PeftConfig | None = None,
        rollout_metrics: Callable[[list[RolloutSample]], dict[str, float]] | None = None,
        **kwargs,
    ):
        if rollout_metrics is not None and not callable(rollout_metrics):
            raise TypeError(f"`rollout_metrics` must be a callable, `samples -> dict`; got {rollout_metrics!r}.")
        self.rollout_metrics = rollout_metrics
        self._batch_rows: list[dict] | None = None
        if args is None:
            args = ActorCriticConfig(output_dir="actor-critic-output")
        elif not isinstance(args, ActorCriticConfig):
            raise TypeError(
                f"`args` is a {type(args).__name__}; ActorCriticTrainer needs an ActorCriticConfig, which takes every "
                "MultiAgentGRPOConfig field and the critic's."
            )
        if critic_model is not None and args.critic_kind != "model":
            raise ValueError(
                f"`critic_model=` gives separate critic models, but `critic_kind={args.critic_kind!r}` builds the "
                "critics on the agents: drop `critic_model`, or set `critic_kind='model'`."
            )
        if critic_peft_config is not None and args.critic_kind != "adapter":
            raise ValueError("`critic_peft_config=` configures critic adapters: it needs `critic_kind='adapter'`.")
        if args.ddp_find_unused_parameters is None:
            # Each actor's and each critic's forward and backward leave the others' parameters unused.
            args.ddp_find_unused_parameters = True
        # An agent may come with a value head (CoMLRL's agents do): the team trains its LM, and with
        # `critic_kind="head"` the agent's critic starts from the head it carries.
        model, heads = split_agents(model)
        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
            **kwargs,
        )
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise NotImplementedError(
                "Actor-critic training under DeepSpeed or FSDP is not supported yet (the critics' clipping and saving "
                "assume unsharded parameters): use DDP (`accelerate launch --multi_gpu`) or one process."
            )
        self.critic_tokenizers: list[PreTrainedTokenizerBase | None] = []
        critics = self._build_critics(model, critic_model, critic_processing_class, critic_peft_config or peft_config)
        if args.critic_kind == "head":
            start_heads(critics, heads * self.num_agents if len(heads) == 1 else heads)
        if args.disable_dropout:
            for critic in critics:
                disable_dropout_in_model(critic)
        attach_critics(self.model, critics)
        # Each critic's target statistics (`value_normalization`), kept beside it: the critic outputs standardized
        # values, read back in the reward's scale.
        self.value_normalizers = [ValueNormalizer() for _ in critics] if args.value_normalization else None
        if self.logprob_temperature is not None:
            self._score_at_temperature(self.logprob_temperature)

    def _score_at_temperature(self, temperature: float) -> None:
        """Score the agents' log-probabilities at `temperature` instead of the sampling temperature.

        TRL computes them in each model's patched forward (`add_fused_lm_head`), whose temperature is fixed when it
        is patched: patch the agents' models again. The new patch passes every other call on to the previous one, so
        generation (whose temperature is the generation config's) is unchanged.
        """
        for model in self.model.models():
            base = model.get_base_model() if isinstance(model, PeftModel) else model
            add_fused_lm_head(
                base,
                temperature=temperature,
                cast_lm_head_to_fp32=self.args.cast_lm_head_to_fp32,
                outputs=("log_probs", "entropy"),
            )

    # ------------------------------------------------------------------ the critics

    @property
    def critics(self) -> list[nn.Module]:
        """The critics: one per agent, or one joint critic. Each answers `values(input_ids, attention_mask)`."""
        return list(self.model.critics)

    @property
    def num_critics(self) -> int:
        return len(self.model.critics)

    def critic_parameters(self, index: int) -> list[nn.Parameter]:
        """The parameters critic `index` owns, which its optimizer groups hold: a separate critic's model and head,
        an adapter critic's adapter and head, or only the head of a value head on an agent (the agent's weights are
        the agent's, in its own group, though the value loss reaches them too)."""
        critic = self.model.critics[index]
        if isinstance(critic, AdapterValueModel) and self.args.critic_kind == "adapter":
            return critic.trainable_parameters()
        if self.args.critic_kind == "head":
            return list(critic.value_head.parameters())
        return list(critic.parameters())

    def _build_critics(self, model, critic_model, critic_processing_class, peft_config) -> list[nn.Module]:
        args, team = self.args, self.model
        count = 1 if args.joint_critic else self.num_agents
        tokenizers = _per_critic("critic_processing_class", critic_processing_class, count)
        hidden = args.critic_value_head_hidden_dim
        shared_base = hasattr(team, "peft_model") and hasattr(team, "adapter_names")  # a LoRA team
        critics: list[nn.Module] = []
        if args.critic_kind == "head":
            for i in range(count):
                if shared_base:
                    critics.append(AdapterValueModel(team.peft_model, team.adapter_names[i], hidden))
                else:
                    critics.append(held_backbone(CausalLMWithValueHead(team.agents[i], hidden)))
                self.critic_tokenizers.append(self._agent_views[i]["processing_class"])
            return critics
        if args.critic_kind == "adapter":
            if not shared_base:
                raise ValueError(
                    "`critic_kind='adapter'` puts each critic as a LoRA adapter on the team's shared base: it needs a "
                    "LoRA team (one model id, path or model with `peft_config=`), or use `critic_kind='model'`."
                )
            config = peft_config[0] if isinstance(peft_config, (list, tuple)) else peft_config
            config = config or team.peft_model.peft_config[team.adapter_names[0]]
            for k in range(count):
                name = CRITIC_FOLDER if args.joint_critic else f"{CRITIC_FOLDER}_{k}"
                team.peft_model.add_adapter(name, config)
                critics.append(AdapterValueModel(team.peft_model, name, hidden))
                tokenizer = (
                    tokenizers[k]
                    if tokenizers
                    else self._agent_views[0 if args.joint_critic else k]["processing_class"]
                )
                self.critic_tokenizers.append(tokenizer)
            return critics

        agents = list(model) if isinstance(model, (list, tuple)) else [model] * self.num_agents
        sources = critic_sources(count, critic_model, agents=agents, joint=args.joint_critic)
        load_kwargs = _load_kwargs(args.model_init_kwargs)
        for k, source in enumerate(sources):
            if isinstance(source, CausalLMWithValueHead):
                critic = source
                if critic.value_head is None:
                    raise ValueError(f"Critic {k} is a CausalLMWithValueHead without a value head: build it with one.")
            elif isinstance(source, (PreTrainedModel, PeftModel)):
                critic = CausalLMWithValueHead(source, hidden)
            else:
                model_config_of(source, "critic_model" if critic_model is not None else "model")
                critic = CausalLMWithValueHead.from_pretrained(
                    str(source), value_head_hidden_dim=hidden, attach_value_head=True, **load_kwargs
                )
            if args.critic_devices is not None:
                critic.to(args.critic_devices[k])
            else:
                critic.to(_device_of(team.peft_model if shared_base else team.agents[0 if args.joint_critic else k]))
            tokenizer = tokenizers[k] if tokenizers else _tokenizer_of(source)
            if args.joint_critic:
                tokenizer = tokenizer or self._agent_views[0]["processing_class"]
                if tokenizer.pad_token is None:
                    tokenizer.pad_token = tokenizer.eos_token
            else:
                self._check_critic_tokenizer(k, source, tokenizer, critic)
            self.critic_tokenizers.append(tokenizer)
            critics.append(critic)
        if args.joint_critic:
            self._check_joint_critic_length(critics[0])
        return critics

    def _check_critic_tokenizer(self, k: int, source, tokenizer, critic: CausalLMWithValueHead) -> None:
        """An IAC critic reads its agent's token ids: it must share the agent's vocabulary."""
        embeddings = critic.model.get_input_embeddings().num_embeddings
        check_critic_vocabulary(k, source, tokenizer, embeddings, self._agent_views[k]["processing_class"])

    def _check_joint_critic_length(self, critic: nn.Module) -> None:
        """A Q joint critic reads every agent's completion: refuse one whose context cannot hold them all."""
        limit = _max_length(critic, self.critic_tokenizers[0])
        if limit is None or self.args.critic_type != "q":
            return
        needed = sum(self.args.agent_setting("max_completion_length", i) or 0 for i in range(self.num_agents))
        if needed >= limit:
            raise ValueError(
                f"The joint critic reads up to {limit} tokens, but its text holds every agent's completion (up to "
                f"{needed} tokens together, before the prompts). Use a critic with a longer context, lower "
                "`max_completion_length`, or `critic_type='v'` (prompts only)."
            )

    # ------------------------------------------------------------------ advantages

    def _score_agents(self, batch, names, weights) -> list[dict[str, Any]]:
        outputs = super()._score_agents(batch, names, weights)
        mode = "train" if self.model.training else "eval"
        device = self.accelerator.device
        rows = outputs[0]["completion_ids"].shape[0]
        start = self.accelerator.process_index * rows
        if self.args.joint_critic:
            ids, mask, positions = self._joint_critic_inputs(batch.agent_rows, batch.rollouts)
            old = self._rollout_values(0, ids, mask, positions)
            outputs[0].update(critic_input_ids=ids, critic_attention_mask=mask, critic_positions=positions)
        groups = None if batch.turns is None else self.accelerator.gather(batch.turns)  # CoMLRL: per turn
        targets_seen: dict[int, list[torch.Tensor]] = {}  # each critic's targets of this batch, every process's
        for i, output in enumerate(outputs):
            critic = 0 if self.args.joint_critic else i
            if not self.args.joint_critic:
                ids, mask, positions = self._agent_critic_inputs(output)
                old = self._rollout_values(i, ids, mask, positions)
                output["critic_positions"] = positions
            values = self.critic_values_in_reward_scale(critic, old)  # V_old in the targets' scale
            target = weighted_sum(batch.credit[i][start : start + rows].to(device), weights).float()  # (rows,)
            if batch.successors is not None:  # a multi-turn rollout: TD targets, untrained rows left out
                target = bootstrapped_targets(target, values, batch.successors, self.args.discount)
                target = target.masked_fill(~batch.trained, float("nan"))
            target_all, old_all = self.accelerator.gather(target), self.accelerator.gather(values)
            advantage = advantages(target_all, old_all, normalize=self.args.advantage_normalization, groups=groups)
            output["advantages"] = advantage[start : start + rows].to(device)
            output["old_values"] = old  # the critic's own outputs (value clipping compares them with its new ones)
            output["value_targets"] = target
            targets_seen.setdefault(critic, []).append(target_all)
            prefix = self.agent_metric_prefix(i)
            trained = ~torch.isnan(target_all)
            self._metrics[mode][f"{prefix}value_mean"].append(old_all.float()[trained].mean().item())
            self._metrics[mode][f"{prefix}value_target_mean"].append(torch.nanmean(target_all.float()).item())
        if self.value_normalizers is not None:
            # The statistics move with a training batch's targets, then the critics learn them standardized.
            for critic, seen in targets_seen.items() if mode == "train" else ():
                self.value_normalizers[critic].update(torch.cat(seen))
            for i, output in enumerate(outputs):
                normalizer = self.value_normalizers[0 if self.args.joint_critic else i]
                output["value_targets"] = normalizer.normalize(output["value_targets"])
        if self.rollout_metrics is not None and self._batch_rows is not None:
            self._log_rollout_metrics(batch, outputs, mode)
        return outputs

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        self._batch_rows = inputs  # the dataset rows, for `rollout_metrics`' `batch_item`
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._batch_rows = None

    def _log_rollout_metrics(self, batch, outputs, mode: str) -> None:
        """`rollout_metrics(samples)` once per dataset item, with that item's samples of every agent and turn; the
        numeric values are logged (their mean over the items), the others dropped, as CoMLRL's `metrics_callback`."""
        width = self.num_generations if mode == "train" else self.num_generations_eval
        offset = self.accelerator.process_index * len(batch.agent_rows[0])
        rows = self._batch_rows
        for item in range(len(rows) // width):
            samples = [
                sample
                for i, output in enumerate(outputs)
                for g in range(width)
                for sample in episode_samples(
                    i, item * width + g, g, batch, output, rows[item * width], offset, self.args.discount
                )
            ]
            for key, value in (self.rollout_metrics(samples) or {}).items():
                try:
                    value = float(value)
                except (TypeError, ValueError):
                    continue
                self._metrics[mode][str(key)].append(value)

    def _agent_critic_inputs(self, output: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An agent's rows as its critic reads them: prompt then completion ids, mask, and the value's position."""
        prompt_ids, prompt_mask = output["prompt_ids"], output["prompt_mask"]
        completion_ids, completion_mask = output["completion_ids"], output["completion_mask"]
        prompt_lengths = torch.full_like(completion_ids[:, 0], prompt_ids.shape[1])  # left-padded prompts
        positions = value_positions(self.args.critic_type, prompt_lengths, completion_mask.sum(dim=1).long())
        return torch.cat([prompt_ids, completion_ids], 1), torch.cat([prompt_mask, completion_mask], 1), positions

    def _joint_critic_inputs(self, agent_inputs, rollouts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The joint critic's text of every joint sample (row k of every agent), tokenized with its tokenizer:
        right-padded ids and mask, and the position of each text's last token."""
        tokenizer = self.critic_tokenizers[0]
        texts = []
        for k in range(len(agent_inputs[0])):
            prompts = [_as_text(rows[k]["prompt"], tokenizer, prompt=True) for rows in agent_inputs]
            completions = None
            if self.args.critic_type == "q":
                completions = [_as_text(rollout.completions[k], tokenizer) for rollout in rollouts]
            texts.append(joint_critic_text(prompts, completions))
        encoded = [tokenizer(text)["input_ids"] for text in texts]
        limit = _max_length(self.model.critics[0], tokenizer)
        longest = max(len(ids) for ids in encoded)
        if limit is not None and longest > limit:
            raise ValueError(
                f"A joint critic text is {longest} tokens long, more than the critic reads ({limit}). Use a critic "
                "with a longer context, shorter prompts or `max_completion_length`, or `critic_type='v'`."
            )
        device = self.accelerator.device
        ids = torch.full((len(encoded), longest), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(encoded), longest), dtype=torch.long)
        for k, row in enumerate(encoded):
            ids[k, : len(row)], mask[k, : len(row)] = torch.tensor(row), 1
        positions = torch.tensor([len(row) - 1 for row in encoded])
        return ids.to(device), mask.to(device), positions.to(device)

    def critic_values_in_reward_scale(self, index: int, values: torch.Tensor) -> torch.Tensor:
        """Critic `index`'s outputs read in the targets' (the reward's) scale: as they are, or, with
        `value_normalization`, de-standardized by its running statistics."""
        if self.value_normalizers is None:
            return values
        return self.value_normalizers[index].denormalize(values)

    @torch.no_grad()
    def _rollout_values(self, index: int, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor):
        """V_old: critic `index`'s values of the rows at `positions`, without gradient, float32 `(rows,)`."""
        critic = self.model.critics[index]
        step = max(self.args.per_device_train_batch_size, 1)
        values = []
        for s in range(0, ids.shape[0], step):
            device = critic.value_head.value_projection.weight.device
            per_position = critic.values(ids[s : s + step].to(device), mask[s : s + step].to(device))
            values.append(values_at(per_position, positions[s : s + step].to(device)).float())
        return torch.cat(values).to(self.accelerator.device)

    # ------------------------------------------------------------------ loss

    def _compute_loss(self, model, inputs):
        actor_inputs = {k: v for k, v in inputs.items() if k.split("/", 1)[-1] not in CRITIC_KEYS}
        if self.reinforce_each_step:  # no ratio to the rollout policy: each step's gradient at the current weights
            actor_inputs = {k: v for k, v in actor_inputs.items() if not k.endswith("/old_per_token_logps")}
        loss = super()._compute_loss(model, actor_inputs)  # the agents' losses; the last one not backwarded yet
        training = model.training and torch.is_grad_enabled()
        mode = "train" if model.training else "eval"
        parts = self._critic_parts(inputs)
        if training:
            # One backward per forward (DDP's reducer expects that): the last agent's, before the critics' forwards.
            self.accelerator.backward(loss)
            loss = loss.detach()
        total = loss
        for n, (k, ids, mask, positions, targets, old) in enumerate(parts):
            with self.model.use_critic(k):
                values = values_at(model(input_ids=ids, attention_mask=mask), positions).float()  # (B,)
            losses = []
            for i, target in targets:
                scored = ~torch.isnan(target)
                part = value_loss(
                    values[scored],
                    target[scored],
                    old[scored],
                    clip_range=self.args.value_clip_range,
                    coef=self.args.value_loss_coef,
                )
                part = part if scored.any() else values.sum() * 0.0  # keeps the graph (DDP) with no scored row
                if training:
                    critic = "the joint critic" if self.args.joint_critic else f"agent {i}'s critic"
                    name = f"value loss of {critic} (`{self.agent_metric_prefix(i)}value_loss`)"
                    check_finite_loss(part, name, self.state.global_step + 1, self.accelerator)
                losses.append(part)
                logged = self.accelerator.gather(part.detach()[None]).mean().item()
                self._metrics[mode][f"{self.agent_metric_prefix(i)}value_loss"].append(logged)
            critic_loss = torch.stack(losses).mean()  # a joint critic: the mean of the agents' value losses
            if mode == "train":
                critic_loss = critic_loss / self.current_gradient_accumulation_steps
            if training and n < len(parts) - 1:
                self.accelerator.backward(critic_loss)
                critic_loss = critic_loss.detach()
            total = total + critic_loss
        return total

    def _critic_parts(self, inputs: dict) -> list[tuple]:
        """Each critic's batch: `(critic, ids, mask, positions, [(agent, targets)], old values)`."""
        if self.args.joint_critic:
            targets = [(i, inputs[f"agent_{i}/value_targets"]) for i in range(self.num_agents)]
            return [
                (
                    0,
                    inputs["agent_0/critic_input_ids"],
                    inputs["agent_0/critic_attention_mask"],
                    inputs["agent_0/critic_positions"],
                    targets,
                    inputs["agent_0/old_values"],
                )
            ]
        parts = []
        for i in range(self.num_agents):
            p = f"agent_{i}/"
            ids = torch.cat([inputs[p + "prompt_ids"], inputs[p + "completion_ids"]], 1)
            mask = torch.cat([inputs[p + "prompt_mask"], inputs[p + "completion_mask"]], 1)
            targets = [(i, inputs[p + "value_targets"])]
            parts.append((i, ids, mask, inputs[p + "critic_positions"], targets, inputs[p + "old_values"]))
        return parts

    # ------------------------------------------------------------------ optimization

    def _parameter_groups(self) -> list[ParameterGroup]:
        # Each critic is optimized and clipped apart from its agent, at the critics' learning rate.
        groups = super()._parameter_groups()
        for k in range(self.num_critics):
            metric = "critic/grad_norm" if self.args.joint_critic else f"agent_{k}/critic_grad_norm"
            groups.append(ParameterGroup(self.critic_parameters(k), self.args.critic_lr, metric, {"critic": k}))
        return groups

    def create_optimizer(self, model=None):
        if self.optimizer is not None:  # the user's (`optimizers=`): it must hold the critics
            held = {id(p) for group in self.optimizer.param_groups for p in group["params"]}
            for k in range(self.num_critics):
                if any(id(p) not in held for p in self.critic_parameters(k)):
                    raise ValueError(
                        f"The optimizer given in `optimizers=` does not hold critic {k}'s parameters "
                        f"(`trainer.critic_parameters({k})`): add them, or let the trainer build the optimizer."
                    )
        for k in range(self.num_critics):  # PEFT freezes an adapter critic whenever an agent's adapter is set
            for p in self.critic_parameters(k):
                p.requires_grad_(True)
        return super().create_optimizer(model)

    # ------------------------------------------------------------------ saving and loading

    def critic_dir(self, output_dir: str, index: int) -> str:
        """Where critic `index` is saved: `critic/` (a joint critic) or `agent_{index}/critic/`."""
        if self.args.joint_critic:
            return os.path.join(output_dir, CRITIC_FOLDER)
        return os.path.join(output_dir, f"agent_{index}", CRITIC_FOLDER)

    def critic_settings(self) -> dict[str, object]:
        """What a checkpoint records of its critics (`critics.json`), so that a trainer whose critics read other
        positions or texts refuses it: `critic_type`, `critic_kind`, `joint_critic`."""
        args = self.args
        return {
            "critic_type": args.critic_type,
            "critic_kind": args.critic_kind,
            "joint_critic": args.joint_critic,
            "value_normalization": args.value_normalization,  # standardized outputs mean nothing without it
        }

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        if self.args.should_save:
            for k in range(self.num_critics):
                self.save_critic(k, output_dir)
            with open(os.path.join(output_dir, CRITIC_SETTINGS_FILE), "w", encoding="utf-8") as f:
                json.dump(self.critic_settings(), f, indent=2)
            if self.value_normalizers is not None:
                states = [normalizer.state_dict() for normalizer in self.value_normalizers]
                torch.save(states, os.path.join(output_dir, VALUE_NORM_FILE))

    def shared_folders(self) -> dict[str, str]:
        """A joint critic (`critic/`, MAAC), described for the Hub card; IAC critics are in their agents' folders."""
        if not self.args.joint_critic:
            return {}
        args = self.args
        loader = "`CausalLMWithValueHead.from_pretrained(folder)`" if args.critic_kind == "model" else (
            "`AdapterValueModel.load_pretrained(folder)` on the team's base"
        )  # fmt: skip
        return {
            CRITIC_FOLDER: (
                f"The team's joint critic (MAAC): a value model that reads every agent's prompt"
                f"{' and completion' if args.critic_type == 'q' else ''} as one text, with `value_head.pt` (CoMLRL's "
                f"layout). `critic_type`: `{args.critic_type}`, `critic_kind`: `{args.critic_kind}`. Load it with "
                f"{loader} (multiagent_trl.actor_critic.value_model)."
            )
        }

    def checkpoint_model_folders(self) -> list[str]:
        """The agents' folders, and each critic's (`critic_dir`) unless the critics are heads on the agents."""
        folders = super().checkpoint_model_folders()
        if self.args.critic_kind != "head":
            folders += [self.critic_dir("", k) for k in range(self.num_critics)]
        return folders

    def checkpoint_files(self, folder: str) -> list[str]:
        """Each critic's `value_head.pt` (in its folder, or `agent_{i}/value_head.pt` for a head on the agent)."""
        if self.args.critic_kind == "head":
            heads = [os.path.join(f"agent_{k}", VALUE_HEAD_FILE) for k in range(self.num_critics)]
        else:
            heads = [os.path.join(self.critic_dir("", k), VALUE_HEAD_FILE) for k in range(self.num_critics)]
        norms = [VALUE_NORM_FILE] if self.value_normalizers is not None else []
        return [*super().checkpoint_files(folder), *heads, *norms]

    def check_checkpoint(self, folder: str) -> None:
        """`MultiAgentGRPOTrainer.check_checkpoint`, the critics' files included, and the critics' settings: a
        checkpoint whose `critics.json` records another `critic_type` (V values read at the prompt's end, Q values at
        the completion's) or another critic layout is refused. A checkpoint without it (older) is not checked."""
        super().check_checkpoint(folder)
        path = os.path.join(folder, CRITIC_SETTINGS_FILE)
        if not os.path.isfile(path):
            return
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        for name, value in self.critic_settings().items():
            if name in saved and saved[name] != value:
                raise ValueError(
                    f"This trainer has {name}={value!r}, but the checkpoint {folder} holds critics with "
                    f"{name}={saved[name]!r} (recorded in {CRITIC_SETTINGS_FILE}): their values do not fit this "
                    f"trainer. Resume with {name}={saved[name]!r}, or start the critics afresh."
                )

    def save_critic(self, index: int, output_dir: str) -> str:
        """Save critic `index` under `output_dir` (see `critic_dir`); a value head on an agent goes to
        `agent_{index}/value_head.pt`. Returns the file or folder written."""
        critic = self.model.critics[index]
        if self.args.critic_kind == "head":
            path = os.path.join(output_dir, f"agent_{index}", VALUE_HEAD_FILE)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save({k: v.detach().cpu() for k, v in critic.value_head.state_dict().items()}, path)
            return path
        path = self.critic_dir(output_dir, index)
        critic.save_pretrained(path)
        tokenizer = self.critic_tokenizers[index]
        if tokenizer is not None and self.args.critic_kind == "model":
            tokenizer.save_pretrained(path)
        return path

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        for k in range(self.num_critics):
            self.load_critic(k, resume_from_checkpoint)
        if self.value_normalizers is not None:
            states = torch.load(os.path.join(resume_from_checkpoint, VALUE_NORM_FILE), weights_only=True)
            for normalizer, state in zip(self.value_normalizers, states):
                normalizer.load_state_dict(state)

    def load_critic(self, index: int, output_dir: str) -> None:
        """Load critic `index`'s weights from what `save_critic` wrote under `output_dir` (resuming)."""
        critic = self.model.critics[index]
        if self.args.critic_kind == "head":
            path = os.path.join(output_dir, f"agent_{index}", VALUE_HEAD_FILE)
            critic.value_head.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
        elif self.args.critic_kind == "adapter":
            critic.load_pretrained(self.critic_dir(output_dir, index))
        else:
            dtype = next(critic.parameters()).dtype
            loaded = CausalLMWithValueHead.from_pretrained(self.critic_dir(output_dir, index), dtype=dtype)
            critic.load_state_dict(loaded.state_dict())


# ---------------------------------------------------------------------------------------------------- helpers


def check_critic_vocabulary(k: int, source, tokenizer, embeddings: int, agent_tokenizer) -> None:
    """An independent critic (critic `k`, from `source`) reads agent k's token ids: raise a `ValueError` unless its
    `tokenizer` (when known) has the agent's vocabulary and its model embeds at least as many tokens (`embeddings`)."""
    agent_tokenizer = getattr(agent_tokenizer, "tokenizer", agent_tokenizer)  # a processor's tokenizer
    name = source if isinstance(source, (str, os.PathLike)) else type(source).__name__
    if tokenizer is not None and tokenizer.get_vocab() != agent_tokenizer.get_vocab():
        raise ValueError(
            f"Critic {k} ({name}) has another tokenizer than agent {k}, but it reads agent {k}'s token ids (an "
            "independent critic scores the agent's own tokens). Use a critic of the agent's model family (the "
            "same tokenizer), or `joint_critic=True`, whose critic reads text with its own tokenizer."
        )
    if embeddings < len(agent_tokenizer):
        raise ValueError(
            f"Critic {k} ({name}) embeds {embeddings} tokens, fewer than agent {k}'s tokenizer has "
            f"({len(agent_tokenizer)}): it cannot read the agent's token ids. Use a critic of the agent's family."
        )


def split_agents(model: Any) -> tuple[Any, list[nn.Module | None]]:
    """`model` (one agent or a list) with each agent given as a `CausalLMWithValueHead` replaced by its LM, and the
    heads they carried (`None` for an agent without), in agent order."""
    if isinstance(model, (list, tuple)):
        pairs = [split_value_model(agent) for agent in model]
        return [agent for agent, _ in pairs], [head for _, head in pairs]
    agent, head = split_value_model(model)
    return agent, [head]


def start_heads(critics: Sequence[nn.Module], heads: Sequence[nn.Module | None]) -> None:
    """Start each value-head critic from the head its agent carried, where it carried one."""
    for k, (critic, head) in enumerate(zip(critics, heads)):
        if head is None:
            continue
        try:
            critic.value_head.load_state_dict(head.state_dict())
        except RuntimeError as error:
            raise ValueError(
                f"Agent {k} carries a value head of another shape than its critic's ({error}): set "
                "`critic_value_head_hidden_dim` to the carried head's hidden width (None for a linear head)."
            ) from error


def _per_critic(name: str, value, count: int) -> list | None:
    if value is None:
        return None
    values = list(value) if isinstance(value, (list, tuple)) else [value] * count
    if len(values) != count:
        raise ValueError(f"`{name}` has {len(values)} entries for {count} critics: give one for all, or one each.")
    if name == "critic_processing_class" and any(isinstance(v, (str, os.PathLike)) for v in values):
        raise TypeError(
            "`critic_processing_class` takes tokenizers, not ids or paths (as TRL's `processing_class`): load it "
            "with `AutoTokenizer.from_pretrained(...)`, or leave it None for the critic model's own."
        )
    return values


def _load_kwargs(model_init_kwargs: dict | None) -> dict:
    kwargs = dict(model_init_kwargs or {})
    dtype = kwargs.pop("torch_dtype", None) or kwargs.get("dtype")
    if isinstance(dtype, str) and dtype != "auto":
        dtype = getattr(torch, dtype)
    if dtype is not None:
        kwargs["dtype"] = dtype
    kwargs.pop("device_map", None)  # the trainer places the critics
    return kwargs


def _tokenizer_of(source) -> PreTrainedTokenizerBase | None:
    """The tokenizer saved with a critic's model, when it has an id or path (else `None`)."""
    if isinstance(source, CausalLMWithValueHead):
        source = source.model
    if isinstance(source, nn.Module):
        source = getattr(getattr(source, "config", None), "_name_or_path", None)
    if not source:
        return None
    try:
        return AutoTokenizer.from_pretrained(str(source))
    except (OSError, ValueError):
        return None


def _device_of(module: nn.Module) -> torch.device:
    return next(module.parameters()).device


def _max_length(critic: nn.Module, tokenizer) -> int | None:
    """The most tokens a critic reads: its model's position limit, or its tokenizer's if smaller."""
    config = getattr(getattr(critic, "model", None), "config", None) or critic.peft_model.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    limits = [getattr(text, "max_position_embeddings", None)]
    model_max = getattr(tokenizer, "model_max_length", None)
    if model_max is not None and model_max < 1_000_000:  # transformers' "no limit" is a huge number
        limits.append(model_max)
    limits = [limit for limit in limits if limit]
    return min(limits) if limits else None


def _as_text(value, tokenizer, prompt: bool = False) -> str:
    """A prompt or completion as text: itself, or a conversation rendered with the critic's chat template (joined
    message contents where it has none)."""
    if isinstance(value, str):
        return value
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(value, tokenize=False, add_generation_prompt=prompt)
    return "\n".join(str(message.get("content", "")) for message in value)
