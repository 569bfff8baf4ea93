"""Pushing a trained team to the Hugging Face Hub: one repo per agent (or one repo with `agent_i/` folders), each
agent with a model card that says which team it belongs to, its role, the joint reward, the config and its metrics.

The trainer's `push_to_hub` calls `push_team`. Everything up to the upload is done by `write_team_folder`, which
writes the folders exactly as they are uploaded (the agents' `save_model` folders plus their `README.md` cards), so
that a test can read them without the network; the cards are built from plain data by `agent_card`. What can fail is
decided before any repo is created: the repo names (`team_repo_names`, which the CLI checks before training too) and
what the cards say (`card_details`). The cards read nothing from the training dataset that a stream lacks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.utils import HFValidationError, validate_repo_id

if TYPE_CHECKING:
    from .config import MultiAgentGRPOConfig
    from .trainer import MultiAgentGRPOTrainer

# The config fields a card shows: what a reader needs to know how the team was trained.
CARD_FIELDS = (
    "num_agents",
    "joint_mode",
    "num_turns",
    "num_generations",
    "learning_rate",
    "agent_learning_rates",
    "beta",
    "temperature",
    "max_completion_length",
    "loss_type",
    "scale_rewards",
    "reward_weights",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "seed",
)
# What a trainer's `log_history` holds beside an agent's metrics: Trainer's bookkeeping, the run summary
# (`train_runtime`, ...), evaluations and the team's shared counters. A team of one logs its metrics among them, under
# TRL's own names (a team of several under `agent_{i}/`).
RUN_KEYS = ("epoch", "step", "total_flos", "learning_rate", "step_time", "num_tokens")
RUN_PREFIXES = ("train_", "eval_", "test_")


def agent_repo_ids(base: str, num_agents: int) -> list[str]:
    """One repo id per agent, named from the run's `base` name.

    >>> agent_repo_ids("me/story-team", 2)
    ['me/story-team-agent-0', 'me/story-team-agent-1']
    """
    return [f"{base}-agent-{i}" for i in range(num_agents)]


def hub_base_name(args: MultiAgentGRPOConfig, repo_id: str | None = None) -> str:
    """The name a team's repos are named from: `repo_id`, else `args.hub_model_id`, else the name of `output_dir`."""
    return repo_id or args.hub_model_id or Path(args.output_dir).name


def team_repo_names(base: str, num_agents: int, single_repo: bool = False, shared: Sequence[str] = ()) -> list[str]:
    """The repos a team is pushed to (one per agent, then one per folder the team `shared` (its trainer's
    `shared_folders()`, such as MAAC's joint critic), or `base` alone with `single_repo`), each checked as a Hub repo
    id, so that a bad name fails before training and before any repo is created.

    >>> team_repo_names("me/story-team", 2)
    ['me/story-team-agent-0', 'me/story-team-agent-1']
    >>> team_repo_names("me/story-team", 2, shared=["critic"])[-1]
    'me/story-team-critic'
    """
    names = [base] if single_repo else [*agent_repo_ids(base, num_agents), *(f"{base}-{name}" for name in shared)]
    for name in names:
        try:
            validate_repo_id(name)
        except HFValidationError as err:
            raise ValueError(
                f"Cannot push the team to {name!r}: {err} Give a valid repo id as `hub_model_id` (`--hub_model_id`) "
                "or `push_to_hub(repo_id=...)`; without one, the name of `output_dir` is used."
            ) from err
    return names


