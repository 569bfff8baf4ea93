import inspect
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

# No network in tests: nothing may reach the Hub, and wandb only writes locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402

from multiagent_trl.testing import tiny_model_path  # noqa: E402

PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Tell a joke about dinosaurs:",
]
G = 4  # num_generations in `small_args`


# ---- weights before and after training


def snapshot(module):
    """A copy of every parameter of `module`, by name."""
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def changed(before, module):
    """The names of `module`'s parameters that differ from `snapshot`'s `before`."""
    return {name for name, p in module.named_parameters() if not torch.equal(before[name], p)}


# ---- joint reward functions shared by the tests


def length_ratio(completions1, completions2):
    """CoMLRL style: agent 1's completion length over agent 0's (plus one)."""
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def id_reward(prompts, completions, completion_ids, **kwargs):
    """TRL style, deterministic in the token ids, so a test can recompute it from the trainer's output."""
    return [float(sum(a) % 13) - 0.5 * float(sum(b) % 7) for a, b in completion_ids]


def recording(tool, log: list):
    """`tool`, appending the keyword arguments of every call to `log`; TRL reads the same name, docs and signature."""

    def wrapper(**kwargs):
        log.append(kwargs)
        return tool(**kwargs)

    wrapper.__name__, wrapper.__doc__, wrapper.__annotations__ = tool.__name__, tool.__doc__, tool.__annotations__
    wrapper.__signature__ = inspect.signature(tool)
    return wrapper


# ---- generation batches and advantages by hand


def generation_batch(dataset, rows: int = 2):
    """What TRL's RepeatSampler hands over: each of the first `rows` rows repeated G times."""
    return [dataset[i] for i in range(rows) for _ in range(G)]


def completion_ids_of(output, agent):
    """Agent `agent`'s completion token ids (without padding) from `_generate_and_score_completions`' output."""
    ids, mask = output[f"agent_{agent}/completion_ids"], output[f"agent_{agent}/completion_mask"]
    return [row[m.bool()].tolist() for row, m in zip(ids, mask)]


def normalize(rewards):
    """TRL's group normalization: (r - mean) / (std + 1e-4), unbiased std, per group of G."""
    grouped = torch.tensor(rewards).view(-1, G)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_llama_path() -> str:
    return tiny_model_path("tiny-llama")


@pytest.fixture
def prompts_dataset() -> Dataset:
    return Dataset.from_dict({"prompt": PROMPTS * 2, "target": [3, 5, 7, 9] * 2})


def lora_config(**overrides):
    """A small LoRA config. init_lora_weights=False: random adapters, so that the agents differ from the base and
    from each other at once."""
    from peft import LoraConfig

    settings = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"], init_lora_weights=False)
    return LoraConfig(**{**settings, **overrides})


def small_args(tmp_path, config_class=None, **overrides):
    """A fast configuration for tests (a `config_class`, by default `MultiAgentGRPOConfig`): short completions, few
    steps, no logging integrations."""
    from multiagent_trl import MultiAgentGRPOConfig

    settings = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    settings.update(overrides)
    return (config_class or MultiAgentGRPOConfig)(**settings)


@pytest.fixture(scope="module")
def vllm_available():
    """Skip where vLLM is not installed; fail instead with `MULTIAGENT_TRL_REQUIRE_VLLM=1` (CI)."""
    import importlib.util

    from multiagent_trl.vllm.engine import INSTALL_HINT

    if importlib.util.find_spec("vllm") is not None:
        return
    if os.environ.get("MULTIAGENT_TRL_REQUIRE_VLLM") == "1":
        pytest.fail(f"MULTIAGENT_TRL_REQUIRE_VLLM=1, but vLLM is not installed. {INSTALL_HINT}")
    pytest.skip(f"vLLM is not installed. {INSTALL_HINT}")


def free_port() -> int:
    """A TCP port free now: each two-process test launches its rendezvous on its own, so that runs side by side (two
    pytest sessions on one machine) do not collide on Accelerate's default port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two_processes(script, *args: str) -> None:
    """`accelerate launch --multi_gpu --num_processes 2` of `script` (gloo on a CPU-only machine); fails the test with
    the end of the ranks' stderr if the launch does not exit 0. ACCELERATE_USE_CPU makes transformers treat the two
    processes as one distributed run. Each script ends with `multiagent_trl.testing.end_launched_process()`."""
    tiny_model_path()  # built once, before two processes race to build it
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "accelerate.commands.launch", "--main_process_port", str(free_port()),
               "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               str(script), *map(str, args)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def trained_ranks(script, out_dir, *args: str) -> list[dict]:
    """`launch_two_processes(script, out_dir, *args)`, whose script writes `out_dir/rank{r}.json` with `world`, and
    `initial` and `fingerprint` (each agent's weight sums before and after training): the two ranks' results, checked
    to be of one 2-process run whose ranks end with the same agents, which training moved."""
    launch_two_processes(script, out_dir, *args)
    ranks = [json.loads((Path(out_dir) / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    assert ranks[0]["fingerprint"] == ranks[1]["fingerprint"], "the ranks' agents diverged"
    for i, (initial, trained) in enumerate(zip(ranks[0]["initial"], ranks[0]["fingerprint"], strict=True)):
        # They agree by training in step, not by not training.
        assert all(a != b for a, b in zip(initial, trained, strict=True)), f"agent {i} did not train"
    return ranks
