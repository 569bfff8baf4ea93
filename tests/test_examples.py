"""The example scripts on TRL's parser: YAML configs, flag overrides, and short training runs (tiny budgets).

Parsing is tested in-process (the scripts are loaded as modules, so `parse_args` and `main` are called directly);
one subprocess per script runs the command line as a user types it.
"""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
CONFIGS = EXAMPLES / "configs"
FAST = ["--max_steps", "1", "--num_generations", "4", "--max_completion_length", "8", "--logging_steps", "1"]


def load_script(name: str):
    """An example script as a module (its file name has dashes, so it cannot be imported by name)."""
    spec = importlib.util.spec_from_file_location(name.replace("-", "_"), EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def story():
    return load_script("story-len-ratio")


@pytest.fixture(scope="module")
def checker():
    return load_script("two-turn-checker")


# ------------------------------------------------------------------------------------------- parsing, no training


def test_model_tiny_reads_tiny_yaml(story):
    script_args, config, model_args = story.parse_args(["--model", "tiny"])
    assert model_args.model_name_or_path == "tiny" and not model_args.use_peft
    # tiny.yaml's values, not MAGRPOConfig's defaults (5e-6, 256 tokens, 20 epochs, 50 logging steps).
    assert (config.learning_rate, config.max_completion_length, config.num_train_epochs) == (3e-3, 32, 40)
    assert (config.logging_steps, config.num_generations, config.seed) == (5, 8, 2)
    assert config.per_device_train_batch_size == 16  # rollout_buffer_size (2 prompts) x num_generations
    assert config.save_strategy == "no" and config.report_to == []


def test_explicit_config_and_the_default_one_agree(story):
    _, by_model, _ = story.parse_args(["--model", "tiny"])
    _, by_file, model_args = story.parse_args(["--config", str(CONFIGS / "tiny.yaml")])
    assert model_args.model_name_or_path == "tiny"
    assert by_file.to_dict() == by_model.to_dict()


def test_a_flag_wins_over_the_yaml_value(story):
    config_file = ["--config", str(CONFIGS / "tiny.yaml")]
    _, config, _ = story.parse_args([*config_file, "--learning_rate", "1e-3", "--max-completion-length", "7"])
    assert (config.learning_rate, config.max_completion_length) == (1e-3, 7)  # tiny.yaml says 3e-3 and 32
    assert config.num_train_epochs == 40  # the rest still from tiny.yaml


def test_every_config_field_is_a_flag(story):
    _, config, _ = story.parse_args(
        ["--model", "tiny", "--beta", "0.04", "--gradient_accumulation_steps", "2", "--loss_type", "grpo"]
    )
    assert (config.beta, config.gradient_accumulation_steps, config.loss_type) == (0.04, 2, "grpo")
    # CoMLRL's names work too (MAGRPOConfig maps them onto the GRPO fields).
    _, config, _ = story.parse_args(["--model", "tiny", "--agent_learning_rate", "1e-2", "--rollout_buffer_size", "1"])
    assert (config.learning_rate, config.per_device_train_batch_size) == (1e-2, 8)


def test_lora_shorthand_reads_the_lora_yaml(story):
    _, config, model_args = story.parse_args(["--model", "tiny", "--lora"])
    assert model_args.use_peft and config.learning_rate == 2e-2  # tiny-lora.yaml
    assert (model_args.lora_r, model_args.lora_dropout, len(model_args.lora_target_modules)) == (16, 0.0, 7)
    _, _, model_args = story.parse_args(["--model", "tiny", "--use_peft", "--lora_r", "8"])
    assert model_args.use_peft and model_args.lora_r == 8 and model_args.lora_alpha == 32


def test_no_model_means_the_pretrained_tutorial_settings(story):
    _, config, model_args = story.parse_args([])
    assert model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B"
    assert (config.learning_rate, config.max_completion_length, config.num_train_epochs) == (5e-5, 128, 3)


@pytest.mark.parametrize(
    "argv, message",
    [
        # MAGRPOConfig sets these from their CoMLRL twins; a value given for them must not vanish silently.
        (["--per_device_train_batch_size", "4"], "rollout_buffer_size"),
        (["--agent_learning_rate", "1e-2", "--learning_rate", "1e-3"], "agent_learning_rate"),
        (["--scale_rewards", "batch"], "advantage_normalization"),
        (["--reference_kl_enabled", "--beta", "0.5"], "reference_kl_coef"),
        (["--model_name_or_path", "other"], "disagree"),
    ],
    ids=["batch-size", "learning-rate", "scale-rewards", "beta", "two-models"],
)
def test_a_setting_that_would_be_ignored_is_an_error(story, argv, message):
    with pytest.raises(ValueError, match=message):
        story.parse_args(["--model", "tiny", *argv])


def test_unknown_yaml_key_is_an_error(story, tmp_path):
    config_file = tmp_path / "run.yaml"
    config_file.write_text((CONFIGS / "tiny.yaml").read_text() + "learning_rat: 0.1\n")
    with pytest.raises(ValueError, match="learning_rat"):
        story.parse_args(["--config", str(config_file)])


def test_help_lists_the_flags(story, capsys):
    with pytest.raises(SystemExit) as exit_info:
        story.parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--lora", "--wandb", "--wandb-project", "--wandb-entity", "--output-dir", "--beta"):
        assert flag in out, flag
    for flag in ("--learning-rate", "--gradient_accumulation_steps", "--agent_learning_rate", "--use_peft"):
        assert flag in out, flag


def test_two_turn_checker_reads_its_yaml(checker):
    _, args, model_args = checker.parse_args(["--model", "tiny", "--discount", "0.9", "--num_turns", "3"])
    assert model_args.model_name_or_path == "tiny"
    assert (args.num_agents, args.num_turns, args.discount, args.early_termination_threshold) == (2, 3, 0.9, -1e-6)
    assert (args.learning_rate, args.max_completion_length, args.per_device_train_batch_size) == (3e-3, 24, 8)
    assert args.eval_do_sample is False and args.num_generations_eval == 1
    with pytest.raises(ValueError, match="num_agents"):
        checker.parse_args(["--model", "tiny", "--num_agents", "3"])


# ------------------------------------------------------------------------------------------ short training runs


def test_beta_and_gradient_accumulation_reach_the_trainer(story, tmp_path, monkeypatch):
    scored = []

    def counting_reward(completions1, completions2, target_min=2.0, target_max=3.0):
        scored.append(len(completions1))
        return story_reward(completions1, completions2, target_min, target_max)

    story_reward = story.proper_length_ratio_reward
    monkeypatch.setattr(story, "proper_length_ratio_reward", counting_reward)
    argv = ["--model", "tiny", *FAST, "--beta", "0.04", "--gradient_accumulation_steps", "2"]
    trainer = story.main(*story.parse_args([*argv, "--output_dir", str(tmp_path)]))
    assert trainer.args.beta == 0.04 and trainer.args.gradient_accumulation_steps == 2
    assert trainer.state.global_step == 1
    logged = trainer.state.log_history[0]
    assert "agent_0/kl" in logged and "agent_1/kl" in logged  # TRL computes the KL term only when beta != 0
    # One optimizer step over two micro-batches of 2 prompts x 4 generations: 16 joint samples scored, not 8.
    assert sum(scored) == 16


def test_peft_flags_from_model_config_give_a_lora_team(story, tmp_path):
    argv = ["--model", "tiny", *FAST, "--use_peft", "--lora_r", "8", "--output_dir", str(tmp_path)]
    trainer = story.main(*story.parse_args(argv))
    targets = yaml.safe_load((CONFIGS / "tiny-lora.yaml").read_text())["lora_target_modules"]
    assert trainer.args.learning_rate == 2e-2  # tiny-lora.yaml, picked by --use_peft
    trainable = {name for name, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)  # the base is frozen
    for i in range(2):
        adapter = json.loads((tmp_path / "models" / f"agent_{i}" / "adapter_config.json").read_text())
        assert (adapter["r"], adapter["lora_alpha"]) == (8, 32)
        assert sorted(adapter["target_modules"]) == sorted(targets)


def test_quickstart_command_runs_offline(tmp_path):
    """The README's command, as a user runs it, with a one-step budget."""
    out = tmp_path / "story"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "story-len-ratio.py"), "--model", "tiny", *FAST, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(out / "models" / f"agent_{i}").config.model_type == "qwen2"


def test_two_turn_checker_example_runs_offline(tmp_path):
    out = tmp_path / "checker"
    script = str(EXAMPLES / "two-turn-checker.py")
    batch = ["--per_device_train_batch_size", "8"]  # two tasks x 4 samples
    result = subprocess.run(
        [sys.executable, script, "--model", "tiny", *FAST, *batch, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'eval_turn_1/reward'" in result.stdout  # the greedy evaluation printed both turns' rewards
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(out / "models" / f"agent_{i}").config.model_type == "qwen2"
