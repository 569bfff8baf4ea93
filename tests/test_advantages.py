"""Aligned and cross credit, checked against advantages computed by hand from the rewards the function returned."""

import itertools

import torch

from multiagent_trl import MultiAgentGRPOTrainer

from .conftest import PROMPTS, G, completion_ids_of, generation_batch, id_reward, normalize, small_args


def test_aligned_advantages(tmp_path, tiny_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=id_reward, args=small_args(tmp_path, num_agents=2), train_dataset=prompts_dataset
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))

    ids = [completion_ids_of(output, a) for a in range(2)]
    rewards = id_reward(None, None, list(zip(*ids)))
    expected = normalize(rewards)
    for agent in range(2):
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], expected, rtol=1e-4, atol=1e-5)
    assert expected.abs().sum() > 0


def test_cross_advantages(tmp_path, tiny_path, prompts_dataset):
    calls = []

    def reward(prompts, completions, completion_ids, **kwargs):
        calls.append(len(completions))
        return id_reward(prompts, completions, completion_ids)

    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        args=small_args(tmp_path, num_agents=2, joint_mode="cross"),
        train_dataset=prompts_dataset,
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    assert calls == [2 * G**2]  # every tuple of every group, in one call

    ids = [completion_ids_of(output, a) for a in range(2)]
    for agent in range(2):
        credit = []
        for group in range(2):
            for k in range(G):
                tuples = [t for t in itertools.product(range(G), repeat=2) if t[agent] == k]
                scores = id_reward(None, None, [(ids[0][group * G + a], ids[1][group * G + b]) for a, b in tuples])
                credit.append(sum(scores) / len(scores))
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], normalize(credit), rtol=1e-4, atol=1e-5)
    assert not torch.equal(output["agent_0/advantages"], output["agent_1/advantages"])


def test_reward_processor_applies_to_the_joint_reward(tmp_path, tiny_path, prompts_dataset):
    from multiagent_trl import RewardProcessors

    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=id_reward,
        reward_processor=RewardProcessors.compose(RewardProcessors.shift(20.0), lambda r: r**2),
        args=small_args(tmp_path, num_agents=2, scale_rewards="none"),
        train_dataset=prompts_dataset,
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    ids = [completion_ids_of(output, a) for a in range(2)]
    processed = torch.tensor([(r + 20.0) ** 2 for r in id_reward(None, None, list(zip(*ids)))]).view(-1, G)
    expected = (processed - processed.mean(1, keepdim=True)).flatten()  # scale_rewards="none": centered only
    torch.testing.assert_close(output["agent_0/advantages"], expected, rtol=1e-4, atol=1e-4)
    assert trainer._metrics["train"]["reward"][-1] == processed.mean().item()


def test_none_reward_means_no_reward(tmp_path, tiny_path, prompts_dataset):
    def sometimes(prompts, completions, **kwargs):
        return [None if j % G == 0 else float(j % 3) for j in range(len(completions))]

    trainer = MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=sometimes, args=small_args(tmp_path, num_agents=2), train_dataset=prompts_dataset
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    advantages = output["agent_1/advantages"].view(-1, G)
    assert torch.all(advantages[:, 0] == 0)  # unscorable samples carry no signal, as in TRL
    assert torch.all(advantages[:, 1:].abs().sum(1) > 0)


def test_prompts_reach_each_agent_through_its_formatter(tmp_path, tiny_path, prompts_dataset):
    seen = {}

    def reward(prompts, completions, target, **kwargs):
        seen["prompts"], seen["target"] = prompts, target
        return [0.0] * len(completions)

    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=reward,
        formatters=[lambda row: "Writer: " + row["prompt"], lambda row: f"Editor ({row['target']}): " + row["prompt"]],
        args=small_args(tmp_path, num_agents=2),
        train_dataset=prompts_dataset,
    )
    trainer.model.train()
    trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    assert seen["prompts"][0] == ("Writer: " + PROMPTS[0], "Editor (3): " + PROMPTS[0])
    assert seen["target"] == [3] * G + [5] * G  # dataset columns arrive as keyword arguments, as in TRL
