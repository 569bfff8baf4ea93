"""Pushing a team to the Hub, offline: the folders and model cards exactly as `push_team` uploads them.

`hub.write_team_folder` is what `push_to_hub` calls before `huggingface_hub`'s upload (not called here); the cards
must name the team, the agent's role, the joint reward, the config and the agent's own metrics, and each folder must
load with `from_pretrained`.
"""

import os
import re

import pytest
from datasets import Dataset
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.hub import agent_card, agent_repo_ids, last_agent_metrics, write_team_folder

from .conftest import length_ratio, lora_config, small_args


def planner(row):
    return f"Plan: {row['prompt']}"


def writer(row):
    return f"Write: {row['prompt']}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_path):
    """A team of two trained one step, with a formatter each (their roles)."""
    from datasets import Dataset

    tmp = tmp_path_factory.mktemp("hub")
    dataset = Dataset.from_dict({"prompt": ["a story", "a poem", "a joke", "a song"]})
    args = small_args(tmp, num_agents=2, max_steps=1, per_device_train_batch_size=4, num_generations=2,
                      temperature=[0.7, 1.0])  # fmt: skip
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=length_ratio, args=args, train_dataset=dataset, formatters=[planner, writer]
    )
    trainer.train()
    return trainer, tmp


@pytest.mark.parametrize("single_repo", [False, True])
def test_team_folder_and_cards(trained, tmp_path, single_repo):
    trainer, _ = trained
    ids = ["me/team"] if single_repo else agent_repo_ids("me/team", 2)
    uploads = write_team_folder(trainer, str(tmp_path), ids, single_repo=single_repo, dataset_name="local/prompts")
    if single_repo:
        assert uploads == [("me/team", str(tmp_path))]
        assert "agent_0/" in (tmp_path / "README.md").read_text()
    else:
        assert uploads == [(ids[i], str(tmp_path / f"agent_{i}")) for i in range(2)]
    for i, role, temperature in ((0, "planner", 0.7), (1, "writer", 1.0)):
        folder = tmp_path / f"agent_{i}"
        card = (folder / "README.md").read_text()
        assert f"# Agent {i} of a team of 2" in card
        # The team: every agent's repo (or folder), this one marked.
        for j in range(2):
            link = f"me/team/agent_{j}" if single_repo else f"me/team-agent-{j}"
            assert link in card
        assert "(this model)" in card.split(f"| {i} |")[1].split("\n")[0]
        # The role: its formatter and its prompt for the first row.
        assert f"Formatter: `{role}`" in card
        assert ("Plan: a story" if i == 0 else "Write: a story") in card
        # The joint reward, the config (this agent's own temperature) and this agent's metrics only.
        assert "`length_ratio`" in card
        assert "| `num_agents` | `2` |" in card and f"| `temperature` | `{temperature}` |" in card
        assert f"`agent_{i}/reward`" in card and f"agent_{1 - i}/" not in card
        assert "datasets:\n- local/prompts" in card and f"agent-{i}" in card
        # The folder as uploaded loads as a model.
        model = AutoModelForCausalLM.from_pretrained(folder)
        AutoTokenizer.from_pretrained(folder)
        assert model.num_parameters() > 0


def test_lora_team_cards_say_adapter(tmp_path, tiny_path, prompts_dataset):
    args = small_args(tmp_path, num_agents=2, max_steps=1, per_device_train_batch_size=4, num_generations=2)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=length_ratio, args=args, train_dataset=prompts_dataset, peft_config=lora_config()
    )
    trainer.train()
    write_team_folder(trainer, str(tmp_path / "hub"), agent_repo_ids("me/lora", 2))
    for i in range(2):
        folder = tmp_path / "hub" / f"agent_{i}"
        card = (folder / "README.md").read_text()
        assert "library_name: peft" in card and "PeftModel.from_pretrained(base, " in card
        assert "No formatter: the dataset's prompt." in card
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), folder)
        assert isinstance(model, PeftModel)