def last_agent_metrics(
    log_history: Sequence[dict[str, Any]], agent: int, prefix: str | None = None
) -> dict[str, float]:
    """The last logged value of each of agent `agent`'s metrics in a trainer's `state.log_history`: those under
    `prefix`, by default `agent_{agent}/`. With `prefix=""` (a team of one, which logs TRL's own names), every metric
    but Trainer's bookkeeping and summaries (`RUN_KEYS`, `RUN_PREFIXES`).

    >>> history = [{"agent_0/reward": 0.1, "loss": 1.0}, {"agent_0/reward": 0.5, "agent_1/reward": 0.2}]
    >>> last_agent_metrics(history, 0)
    {'agent_0/reward': 0.5}
    >>> last_agent_metrics([{"reward": 0.5, "loss": 1.0, "epoch": 1.0}, {"train_runtime": 9.0}], 0, prefix="")
    {'reward': 0.5, 'loss': 1.0}
    """
    prefix = f"agent_{agent}/" if prefix is None else prefix

    def is_metric(key: str) -> bool:
        if prefix:
            return key.startswith(prefix)
        return key not in RUN_KEYS and not key.startswith(RUN_PREFIXES)

    metrics: dict[str, float] = {}
    for entry in log_history:
        metrics.update({k: v for k, v in entry.items() if is_metric(k) and isinstance(v, (int, float))})
    return metrics


def card_config(args, agent: int) -> dict[str, Any]:
    """The key `CARD_FIELDS` of a `MultiAgentGRPOConfig`, with agent `agent`'s value of each per-agent setting."""
    from .config import AGENT_SETTINGS

    values = {}
    for name in CARD_FIELDS:
        if not hasattr(args, name):
            continue
        value = args.agent_setting(name, agent) if name in AGENT_SETTINGS else getattr(args, name)
        if name == "agent_learning_rates" and value is not None:
            name, value = "learning_rate", value[agent]  # this agent's own
        values[name] = value
    return values


