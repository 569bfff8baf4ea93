"""A training process killed with SIGKILL, mid-run or during a checkpoint save, resumes with
`train(resume_from_checkpoint=True)` to the weights of an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers.trainer_utils import get_last_checkpoint

from multiagent_trl import JointRewardModel

SCRIPT = Path(__file__).parent / "scripts" / "kill_resume.py"
MAX_STEPS = 6  # the script's; it saves every 2 steps
TIMEOUT = 300


def start(out_dir: Path, mode: str, kind: str = "full") -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    command = [sys.executable, str(SCRIPT), str(out_dir), mode, kind]
    with open(out_dir / f"{mode}.log", "w") as log:  # a file, not a pipe nobody reads, which could block the run
        return subprocess.Popen(command, stdout=log, stderr=log, env=env)


def log_tail(out_dir: Path, mode: str) -> str:
    return (out_dir / f"{mode}.log").read_text()[-3000:]


def run(out_dir: Path, mode: str, kind: str = "full") -> int:
    process = start(out_dir, mode, kind)
    try:
        return process.wait(timeout=TIMEOUT)
    finally:
        process.kill()


def resume(out_dir: Path, kind: str = "full") -> dict:
    assert run(out_dir, "resume", kind) == 0, log_tail(out_dir, "resume")
    return json.loads((out_dir / "result.json").read_text())


def assert_same_weights(out_dir: Path, expected: dict) -> None:
    weights = torch.load(out_dir / "weights.pt")
    assert weights.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(weights[name], value, rtol=1e-5, atol=1e-6, msg=name)


def checkpoint_step(path: str) -> int:
    return int(Path(path).name.rsplit("-", 1)[1])


def kill_after_first_checkpoint(process: subprocess.Popen, out_dir: Path) -> None:
    """SIGKILL a `slow` run once its `checkpoint-2` exists; it must not have ended by then, nor written a result."""
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (out_dir / "run" / "checkpoint-2").is_dir():
            assert process.poll() is None, "the run ended before its first checkpoint:\n" + log_tail(out_dir, "slow")
            assert time.monotonic() < deadline, "no checkpoint-2 in time"
            time.sleep(0.05)
        assert process.poll() is None, "the run ended before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        process.kill()
    assert not (out_dir / "result.json").exists()


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run's final weights, per team kind (run once per kind)."""
    runs = {}

    def weights(kind: str = "full") -> dict:
        if kind not in runs:
            out_dir = tmp_path_factory.mktemp(f"straight-{kind}")
            assert run(out_dir, "straight", kind) == 0, log_tail(out_dir, "straight")
            assert json.loads((out_dir / "result.json").read_text())["steps"] == list(range(1, MAX_STEPS + 1))
            runs[kind] = torch.load(out_dir / "weights.pt")
        return runs[kind]

    return weights


def test_killed_mid_run_resumes_to_the_same_weights(tmp_path, straight):
    # sleeps 1 s after each step: it is still running when the kill comes
    kill_after_first_checkpoint(start(tmp_path, "slow"), tmp_path)

    last = get_last_checkpoint(str(tmp_path / "run"))
    assert checkpoint_step(last) in (2, 4)  # 4 only if the kill came late
    result = resume(tmp_path)
    assert result["steps"] == list(range(checkpoint_step(last) + 1, MAX_STEPS + 1)), "did not resume from " + last
    assert result["global_step"] == MAX_STEPS
    assert_same_weights(tmp_path, straight())


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_killed_during_a_save_resumes_from_the_previous_checkpoint(tmp_path, straight, kind):
    # The script kills itself in the save at step 4, once both agents are written and before the optimizer is.
    assert run(tmp_path, "die-in-save", kind) == -signal.SIGKILL, log_tail(tmp_path, "die-in-save")
    run_dir = tmp_path / "run"
    # model.safetensors, or adapter_model.safetensors for the LoRA team
    half_saved = [p for p in run_dir.rglob("*model.safetensors") if "checkpoint-2" not in p.parts]
    assert len(half_saved) == 2, "the process did not die during the second save"
    assert not (run_dir / "checkpoint-4").exists()
    assert get_last_checkpoint(str(run_dir)) == str(run_dir / "checkpoint-2")

    result = resume(tmp_path, kind)
    assert result["steps"] == [3, 4, 5, 6]
    assert result["global_step"] == MAX_STEPS
    assert_same_weights(tmp_path, straight(kind))
    # The unfinished save's files are gone; the checkpoints are the uninterrupted run's.
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]


RLHF_SCRIPT = Path(__file__).parent / "scripts" / "rlhf_kill_resume.py"


def start_rlhf(out_dir: Path, mode: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    with open(out_dir / f"{mode}.log", "w") as log:
        command = [sys.executable, str(RLHF_SCRIPT), str(out_dir), mode]
        return subprocess.Popen(command, stdout=log, stderr=log, env=env)


def run_rlhf(out_dir: Path, mode: str) -> dict:
    process = start_rlhf(out_dir, mode)
    try:
        assert process.wait(timeout=TIMEOUT) == 0, log_tail(out_dir, mode)
    finally:
        process.kill()
    return json.loads((out_dir / "result.json").read_text())


def test_native_rlhf_killed_mid_run_resumes_with_its_reward_model(tmp_path_factory):
    """docs/preference.md's MultiAgentRLHFTrainer recipe, killed with SIGKILL after a checkpoint: the resumed process
    loads the reward model that checkpoint holds (it trains none) and ends where an uninterrupted run ends."""
    straight_dir, killed_dir = tmp_path_factory.mktemp("rlhf-straight"), tmp_path_factory.mktemp("rlhf-killed")
    straight = run_rlhf(straight_dir, "straight")
    assert straight["reward_model_steps"] > 0 and straight["steps"] == list(range(1, MAX_STEPS + 1))

    kill_after_first_checkpoint(start_rlhf(killed_dir, "slow"), killed_dir)

    last = get_last_checkpoint(str(killed_dir / "run"))
    saved = JointRewardModel.from_pretrained(os.path.join(last, "reward_model")).state_dict()
    result = run_rlhf(killed_dir, "resume")
    assert result["steps"] == list(range(checkpoint_step(last) + 1, MAX_STEPS + 1)), "did not resume from " + last
    assert result["reward_model_steps"] == 0  # restored from the checkpoint, not trained again
    reward_model = torch.load(killed_dir / "reward_model.pt")
    for name, value in saved.items():
        torch.testing.assert_close(reward_model[name], value, msg=name)
    for name, value in torch.load(straight_dir / "reward_model.pt").items():
        torch.testing.assert_close(reward_model[name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert_same_weights(killed_dir, torch.load(straight_dir / "weights.pt"))
