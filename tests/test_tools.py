"""Tools and environments for teams: TRL's real parser and tool-calling loop run per agent, on a tiny model that was
fine-tuned to call the tools (`multiagent_trl.tools.testing`); no generation is mocked."""

import math
import threading

import pytest
import torch
from datasets import Dataset

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.tools.environments import shared_environment
from multiagent_trl.tools.testing import CALCULATOR_QUESTIONS, LOOKUP_QUESTIONS, add, capital, tiny_tool_caller_path

from .conftest import completion_ids_of, id_reward, recording, small_args

G = 4


@pytest.fixture(scope="module")
def tool_caller():
    return tiny_tool_caller_path()


def rows():
    """Row k asks agent 0 calculator question k and agent 1 lookup question k."""
    return Dataset.from_dict({"index": list(range(len(CALCULATOR_QUESTIONS)))})


FORMATTERS = [
    lambda row: [{"role": "user", "content": CALCULATOR_QUESTIONS[row["index"]][0]}],
    lambda row: [{"role": "user", "content": LOOKUP_QUESTIONS[row["index"]][0]}],
]


def args(tmp_path, **overrides):
    # A low temperature keeps the tiny model on the calls it learned; completions hold call, result and answer.
    settings = dict(max_completion_length=160, per_device_train_batch_size=2 * G, temperature=0.3, max_steps=1)
    return small_args(tmp_path, **{**settings, **overrides})


def batch():
    return [{"index": k} for k in range(len(CALCULATOR_QUESTIONS)) for _ in range(G)]


class Seen:
    """A reward function that keeps the conversations it was given (TRL style: `completions[j]` is the tuple)."""

    def __init__(self):
        self.completions = []
        self.__name__ = "seen"

    def __call__(self, prompts, completions, **kwargs):
        self.completions.extend(completions)
        return [1.0] * len(completions)


def tool_messages(conversation):
    return [m for m in conversation if m["role"] == "tool"]


