"""Checkpoints hold every agent; resuming continues to the same weights as an uninterrupted run."""

import json

import torch

from multiagent_trl import MultiAgentGRPOTrainer

from .conftest import small_args


def ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def make_trainer(tmp_path, tiny_path, dataset, output_dir):
    args = small_args(
        tmp_path, num_agents=2, max_steps=4, save_strategy="steps", save_steps=2, output_dir=str(output_dir)
    )
    return MultiAgentGRPOTrainer(model=tiny_path, reward_funcs=ratio, args=args, train_dataset=dataset)


def test_resume_reaches_the_same_weights(tmp_path, tiny_path, prompts_dataset):
    straight = make_trainer(tmp_path, tiny_path, prompts_dataset, tmp_path / "straight")
    straight.train()

    checkpoint = tmp_path / "straight" / "checkpoint-2"
    for i in range(2):
        assert (checkpoint / f"agent_{i}" / "model.safetensors").exists()
        assert (checkpoint / f"agent_{i}" / "tokenizer.json").exists()
    assert (checkpoint / "optimizer.pt").exists() and (checkpoint / "scheduler.pt").exists()

    resumed = make_trainer(tmp_path, tiny_path, prompts_dataset, tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4
    for a, b in zip(straight.model.agents, resumed.model.agents):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)


def test_saves_are_published_whole_with_the_best_checkpoint_and_rotation(tmp_path, tiny_path, prompts_dataset):
    args = small_args(
        tmp_path, num_agents=2, save_strategy="steps", save_steps=2, save_total_limit=1, save_only_model=True
    )
    trainer = MultiAgentGRPOTrainer(model=tiny_path, reward_funcs=ratio, args=args, train_dataset=prompts_dataset)
    out = tmp_path / "out"
    (out / "tmp-checkpoint-9").mkdir(parents=True)  # what a process killed during a save leaves

    def save(step):
        trainer.state.global_step = step
        trainer._save_checkpoint(trainer.model, trial=None)
        return sorted(p.name for p in out.iterdir() if p.is_dir())

    trainer.state.best_global_step = 2
    assert save(2) == ["checkpoint-2"]
    assert trainer.state.best_model_checkpoint == str(out / "checkpoint-2")
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == str(out / "checkpoint-2")
    assert save(4) == ["checkpoint-2", "checkpoint-4"]  # save_total_limit=1 keeps the best and the newest
    assert save(6) == ["checkpoint-2", "checkpoint-6"]

    (out / "checkpoint-6" / "stale.txt").write_text("")  # saving step 6 again replaces its checkpoint
    assert save(6) == ["checkpoint-2", "checkpoint-6"]
    assert not (out / "checkpoint-6" / "stale.txt").exists()
    assert (out / "checkpoint-6" / "agent_1" / "model.safetensors").exists()