def test_last_agent_metrics_and_card_from_plain_data():
    history = [{"agent_1/reward": 0.1, "agent_1/loss": 2.0}, {"agent_1/reward": 0.75, "epoch": 1}]
    metrics = last_agent_metrics(history, 1)
    assert metrics == {"agent_1/reward": 0.75, "agent_1/loss": 2.0}
    card = str(
        agent_card(
            1,
            ["u/t-agent-0", "u/t-agent-1"],
            role="Formatter: `critic`.",
            reward_names=["accuracy (weight 2)", "brevity"],
            config={"joint_mode": "cross"},
            metrics=metrics,
            base_model="Qwen/Qwen2.5-0.5B",
            run_links={"Weights & Biases": "https://wandb.ai/me/team/runs/1"},
        )
    )
    assert card.startswith("---\nbase_model: Qwen/Qwen2.5-0.5B\n")
    assert "| 1 | [u/t-agent-1](https://huggingface.co/u/t-agent-1) (this model) |" in card
    assert "| 0 | [u/t-agent-0](https://huggingface.co/u/t-agent-0) |" in card
    assert "`accuracy (weight 2)`, `brevity`" in card and "| `joint_mode` | `cross` |" in card
    assert "Training run: [Weights & Biases](https://wandb.ai/me/team/runs/1)." in card
    assert "| `agent_1/reward` | 0.75 |" in card and 'from_pretrained("u/t-agent-1")' in card


@pytest.fixture
def hub_calls(monkeypatch):
    """The Hub client, faked (the Hub is unreachable in tests): each repo creation and upload, in order."""
    calls = []

    class FakeApi:
        def __init__(self, token=None):
            pass

        def create_repo(self, name, private=None, exist_ok=False):
            calls.append(("create", name))
            return type("RepoUrl", (), {"repo_id": name if "/" in name else f"user/{name}"})()

        def upload_folder(self, repo_id, folder_path, **kwargs):
            calls.append(("upload", repo_id, folder_path.rsplit("/", 1)[-1]))

    monkeypatch.setattr("huggingface_hub.HfApi", FakeApi)
    return calls


def test_push_to_hub_is_the_team_push(hub_calls, trained):
    """`trainer.push_to_hub` creates one repo per agent and uploads each agent folder (the Hub client is faked)."""
    trainer, _ = trained
    calls = hub_calls
    urls = trainer.push_to_hub(repo_id="story", dataset_name="local/prompts")
    assert urls == ["https://huggingface.co/user/story-agent-0", "https://huggingface.co/user/story-agent-1"]
    assert calls == [
        ("create", "story-agent-0"),
        ("create", "story-agent-1"),
        ("upload", "user/story-agent-0", "agent_0"),
        ("upload", "user/story-agent-1", "agent_1"),
    ]


def example_prompt(card: str) -> str:
    return re.search(r"Example prompt[^\n]*\n\n```text\n(.*?)\n```", card, re.S).group(1)


@pytest.mark.parametrize("streaming", [False, True], ids=["map-style", "streaming"])
def test_cards_and_push_after_training_on_either_kind_of_dataset(tmp_path, tiny_path, hub_calls, streaming):
    """A stream has no length and no row 0: the card's example prompt is then the first row trained on."""
    prompts = ["a story", "a poem", "a joke", "a song"]
    dataset = Dataset.from_dict({"prompt": prompts})
    args = small_args(tmp_path, num_agents=2, max_steps=1, per_device_train_batch_size=4, num_generations=2)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=args,
        train_dataset=dataset.to_iterable_dataset() if streaming else dataset,
        formatters=[planner, writer],
    )
    trainer.train()
    write_team_folder(trainer, str(tmp_path / "hub"), agent_repo_ids("me/team", 2))
    for i, role in ((0, "Plan: "), (1, "Write: ")):
        example = example_prompt((tmp_path / "hub" / f"agent_{i}" / "README.md").read_text())
        assert example == role + "a story" if not streaming else example.removeprefix(role) in prompts
    urls = trainer.push_to_hub(repo_id="me/story")
    assert urls == ["https://huggingface.co/me/story-agent-0", "https://huggingface.co/me/story-agent-1"]
    assert [call[0] for call in hub_calls] == ["create", "create", "upload", "upload"]


def test_push_checks_the_repo_names_before_creating_any(trained, hub_calls):
    trainer, _ = trained
    with pytest.raises(ValueError, match=r"'me/a story-agent-0'.*`hub_model_id`"):
        trainer.push_to_hub(repo_id="me/a story")
    assert hub_calls == []


