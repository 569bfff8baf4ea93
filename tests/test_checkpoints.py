"""Checkpoints hold every agent; resuming continues to the same weights as an uninterrupted run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

from multiagent_trl import ActorCriticConfig, ActorCriticTrainer, MultiAgentGRPOTrainer
from multiagent_trl.team.checkpointing import publishes

from .conftest import free_port, length_ratio, lora_config, small_args

TWO_NODES = Path(__file__).parent / "scripts" / "two_nodes.py"


def make_trainer(tmp_path, tiny_path, dataset, output_dir, kind="full"):
    args = small_args(
        tmp_path, num_agents=2, max_steps=4, save_strategy="steps", save_steps=2, output_dir=str(output_dir)
    )
    peft_config = lora_config() if kind == "lora" else None
    return MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=length_ratio, args=args, train_dataset=dataset, peft_config=peft_config
    )


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_resume_restores_every_agent_and_its_optimizer_state(tmp_path, tiny_path, prompts_dataset, kind):
    straight = make_trainer(tmp_path, tiny_path, prompts_dataset, tmp_path / "straight", kind)
    straight.train()

    checkpoint = tmp_path / "straight" / "checkpoint-2"
    weights = "adapter_model.safetensors" if kind == "lora" else "model.safetensors"
    for i in range(2):
        assert (checkpoint / f"agent_{i}" / weights).exists()
        assert (checkpoint / f"agent_{i}" / "tokenizer.json").exists()
    assert (checkpoint / "optimizer.pt").exists() and (checkpoint / "scheduler.pt").exists()

    resumed = make_trainer(tmp_path, tiny_path, prompts_dataset, tmp_path / "resumed", kind)
    with (
        torch.no_grad()
    ):  # other weights from the start (same seed otherwise), so only the checkpoint makes them agree
        for i in range(2):
            for p in resumed.model.agent_parameters(i):
                p.normal_()
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 4
    for i in range(2):
        expected, trained = straight.model.agent_parameters(i), resumed.model.agent_parameters(i)
        assert len(trained) == len(expected) > 0 and all(p.requires_grad for p in trained)
        for p, q in zip(expected, trained):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["full", "lora", "actor-critic"])
def test_load_best_model_at_end_loads_every_agent_of_the_best_checkpoint(tmp_path, tiny_path, prompts_dataset, kind):
    # `eval_num_tokens` (the tokens seen so far) grows with every step: the first checkpoint is the best.
    best = dict(
        num_agents=2, max_steps=4, save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
        load_best_model_at_end=True, metric_for_best_model="eval_num_tokens", greater_is_better=False,
    )  # fmt: skip
    data = dict(train_dataset=prompts_dataset, eval_dataset=prompts_dataset.select(range(2)))
    if kind == "actor-critic":
        args = small_args(tmp_path, ActorCriticConfig, num_generations=2, per_device_train_batch_size=4, **best)
        trainer = ActorCriticTrainer(model=tiny_path, reward_funcs=length_ratio, args=args, **data)
    else:
        peft_config = lora_config() if kind == "lora" else None
        args = small_args(tmp_path, **best)
        trainer = MultiAgentGRPOTrainer(
            model=tiny_path, reward_funcs=length_ratio, args=args, peft_config=peft_config, **data
        )

    def trained(i: int) -> list[torch.Tensor]:  # agent i's weights, and its critic's
        critic = trainer.critic_parameters(i) if kind == "actor-critic" else []
        return [p.detach().clone() for p in [*trainer.model.agent_parameters(i), *critic]]

    weights = {}

    class Snapshots(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            weights[state.global_step] = [trained(i) for i in range(2)]

    trainer.add_callback(Snapshots())
    trainer.train()
    assert trainer.state.best_model_checkpoint == str(tmp_path / "out" / "checkpoint-2")
    for i in range(2):
        assert any(not torch.equal(p, q) for p, q in zip(weights[4][i], weights[2][i]))  # the steps changed them
        for p, q in zip(trained(i), weights[2][i]):
            torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_saves_are_published_whole_with_the_best_checkpoint_and_rotation(tmp_path, tiny_path, prompts_dataset):
    args = small_args(
        tmp_path, num_agents=2, save_strategy="steps", save_steps=2, save_total_limit=1, save_only_model=True
    )
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=length_ratio, args=args, train_dataset=prompts_dataset
    )
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


# Node main processes (their ranks) and the storage each one writes to: one publisher per storage, the lowest rank.
@pytest.mark.parametrize(
    "storages, publishers",
    [
        ({0: "local"}, {0}),  # one node
        ({0: "nfs", 8: "nfs"}, {0}),  # shared filesystem: node 1 must not rename too
        ({0: "disk0", 8: "disk1"}, {0, 8}),  # node-local disks: each node publishes its own folder
        ({0: "nfs", 4: "disk1", 8: "nfs", 12: "disk3"}, {0, 4, 12}),
    ],
)
def test_one_process_per_storage_renames(storages, publishers):
    for rank, storage in storages.items():
        visible = [r for r, s in storages.items() if s == storage]  # the markers this node's main process sees
        assert publishes(rank, True, visible) == (rank in publishers), rank
        assert not publishes(rank + 1, False, visible)  # not a node's main process


def test_two_nodes_publish_what_trainer_writes_on_each_storage(tmp_path):
    # Two processes, each its node's main process (LOCAL_RANK=0), on a shared output dir and on per-node dirs.
    port = free_port()
    processes = []
    for rank in range(2):
        env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1", "RANK": str(rank),
               "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}  # fmt: skip
        log = open(tmp_path / f"log{rank}", "w")
        processes.append(
            subprocess.Popen([sys.executable, str(TWO_NODES), str(tmp_path)], stdout=log, stderr=log, env=env)
        )
    try:
        codes = [p.wait(timeout=300) for p in processes]
    finally:
        for p in processes:
            p.kill()
    assert codes == [0, 0], "\n".join((tmp_path / f"log{r}").read_text()[-3000:] for r in range(2))

    published = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for layout in ("shared-each_node=False", "shared-each_node=True"):
        assert [p[layout] for p in published] == [True, False], layout
        folder = tmp_path / layout
        assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["checkpoint-2"], layout
        checkpoint = folder / "checkpoint-2"
        assert sorted(p.name for p in checkpoint.glob("rng_state*")) == ["rng_state_0.pth", "rng_state_1.pth"]
        assert (checkpoint / "agent_1" / "model.safetensors").exists() and (checkpoint / "optimizer.pt").exists()
    for each_node in (False, True):
        layout = f"local-each_node={each_node}"
        assert [p[layout] for p in published] == [True, True], layout
        for rank in range(2):
            folder = tmp_path / layout / f"node{rank}"
            saves_model = rank == 0 or each_node
            # Rotation (save_total_limit=1) is Trainer's: only on nodes that save the model.
            expected = ["checkpoint-2"] if saves_model else ["checkpoint-1", "checkpoint-2"]
            assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == expected, (layout, rank)
            checkpoint = folder / "checkpoint-2"
            assert [p.name for p in checkpoint.glob("rng_state*")] == [f"rng_state_{rank}.pth"], (layout, rank)
            # Weights only on node 0: transformers 5.24's `save_pretrained` writes them on global rank 0 alone.
            assert (checkpoint / "agent_1" / "model.safetensors").exists() == (rank == 0), (layout, rank)
            assert (checkpoint / "agent_1" / "tokenizer.json").exists() == saves_model, (layout, rank)
            assert (checkpoint / "optimizer.pt").exists() == saves_model, (layout, rank)
