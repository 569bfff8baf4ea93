"""Centralized MAGRPO: one model writes every role. The tagged adapter's prompt and parse and the
collaboration's reward equal CoMLRL 1.4.3's own; a CoMLRL script trains with only its imports changed; the core
trains the same way with one agent; bad arguments raise at construction."""

import dataclasses
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from multiagent_trl import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    MAGRPOConfig,
    MultiAgentGRPOTrainer,
    TaggedCentralizedComparatorAdapter,
)
from multiagent_trl.rewards.centralized import CentralizedCollaboration

from .conftest import changed, small_args, snapshot

comlrl_preference = pytest.importorskip("comlrl.trainers.preference", reason="parity needs comlrl==1.4.3")
from comlrl.trainers.preference.collaboration import CentralizedCollaboration as ComlrlCollaboration  # noqa: E402

ComlrlTagged = comlrl_preference.TaggedCentralizedComparatorAdapter
ComlrlParseError = comlrl_preference.CentralizedComparatorParseError

ROLE_PROMPTS = [
    ["Write a haiku."],
    ["Name a color:", "Describe it in two words:"],
    ["", "line one\nline two\n", "Ünïcode {braces} <agent_0> and 100%"],
]
COMPLETIONS = [
    "<agent_0>red</agent_0><agent_1>warm and bright</agent_1>",
    "<AGENT_1>\n  second \n</Agent_1> then < agent_0 >first</ agent_0 >",  # case, spaces, order
    "<agent_0>only the first</agent_0>",  # a missing role is ""
    "<agent_1>b</agent_1><agent_1>b again</agent_1>",  # the first section wins
    "<agent_0>a<agent_1>nested</agent_1></agent_0>",
    "<agent_0>unclosed",  # no complete section: a parse error
    "no tags at all",
    "",
]


# ---------------------------------------------------------------------------------------------- 1. the adapter


@pytest.mark.parametrize("prompts", ROLE_PROMPTS)
def test_tagged_prompt_is_comlrls_text(prompts):
    ours = TaggedCentralizedComparatorAdapter().build_prompt({"prompt": "unused"}, prompts)
    assert ours == ComlrlTagged().build_prompt({"prompt": "unused"}, prompts)
    assert ours.endswith(f"</agent_{len(prompts) - 1}>\n")


@pytest.mark.parametrize("completion", COMPLETIONS)
@pytest.mark.parametrize("num_agents", [1, 2, 3])
def test_tagged_parse_is_comlrls(completion, num_agents):
    try:
        expected = list(ComlrlTagged().parse_completion(completion, {}, num_agents))
    except ComlrlParseError:
        with pytest.raises(CentralizedComparatorParseError):
            TaggedCentralizedComparatorAdapter().parse_completion(completion, {}, num_agents)
        return
    assert TaggedCentralizedComparatorAdapter().parse_completion(completion, {}, num_agents) == expected


def test_the_adapters_satisfy_the_protocol():
    assert isinstance(TaggedCentralizedComparatorAdapter(), CentralizedComparatorAdapter)
    assert issubclass(CentralizedComparatorParseError, ValueError)
    assert not isinstance(object(), CentralizedComparatorAdapter)


# ---------------------------------------------------------------------------------------------- 2. the reward


def per_role_lists(completions1, completions2):
    """CoMLRL style, one list per role: rewards the roles' lengths differently, so that a swap of roles shows."""
    return [len(a) + 10 * len(b) for a, b in zip(completions1, completions2)]


def prompts_first(prompts, completions1, completions2):
    return [len(prompts[0]) + len(a) - len(b) for a, b in zip(completions1, completions2)]


def with_rows(completions1, completions2, *, batch_items=None, prompts=None):
    return [
        batch_items[0]["target"] * len(a) + len(prompts[0]) + 0.5 * len(b) for a, b in zip(completions1, completions2)
    ]


REWARDS = [per_role_lists, prompts_first, with_rows]
ITEMS = [{"prompt": "Tell a joke:", "target": 3}, {"prompt": "Name a bird:", "target": 5}]
ROLE_FORMATTERS = [lambda item: "A: " + item["prompt"], lambda item: "B: " + item["prompt"] + " (short)"]