def test_a_team_of_one_card_shows_its_metrics(tmp_path, tiny_path, prompts_dataset):
    """A team of one logs TRL's own metric names, without the `agent_0/` prefix."""
    args = small_args(tmp_path, max_steps=1, per_device_train_batch_size=4, num_generations=2)

    def brevity(completions, **kwargs):
        return [-len(c) / 10 for c in completions]

    trainer = MultiAgentGRPOTrainer(model=tiny_path, reward_funcs=brevity, args=args, train_dataset=prompts_dataset)
    trainer.train()
    write_team_folder(trainer, str(tmp_path / "hub"), agent_repo_ids("me/solo", 1))
    card = (tmp_path / "hub" / "agent_0" / "README.md").read_text()
    metrics = card.split("## Training metrics")[1].split("## Usage")[0]
    assert "(none logged)" not in metrics
    assert "| `reward` |" in metrics and "| `loss` |" in metrics
    assert "`epoch`" not in metrics and "`train_runtime`" not in metrics  # the Trainer's run summary is no metric


@pytest.mark.parametrize("single_repo", [False, True])
def test_a_joint_critic_is_uploaded_and_described(
    tmp_path, tiny_path, prompts_dataset, hub_calls, monkeypatch, single_repo
):
    """MAAC's joint critic (`critic/` beside the agents) is pushed with the team: in its own repo `<base>-critic`
    (or as `critic/` of the one repo), with a card, and the agents' cards say where it is."""
    from multiagent_trl.actor_critic.config import ActorCriticConfig
    from multiagent_trl.actor_critic.trainer import ActorCriticTrainer
    from multiagent_trl.actor_critic.value_model import VALUE_HEAD_FILE, CausalLMWithValueHead
    from multiagent_trl.hub import team_repo_names

    args = small_args(
        tmp_path, ActorCriticConfig, num_agents=2, max_steps=1, per_device_train_batch_size=4, num_generations=2,
        max_completion_length=6, joint_critic=True,
    )  # fmt: skip
    trainer = ActorCriticTrainer(model=tiny_path, reward_funcs=length_ratio, args=args, train_dataset=prompts_dataset)
    trainer.train()
    assert trainer.shared_folders().keys() == {"critic"}
    names = team_repo_names("me/team", 2, single_repo, shared=trainer.shared_folders())
    assert names == (["me/team"] if single_repo else ["me/team-agent-0", "me/team-agent-1", "me/team-critic"])
    uploads = write_team_folder(trainer, str(tmp_path / "hub"), names, single_repo=single_repo)
    critic = tmp_path / "hub" / "critic"
    if single_repo:
        assert uploads == [("me/team", str(tmp_path / "hub"))]
        assert "critic/" in (tmp_path / "hub" / "README.md").read_text()
    else:
        assert uploads[-1] == ("me/team-critic", str(critic))
    card = (critic / "README.md").read_text()
    assert "joint critic" in card and "`critic_type`: `v`" in card and "CausalLMWithValueHead" in card
    for i in range(2):
        assert ("me/team/critic" if single_repo else "me/team-critic") in (
            tmp_path / "hub" / f"agent_{i}" / "README.md"
        ).read_text()
    assert (critic / VALUE_HEAD_FILE).is_file()
    CausalLMWithValueHead.from_pretrained(str(critic))  # the folder as uploaded loads

    uploaded = []  # (repo, folder, allow_patterns) of each upload
    monkeypatch.setattr(
        "huggingface_hub.HfApi.upload_folder",
        lambda self, repo_id, folder_path, **kw: uploaded.append((repo_id, os.path.basename(folder_path),
                                                                  kw.get("allow_patterns"))),
    )  # fmt: skip
    trainer.args.output_dir = str(tmp_path / "push")
    trainer.push_to_hub(repo_id="team", single_repo=single_repo)
    assert uploaded == ([("user/team", "push", ["README.md", "agent_*/**", "critic/**"])] if single_repo else [
        ("user/team-agent-0", "agent_0", None), ("user/team-agent-1", "agent_1", None),
        ("user/team-critic", "critic", None),
    ])  # fmt: skip
