"""wandb (offline) records a run with the joint and per-agent metrics; saving does not end the run."""

import wandb

from multiagent_trl import MultiAgentGRPOTrainer

from .conftest import length_ratio, small_args


def test_wandb_offline_run_has_per_agent_metrics(tmp_path, monkeypatch, tiny_path, prompts_dataset):
    wandb.teardown()  # wandb keeps the settings of a process's first run; start from this test's environment
    for name in ("WANDB_ENTITY", "WANDB_TAGS", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "multiagent-trl-tests")
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, report_to="wandb", run_name="team-of-two"),
        train_dataset=prompts_dataset,
    )
    try:
        trainer.train()
        trainer.save_model(tmp_path / "saved")
        assert wandb.run is not None, "save_model must not end the wandb run"
        summary = dict(wandb.run.summary)
        for key in ("train/reward", "train/agent_0/completions/mean_length", "train/agent_1/entropy"):
            assert key in summary, key
        assert summary["train/reward"] == trainer.state.log_history[-2]["reward"]
        run_dir = wandb.run.dir
    finally:
        wandb.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")), "no offline run file was written"
    assert run_dir.startswith(str(tmp_path))