@pytest.mark.parametrize("reward", REWARDS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("formatters", [None, ROLE_FORMATTERS], ids=["default", "per-role"])
def test_collaboration_reward_is_comlrls(reward, formatters):
    completions = COMPLETIONS  # parse failures included
    ours = CentralizedCollaboration(TaggedCentralizedComparatorAdapter(), formatters, reward, 2)
    theirs = ComlrlCollaboration(ComlrlTagged(), formatters, reward, 2)
    for item in ITEMS:
        expected = theirs(completions, batch_items=[item])
        assert ours(completions, batch_items=[item]) == pytest.approx(expected)
        assert ours.build_prompt(item) == theirs.build_prompt(item)
    # One row per completion, as the core hands them.
    rows = [ITEMS[j % 2] for j in range(len(completions))]
    assert ours(completions, batch_items=rows) == pytest.approx(theirs(completions, batch_items=rows))
    # A completion without any section is scored with every role "" (not skipped, not an error).
    assert ours(["no tags"], batch_items=[ITEMS[0]]) == pytest.approx(
        theirs(["<agent_0></agent_0>"], batch_items=[ITEMS[0]])  # both roles "" there too
    )


def test_collaboration_needs_one_reward_per_joint_completion():
    def two_values(completions1, completions2):
        return [1.0, 2.0]

    def per_role(completions1, completions2):
        return [[1.0, 2.0]]

    for reward in (two_values, per_role):
        ours = CentralizedCollaboration(TaggedCentralizedComparatorAdapter(), None, reward, 2)
        with pytest.raises(ValueError, match="one"):
            ours(["<agent_0>a</agent_0>"], batch_items=[ITEMS[0]])
    with pytest.raises(ValueError):  # CoMLRL refuses the first too (the second is not a list of floats there)
        ComlrlCollaboration(ComlrlTagged(), None, two_values, 2)(["<agent_0>a</agent_0>"], batch_items=[ITEMS[0]])
    # A number alone is one reward, as CoMLRL reads it; the reward range is the user function's.
    scalar = CentralizedCollaboration(TaggedCentralizedComparatorAdapter(), None, lambda c1, c2: 0.5, 2)
    assert scalar(["x"], batch_items=[ITEMS[0]]) == [0.5]

    def bounded(completions1, completions2):
        return [2.0]

    bounded.reward_range = (0.0, 1.0)
    ours = CentralizedCollaboration(TaggedCentralizedComparatorAdapter(), None, bounded, 2)
    assert ours.reward_range == ComlrlCollaboration(ComlrlTagged(), None, bounded, 2).reward_range == (0.0, 1.0)
    with pytest.raises(ValueError, match="reward_range"):
        ours(["x"], batch_items=[ITEMS[0]])


def test_split_eval_is_comlrls_layout():
    ours = CentralizedCollaboration(TaggedCentralizedComparatorAdapter(), None, per_role_lists, 2)
    theirs = ComlrlCollaboration(ComlrlTagged(), None, per_role_lists, 2)
    joint = [[[COMPLETIONS[0]], [COMPLETIONS[6]]]]  # one writer, two rows, one turn
    assert (
        ours.split_eval(joint, ITEMS)
        == theirs.split_eval(joint, ITEMS)
        == [[["red"], [""]], [["warm and bright"], [""]]]
    )


# ---------------------------------------------------------------------------------------------- 3. training

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "comlrl_centralized_script.py"
COMLRL_IMPORTS = (
    "from comlrl.trainers.preference import TaggedCentralizedComparatorAdapter\n"
    "from comlrl.trainers.reinforce import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer\n"
)
OUR_IMPORTS = (
    "from multiagent_trl import CentralizedMAGRPOConfig, CentralizedMAGRPOTrainer, "
    "TaggedCentralizedComparatorAdapter\n"
)


def run_script(imports: str, tiny_path: str, output_dir: Path):
    source = SCRIPT.read_text()
    assert source.count(COMLRL_IMPORTS) == 1
    namespace = {"__name__": "centralized_script"}
    exec(compile(source.replace(COMLRL_IMPORTS, imports), str(SCRIPT), "exec"), namespace)
    return namespace["main"](tiny_path, str(output_dir))


def test_comlrl_script_trains_with_only_its_imports_changed(tmp_path, tiny_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # CoMLRL's default output folders land here
    trainer, seen = run_script(OUR_IMPORTS, tiny_path, tmp_path / "ours")
    # One model, trained on both roles' reward; the user's config keeps the role count.
    assert trainer.num_agents == 1 and trainer.num_roles == 2 and trainer.args.num_agents == 1
    assert trainer.state.global_step == 1
    # 2 prompts x G=2 joint completions, each split and scored with its row; evaluation saw [role][item][turn].
    assert seen["train_reward_calls"] == 4
    assert {topic for _, _, topic in seen["parsed"]} == {"color", "animal"}
    assert seen["eval_layout"] == [[1, 1], [1, 1]]
    metrics = trainer.state.log_history
    assert any("eval_turn_1/total_length" in h for h in metrics)
    # The weights changed, and save_model wrote a loadable model (CoMLRL's layout: final/agent_0).
    initial = AutoModelForCausalLM.from_pretrained(tiny_path)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "ours" / "final" / "agent_0")
    assert changed(snapshot(initial), trained)
    assert changed(snapshot(initial), trained) == {name for name, _ in initial.named_parameters()}
    # The same file under CoMLRL: the same number of reward calls and the same evaluation layout.
    _, theirs = run_script(COMLRL_IMPORTS, tiny_path, tmp_path / "comlrl")
    assert {k: theirs[k] for k in ("train_reward_calls", "eval_layout")} == {
        k: seen[k] for k in ("train_reward_calls", "eval_layout")
    }
    assert (tmp_path / "comlrl" / "final" / "agent_0").is_dir()


def test_the_core_trains_a_centralized_team_of_one(tmp_path, tiny_path, prompts_dataset):
    """The module docstring's recipe: `MultiAgentGRPOTrainer` with one agent, the collaboration as formatter and
    reward; the reward sees each joint completion's roles and its row."""
    seen = []

    def halves(completion, item, num_agents):
        half = len(completion) // 2
        return [completion[:half], completion[half:]]

    class Halves(TaggedCentralizedComparatorAdapter):
        def parse_completion(self, completion, batch_item, num_agents):
            return halves(completion, batch_item, num_agents)

    def reward(completions1, completions2, *, batch_items):
        seen.append((completions1, completions2, batch_items))
        return [len(a) - 2.0 * len(b) + batch_items[0]["target"] for a, b in zip(completions1, completions2)]

    team = CentralizedCollaboration(Halves(), None, reward, num_roles=2)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=team,
        formatters=team.build_prompt,
        train_dataset=prompts_dataset,
        args=small_args(tmp_path, num_agents=1, max_steps=1),
    )
    before = snapshot(trainer.model)
    trainer.train()
    assert changed(before, trainer.model)
    assert len(seen) == 8  # 2 prompts x G=4, one call per joint completion
    assert all(row["prompt"] in prompts_dataset["prompt"] for _, _, rows in seen for row in rows)
    assert "rewards/reward/mean" in trainer.state.log_history[0]


