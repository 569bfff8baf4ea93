"""wandb (offline) records a run with the joint and per-agent metrics; saving does not end the run."""

import pytest
import wandb

from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, MultiAgentGRPOTrainer

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


def test_magrpo_training_logs_comlrls_turn_names_and_each_agents_metrics(tmp_path, tiny_path, prompts_dataset):
    """docs/comlrl-users.md, "Metric names": training logs the joint `reward`, per turn `turn_k/reward` and CoMLRL's
    `turn_k/reward_mean` and `turn_k/expected_return` (one turn too, as CoMLRL logs them), and per agent the loss,
    grad norm, lengths and KL."""
    args = MAGRPOConfig(
        output_dir=str(tmp_path / "out"), num_turns=1, max_new_tokens=8, rollout_buffer_size=2, max_steps=1,
        agent_learning_rate=1e-3, logging_steps=1, report_to="none", reference_kl_enabled=True, reference_kl_coef=0.05,
    )  # fmt: skip
    trainer = MAGRPOTrainer(agent_model=tiny_path, reward_func=length_ratio, args=args, train_dataset=prompts_dataset)
    trainer.train()
    logs = trainer.state.log_history[0]
    for key in ("turn_1/reward", "turn_1/reward_mean", "turn_1/expected_return"):
        assert logs[key] == logs["reward"], key  # one turn: the turn's reward is the episode's return
    for i in range(2):
        for key in ("loss", "grad_norm", "completions/mean_length", "kl"):
            assert f"agent_{i}/{key}" in logs, f"agent_{i}/{key}"


def test_trackio_local_run_has_per_agent_series(tmp_path, monkeypatch, tiny_path, prompts_dataset):
    """`report_to="trackio"` (transformers' TrackioCallback, local mode: a SQLite file per project under TRACKIO_DIR,
    no Space, no network) stores the joint and the per-agent series, one point per logged step, as wandb does."""
    # trackio reads TRACKIO_DIR once, when it is first imported (here, unless another test imported it before): set it
    # first, and point the storage module at tmp_path as well in case trackio was already imported.
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    pytest.importorskip("trackio", reason="trackio is not installed (pip install trackio); it is not in the dev extra")
    from trackio import sqlite_storage

    monkeypatch.setattr(sqlite_storage, "TRACKIO_DIR", tmp_path / "trackio")
    for name in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_BUCKET_ID", "TRACKIO_DATASET_ID"):
        monkeypatch.delenv(name, raising=False)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(
            tmp_path, num_agents=2, report_to="trackio", project="multiagent-trl-tests", run_name="team-of-two"
        ),
        train_dataset=prompts_dataset,
    )
    trainer.train()
    database = sqlite_storage.SQLiteStorage.get_project_db_path("multiagent-trl-tests")
    assert database.is_relative_to(tmp_path) and database.exists()
    logs = sqlite_storage.SQLiteStorage.get_logs("multiagent-trl-tests", "team-of-two")
    keys = (
        "train/agent_0/loss",
        "train/agent_1/loss",
        "train/agent_0/completions/mean_length",
        "train/agent_1/entropy",
    )
    for key in ("train/reward", *keys):
        series = [(entry["step"], entry[key]) for entry in logs if key in entry]
        assert [step for step, _ in series] == [1, 2], (key, series)
    rewards = [entry["train/reward"] for entry in logs if "train/reward" in entry]
    assert rewards == [entry["reward"] for entry in trainer.state.log_history if "reward" in entry]
