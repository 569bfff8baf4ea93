"""`multiagent-trl grpo|magrpo`: the flags parse as `trl grpo`'s do (plus the team's), and a run end to end, offline,
on a local data folder with a reward by dotted import path, saves `agent_i/` folders that load."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from multiagent_trl import MAGRPOConfig, MultiAgentGRPOConfig
from multiagent_trl.cli import (
    COMMANDS,
    TeamArguments,
    command_classes,
    import_object,
    load_datasets,
    parse_args,
    per_agent_reward,
    reward_functions,
)

ROOT = Path(__file__).resolve().parents[1]

# The user's code, imported by dotted path from the working directory (as `trl grpo` imports it).
USER_MODULE = '''
def ratio(completions1, completions2):
    """CoMLRL style: the second answer's length over the first's."""
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def plan(row):
    return "Plan: " + row["prompt"]


def write(row):
    return "Write: " + row["prompt"]


def feedback(row, histories, turn):
    return [row["prompt"] + " Again.", row["prompt"] + " Longer."]
'''


@pytest.fixture
def workdir(tmp_path):
    """A working directory with `team_code.py` and a local data folder, `data/train.jsonl`."""
    (tmp_path / "team_code.py").write_text(USER_MODULE)
    (tmp_path / "data").mkdir()
    prompts = ["Describe a city:", "Invent a holiday:", "Tell a joke:", "Name a fruit:"]
    Dataset.from_dict({"prompt": prompts}).to_json(str(tmp_path / "data" / "train.jsonl"))
    return tmp_path


# ------------------------------------------------------------------------------------------------ parsing


def test_yaml_config_and_flags(tmp_path):
    config = tmp_path / "team.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            agent_models: [org/a, org/b]
            dataset_name: data
            reward_funcs: [think_format_reward, team_code.ratio]
            joint_mode: cross
            temperature: [0.5, 0.9]
            learning_rate: 1.0e-4
            output_dir: out
            report_to: none
            """
        )
    )
    argv = ["grpo", "--config", str(config), "--learning_rate", "2e-4", "--max_completion_length", "16", "32"]
    command, script_args, args, model_args, _ = parse_args(argv)
    assert command == "grpo" and type(args) is MultiAgentGRPOConfig and isinstance(script_args, TeamArguments)
    assert script_args.agent_models == ["org/a", "org/b"] and script_args.dataset_name == "data"
    assert script_args.reward_funcs == ["think_format_reward", "team_code.ratio"]
    assert args.joint_mode == "cross" and args.temperature == [0.5, 0.9] and args.max_completion_length == [16, 32]
    assert args.learning_rate == 2e-4  # the flag wins over the YAML file
    assert model_args.model_name_or_path is None and not model_args.use_peft


def test_team_flags_and_lora():
    argv = ["grpo", "--model_name_or_path", "org/m", "--num_agents", "3", "--num_turns", "2", "--use_peft",
            "--lora_r", "4", "--external_transition", "team_code.feedback", "--formatters", "team_code.plan",
            "--output_dir", "out", "--report_to", "none"]  # fmt: skip
    _, script_args, args, model_args, _ = parse_args(argv)
    assert args.num_agents == 3 and args.num_turns == 2
    assert model_args.use_peft and model_args.lora_r == 4 and model_args.model_name_or_path == "org/m"
    assert script_args.external_transition == "team_code.feedback" and script_args.formatters == ["team_code.plan"]


def test_magrpo_takes_comlrl_names():
    argv = ["magrpo", "--model_name_or_path", "org/m", "--agent_learning_rate", "3e-4", "--max_new_tokens", "24",
            "--output_dir", "out", "--report_to", "none"]  # fmt: skip
    _, _, args, _, _ = parse_args(argv)
    assert type(args) is MAGRPOConfig
    assert args.learning_rate == 3e-4 and args.max_completion_length == 24 and args.num_agents == 2