def test_each_agent_runs_its_own_tools_and_their_results_are_out_of_the_loss(tmp_path, tool_caller):
    calls = [[], []]
    seen = Seen()
    trainer = MultiAgentGRPOTrainer(
        model=[tool_caller, tool_caller],
        reward_funcs=seen,
        args=args(tmp_path),
        train_dataset=rows(),
        formatters=FORMATTERS,
        tools=[[recording(add, calls[0])], [recording(capital, calls[1])]],  # one list per agent
    )
    output = trainer._generate_and_score_completions(batch())

    # Each agent called its own tool, with the arguments of its own questions (premise: both called at least once).
    assert calls[0] and calls[1]
    assert all(c in [a for _, a in CALCULATOR_QUESTIONS] for c in calls[0]), calls[0]
    assert all(c in [a for _, a in LOOKUP_QUESTIONS] for c in calls[1]), calls[1]
    # The joint reward saw each agent's final conversation, with its tool's result right after its call.
    for j, joint in enumerate(seen.completions):
        for agent, (tool, questions) in enumerate([(add, CALCULATOR_QUESTIONS), (capital, LOOKUP_QUESTIONS)]):
            conversation = joint[agent]
            call = conversation[0].get("tool_calls")
            if not call:
                continue
            arguments = call[0]["function"]["arguments"]
            assert call[0]["function"]["name"] == tool.__name__
            assert tool_messages(conversation)[0]["content"] == str(tool(**arguments))
            assert arguments == questions[j // G][1]  # row j // G asked this question
    # The tool results are in the completion tokens but out of the loss; the model's own tokens are in it.
    tokenizer = trainer.processing_class
    called = 0
    for agent in range(2):
        ids, mask = output[f"agent_{agent}/completion_ids"], output[f"agent_{agent}/completion_mask"]
        tool_mask = output[f"agent_{agent}/tool_mask"]
        for row in range(len(ids)):
            model_text = tokenizer.decode(ids[row][(mask[row] * tool_mask[row]).bool()])
            tool_text = tokenizer.decode(ids[row][(mask[row] * (1 - tool_mask[row])).bool()])
            if "<tool_response>" in tool_text:
                called += 1
                assert "<tool_call>" in model_text and "<tool_response>" not in model_text
    assert called > 0
    # TRL's tool metrics are logged per agent.
    metrics = trainer._agent_views[0]["_metrics"]["train"]
    assert metrics["tools/call_frequency"][-1] > 0


class Desk:
    """A shared environment: both agents' tool calls land in the same instance for one joint trajectory."""

    created = 0

    def __init__(self):
        Desk.created += 1
        self.actions = None

    def reset(self, **row):
        self.actions = []
        self.row = row["index"]

    def add(self, a: int, b: int, agent: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        self.actions.append((agent, "add", a, b))
        return a + b

    def capital(self, country: str, agent: int) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country's English name.
        """
        self.actions.append((agent, "capital", country))
        return capital(country)

    def get_reward(self) -> float:
        return float(len({action[0] for action in self.actions}))  # 2.0 when both agents acted


def test_a_shared_environment_sees_both_agents_actions_in_one_trajectory(tmp_path, tool_caller):
    seen = Seen()
    trainer = MultiAgentGRPOTrainer(
        model=[tool_caller, tool_caller],
        reward_funcs=seen,
        args=args(tmp_path),
        train_dataset=rows(),
        formatters=FORMATTERS,
        environment_factory=shared_environment(Desk),
    )
    assert trainer.reward_func_names == ["seen", "Desk"]
    inputs = batch()
    output = trainer._generate_and_score_completions(inputs)
    environments = trainer.environments
    assert len(environments) == len(inputs) and len({id(e) for e in environments}) == len(inputs)
    both = 0
    for j, environment in enumerate(environments):
        assert environment.row == inputs[j]["index"]  # reset once with its own row
        agents = {action[0] for action in environment.actions}
        # Each agent's calls carry its index and are the ones its completion made.
        for agent, conversation in enumerate(seen.completions[j]):
            made = [c["function"]["name"] for c in conversation[0].get("tool_calls") or []]
            assert [a[1] for a in environment.actions if a[0] == agent][: len(made)] == made
        both += agents == {0, 1}
    assert both > 0  # premise: some trajectories have both agents acting
    # The environment's reward (the number of agents that acted) is a reward column; TRL weighed it in (weight 1).
    expected = torch.tensor([float(len({a[0] for a in e.actions})) for e in environments])
    assert torch.allclose(trainer._metrics["train"]["rewards/Desk/mean"][-1] * torch.ones(1), expected.mean())
    assert output["agent_0/advantages"].shape == (len(inputs),)
    trainer.train()  # a real step runs with the environment
    assert trainer.state.global_step == 1


def test_tool_arguments_are_checked_at_construction(tmp_path, tool_caller):
    with pytest.raises(ValueError, match="`tools` has 3 entries for 2 agents"):
        MultiAgentGRPOTrainer(
            model=[tool_caller, tool_caller],
            reward_funcs=Seen(),
            args=args(tmp_path),
            train_dataset=rows(),
            formatters=FORMATTERS,
            tools=[[add], [capital], [add]],
        )
    with pytest.raises(NotImplementedError, match="shared_environment"):
        MultiAgentGRPOTrainer(
            model=[tool_caller, tool_caller],
            reward_funcs=Seen(),
            args=args(tmp_path),
            train_dataset=rows(),
            formatters=FORMATTERS,
            environment_factory={"desk": Desk},
        )


class Broken(Desk):
    """An environment whose reward is NaN."""

    def get_reward(self) -> float:
        return math.nan


def test_a_non_finite_environment_reward_fails_and_names_the_environment(tmp_path, tool_caller):
    trainer = MultiAgentGRPOTrainer(
        model=[tool_caller, tool_caller],
        reward_funcs=Seen(),
        args=args(tmp_path, max_completion_length=16),
        train_dataset=rows(),
        formatters=FORMATTERS,
        environment_factory=shared_environment(Broken),
    )
    with pytest.raises(ValueError, match=r"'Broken' returned nan for joint sample 0"):
        trainer.train()


def test_a_tree_rollout_gives_each_child_a_copy_of_the_environment_it_continues(tmp_path, tool_caller):
    """Tools and environments over two turns (MAGRPO's tree): each turn-2 row starts from a deep copy of the shared
    environment of the turn-1 joint sample it continues (its actions so far), and siblings do not share one."""
    snapshots = []

    def desk_log(prompts, completions, environments, **kwargs):
        snapshots.append([(id(e), list(e.actions)) for e in environments])
        return [1.0] * len(completions)

    def ask_again(row, histories, turn):
        return [formatter(row) for formatter in FORMATTERS]

    g = 2
    trainer = MultiAgentGRPOTrainer(
        model=[tool_caller, tool_caller],
        reward_funcs=desk_log,
        args=args(tmp_path, num_generations=g, per_device_train_batch_size=2 * g, num_turns=2),
        train_dataset=rows(),
        formatters=FORMATTERS,
        environment_factory=shared_environment(Desk),
        external_transition=ask_again,
    )
    output = trainer._generate_and_score_completions([{"index": k} for k in range(2) for _ in range(g)])
    first, second = snapshots
    assert len(first) == 2 * g and len(second) == 2 * g * g  # every turn-1 joint sample spawned a node of g rows
    assert len({identity for identity, _ in first + second}) == len(first) + len(second)  # no two rows share one
    assert any(actions for _, actions in first), "premise: the agents acted at turn 1"
    for c, (_, parent_actions) in enumerate(first):  # child node c continues turn-1 sample c
        for _, actions in second[c * g : (c + 1) * g]:
            assert actions[: len(parent_actions)] == parent_actions
    assert len(output["agent_0/advantages"]) == 2 * g + 2 * g * g


class LockedDesk(Desk):
    """A shared environment holding a lock, which `copy.deepcopy` cannot copy."""

    def reset(self, **row):
        super().reset(**row)
        self.lock = threading.Lock()


def test_a_tree_rollout_refuses_an_environment_it_cannot_copy(tmp_path, tool_caller):
    trainer = MultiAgentGRPOTrainer(
        model=[tool_caller, tool_caller],
        reward_funcs=Seen(),
        args=args(tmp_path, num_generations=2, per_device_train_batch_size=4, num_turns=2),
        train_dataset=rows(),
        formatters=FORMATTERS,
        environment_factory=shared_environment(LockedDesk),
        external_transition=lambda row, histories, turn: [formatter(row) for formatter in FORMATTERS],
    )
    with pytest.raises(TypeError, match=r"`copy.deepcopy` failed on LockedDesk.*use `rollout='linear'`"):
        trainer._generate_and_score_completions([{"index": k} for k in range(2) for _ in range(2)])


class Tally:
    """An environment without tools; its reward is the order of its reset (mod 3), so it differs within a group."""

    resets = 0

    def reset(self, **row):
        Tally.resets += 1
        self.reward = float(Tally.resets % 3)

    def get_reward(self) -> float:
        return self.reward


def test_an_agent_without_an_environment_gets_no_reward_from_it(tmp_path, tiny_path, prompts_dataset):
    """Issue #28, 2: `environment_factory=[Tally, None]` scores joint samples `[r, None]`, which once crashed the first
    batch. Agent 0 is credited with the joint reward plus its environment's, agent 1 with the joint reward alone."""
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=id_reward,
        args=small_args(tmp_path, num_agents=2, scale_rewards="none"),
        train_dataset=prompts_dataset,
        environment_factory=[Tally, None],
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions([prompts_dataset[i] for i in range(2) for _ in range(G)])
    joint = torch.tensor(id_reward(None, None, list(zip(*[completion_ids_of(output, a) for a in range(2)]))))
    environment = torch.tensor([e.get_reward() for e in trainer._agent_views[0]["environments"]])
    assert trainer._agent_views[1]["environments"] is None and len(set(environment.tolist())) > 1
    for agent, reward in ((0, joint + environment), (1, joint)):
        grouped = reward.view(-1, G)
        expected = (grouped - grouped.mean(1, keepdim=True)).flatten()
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], expected)
    # The environment's column of the team's reward is the mean over the agents it scored: agent 0's.
    assert trainer._metrics["train"]["rewards/Tally/mean"] == [pytest.approx(environment.mean().item())]
