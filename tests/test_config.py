"""Configuration: GRPO fields carry over, CoMLRL names map onto GRPO fields, CPU needs no bf16 switch."""

import re

import pytest
import torch

from multiagent_trl import MAGRPOConfig, MultiAgentGRPOConfig


def test_grpo_fields_keep_working(tmp_path):
    config = MultiAgentGRPOConfig(
        output_dir=str(tmp_path), loss_type="grpo", beta=0.02, epsilon=0.3, num_iterations=2, max_completion_length=64
    )
    assert (config.loss_type, config.beta, config.epsilon, config.num_iterations) == ("grpo", 0.02, 0.3, 2)
    assert config.joint_mode == "aligned" and config.num_agents is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU default")
def test_bf16_is_off_by_default_without_a_gpu(tmp_path):
    assert MultiAgentGRPOConfig(output_dir=str(tmp_path)).bf16 is False


def test_magrpo_maps_comlrl_fields(tmp_path):
    config = MAGRPOConfig(
        output_dir=str(tmp_path),
        num_train_epochs=3,
        agent_learning_rate=5e-5,
        logging_steps=10,
        num_generations=8,
        num_turns=1,
        max_new_tokens=128,
        advantage_normalization=False,
        rollout_buffer_size=3,
        reference_kl_enabled=True,
        reference_kl_coef=0.05,
        eval_interval=4,
        joint_mode="cross",
    )
    assert config.learning_rate == 5e-5
    assert config.max_completion_length == 128
    assert config.scale_rewards == "none"
    assert config.per_device_train_batch_size == 3 * 8  # prompts per step times generations
    assert config.beta == 0.05
    assert (config.eval_strategy, config.eval_steps) == ("steps", 4)
    assert config.joint_mode == "cross"


def test_magrpo_defaults_follow_comlrl(tmp_path):
    config = MAGRPOConfig()
    assert config.output_dir == "magrpo_output"
    assert (config.num_agents, config.num_generations, config.temperature, config.top_p, config.top_k) == (
        2,
        4,
        0.6,
        0.6,
        50,
    )
    assert config.learning_rate == 5e-6 and config.beta == 0.0 and config.scale_rewards == "group"


ON_CPU = pytest.mark.skipif(torch.cuda.is_available(), reason="'auto' is the CPU on a machine without CUDA")


@pytest.mark.parametrize(
    "given, expected",
    [
        ("cpu", ["cpu", "cpu"]),
        (["cpu"], ["cpu", "cpu"]),
        (["cpu", "cpu"], ["cpu", "cpu"]),
        pytest.param("auto", ["cpu", "cpu"], marks=ON_CPU),
        pytest.param(["AUTO"], ["cpu", "cpu"], marks=ON_CPU),
    ],
)
def test_agent_devices_take_one_device_a_list_of_one_or_auto(tmp_path, given, expected):
    """`agent_devices` and `reference_devices` accept one device for all, a list of one or one per agent, or "auto";
    the config holds one device per agent."""
    config = MultiAgentGRPOConfig(output_dir=str(tmp_path), num_agents=2, agent_devices=given, reference_devices=given)
    assert config.agent_devices == expected and config.reference_devices == expected


def test_agent_devices_wait_for_the_number_of_agents(tmp_path, tiny_path, prompts_dataset):
    """Without `num_agents` the config keeps the specification; the trainer gives each of its agents a device."""
    from multiagent_trl import MultiAgentGRPOTrainer

    args = MultiAgentGRPOConfig(
        output_dir=str(tmp_path), agent_devices="cpu", per_device_train_batch_size=2, num_generations=2, max_steps=1
    )
    assert args.agent_devices == "cpu"
    trainer = MultiAgentGRPOTrainer(
        model=[tiny_path] * 3, reward_funcs=lambda a, b, c: [0.0] * len(a), args=args, train_dataset=prompts_dataset
    )
    assert trainer.model.hf_device_map == {"agents.0": "cpu", "agents.1": "cpu", "agents.2": "cpu"}


@pytest.mark.parametrize(
    "given, message",
    [
        (["cpu", "cpu", "cpu"], "`agent_devices` has 3 devices for 2 agents: give one device, 'auto', or a list of 1"),
        ([], "`agent_devices` is an empty list"),
        (["auto", "cpu"], "`agent_devices` entry 'auto' is not a device name"),
    ],
)
def test_agent_devices_bad_forms_raise(tmp_path, given, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MultiAgentGRPOConfig(output_dir=str(tmp_path), num_agents=2, agent_devices=given)
