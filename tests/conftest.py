import os

import pytest

# No network in tests: nothing may reach the Hub, and wandb only writes locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402

from multiagent_trl.testing import tiny_model_path  # noqa: E402

PROMPTS = [
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Tell a joke about dinosaurs:",
]


@pytest.fixture(scope="session")
def tiny_path() -> str:
    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_llama_path() -> str:
    return tiny_model_path("tiny-llama")


@pytest.fixture
def prompts_dataset() -> Dataset:
    return Dataset.from_dict({"prompt": PROMPTS * 2, "target": [3, 5, 7, 9] * 2})


def small_args(tmp_path, **overrides):
    """A fast configuration for tests: short completions, few steps, no logging integrations."""
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
    return MultiAgentGRPOConfig(**settings)
