"""Reward models (sequence classifiers) in `reward_funcs` with several agents: each joint sample scored as one text."""

import math
import os

import pytest
import torch
from transformers import AutoModelForSequenceClassification, Qwen2Config

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.rewards.models import JointRewardModel, default_joint_text
from multiagent_trl.testing import tiny_tokenizer

from .conftest import PROMPTS, small_args


def short_second(completions1, completions2):
    """A plain function reward, mixed with the reward model through `reward_weights`."""
    return [-float(len(b)) for b in completions2]


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory) -> str:
    """A tiny sequence classifier (one label) with its tokenizer, saved like a Hub reward model."""
    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config)
    path = os.path.join(tmp_path_factory.mktemp("rm"), "tiny-rm")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def direct_scores(path, texts):
    """The reward model called directly on `texts`, as TRL calls one: right padding, first logit."""
    tokenizer = tiny_tokenizer()
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    with torch.no_grad():
        return model(**inputs).logits[:, 0].tolist()


def test_joint_reward_model_scores_the_formatted_texts(reward_model_path):
    scorer = JointRewardModel(reward_model_path, batch_size=2)  # tokenizer loaded from the path; 2 per forward
    prompts = [(p, p) for p in PROMPTS[:3]]
    completions = [("a short one", "and a longer second answer"), ("x", "y"), ("", "only the second agent")]
    texts = [default_joint_text(p, c) for p, c in zip(prompts, completions)]
    assert texts[1] == f"{PROMPTS[1]}\n\n[agent_0]\nx\n\n[agent_1]\ny"
    scores = scorer(prompts=prompts, completions=completions)
    torch.testing.assert_close(torch.tensor(scores), torch.tensor(direct_scores(reward_model_path, texts)))
    assert len(set(scores)) == 3  # the texts are told apart
    assert scorer.__name__ == "tiny-rm"


def test_a_team_trains_on_a_reward_model_mixed_with_a_function(
    tmp_path, tiny_path, prompts_dataset, reward_model_path
):
    def swapped(prompts, completions):  # a user's joint text: agent 1 first
        return f"{prompts[0]}||{completions[1]}||{completions[0]}"

    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=[reward_model_path, short_second],
        args=small_args(tmp_path, num_agents=2, max_steps=1, reward_weights=[1.0, 0.5], max_completion_length=6),
        train_dataset=prompts_dataset,
        reward_processing_classes=[tiny_tokenizer(), None],
        joint_text=swapped,
    )
    before = [{n: p.detach().clone() for n, p in agent.named_parameters()} for agent in trainer.model.agents]
    trainer.train()

    # The logged per-sample rewards are the reward model's scores of the user's texts of the joint samples.
    logs = trainer._logs
    prompts = list(logs["prompt"])
    firsts, seconds = list(logs["extra"]["agent_0/completion"]), list(logs["extra"]["agent_1/completion"])
    texts = [f"{p}||{b}||{a}" for p, a, b in zip(prompts, firsts, seconds)]
    logged = torch.tensor(list(logs["rewards"]["tiny-rm"]))
    assert len(texts) == 8
    torch.testing.assert_close(logged, torch.tensor(direct_scores(reward_model_path, texts)))
    # Mixed through reward_weights, as in TRL: the joint reward is 1.0 * model + 0.5 * function.
    function = torch.tensor(short_second(firsts, seconds))
    step = trainer.state.log_history[0]
    assert step["reward"] == pytest.approx((logged + 0.5 * function).mean().item(), abs=1e-5)
    assert step["rewards/tiny-rm/mean"] == pytest.approx(logged.mean().item(), abs=1e-5)
    # Training moved every agent.
    for i, agent in enumerate(trainer.model.agents):
        changed = [n for n, p in agent.named_parameters() if not torch.equal(p, before[i][n])]
        assert changed, f"agent {i} did not train"


def test_joint_text_without_a_reward_model_is_an_error(tmp_path, tiny_path, prompts_dataset):
    with pytest.raises(ValueError, match="`joint_text=` formats joint samples for reward models"):
        MultiAgentGRPOTrainer(
            model=tiny_path,
            reward_funcs=short_second,
            args=small_args(tmp_path, num_agents=2),
            train_dataset=prompts_dataset,
            joint_text=default_joint_text,
        )


def test_reward_processing_classes_must_match_the_reward_functions(
    tmp_path, tiny_path, prompts_dataset, reward_model_path
):
    with pytest.raises(ValueError, match=r"`reward_processing_classes` has 3 entries for 2 reward functions"):
        MultiAgentGRPOTrainer(
            model=tiny_path,
            reward_funcs=[reward_model_path, short_second],
            args=small_args(tmp_path, num_agents=2),
            train_dataset=prompts_dataset,
            reward_processing_classes=[None, None, None],
        )


@pytest.mark.parametrize("num_agents", [1, 2])
def test_a_reward_model_that_scores_nan_fails(tmp_path, tiny_path, prompts_dataset, reward_model_path, num_agents):
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_path)
    with torch.no_grad():
        model.score.weight.fill_(math.nan)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=[short_second, model] if num_agents == 2 else [model],
        args=small_args(tmp_path, num_agents=num_agents, max_steps=1),
        train_dataset=prompts_dataset,
        reward_processing_classes=tiny_tokenizer(),
    )
    with pytest.raises(ValueError, match=r"Reward model 'tiny-rm' returned nan for joint sample 0"):
        trainer.train()
