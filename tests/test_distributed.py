"""Scaling out: two processes (gloo on CPU), gradient accumulation, bf16."""

from pathlib import Path

import pytest
import torch

from multiagent_trl import MultiAgentGRPOTrainer

from .conftest import length_ratio, small_args, trained_ranks

SCRIPT = Path(__file__).parent / "scripts" / "ddp_team.py"


@pytest.mark.parametrize("kind", ["full", "lora", "multiturn"])
def test_two_processes_train_the_same_team(tmp_path, tiny_path, kind):
    ranks = trained_ranks(SCRIPT, tmp_path, kind)
    for rank in ranks:  # every joint sample pairs both agents' completions of the same row
        assert rank["seen"], "no joint sample was scored"
        for prompt_0, prompt_1, row_id in rank["seen"]:
            assert prompt_0.startswith(f"A Row {row_id}: ") and prompt_1.startswith(f"B Row {row_id}: ")
        second_turns = sum(p.endswith("again.") for p, _, _ in rank["seen"])
        assert (second_turns > 0) == (kind == "multiturn")
    assert ranks[0]["seen"] != ranks[1]["seen"], "both ranks scored the same samples: no data parallelism"
    if kind == "multiturn":
        # Even rows end at turn 1. Where one rank's node went on and the other's ended, the other scored placeholder
        # copies of its turn-1 node (collectives need equal rows): more turn-1 prompts than its 4 rows per step.
        assert len(ranks[0]["seen"]) == len(ranks[1]["seen"])
        first_turns = [sum(not p.endswith("again.") for p, _, _ in rank["seen"]) for rank in ranks]
        assert max(first_turns) > 4 * 3, first_turns


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_gradient_accumulation_matches_the_full_batch(tmp_path, tiny_path, prompts_dataset, loss_type):
    weights, initial = [], None
    for batch_size, accumulation in ((8, 1), (4, 2)):
        args = small_args(
            tmp_path, num_agents=2, max_steps=1, loss_type=loss_type,
            per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation,
        )  # fmt: skip
        trainer = MultiAgentGRPOTrainer(
            model=tiny_path, reward_funcs=length_ratio, args=args, train_dataset=prompts_dataset
        )
        initial = [[p.detach().clone() for p in trainer.model.agent_parameters(i)] for i in range(2)]
        trainer.train()
        weights.append([[p.detach().clone() for p in trainer.model.agent_parameters(i)] for i in range(2)])
    for i in range(2):
        for full, accumulated, start in zip(weights[0][i], weights[1][i], initial[i], strict=True):
            torch.testing.assert_close(accumulated, full, rtol=1e-4, atol=1e-6)
            assert not torch.equal(full, start)  # the step moved the weights: equal by not training proves nothing


def test_bf16_step_on_cpu(tmp_path, tiny_path, prompts_dataset):
    args = small_args(tmp_path, num_agents=2, max_steps=1, bf16=True, use_cpu=True)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=length_ratio, args=args, train_dataset=prompts_dataset
    )
    assert trainer.accelerator.mixed_precision == "bf16"
    before = [[p.detach().clone() for p in trainer.model.agent_parameters(i)] for i in range(2)]
    trainer.train()
    for i in range(2):
        assert all(not torch.equal(b, p) for b, p in zip(before[i], trainer.model.agent_parameters(i))), f"agent {i}"
