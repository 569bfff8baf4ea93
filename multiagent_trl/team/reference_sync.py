"""Reference sync for teams (`sync_ref_model=True`): each agent's KL reference follows its own policy.

TRL's `SyncRefModelCallback` mixes one policy into one reference every `ref_model_sync_steps` optimizer steps:
`ref <- alpha * policy + (1 - alpha) * ref`, with `alpha = ref_model_mixup_alpha` (TR-DPO,
https://huggingface.co/papers/2404.09656). A team has one reference per agent (in the agent's view); the callback
here applies the same update to each agent's reference from that agent's policy only, so no reference ever moves
toward another agent.

LoRA agents are refused, as `GRPOTrainer` refuses PEFT models: their reference is the base model with the adapter
disabled (or a frozen `ref` copy of a trained adapter), not a copy of its own that could follow the policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from accelerate import Accelerator
from peft import PeftModel
from transformers import TrainerCallback
from trl.trainer.callbacks import SyncRefModelCallback

if TYPE_CHECKING:
    from ..config import MultiAgentGRPOConfig


def check_reference_sync(args: MultiAgentGRPOConfig, models: list) -> None:
    """Raise early, naming what to change, when `sync_ref_model=True` cannot run for these agents."""
    if not args.sync_ref_model:
        return
    betas = args.beta if isinstance(args.beta, list) else [args.beta]
    if all(beta == 0.0 for beta in betas):
        raise ValueError(
            "`sync_ref_model=True` needs a reference model, which only an agent with `beta != 0` has: set `beta` (one "
            "value, or one per agent), or set `sync_ref_model=False`."
        )
    if any(isinstance(model, PeftModel) for model in models):
        raise NotImplementedError(
            "`sync_ref_model=True` with LoRA agents is not supported (nor is it by GRPOTrainer for PEFT models): an "
            "adapter's reference is its base model with the adapter disabled, which cannot follow the policy. Train "
            "full models (no `peft_config`) to sync references, or keep `sync_ref_model=False`."
        )
    if args.ref_model_sync_steps < 1:
        raise ValueError(f"`ref_model_sync_steps` must be at least 1, got {args.ref_model_sync_steps}.")
    if not 0.0 <= args.ref_model_mixup_alpha <= 1.0:
        raise ValueError(f"`ref_model_mixup_alpha` must be in [0, 1], got {args.ref_model_mixup_alpha}.")


class ReferenceSyncCallback(TrainerCallback):
    """Every `ref_model_sync_steps` optimizer steps, mix each agent's policy into its own reference:
    `ref_i <- alpha * policy_i + (1 - alpha) * ref_i`. Agents with `beta == 0` have no reference and are skipped.

    Args:
        accelerator: The run's accelerator (it unwraps the team and the references).
        views: The agents' views (`team.views`), whose `ref_model` entries are the references.
    """

    def __init__(self, accelerator: Accelerator, views: list[dict[str, Any]]):
        self.accelerator = accelerator
        self.views = views

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % args.ref_model_sync_steps != 0:
            return
        team = self.accelerator.unwrap_model(model)
        for i, view in enumerate(self.views):
            if view["ref_model"] is None:
                continue
            reference = self.accelerator.unwrap_model(view["ref_model"])
            # TRL's own update (it also gathers ZeRO-3 shards), applied to one agent and its reference.
            SyncRefModelCallback.sync_target_model(team.agents[i], reference, args.ref_model_mixup_alpha)