def test_magrpo_refuses_a_grpo_name_its_twin_replaces(tmp_path):
    argv = ["magrpo", "--model_name_or_path", "org/m", "--learning_rate", "1e-3", "--output_dir", "o"]
    with pytest.raises(ValueError, match="--learning_rate 0.001 was replaced.*--agent_learning_rate instead"):
        parse_args(argv)
    # With the twin unset (in the YAML file), the GRPO name holds, as examples/configs/tiny.yaml does it.
    config = tmp_path / "c.yaml"
    config.write_text("agent_learning_rate: null\nmax_new_tokens: null\nmax_completion_length: 16\n")
    _, _, args, _, _ = parse_args([*argv, "--config", str(config)])
    assert args.learning_rate == 1e-3 and args.max_completion_length == 16
    with pytest.raises(ValueError, match="--max_completion_length 16 was replaced by 8.*--max_new_tokens"):
        parse_args([*argv, "--config", str(config), "--max_new_tokens", "8", "--max_completion_length", "16"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["grpo", "--output_dir", "out"], "--model_name_or_path"),
        (["grpo", "--model_name_or_path", "m", "--agent_models", "a", "b", "--output_dir", "o"], "not both"),
    ],
)
def test_agents_must_be_given_once(argv, message):
    with pytest.raises(ValueError, match=message):
        parse_args(argv)


def test_unknown_command_says_usage():
    with pytest.raises(SystemExit, match="grpo,dpo,rlhf,iterative-dpo,iterative-rlhf,actor-critic,actor-critic-rlhf,"):
        parse_args(["sft"])


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "magrpo"])
def test_each_family_parses_its_own_config(command):
    argv = [command, "--model_name_or_path", "org/m", "--num_agents", "2", "--learning_rate", "3e-4",
            "--output_dir", "out", "--report_to", "none"]  # fmt: skip
    _, _, args, _, _ = parse_args(argv)
    assert type(args) is command_classes(command)[0] and args.learning_rate == 3e-4 and args.num_agents == 2


def test_critic_model_is_for_the_actor_critic_commands():
    argv = ["--model_name_or_path", "org/m", "--critic_model", "org/c", "--output_dir", "o", "--report_to", "none"]
    assert parse_args(["actor-critic", *argv])[1].critic_model == "org/c"
    with pytest.raises(ValueError, match="--critic_model is for the actor-critic commands; `rlhf` trains no critic"):
        parse_args(["rlhf", *argv])


def test_bad_reward_names_name_the_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "team_code.py").write_text(USER_MODULE)
    with pytest.raises(ValueError, match=r"--reward_funcs 'accuracy'.*think_format_reward.*dotted import path"):
        reward_functions(TeamArguments(reward_funcs=["accuracy"]), num_agents=2)
    with pytest.raises(ValueError, match=r"--reward_funcs 'team_code.missing'.*no attribute 'missing'"):
        reward_functions(TeamArguments(reward_funcs=["team_code.missing"]), num_agents=2)
    with pytest.raises(ValueError, match=r"--reward_funcs 'nowhere.f'.*cannot import module 'nowhere'"):
        reward_functions(TeamArguments(reward_funcs=["nowhere.f"]), num_agents=2)
    with pytest.raises(ValueError, match="--formatters 'plan'.*dotted import path"):
        import_object("plan", "--formatters")
    funcs = reward_functions(TeamArguments(reward_funcs=["team_code.ratio", "think_format_reward"]), num_agents=2)
    assert funcs[0].__name__ == "ratio" and funcs[1].__name__ == "think_format_reward"


def test_trl_reward_scores_each_agent_alone():
    """A TRL built-in (one completion per sample) gives each agent its own reward in a team."""

    def starts_with_yes(completions, **kwargs):
        return [float(c.startswith("yes")) for c in completions]

    team = per_agent_reward(starts_with_yes, num_agents=2)
    rows = team(prompts=[("p", "q"), ("p", "q")], completions=[("yes", "no"), ("no", "yes!")])
    assert rows == [[1.0, 0.0], [0.0, 1.0]]
    assert per_agent_reward(starts_with_yes, num_agents=1) is starts_with_yes

    def judged_if_short(completions, **kwargs):  # None: "does not apply", as TRL's accuracy_reward may return
        return [float(c == "yes") if len(c) < 4 else None for c in completions]

    team = per_agent_reward(judged_if_short, num_agents=2)
    rows = team(prompts=[("p", "q")] * 3, completions=[("yes", "no"), ("yes", "longer"), ("longer", "longer")])
    assert rows == [0.5, 1.0, None]


