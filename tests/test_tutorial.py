"""The CoMLRL tutorial (shared/reference/story-len-ratio.md) runs with only its imports and model name changed."""

from pathlib import Path

import pytest


def test_tutorial_code_runs_unchanged(tmp_path, monkeypatch, tiny_path):
    monkeypatch.chdir(tmp_path)  # the tutorial writes relative to the working directory

    # ---- the tutorial, verbatim but for the marked lines ----
    import math
    from functools import partial

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F811

    from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors  # changed: import lines

    train_data = {
        "prompt": [
            "Describe a city in the clouds:",
            "Invent a new holiday and explain it:",
            "Write a bedtime story for a dragon:",
            "Explain how teleportation might work:",
            "Tell a joke about dinosaurs:",
            "Describe a world without electricity:",
            "Create a superhero with a unique power:",
            "Write a scene where the moon talks:",
            "Invent a new type of fruit:",
            "Design a playground on Mars:",
        ]
    }
    train_dataset = Dataset.from_dict(train_data)

    model_name = tiny_path  # changed: the model name (no download in tests)
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    agents = [AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)]

    def proper_length_ratio_reward(completions1, completions2, target_min=2.0, target_max=3.0):
        rewards = []
        for c1, c2 in zip(completions1, completions2):
            len1, len2 = len(c1), len(c2)
            if len1 == 0:
                rewards.append(0.0)
                continue
            ratio = len2 / len1
            if target_min <= ratio <= target_max:
                reward = 1.0
            else:
                distance = target_min - ratio if ratio < target_min else ratio - target_max
                reward = math.exp(-distance)
            rewards.append(float(reward))
        return rewards

    output_dir = "./magrpo_multi_reward_output"
    config = MAGRPOConfig(
        num_train_epochs=3,
        agent_learning_rate=5e-5,
        logging_steps=10,
        num_generations=8,
        num_turns=1,
        max_new_tokens=128,
    )

    configured_reward_func = partial(proper_length_ratio_reward, target_min=2, target_max=3)
    trainer = MAGRPOTrainer(
        agents=agents,
        reward_func=configured_reward_func,
        reward_processor=RewardProcessors.scale(factor=100.0),
        args=config,
        train_dataset=train_dataset,
        tokenizer=tokenizer,
    )

    trainer.train()
    trainer.save_model(f"{output_dir}/models")
    # ---- end of the tutorial ----

    assert trainer.state.global_step == 15  # 10 prompts x 8 generations, 2 prompts per step, 3 epochs
    # The processor's scale shows in the joint reward: 100 times the function's own (unscaled) mean, which is > 0.
    # (Logged at step 10 and, for steps 11-15, with the end-of-training summary.)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    (raw_key,) = {k for h in logs for k in h if k.startswith("rewards/") and k.endswith("/mean")}
    assert logs and all(h[raw_key] > 0 for h in logs), logs
    for h in logs:
        assert h["reward"] == pytest.approx(100.0 * h[raw_key], rel=1e-5)
    for i in range(2):
        saved = Path(output_dir) / "models" / f"agent_{i}"
        assert AutoModelForCausalLM.from_pretrained(saved).config.model_type == "qwen2"
        assert AutoTokenizer.from_pretrained(saved).decode(tokenizer("moon")["input_ids"]) == "moon"
