"""The example scripts run from the command line (tiny budgets)."""

import subprocess
import sys
from pathlib import Path

from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]


def test_story_len_ratio_example_runs_offline(tmp_path):
    out = tmp_path / "story"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "story-len-ratio.py"),
            "--model",
            "tiny",
            "--max-steps",
            "2",
            "--output-dir",
            str(out),
            "--logging-steps",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(out / "models" / f"agent_{i}").config.model_type == "qwen2"


def test_story_len_ratio_help_lists_the_flags():
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "story-len-ratio.py"), "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0
    for flag in ("--model", "--wandb", "--wandb-project", "--wandb-entity", "--output-dir", "--learning-rate"):
        assert flag in result.stdout, flag
