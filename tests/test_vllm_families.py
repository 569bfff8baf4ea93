"""The families beside MAGRPO on the team core's vLLM engines (`use_vllm=True`, colocate mode, vLLM's CPU build).

A file of its own, run in its own process (`.ci/run`): each trainer here starts two engines, and a test process keeps
most of the memory of every engine it started (`tests/test_vllm.py`'s process reached 19.7 GB with these in it, and
was killed for memory on the 24 GB CI machine). Skips without vLLM; fails instead with `MULTIAGENT_TRL_REQUIRE_VLLM=1`.
"""

import os

os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

import pytest  # noqa: E402
from datasets import Dataset  # noqa: E402

from multiagent_trl import (  # noqa: E402
    ActorCriticConfig,
    ActorCriticTrainer,
    MultiAgentDPOConfig,
    MultiAgentDPOTrainer,
)
from multiagent_trl.testing import tiny_model_path  # noqa: E402

# The engines' environment and their release after each test, as in `tests/test_vllm.py` (autouse there and here).
from .test_vllm import (  # noqa: E402, F401
    PROMPTS,
    bare_vllm_environment,
    check_greedy,
    engine_changed,
    length_ratio,
    release_engines,
    vllm_args,
)

FAMILIES = {  # config class, trainer class, settings: each family's own generation batch on the team core
    "actor_critic": (ActorCriticConfig, ActorCriticTrainer, dict(num_generations=1, per_device_train_batch_size=4)),
    "dpo": (MultiAgentDPOConfig, MultiAgentDPOTrainer, {}),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_generates_on_synced_engines(vllm_available, tmp_path, family):
    """The actor-critic and DPO trainers generate with the core's vLLM engines too: per agent, the engines' greedy
    tokens equal transformers' before and after 2 optimizer steps; the trainer synced the engines before step 2's
    generation, and the steps reached them (their tokens or log-probs moved)."""
    config_class, trainer_class, settings = FAMILIES[family]
    trainer = trainer_class(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=vllm_args(tmp_path, config_class, **settings),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
    )
    before = check_greedy(trainer, with_logprobs=True)
    engines, synced_at = trainer._vllm, []
    sync = engines.sync

    def recorded_sync():
        synced_at.append(trainer.state.global_step)
        return sync()

    engines.sync = recorded_sync
    trainer.train()
    assert trainer.state.global_step == 2
    assert synced_at == [1]  # a generation batch per step: the second one's engines hold the first step's update
    after = check_greedy(trainer, with_logprobs=True)
    for i in range(2):
        assert engine_changed(before, after, i), f"agent {i}: the engine generates as before training: not synced"
