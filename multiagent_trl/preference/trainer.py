"""`MultiAgentDPOTrainer`: the team trainer with a joint DPO loss on preference pairs drawn from the joint reward
(MADPO, as CoMLRL 1.4.3 defines its loss).

How one generation batch flows:

1. The team core plays the batch (`MultiAgentGRPOTrainer._play`, one turn): every agent samples K =
   `num_generations` completions per prompt, and the joint reward scores the K aligned joint candidates (the core's
   `reward_funcs`, `reward_weights`, `reward_processor`).
2. `played_pairs` (`select_pairs` per prompt) picks `(winner, loser)` joint candidates per prompt (`pair_selection`,
   `preference_pairs_per_sample`); the same index is winner (or loser) for every agent. When the first generation
   batches have no pair at all, training raises (`check_pair_set`) instead of training on nothing; once pairs were
   found, a batch without any (the policies agree everywhere, e.g. once converged) trains nothing and is logged.
3. The batch handed to TRL's step machinery has one row per pair: per agent, `prompt + chosen` and `prompt +
   rejected` token rows (right-padded, `pack_rows`) with the mask of the scored tokens, and, with a reference, the
   reference's log-probabilities of both. Every prompt gets `pairs_per_prompt` rows (the count rounded up to a
   multiple of `steps_per_generation`); rows without a pair carry `pair_weight = 0`. TRL shuffles the rows and
   splits them into the generation batch's optimizer steps, as it does for GRPO: `args.pair_steps`, which may be
   more steps than the batch's completions divide into (`pair_steps_per_generation`: the sampler repeats each
   generation batch for that many steps, and TRL's step machinery runs with it as `steps_per_generation`).
4. `_compute_loss`: each agent's model runs on its `[chosen; rejected]` rows (one forward), the sequence
   log-probabilities are summed at temperature 1 (`sequence_logprobs`), and agent i's loss is MADPO's
   `mean_p -logsigmoid(dpo_beta * (delta_i(p) + sum_{j != i} delta_j(p)))`, the other agents' log-ratios detached
   and computed, as CoMLRL does, before any agent's update of the step (`joint_dpo_losses`). One backward per agent.

Every item is trained each epoch: the last generation batch of an epoch is completed with items from the start of
the epoch's order (`rollout.buffers`; TRL's sampler drops the items that do not fill it).

Evaluation is the core's (the joint reward of the current policies' completions); no preference loss is computed in
evaluation.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from peft import PeftConfig, PeftModel
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..team.modules import LoraAgentTeam
from ..team.optim import check_finite_loss
from ..team.views import swapped
from ..trainer import MultiAgentGRPOTrainer
from .config import MultiAgentDPOConfig
from .losses import joint_dpo_losses, pack_rows, preference_logratios, sequence_logprobs, trim_completion
from .pairs import check_pair_set, played_pairs

logger = logging.getLogger(__name__)

SIDES = ("chosen", "rejected")
DPO_TAG_NAMES = ["trl", "dpo", "multiagent-trl", "madpo"]  # TRL's `_tag_names`: every agent's model card


class MultiAgentDPOTrainer(MultiAgentGRPOTrainer):
    """Train N agents with MADPO: a joint DPO loss on pairs of joint samples ranked by the joint reward.

    Takes every `MultiAgentGRPOTrainer` argument; `args` is a `MultiAgentDPOConfig`. What differs, and why:

    - `_generate_and_score_completions` (training): the core plays the generation batch; the K joint candidates of
      each prompt are paired by reward and the batch holds one row per pair (see the module docstring). Evaluation
      batches are the core's.
    - `_compute_loss`: the joint-factorised DPO loss per agent instead of GRPO's, one backward per agent; logs
      `agent_{i}/loss`, `agent_{i}/logps/{chosen,rejected}`, `agent_{i}/rewards/{chosen,rejected,margins,accuracies}`
      (TRL's DPO names: `dpo_beta` times the log-ratio to the reference, or the plain log-probability without one),
      `rewards/joint_margins`, `rewards/joint_accuracies` and `pairs/trained` per step.
    - With `reference_free=False`, each agent's reference log-probabilities are computed once per generation batch:
      a frozen copy of each full-model agent's starting weights, or the agent's base with its adapters disabled.

    Args:
        model, reward_funcs, args, train_dataset, eval_dataset, processing_class, callbacks, optimizers, peft_config:
            As in `MultiAgentGRPOTrainer` (a LoRA team is one base with `peft_config=`).
        **kwargs: Other `MultiAgentGRPOTrainer` arguments (`reward_processor`, `formatters`, ...).

    Example:

    ```python
    from datasets import Dataset
    from multiagent_trl import MultiAgentDPOConfig, MultiAgentDPOTrainer
    from multiagent_trl.testing import tiny_model_path

    def ratio_reward(completions1, completions2):
        return [min(len(b) / max(len(a), 1), 3.0) for a, b in zip(completions1, completions2)]

    trainer = MultiAgentDPOTrainer(
        model=tiny_model_path(),
        reward_funcs=ratio_reward,
        args=MultiAgentDPOConfig(output_dir="out", num_agents=2, num_generations=4, max_steps=10),
        train_dataset=Dataset.from_dict({"prompt": ["Tell a story:"] * 8}),
    )
    trainer.train()
    trainer.save_model("out/final")  # out/final/agent_0/, out/final/agent_1/
    ```
    """

    _tag_names = DPO_TAG_NAMES
    _name = "MADPO"
    _found_pairs = False  # whether a training batch of this run held a pair yet
    covers_every_item = True  # every item trained each epoch, the last generation batch completed (`rollout.buffers`)

    def __init__(
        self,
        model: str | PreTrainedModel | Sequence[str | PreTrainedModel] | None = None,
        reward_funcs: Callable | Sequence[Callable] | None = None,
        args: MultiAgentDPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class: PreTrainedTokenizerBase | Sequence[PreTrainedTokenizerBase] | None = None,
        callbacks=None,
        optimizers=(None, None),
        peft_config: PeftConfig | Sequence[PeftConfig] | None = None,
        **kwargs,
    ):
        if args is None:
            args = MultiAgentDPOConfig(output_dir="madpo-output")
        elif not isinstance(args, MultiAgentDPOConfig):
            raise TypeError(
                f"`args` is a {type(args).__name__}; MultiAgentDPOTrainer needs a MultiAgentDPOConfig, which takes "
                "every MultiAgentGRPOConfig field and the preference fields (`dpo_beta`, `pair_selection`, ...)."
            )
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
        team_tools = self._team_tools  # a team's tools; a team of one hands them to TRL (`tools`, `rollout_func`)
        custom_rollouts = any(f is not None for f in team_tools.rollout_funcs) or self.rollout_func is not None
        if team_tools.uses_tools or custom_rollouts or getattr(self, "tools", None):
            raise NotImplementedError(
                "MADPO scores whole completions written by the agents: tools, environments and `rollout_func` are "
                "not supported yet. Use MultiAgentGRPOTrainer for tool-using agents."
            )
        self._reference_models = None if args.reference_free else self._frozen_references()

    # ------------------------------------------------------------------ references

    def _frozen_references(self) -> list[torch.nn.Module | None]:
        """Each full-model agent's reference: a frozen copy of its starting weights (`None` for an adapter agent,
        whose reference is its base with the adapters disabled)."""
        if isinstance(self.model, LoraAgentTeam):
            return [None] * self.num_agents
        references = []
        for agent in self.model.agents:
            if isinstance(agent, PeftModel):
                references.append(None)
                continue
            reference = copy.deepcopy(agent)
            # TRL patched the agent's `forward` (`add_fused_lm_head`) with a closure over the agent's own forward: a
            # copy would call the trained agent. The class's forward is the original one.
            reference.__dict__.pop("forward", None)
            reference.requires_grad_(False).eval()
            references.append(reference)
        return references

    def _reference_context(self, index: int):
        """`(module, context)`: what computes agent `index`'s reference log-probabilities, and the context to run it
        in (adapters disabled for an adapter agent)."""
        if isinstance(self.model, LoraAgentTeam):
            return self.model.peft_model, self.model.peft_model.disable_adapter()
        reference = self._reference_models[index]
        if reference is not None:
            return reference, nullcontext()
        agent = self.model.agents[index]
        return agent, agent.disable_adapter()

    # ------------------------------------------------------------------ pairs

    # A generation batch trains `args.pair_steps` optimizer steps, which `pair_steps_per_generation` may set apart from
    # `steps_per_generation` (which with `per_device_train_batch_size` sizes the batch's completions): TRL's sampler
    # repeats each batch once per step, and its `_prepare_inputs` splits the batch's rows into its steps.
    def _get_train_sampler(self, dataset=None):
        with swapped(self.args, steps_per_generation=self.args.pair_steps):
            return super()._get_train_sampler(dataset)

    def _prepare_inputs(self, generation_batch):
        with swapped(self.args, steps_per_generation=self.args.pair_steps):
            return super()._prepare_inputs(generation_batch)

    def _generate_and_score_completions(self, inputs: list[dict]) -> dict[str, Any]:
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)  # evaluation: the core's rewards and metrics
        if self._first_train_row is None:
            self._first_train_row = dict(inputs[0])
        args, width, device = self.args, self.num_generations, self.accelerator.device
        agent_inputs = [self._agent_inputs(inputs, i) for i in range(self.num_agents)]
        levels = self._play(inputs, agent_inputs, width, "train")  # steps 1 and 2 of the core, one turn
        level = levels[0]
        nodes = len(level.nodes)
        # (nodes, K) rewards of this process's prompts; pairs (node, winner, loser), none from placeholders.
        rewards, pairs = played_pairs(
            level, width, self.accelerator.process_index, args.pair_selection, args.preference_pairs_per_sample
        )
        total = int(self.accelerator.gather(torch.tensor([len(pairs)], device=device)).sum())
        items = int(self.accelerator.gather(torch.tensor([nodes], device=device)).sum())
        if total == 0 and not self._found_pairs:  # nothing to learn from since the start: say what to change
            check_pair_set(total, items, width, args.pair_selection)
        if total == 0:  # the policies agree on every prompt now (e.g. converged): this batch trains nothing
            logger.warning(
                "MADPO: no preference pair in this generation batch (every prompt's %d candidates got the same "
                "reward); it trains nothing. Training goes on with the next batch.",
                width,
            )
        self._found_pairs = self._found_pairs or total > 0

        # A fixed number of rows: `pairs_per_prompt` per prompt, rounded up to whole optimizer steps.
        steps = args.pair_steps
        slots = math.ceil(nodes * args.pairs_per_prompt / steps) * steps
        weight = torch.zeros(slots, device=device)
        weight[: len(pairs)] = 1.0
        filler = pairs[0] if pairs else (0, 0, 0)  # rows with weight 0 repeat a real pair (or any rows)
        pairs = pairs + [filler] * (slots - len(pairs))
        token_pairs = [  # (pairs, agents) of (prompt ids, chosen ids, rejected ids)
            [
                (
                    rollout.prompt_ids[node * width + winner],
                    rollout.completion_ids[node * width + winner],
                    rollout.completion_ids[node * width + loser],
                )
                for rollout in level.rollouts
            ]
            for node, winner, loser in pairs
        ]
        batch = self._preference_rows(token_pairs, weight)
        self._log_pairs(rewards, pairs, weight)
        return batch

    def _preference_rows(self, pairs: list[list[tuple[list[int], list[int], list[int]]]], weight: torch.Tensor):
        """The training batch of `pairs`, whatever made them (this batch's candidates, or stored pair records):
        `pairs[p][i]` is agent i's `(prompt ids, chosen completion ids, rejected completion ids)` of pair p, and
        `weight` `(P,)` each pair's weight (0: a placeholder row). Returns `pair_weight` and every agent's rows."""
        batch: dict[str, Any] = {"pair_weight": weight}
        for i in range(self.num_agents):
            batch.update(self._pair_rows(i, [pair[i] for pair in pairs]))
        return batch

    def _pair_rows(self, index: int, pairs: list[tuple[list[int], list[int], list[int]]]) -> dict[str, Any]:
        """Agent `index`'s rows for `pairs` (its `(prompt, chosen, rejected)` token ids): `prompt + chosen` and
        `prompt + rejected` token rows, attention masks and scored-token masks (and the reference's
        log-probabilities), keyed `agent_{index}/...`."""
        tokenizer = self._agent_views[index]["_tokenizer"]
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        device = self.accelerator.device

        def completion(ids: list[int]) -> torch.Tensor:
            ids = torch.tensor(ids, dtype=torch.long)
            return trim_completion(ids, pad) if self.args.drop_last_token else ids

        prompts, completions = [], []
        for k in range(len(SIDES)):  # the chosen rows, then the rejected rows
            for pair in pairs:
                prompts.append(torch.tensor(pair[0], dtype=torch.long))
                completions.append(completion(pair[1 + k]))
        input_ids, attention_mask, scored = pack_rows(prompts, completions, pad, self.args.drop_last_token)
        input_ids, attention_mask, scored = input_ids.to(device), attention_mask.to(device), scored.to(device)
        half = len(pairs)
        prefix = f"agent_{index}/"
        rows = {}
        for k, side in enumerate(SIDES):
            part = slice(k * half, (k + 1) * half)
            rows[f"{prefix}{side}_input_ids"] = input_ids[part]
            rows[f"{prefix}{side}_attention_mask"] = attention_mask[part]
            rows[f"{prefix}{side}_mask"] = scored[part]
        if not self.args.reference_free:
            module, context = self._reference_context(index)
            with torch.no_grad(), context:
                logps = self._batched_logps(module, input_ids, attention_mask, scored)
            rows[f"{prefix}ref_chosen_logps"], rows[f"{prefix}ref_rejected_logps"] = logps[:half], logps[half:]
        return rows

    def _log_pairs(self, rewards: list[list[float]], pairs, weight: torch.Tensor) -> None:
        """Per generation batch: the pairs found, and the mean reward of winners and losers."""
        device = self.accelerator.device
        real = [p for p, w in zip(pairs, weight.tolist()) if w > 0]
        sums = torch.tensor(
            [
                len(real),
                sum(rewards[n][w] for n, w, _ in real),
                sum(rewards[n][lose] for n, _, lose in real),
            ],
            device=device,
            dtype=torch.float64,
        )
        count, chosen, rejected = self.accelerator.gather(sums[None]).sum(dim=0).tolist()
        metrics = self._metrics["train"]
        metrics["pairs/count"].append(count)
        if count:
            metrics["pairs/chosen_reward"].append(chosen / count)
            metrics["pairs/rejected_reward"].append(rejected / count)

    # ------------------------------------------------------------------ loss

    def _batched_logps(self, module, input_ids, attention_mask, scored) -> torch.Tensor:
        """`(rows,)` summed log-probabilities of the scored tokens under `module`, at temperature 1."""
        step = max(self.args.per_device_train_batch_size, 1) * 2
        out = []
        for s in range(0, input_ids.shape[0], step):
            logits = module(
                input_ids=input_ids[s : s + step], attention_mask=attention_mask[s : s + step], use_cache=False
            ).logits
            out.append(sequence_logprobs(logits, input_ids[s : s + step], scored[s : s + step]))
        return torch.cat(out)

    def _agent_logps(self, model, index: int, inputs: dict, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Agent `index`'s `(chosen, rejected)` log-probabilities `(B,)` of the batch's `rows`, in one forward."""
        prefix = f"agent_{index}/"
        ids, mask, scored = (
            torch.cat([inputs[f"{prefix}{side}_{key}"][rows] for side in SIDES])
            for key in ("input_ids", "attention_mask", "mask")
        )
        width = int(mask.sum(dim=1).max())  # rows are right-padded: drop the columns no row uses
        ids, mask, scored = ids[:, :width], mask[:, :width], scored[:, :width]
        with self._agent_view(index):
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # (2B, T, V)
        logps = sequence_logprobs(logits, ids, scored)  # (2B,)
        return logps[: len(rows)], logps[len(rows) :]

    def _logratios(self, model, index: int, inputs: dict, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        chosen, rejected = self._agent_logps(model, index, inputs, rows)
        ref_chosen = ref_rejected = None
        if not self.args.reference_free:
            ref_chosen = inputs[f"agent_{index}/ref_chosen_logps"][rows]
            ref_rejected = inputs[f"agent_{index}/ref_rejected_logps"][rows]
        return preference_logratios(chosen, rejected, ref_chosen, ref_rejected), chosen, rejected

    def _compute_loss(self, model, inputs):
        if "pair_weight" not in inputs:  # an evaluation batch (the core's): no preference loss
            return torch.zeros((), device=self.accelerator.device)
        weight = inputs["pair_weight"]
        rows = (weight > 0).nonzero().squeeze(1)
        real = len(rows) > 0
        if not real:  # no pair in this step on this process: one row, weighted 0, keeps every process in step
            rows = torch.zeros(1, dtype=torch.long, device=weight.device)
        training = model.training and torch.is_grad_enabled()
        separate_backward = training and not self.is_deepspeed_enabled
        n = self.num_agents

        # The other agents' log-ratios, detached, at this step's weights (before any update), as CoMLRL takes them.
        with torch.no_grad():
            detached = [self._logratios(model, i, inputs, rows) for i in range(n)] if n > 1 else None
        total = 0.0
        losses, own = [], []
        for i in range(n):
            delta, chosen, rejected = self._logratios(model, i, inputs, rows)
            logratios = torch.stack([delta if j == i else detached[j][0] for j in range(n)]) if n > 1 else delta[None]
            loss = joint_dpo_losses(logratios, self.args.dpo_beta, self.args.dpo_loss_type)[i]
            if not real:
                loss = loss * 0.0
            if model.training:
                loss = loss / self.current_gradient_accumulation_steps
            if training:
                check_finite_loss(loss, self.loss_name("DPO loss", i), self.state.global_step + 1, self.accelerator)
            losses.append(loss.detach())
            own.append((delta.detach(), chosen.detach(), rejected.detach()))
            if separate_backward and i < n - 1:
                self.accelerator.backward(loss)
                loss = loss.detach()
            total = total + loss
        self._log_step(losses, own, inputs, rows, real, "train" if model.training else "eval")
        return total

    def _log_step(self, losses, own, inputs, rows, real: bool, mode: str) -> None:
        """Per agent TRL DPO's metrics, and the team's joint margins, over the step's pairs (every process's)."""
        beta, gather = self.args.dpo_beta, self.accelerator.gather
        keep = torch.full((len(rows),), float(real), device=rows.device)  # (B,) 1 for the real pairs
        count = gather(keep.sum()[None]).sum()
        metrics = self._metrics[mode]
        metrics["pairs/trained"].append(count.item())
        if count == 0:
            return

        def mean(values: torch.Tensor) -> float:
            return (gather((values.float() * keep).sum()[None]).sum() / count).item()

        scale = self.current_gradient_accumulation_steps if mode == "train" else 1
        joint = sum(delta for delta, _, _ in own)  # (B,)
        for i, (loss, (delta, chosen, rejected)) in enumerate(zip(losses, own)):
            prefix = self.agent_metric_prefix(i)
            ref = f"agent_{i}/ref_"
            ref_chosen = inputs[ref + "chosen_logps"][rows] if not self.args.reference_free else 0.0
            ref_rejected = inputs[ref + "rejected_logps"][rows] if not self.args.reference_free else 0.0
            if prefix:  # a team of one: Trainer logs its loss as `loss`
                metrics[f"{prefix}loss"].append(gather(loss[None] * scale).mean().item())
            metrics[f"{prefix}logps/chosen"].append(mean(chosen))
            metrics[f"{prefix}logps/rejected"].append(mean(rejected))
            metrics[f"{prefix}rewards/chosen"].append(mean(beta * (chosen - ref_chosen)))
            metrics[f"{prefix}rewards/rejected"].append(mean(beta * (rejected - ref_rejected)))
            metrics[f"{prefix}rewards/margins"].append(mean(beta * delta))
            metrics[f"{prefix}rewards/accuracies"].append(mean(delta > 0))
        metrics["rewards/joint_margins"].append(mean(beta * joint))
        metrics["rewards/joint_accuracies"].append(mean(joint > 0))


__all__ = ["MultiAgentDPOTrainer"]
