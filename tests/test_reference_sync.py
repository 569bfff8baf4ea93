"""`sync_ref_model=True` with a team: each agent's reference follows its own policy, as TRL's callback does for one."""

import pytest
import torch
from peft import LoraConfig
from transformers import TrainerCallback

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.testing import tiny_model_path

from .conftest import small_args

ALPHA = 0.3


def length_ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def weights(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


class PolicySnapshots(TrainerCallback):
    """Each agent's policy weights at every step end (before the sync callback, which is added after this one)."""

    def __init__(self):
        self.trainer = None
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append((state.global_step, [weights(agent) for agent in self.trainer.model.agents]))


def test_each_reference_follows_its_own_policy(tmp_path, prompts_dataset):
    # Two agents with different initial weights, so that a reference mixed with the wrong policy is told apart.
    snapshots = PolicySnapshots()
    trainer = MultiAgentGRPOTrainer(
        model=[tiny_model_path(seed=0), tiny_model_path(seed=1)],
        reward_funcs=length_ratio,
        args=small_args(
            tmp_path, max_steps=3, beta=0.1, sync_ref_model=True, ref_model_mixup_alpha=ALPHA, ref_model_sync_steps=2
        ),
        train_dataset=prompts_dataset,
        callbacks=[snapshots],
    )
    snapshots.trainer = trainer
    initial = [weights(view["ref_model"]) for view in trainer._agent_views]
    trainer.train()

    # By hand: ref <- alpha * policy + (1 - alpha) * ref at the steps divisible by ref_model_sync_steps (step 2 only).
    synced = [(step, policies) for step, policies in snapshots.steps if step % 2 == 0]
    assert [step for step, _ in synced] == [2]
    for i, view in enumerate(trainer._agent_views):
        expected, other = dict(initial[i]), dict(initial[i])
        for _, policies in synced:
            expected = {n: ALPHA * policies[i][n] + (1 - ALPHA) * expected[n] for n in expected}
            other = {n: ALPHA * policies[1 - i][n] + (1 - ALPHA) * other[n] for n in other}
        actual = weights(view["ref_model"])
        for name in expected:
            torch.testing.assert_close(actual[name], expected[name])
        # No reference moved toward the other agent: it is far from the mixture with the other agent's policy.
        distance_to_other = sum((actual[n] - other[n]).abs().sum().item() for n in actual)
        assert distance_to_other > 1.0, f"agent {i}'s reference is close to a mix with agent {1 - i}'s policy"
        # And it did move: it is not its initial weights any more.
        assert any(not torch.equal(actual[n], initial[i][n]) for n in actual)


@pytest.mark.parametrize(
    "team, settings, error, message",
    [
        ("full", dict(beta=0.0), ValueError, r"`sync_ref_model=True` needs a reference model"),
        ("lora", dict(beta=0.1), NotImplementedError, r"with LoRA agents is not supported .* Train full models"),
        ("full", dict(beta=0.1, ref_model_mixup_alpha=1.5), ValueError, r"`ref_model_mixup_alpha` must be in"),
    ],
)
def test_what_cannot_sync_is_refused_at_construction(
    tmp_path, tiny_path, prompts_dataset, team, settings, error, message
):
    lora = dict(peft_config=LoraConfig(r=4, target_modules=["q_proj"])) if team == "lora" else {}
    with pytest.raises(error, match=message):
        MultiAgentGRPOTrainer(
            model=tiny_path,
            reward_funcs=length_ratio,
            args=small_args(tmp_path, num_agents=2, sync_ref_model=True, **settings),
            train_dataset=prompts_dataset,
            **lora,
        )