# ---------------------------------------------------------------------------------------------- 4. bad arguments


class NoParse:
    def build_prompt(self, batch_item, agent_prompts):
        return "joint"


def bad_cases(tiny_path, tmp_path):
    args = CentralizedMAGRPOConfig(output_dir=str(tmp_path), report_to="none")
    three_roles = CentralizedMAGRPOConfig(output_dir=str(tmp_path), report_to="none", num_agents=3)
    tagged = TaggedCentralizedComparatorAdapter()
    base = dict(agent_model=tiny_path, reward_func=per_role_lists, args=args, centralized_adapter=tagged)
    magrpo = MAGRPOConfig(output_dir=str(tmp_path), report_to="none", num_turns=1)
    return {
        "missing adapter": ({**base, "centralized_adapter": None}, TypeError, "centralized_adapter"),
        "adapter without parse_completion": (
            {**base, "centralized_adapter": NoParse()},
            TypeError,
            "parse_completion",
        ),
        "two agents": ({**base, "agent_model": None, "agents": [tiny_path, tiny_path]}, ValueError, "exactly one"),
        "num_agents mismatch": ({**base, "args": three_roles}, ValueError, "num_agents"),
        "a decentralized config": ({**base, "args": magrpo}, ValueError, "collaboration_mode"),
        "two tokenizers": ({**base, "tokenizer": [None, None]}, ValueError, "one tokenizer"),
        "no reward": ({**base, "reward_func": None}, ValueError, "reward_func"),
    }


CASES = [
    "missing adapter",
    "adapter without parse_completion",
    "two agents",
    "num_agents mismatch",
    "a decentralized config",
    "two tokenizers",
    "no reward",
]


@pytest.mark.parametrize("case", CASES)
def test_bad_arguments_raise_at_construction(case, tiny_path, tmp_path):
    kwargs, error, match = bad_cases(tiny_path, tmp_path)[case]
    with pytest.raises(error, match=match):
        CentralizedMAGRPOTrainer(**kwargs)


def test_config_keeps_one_turn_and_centralized():
    config = CentralizedMAGRPOConfig(report_to="none")
    assert (config.num_turns, config.collaboration_mode, config.num_agents) == (1, "centralized", 2)
    # Every field of CoMLRL's config, with its default.
    from comlrl.trainers.reinforce import CentralizedMAGRPOConfig as Reference

    names = {f.name for f in dataclasses.fields(CentralizedMAGRPOConfig)}
    assert {f.name for f in dataclasses.fields(Reference)} <= names
    with pytest.raises(ValueError, match="num_turns"):
        CentralizedMAGRPOConfig(report_to="none", num_turns=2)
    with pytest.raises(ValueError, match="collaboration_mode"):
        CentralizedMAGRPOConfig(report_to="none", collaboration_mode="decentralized")
    # A config changed after construction is refused by the trainer too, naming the field.
    config.num_turns = 2
    with pytest.raises(ValueError, match="num_turns"):
        CentralizedMAGRPOTrainer(
            centralized_adapter=TaggedCentralizedComparatorAdapter(),
            agent_model="unused",
            reward_func=per_role_lists,
            args=config,
        )
    # The per-agent settings are the one model's: one learning rate, not one per role.
    assert CentralizedMAGRPOConfig(report_to="none", agent_learning_rates=[1e-4]).agent_learning_rates == [1e-4]
    with pytest.raises(ValueError, match="agent_learning_rates"):
        CentralizedMAGRPOConfig(report_to="none", agent_learning_rates=[1e-4, 2e-4])
