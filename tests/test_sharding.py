"""Sharded engines: FSDP2 runs a team across 2 gloo processes on CPU; a requested engine never silently falls back."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.testing import tiny_model_path

from .conftest import free_port, small_args

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_team.py"
FSDP_CONFIG = Path(__file__).parents[1] / "examples" / "accelerate_configs" / "fsdp.yaml"
# FSDP2 reduce-scatters (then divides) where DDP all-reduces, and adds the tied embedding's two gradients in another
# order: the weights agree to float32 rounding after 3 steps of lr 1e-2.
ATOL = 1e-5


def launch(out_dir: Path, mode: str, use_cpu: bool) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    env.pop("ACCELERATE_USE_CPU", None)
    if use_cpu:
        env["ACCELERATE_USE_CPU"] = "true"
    command = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port()),
               "--config_file", str(FSDP_CONFIG),
               "--num_processes", "2", "--mixed_precision", "no", "--dynamo_backend", "no",
               str(SCRIPT), str(out_dir), mode]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_path):
    """One launch under the FSDP config: FSDP2 runs (full and LoRA teams, and a resumed run), then the same as DDP."""
    out = tmp_path_factory.mktemp("fsdp")
    result = launch(out, "train", use_cpu=True)
    assert result.returncode == 0, result.stderr[-4000:]
    return out


def report(runs: Path, engine: str, kind: str) -> list[dict]:
    return [json.loads((runs / f"{engine}-{kind}-rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_fsdp_shards_each_agent_across_the_ranks(runs, kind):
    fsdp, ddp = report(runs, "fsdp", kind), report(runs, "ddp", kind)
    assert [r["engine"] for r in fsdp] == ["FSDP", "FSDP"] and [r["world"] for r in fsdp] == [2, 2]
    assert [r["engine"] for r in ddp] == ["MULTI_CPU", "MULTI_CPU"]
    for rank in fsdp:
        for local, full in zip(rank["local_bytes"], rank["full_bytes"], strict=True):
            assert abs(local / full - 0.5) < 0.02, f"a rank holds {local} of {full} bytes"
        # each agent (a LoRA team: its one base) is its own units: 2 decoder layers, its tail, itself
        assert all(units >= 4 for units in rank["units"])
    for rank in ddp:  # DDP keeps the whole team on each rank
        assert rank["local_bytes"] == rank["full_bytes"] and rank["units"] == [0] * len(rank["units"])
    assert fsdp[0]["full_bytes"] == ddp[0]["full_bytes"]


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_fsdp_trains_like_ddp(runs, kind, tiny_path):
    fsdp, ddp = report(runs, "fsdp", kind), report(runs, "ddp", kind)
    assert fsdp[0]["fingerprint"] == fsdp[1]["fingerprint"], "the ranks' gathered weights differ"
    assert ddp[0]["fingerprint"] == ddp[1]["fingerprint"]
    sharded = torch.load(runs / f"fsdp-{kind}-weights.pt")
    replicated = torch.load(runs / f"ddp-{kind}-weights.pt")
    assert sharded.keys() == replicated.keys()
    for name in sharded:
        torch.testing.assert_close(sharded[name], replicated[name], rtol=0, atol=ATOL, msg=name)
    # and training moved every agent's weights (the comparison is not between two untouched models)
    initial = load_file(Path(tiny_path) / "model.safetensors")
    if kind == "lora":  # every adapter's B starts at zero
        trained = {k: torch.zeros_like(v) for k, v in sharded.items() if "lora_B" in k}
    else:
        trained = {k: initial[k.split(".", 2)[2]] for k in sharded if k.split(".", 2)[2] in initial}
    assert len(trained) >= 8
    for name, reference in trained.items():
        assert (sharded[name] - reference).abs().max() > 1e-4, f"{name} did not change"


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_fsdp_save_model_writes_full_loadable_agents(runs, kind, tiny_path):
    weights = torch.load(runs / f"fsdp-{kind}-weights.pt")
    for i in range(2):
        folder = runs / f"fsdp-{kind}-final" / f"agent_{i}"
        if kind == "full":
            model = AutoModelForCausalLM.from_pretrained(folder)
            prefix = f"agents.{i}."
        else:
            model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), folder)
            prefix = "peft_model."
        loaded = model.state_dict()
        for name, value in weights.items():
            if not name.startswith(prefix) or (kind == "lora" and f".agent_{i}." not in name):
                continue
            key = name[len(prefix) :].replace(f".agent_{i}.", ".default.")
            torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)


def test_fsdp_resume_reaches_the_uninterrupted_weights(runs):
    uninterrupted = torch.load(runs / "fsdp-full-weights.pt")
    resumed = torch.load(runs / "fsdp-full-resumed-weights.pt")
    for name in uninterrupted:
        torch.testing.assert_close(resumed[name], uninterrupted[name], rtol=0, atol=0, msg=name)


def test_launch_that_is_not_one_run_raises(tmp_path, tiny_path):
    # The finding: on a CPU-only machine, the FSDP config without ACCELERATE_USE_CPU starts 2 processes that
    # each count 1 process (no accelerator: no backend). Now the trainer refuses before loading any model.
    result = launch(tmp_path, "construct", use_cpu=False)
    assert result.returncode != 0
    message = "2 processes were launched (WORLD_SIZE=2), but Accelerate set up 1"
    assert message in result.stderr and "ACCELERATE_USE_CPU=true" in result.stderr


def test_fsdp_refuses_a_comparator_that_swaps_whole_weights(tmp_path, tiny_path):
    result = launch(tmp_path, "comparator", use_cpu=True)
    assert result.returncode != 0
    assert "`comparator='history'` swaps whole weights into the agents" in result.stderr


def test_fsdp_asked_for_but_not_set_up_raises(tmp_path, tiny_path, prompts_dataset, monkeypatch):
    # One process on CPU: Accelerate drops the FSDP plugin (it attaches it only for accelerator device types). (Asking
    # for DeepSpeed without it installed already fails in TrainingArguments, before the trainer.)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    args = small_args(tmp_path, num_agents=2, use_cpu=True)
    with pytest.raises(RuntimeError, match=re.escape("FSDP was asked for (ACCELERATE_USE_FSDP or `fsdp=`), but")):
        MultiAgentGRPOTrainer(
            model=tiny_model_path(), reward_funcs=lambda c1, c2: [0.0] * len(c1), args=args,
            train_dataset=prompts_dataset,
        )  # fmt: skip