def agent_card(
    agent: int,
    repo_ids: Sequence[str],
    role: str,
    reward_names: Sequence[str],
    config: dict[str, Any],
    metrics: dict[str, float],
    base_model: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] = (),
    subfolder: str | None = None,
    adapter: bool = False,
    run_links: dict[str, str] | None = None,
    shared: dict[str, tuple[str, str]] | None = None,
) -> ModelCard:
    """The model card of agent `agent` of a team whose agents live in `repo_ids` (one per agent).

    Args:
        agent: The agent's index.
        repo_ids: Each agent's repo id (the same id for all with one repo for the team).
        role: What the agent does in the team: its formatter's name and an example of its prompt.
        reward_names: The joint reward functions' names (with their weights if any).
        config: The training settings to show (`card_config`).
        metrics: The agent's last logged training metrics (`last_agent_metrics`).
        base_model: The Hub id the agent started from, if any (a local folder is not a Hub id).
        dataset_name: The training dataset's Hub id or name, if any.
        tags: More tags for the card's metadata.
        subfolder: The agent's folder in its repo (`agent_i` with one repo for the team), or `None`.
        adapter: Whether the agent is a LoRA adapter (loaded with `PeftModel.from_pretrained`).
        run_links: The training run's pages by tracker (`{"Weights & Biases": url}`), as TRL's cards link them.
        shared: What the team shares beside its agents (a joint critic, ...): folder name -> (its link, what it is).

    Returns:
        A `huggingface_hub.ModelCard`; `str(card)` is the README.md text.
    """
    import transformers
    import trl

    from ._version import __version__

    num_agents = len(repo_ids)
    data = ModelCardData(
        base_model=base_model,
        datasets=[dataset_name] if dataset_name else None,
        library_name="peft" if adapter else "transformers",
        tags=sorted({"multiagent_trl", "trl", "grpo", "magrpo", f"agent-{agent}", *tags}),
    )
    team = "\n".join(
        f"| {i} | [{repo}](https://huggingface.co/{repo}){' (this model)' if i == agent else ''} |"
        for i, repo in enumerate(repo_ids)
    )
    if subfolder is not None:
        team = "\n".join(
            f"| {i} | [{repo}/agent_{i}](https://huggingface.co/{repo}/tree/main/agent_{i})"
            f"{' (this model)' if i == agent else ''} |"
            for i, repo in enumerate(repo_ids)
        )
    loader = "PeftModel.from_pretrained(base, " if adapter else "AutoModelForCausalLM.from_pretrained("
    where = f'"{repo_ids[agent]}"' + (f', subfolder="{subfolder}"' if subfolder else "")
    imports = "from peft import PeftModel" if adapter else "from transformers import AutoModelForCausalLM"
    config_rows = "\n".join(f"| `{k}` | `{v}` |" for k, v in config.items())
    metric_rows = "\n".join(f"| `{k}` | {v:.4g} |" for k, v in metrics.items()) or "| (none logged) | |"
    runs = "".join(f"\n\nTraining run: [{name}]({url})." for name, url in (run_links or {}).items())
    shared_rows = "".join(f"\n| `{name}/` | {link} | {what} |" for name, (link, what) in (shared or {}).items())
    shared_section = (
        f"\n\n## Shared by the team\n\n| Folder | Where | What |\n|---|---|---|{shared_rows}" if shared_rows else ""
    )
    body = f"""# Agent {agent} of a team of {num_agents}

This model is agent {agent} of {num_agents} agents trained together with multiagent_trl (MAGRPO: GRPO on one joint
reward, built on [TRL](https://github.com/huggingface/trl)). It was trained to cooperate with the other agents below:
its rewards depend on their answers too.{runs}

## Team

| Agent | Repo |
|---|---|
{team}{shared_section}

## Role

{role}

## Joint reward

{", ".join(f"`{name}`" for name in reward_names)}

## Training config

| Field | Value |
|---|---|
{config_rows}

## Training metrics (last logged, this agent)

| Metric | Value |
|---|---|
{metric_rows}

## Usage

```python
{imports}

model = {loader}{where})
```

## Framework versions

- multiagent_trl: {__version__}
- TRL: {trl.__version__}
- Transformers: {transformers.__version__}
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def run_links() -> dict[str, str]:
    """The current run's pages in the trackers that have one (W&B, Trackio, Comet), found as TRL's cards find them."""
    from transformers import is_wandb_available
    from trl.trainer.utils import get_comet_experiment_url, get_trackio_space_url

    links = {}
    if is_wandb_available():
        import wandb

        if wandb.run is not None and wandb.run.url:
            links["Weights & Biases"] = wandb.run.url
    for name, url in (("Trackio", get_trackio_space_url()), ("Comet", get_comet_experiment_url())):
        if url:
            links[name] = url
    return links


def example_row(trainer: MultiAgentGRPOTrainer) -> dict[str, Any] | None:
    """The training row whose prompts a card shows: a map-style dataset's first row; for a stream, which has no row 0
    (and reading it again may reach the network), the first row the trainer trained on; `None` when there is none
    (a stream not trained on yet, or no training dataset)."""
    from datasets import Dataset

    dataset = trainer.train_dataset
    if isinstance(dataset, Dataset):
        return dataset[0] if len(dataset) else None
    return trainer.first_train_row


def agent_role(trainer: MultiAgentGRPOTrainer, agent: int) -> str:
    """Agent `agent`'s role, in words: its formatter's name (if it has one) and its prompt for a training row
    (`example_row`)."""
    from trl.trainer.utils import get_callable_name

    formatter = trainer.formatters[agent] if trainer.formatters else None
    row = example_row(trainer)
    lines = [f"Formatter: `{get_callable_name(formatter)}`." if formatter else "No formatter: the dataset's prompt."]
    if row is not None:
        prompt = formatter(row) if formatter else row.get("prompt")
        if prompt is not None:
            lines.append(f"Example prompt (a training row):\n\n```text\n{prompt}\n```")
    return "\n\n".join(lines)


def card_details(trainer: MultiAgentGRPOTrainer) -> list[dict[str, Any]]:
    """What each agent's card says about its training, as `agent_card` arguments (one dict per agent): its role, the
    joint reward, its config and metrics, its base model and the run's pages. `push_team` builds them before creating
    any repo, so that what can fail here fails before anything is on the Hub."""
    from trl.trainer.utils import get_config_model_id

    models = trainer.model.models()
    weights = trainer.reward_weights.tolist() if getattr(trainer, "reward_weights", None) is not None else None
    names = list(trainer.reward_func_names)
    if weights is not None and any(w != 1.0 for w in weights):
        names = [f"{name} (weight {w:g})" for name, w in zip(names, weights)]
    links = run_links()
    details = []
    for i in range(trainer.num_agents):
        model = models[i] if len(models) > 1 else models[0]
        base_model = get_config_model_id(model.config) or None
        if base_model is not None and os.path.isdir(base_model):  # as TRL's cards: a local folder is no Hub id
            base_model = None
        details.append(
            {
                "role": agent_role(trainer, i),
                "reward_names": names,
                "config": card_config(trainer.args, i),
                "metrics": last_agent_metrics(trainer.state.log_history, i, trainer.agent_metric_prefix(i)),
                "base_model": base_model,
                "run_links": links,
            }
        )
    return details


def write_team_folder(
    trainer: MultiAgentGRPOTrainer,
    folder: str,
    repo_ids: Sequence[str],
    single_repo: bool = False,
    dataset_name: str | None = None,
    tags: Sequence[str] = (),
    save: bool = True,
    details: list[dict[str, Any]] | None = None,
) -> list[tuple[str, str]]:
    """Write the team to `folder` as it is uploaded, and return the uploads: `(repo id, local folder)` pairs.

    Each agent goes to `folder/agent_{i}/` (`trainer.save_model(folder)`, skipped with `save=False`) with its
    `README.md` card; so does each folder the team shares (`trainer.shared_folders()`: MAAC's joint critic in
    `critic/`, ...), with a card of its own, and the agents' cards say where it is. With `single_repo`, `repo_ids`
    holds one id, `folder` holds a team `README.md` too, and the one upload is `folder`'s `README.md`, `agent_*/` and
    shared folders; otherwise one upload per agent folder, then one per shared folder (`repo_ids` as
    `team_repo_names` gives them). `details` are the cards' `card_details`, built here when `None`.
    """
    num_agents = trainer.num_agents
    shared = shared_folders(trainer)
    ids = [repo_ids[0]] * (num_agents + len(shared)) if single_repo else list(repo_ids)
    if len(ids) != num_agents + len(shared):
        raise ValueError(
            f"{len(ids)} repo ids for {num_agents} agents and the shared folders {list(shared)}: give one per agent "
            "and one per shared folder (`team_repo_names(..., shared=trainer.shared_folders())`), or single_repo=True."
        )
    details = card_details(trainer) if details is None else details
    if save:
        trainer.save_model(folder, _internal_call=True)  # not a push of its own with `args.push_to_hub`
    links = {}
    for k, (name, what) in enumerate(shared.items()):
        repo = ids[num_agents + k]
        link = (
            f"[{repo}/{name}](https://huggingface.co/{repo}/tree/main/{name})"
            if single_repo
            else f"[{repo}](https://huggingface.co/{repo})"
        )
        links[name] = (link, what)
        shared_card(name, what, ids[:num_agents], single_repo).save(os.path.join(folder, name, "README.md"))
    cards = []
    for i in range(num_agents):
        agent_dir = os.path.join(folder, f"agent_{i}")
        card = agent_card(
            i,
            ids,
            **details[i],
            dataset_name=dataset_name,
            tags=tags,
            subfolder=f"agent_{i}" if single_repo else None,
            adapter=os.path.exists(os.path.join(agent_dir, "adapter_config.json")),
            shared=links,
        )
        card.save(os.path.join(agent_dir, "README.md"))
        cards.append(card)
    if single_repo:
        team_card = ModelCard(
            f"---\n{cards[0].data.to_yaml()}\n---\n\n# A team of {num_agents} agents\n\n"
            + "\n".join(f"- [`agent_{i}/`](agent_{i}/README.md)" for i in range(num_agents))
            + "\n\nEach folder is one agent, with its own model card.\n"
            + "".join(f"\n- [`{name}/`]({name}/README.md): {what}\n" for name, what in shared.items())
        )
        team_card.save(os.path.join(folder, "README.md"))
        return [(ids[0], folder)]
    agents = [(ids[i], os.path.join(folder, f"agent_{i}")) for i in range(num_agents)]
    return agents + [(ids[num_agents + k], os.path.join(folder, name)) for k, name in enumerate(shared)]


def shared_folders(trainer) -> dict[str, str]:
    """What `trainer` saves beside its agents for the team (`trainer.shared_folders()`; none for a trainer without
    the method): folder name -> what it is."""
    method = getattr(trainer, "shared_folders", None)
    return dict(method()) if method is not None else {}


def shared_card(name: str, what: str, agent_repo_ids: Sequence[str], single_repo: bool) -> ModelCard:
    """The card of a folder the team shares (`name/`, described by `what`): what it is and the team's agents."""
    from . import __version__

    data = ModelCardData(library_name="transformers", tags=sorted({"multiagent_trl", "trl", name}))
    agents = "\n".join(
        f"| {i} | [{repo}/agent_{i}](https://huggingface.co/{repo}/tree/main/agent_{i}) |"
        if single_repo
        else f"| {i} | [{repo}](https://huggingface.co/{repo}) |"
        for i, repo in enumerate(agent_repo_ids)
    )
    body = f"""# `{name}/` of a team of {len(agent_repo_ids)} agents

{what}

## Team

| Agent | Repo |
|---|---|
{agents}

Trained with multiagent_trl {__version__}.
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def push_team(
    trainer: MultiAgentGRPOTrainer,
    repo_id: str | None = None,
    single_repo: bool = False,
    commit_message: str = "End of training",
    private: bool | None = None,
    token: str | None = None,
    revision: str | None = None,
    dataset_name: str | None = None,
    tags: Sequence[str] = (),
) -> list[str]:
    """Save the team and push it to the Hub: one repo per agent (`<repo_id>-agent-{i}`, and `<repo_id>-<name>` per
    folder the team shares, such as `-critic` for MAAC's joint critic) or, with `single_repo`, one repo `repo_id`
    with `agent_i/` (and shared) folders. Returns the repos' URLs (an empty list on processes other than the main
    one).

    `repo_id` defaults to `args.hub_model_id`, else the name of `args.output_dir`; without a namespace the repos go
    to the token's user. Every process must call this (saving may need all of them); only the main one uploads. The
    names and the cards' contents are checked and built before any repo is created.
    """
    from huggingface_hub import HfApi

    args = trainer.args
    shared = shared_folders(trainer)
    names = team_repo_names(hub_base_name(args, repo_id), trainer.num_agents, single_repo, shared)
    token = token if token is not None else args.hub_token
    private = private if private is not None else args.hub_private_repo
    trainer.save_model(args.output_dir, _internal_call=True)  # Trainer.save_model would push with args.push_to_hub
    if not trainer.is_world_process_zero():
        return []
    details = card_details(trainer)
    api = HfApi(token=token)
    # Created before the cards are written: the Hub resolves the namespace, and the cards link the agents by their
    # full ids.
    ids = [api.create_repo(name, private=private, exist_ok=True).repo_id for name in names]
    uploads = write_team_folder(trainer, args.output_dir, ids, single_repo, dataset_name, tags, False, details)
    urls = []
    for repo, path in uploads:
        patterns = ["README.md", "agent_*/**", *(f"{name}/**" for name in shared)] if single_repo else None
        api.upload_folder(
            repo_id=repo,
            folder_path=path,
            commit_message=commit_message,
            revision=revision if revision is not None else args.hub_revision,
            allow_patterns=patterns,
        )
        urls.append(f"https://huggingface.co/{repo}")
    return urls


def push_to_hub(
    trainer: MultiAgentGRPOTrainer,
    commit_message: str | None = "End of training",
    blocking: bool = True,
    token: str | None = None,
    revision: str | None = None,
    private: bool | None = None,
    *,
    repo_id: str | None = None,
    single_repo: bool = False,
    dataset_name: str | None = None,
    tags: Sequence[str] = (),
    **kwargs,
) -> list[str]:
    """`MultiAgentGRPOTrainer.push_to_hub`: push every agent to the Hub, each with a model card (`push_team`): one repo
    per agent, `<repo_id>-agent-{i}`, or with `single_repo=True` one repo `repo_id` with `agent_i/` folders. `repo_id`
    defaults to `args.hub_model_id`, else the name of `output_dir`. Returns the repos' URLs. (Trainer's pushes one
    folder to one repo; `blocking` is accepted for its signature, the uploads always finish before returning.)"""
    message = commit_message or "End of training"
    return push_team(trainer, repo_id, single_repo, message, private, token, revision, dataset_name, tags)
