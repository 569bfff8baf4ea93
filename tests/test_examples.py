"""The example scripts run from the command line (tiny budgets)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("extra", [[], ["--lora", "--lora-r", "4"]], ids=["full", "lora"])
def test_story_len_ratio_example_runs_offline(tmp_path, extra):
    out = tmp_path / "story"
    script = str(ROOT / "examples" / "story-len-ratio.py")
    result = subprocess.run(
        [sys.executable, script, "--model", "tiny", "--max-steps", "2", "--output-dir", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for i in range(2):
        agent_dir = out / "models" / f"agent_{i}"
        if extra:  # an adapter folder for PeftModel.from_pretrained
            assert json.loads((agent_dir / "adapter_config.json").read_text())["r"] == 4
        else:
            assert AutoModelForCausalLM.from_pretrained(agent_dir).config.model_type == "qwen2"


def test_story_len_ratio_help_lists_the_flags():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "story-len-ratio.py"), "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for flag in ("--model", "--wandb", "--wandb-project", "--wandb-entity", "--output-dir", "--learning-rate"):
        assert flag in result.stdout, flag


def test_two_turn_checker_example_runs_offline(tmp_path):
    out = tmp_path / "checker"
    script = str(ROOT / "examples" / "two-turn-checker.py")
    result = subprocess.run(
        [sys.executable, script, "--model", "tiny", "--max-steps", "2", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'eval_turn_1/reward'" in result.stdout  # the greedy evaluation printed both turns' rewards
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(out / "models" / f"agent_{i}").config.model_type == "qwen2"