# ------------------------------------------------------------------------------------------------ end to end


@pytest.mark.parametrize(
    "command, team_flags",
    [
        # TRL's names: one model for every agent, a two-turn rollout with a transition by dotted path.
        ("grpo", ["--num_agents", "2", "--num_turns", "2", "--external_transition", "team_code.feedback",
                  "--learning_rate", "1e-3", "--max_completion_length", "8", "--per_device_train_batch_size", "2"]),
        # CoMLRL's names: one model per agent, a formatter each.
        ("magrpo", ["--num_turns", "1", "--formatters", "team_code.plan", "team_code.write",
                    "--agent_learning_rate", "1e-3", "--max_new_tokens", "8", "--rollout_buffer_size", "1"]),
    ],
)  # fmt: skip
def test_end_to_end(workdir, tiny_path, command, team_flags):
    models = ["--agent_models", tiny_path, tiny_path] if command == "magrpo" else ["--model_name_or_path", tiny_path]
    argv = [command, *models, "--dataset_name", "data", "--reward_funcs", "team_code.ratio", "--output_dir", "out",
            "--max_steps", "1", "--num_generations", "2", "--report_to", "none", "--save_strategy", "no",
            *team_flags]  # fmt: skip
    run_and_load(workdir, argv)


def run_and_load(workdir, argv: list[str]) -> None:
    """Run `multiagent-trl <argv>` in `workdir`, offline; it must save 2 agents in `out/` that load back."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", WANDB_MODE="offline", PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "multiagent_trl.cli", *argv], cwd=workdir, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Saved 2 agents" in result.stdout
    for i in range(2):
        folder = workdir / "out" / f"agent_{i}"
        assert AutoModelForCausalLM.from_pretrained(folder).num_parameters() > 0
        AutoTokenizer.from_pretrained(folder)


# Each native family's command end to end, and what it saves beside the agents ("TINY": the tiny model's path).
FAMILY_RUNS = {
    "dpo": (["--num_generations", "4", "--per_device_train_batch_size", "8"], []),
    "rlhf": (["--num_generations", "2", "--preference_num_candidates", "2"], ["reward_model"]),
    "iterative-dpo": (["--num_generations", "4", "--per_device_train_batch_size", "8"], ["preference_replay"]),
    "iterative-rlhf": (
        ["--num_generations", "2", "--preference_num_candidates", "2"], ["preference_replay", "reward_model"]
    ),
    "actor-critic": (["--num_generations", "1", "--critic_model", "TINY"], ["agent_0/critic", "agent_1/critic"]),
    "actor-critic-rlhf": (
        ["--num_generations", "1", "--preference_num_candidates", "2"], ["agent_0/critic", "reward_model"]
    ),
}  # fmt: skip


@pytest.mark.parametrize("command", sorted(FAMILY_RUNS))
def test_each_family_trains_and_saves_from_the_command_line(workdir, tiny_path, command):
    flags, saved = FAMILY_RUNS[command]
    argv = [command, "--model_name_or_path", tiny_path, "--num_agents", "2", "--dataset_name", "data",
            "--reward_funcs", "team_code.ratio", "--output_dir", "out", "--max_steps", "1", "--report_to", "none",
            "--save_strategy", "no", "--per_device_train_batch_size", "2", "--max_completion_length", "8",
            *[tiny_path if flag == "TINY" else flag for flag in flags]]  # fmt: skip
    run_and_load(workdir, argv)
    for folder in saved:
        assert (workdir / "out" / folder).is_dir(), folder


@pytest.fixture
def hub_calls(monkeypatch):
    """The Hub client, faked (the Hub is unreachable in tests): each repo creation and upload, in order."""
    calls = []

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, name, private=None, exist_ok=False):
            calls.append(("create", name))
            return type("RepoUrl", (), {"repo_id": name})()

        def upload_folder(self, repo_id, folder_path, allow_patterns=None, **kwargs):
            calls.append(("upload", repo_id, Path(folder_path).name, allow_patterns))

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    return calls


PUSH_ARGV = ["grpo", "--num_agents", "2", "--dataset_name", "data", "--reward_funcs", "team_code.ratio",
             "--output_dir", "out", "--max_steps", "1", "--num_generations", "2",
             "--per_device_train_batch_size", "2", "--max_completion_length", "8", "--report_to", "none",
             "--save_strategy", "no", "--push_to_hub"]  # fmt: skip


def test_streaming_dataset_and_push_to_hub(workdir, tiny_path, monkeypatch, hub_calls):
    """`--dataset_streaming --push_to_hub`: the cards are written from what training saw (a stream has no length)."""
    from multiagent_trl.cli import main

    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))
    argv = [*PUSH_ARGV, "--model_name_or_path", tiny_path, "--dataset_streaming", "--hub_model_id", "me/team"]
    assert main(argv) == 0
    assert [call[:2] for call in hub_calls] == [
        ("create", "me/team-agent-0"),
        ("create", "me/team-agent-1"),
        ("upload", "me/team-agent-0"),
        ("upload", "me/team-agent-1"),
    ]
    card = (workdir / "out" / "agent_0" / "README.md").read_text()
    assert "Example prompt (a training row)" in card and "me/team-agent-1" in card


def test_a_bad_repo_name_fails_before_training(workdir, tiny_path, monkeypatch, hub_calls):
    from multiagent_trl.cli import main

    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))
    argv = [*PUSH_ARGV, "--model_name_or_path", tiny_path, "--hub_model_id", "me/my team"]
    with pytest.raises(ValueError, match=r"Cannot push the team to 'me/my team-agent-0'.*`hub_model_id`"):
        main(argv)
    assert hub_calls == [] and not (workdir / "out" / "agent_0").exists()  # nothing trained, saved or created


@pytest.mark.parametrize("streaming", [False, True], ids=["map-style", "streaming"])
@pytest.mark.parametrize("saved", ["dataset_dict", "dataset"])
def test_dataset_name_takes_a_save_to_disk_folder(tmp_path, saved, streaming):
    from datasets import DatasetDict, IterableDataset

    train = Dataset.from_dict({"prompt": ["Describe a city:", "Tell a joke:"]})
    data = DatasetDict(train=train, test=train.select([0])) if saved == "dataset_dict" else train
    data.save_to_disk(str(tmp_path / "saved"))
    argv = ["grpo", "--model_name_or_path", "m", "--dataset_name", str(tmp_path / "saved"), "--output_dir", "o",
            "--eval_strategy", "steps", *(["--dataset_streaming"] if streaming else [])]  # fmt: skip
    _, script_args, config, _, dataset_args = parse_args(argv)
    train_dataset, eval_dataset = load_datasets(script_args, config, dataset_args)
    assert isinstance(train_dataset, IterableDataset if streaming else Dataset)
    assert [row["prompt"] for row in train_dataset] == train["prompt"]
    if saved == "dataset_dict":
        assert [row["prompt"] for row in eval_dataset] == ["Describe a city:"]
    else:
        assert eval_dataset is None  # one split: the train split


def test_push_to_hub_flag_pushes_the_team(workdir, tiny_path, monkeypatch, hub_calls):
    """`--push_to_hub --hub_single_repo` pushes one repo with `agent_i/` folders and their cards at the end (the Hub
    client is faked; nothing is pushed during training)."""
    from multiagent_trl.cli import main

    calls = hub_calls

    monkeypatch.chdir(workdir)
    monkeypatch.syspath_prepend(str(workdir))
    argv = ["grpo", "--model_name_or_path", tiny_path, "--num_agents", "2", "--dataset_name", "data",
            "--reward_funcs", "team_code.ratio", "--output_dir", "out", "--max_steps", "1", "--num_generations", "2",
            "--per_device_train_batch_size", "2", "--max_completion_length", "8", "--report_to", "none",
            "--save_strategy", "no", "--push_to_hub", "--hub_model_id", "me/team", "--hub_single_repo"]  # fmt: skip
    assert main(argv) == 0
    assert calls == [("create", "me/team"), ("upload", "me/team", "out", ["README.md", "agent_*/**"])]
    for i in range(2):
        card = (workdir / "out" / f"agent_{i}" / "README.md").read_text()
        assert "me/team/agent_0" in card and "me/team/agent_1" in card and "`ratio`" in card
