"""Code rewards: a helper agent and a main agent write one program, scored by the problem's tests in a `Sandbox`.

The task is MAGRPO's cooperative coding setup: for a problem (a function signature and docstring, with tests),
agent 0 writes a helper function (`aux` by default) and agent 1 writes the function itself, which may call the
helper. The two are composed into one program (the problem's imports, the helper, the main function) and run
against the tests. `CodeTeam` gives everything a trainer needs:

```python
from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.rewards.code import CodeTeam
from multiagent_trl.rewards.sandbox import Sandbox

team = CodeTeam(Sandbox(timeout=4.0))
trainer = MultiAgentGRPOTrainer(
    model=...,
    args=MultiAgentGRPOConfig(output_dir="out", num_agents=2, num_turns=2),
    train_dataset=humaneval,  # columns: prompt, test, entry_point (HumanEval's)
    formatters=team.formatters,  # the helper's and the main's prompts
    reward_funcs=team.code_reward,  # TRL style: one `run_many` call per batch
    external_transition=team.transition,  # turn 2's prompts carry the test results of the team's program
)
```

Reward levels of a joint sample (the defaults of `CodeTeam(levels=...)`, 4.5 at most):

| level                                                   | reward added |
|---------------------------------------------------------|--------------|
| both parts parse and the main part defines the function | `syntax` 1.0 |
| the program runs (imports and test setup raise nothing) | `runs` 1.0   |
| fraction of the tests passed                            | `tests` 2.0 x fraction |
| the main function calls the helper, and some test passes | `helper_call` 0.5 |

Each level counts only when the one above it was reached. The bonus for calling the helper needs a passing test, so
that calling a useless helper does not pay.

Writing your own reward on `Sandbox`: score a whole batch with one `run_many` call, so that the jobs run in
parallel, and map each `ExecutionResult` to a number:

```python
sandbox = Sandbox(timeout=4.0)

def pass_rate(prompts, completions, test, entry_point, **kwargs):
    jobs = [(helper + "\\n\\n" + main, t, e) for (helper, main), t, e in zip(completions, test, entry_point)]
    return [result.fraction for result in sandbox.run_many(jobs)]
```
"""

from __future__ import annotations

import ast
import re
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .sandbox import ExecutionResult, Job, Sandbox

PROBLEM = "Problem:\n"  # CodeTeam's prompts: the problem follows this line ...
PREVIOUS = "\n\nYour previous "  # ... and ends before a turn-2 prompt's previous code
_FENCE = re.compile(r"```(?:[A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class CodeLevels:
    """What each level of the code reward adds; see the module docstring."""

    syntax: float = 1.0
    runs: float = 1.0
    tests: float = 2.0
    helper_call: float = 0.5

    @property
    def maximum(self) -> float:
        return self.syntax + self.runs + self.tests + self.helper_call


def extract_code(completion: Any) -> str:
    """The code in a completion: the first fenced block if there is one, else the text; a conversation's last message.

    >>> extract_code("Here:\\n```python\\ndef aux(x):\\n    return x\\n```\\nDone.")
    'def aux(x):\\n    return x\\n'
    >>> extract_code([{"role": "assistant", "content": "x = 1"}])
    'x = 1'
    """
    if isinstance(completion, list):  # conversational: the last message's content
        completion = completion[-1]["content"] if completion else ""
    text = str(completion)
    match = _FENCE.search(text)
    return match.group(1) if match else text


def parses(code: str) -> ast.Module | None:
    """The syntax tree of `code`, or None when it does not parse (parsing runs nothing)."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def defined_functions(tree: ast.Module | None) -> dict[str, ast.FunctionDef]:
    """Top-level functions of a module, by name."""
    if tree is None:
        return {}
    return {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def calls(function: ast.AST, name: str) -> bool:
    """Whether `function` calls `name(...)` anywhere in its body.

    >>> calls(ast.parse("def f(x):\\n    return aux(x) + 1").body[0], "aux")
    True
    """
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name
        for node in ast.walk(function)
    )


def prompt_imports(prompt: str) -> str:
    """The import lines of a problem's text before its first function (HumanEval's `from typing import List`), to
    prefix programs; the text around the problem (instructions) may be anything.

    >>> prompt_imports("Solve this.\\nfrom typing import List\\n\\n\\ndef f(xs: List[int]) -> int:\\n    import os")
    'from typing import List'
    """
    imports = []
    for line in prompt.splitlines():
        if line.startswith(("def ", "async def ", "class ")):
            break
        if line.startswith(("import ", "from ")):
            tree = parses(line)
            if tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], (ast.Import, ast.ImportFrom)):
                imports.append(line)
    return "\n".join(imports)


def problem_text(prompt: Any) -> str:
    """The problem in a prompt `CodeTeam` wrote (between its `PROBLEM` marker and `PREVIOUS`), else the whole text."""
    if isinstance(prompt, (tuple, list)) and prompt and isinstance(prompt[0], dict):  # a conversation
        prompt = "\n".join(str(message.get("content", "")) for message in prompt)
    text = str(prompt)
    if PROBLEM in text:
        text = text.split(PROBLEM, 1)[1]
    return text.split(PREVIOUS, 1)[0]


@dataclass(frozen=True)
class TeamProgram:
    """A helper and a main part composed into one program, and what static checks found."""

    program: str
    syntax_ok: bool  # both parts parse and the main part defines the entry point
    calls_helper: bool  # the entry point calls the helper, which the helper part defines


class CodeTeam:
    """Prompts, joint reward and multi-turn transition for a helper agent (agent 0) and a main agent (agent 1).

    Args:
        sandbox (`Sandbox`, *optional*): runs the programs; defaults to `Sandbox(timeout=4.0)` (bubblewrap).
        helper_name (`str`, defaults to `"aux"`): the helper function's name.
        levels (`CodeLevels`, *optional*): what each reward level adds (see the module docstring).
        feedback_chars (`int`, defaults to 600): the longest test report a turn-2 prompt carries.
        cache_size (`int`, defaults to 4096): results kept, so that the transition reuses the reward's runs of
            the same programs instead of running them again (programs are assumed deterministic).

    The dataset needs HumanEval's columns: `prompt` (signature and docstring), `test` (a `check(candidate)` function
    or assert lines) and `entry_point` (the function's name).
    """

    def __init__(
        self,
        sandbox: Sandbox | None = None,
        helper_name: str = "aux",
        levels: CodeLevels | None = None,
        feedback_chars: int = 600,
        cache_size: int = 4096,
    ):
        if sandbox is not None and not isinstance(sandbox, Sandbox):
            raise TypeError(f"`sandbox` must be a multiagent_trl.sandbox.Sandbox; got {type(sandbox).__name__}.")
        if not helper_name.isidentifier():
            raise ValueError(f"`helper_name` must be a Python identifier; got {helper_name!r}.")
        self.sandbox = sandbox if sandbox is not None else Sandbox(timeout=4.0)
        self.helper_name = helper_name
        self.levels = levels or CodeLevels()
        self.feedback_chars = feedback_chars
        self.cache_size = cache_size
        self._cache: OrderedDict[Job, ExecutionResult] = OrderedDict()

    # ------------------------------------------------------------------ prompts

    def helper_prompt(self, row: dict[str, Any]) -> str:
        """Agent 0's prompt: write the helper for this problem."""
        return (
            f"Write a short Python helper function named `{self.helper_name}` that would help implement the function "
            f"below. Write only the `{self.helper_name}` function in a ```python block.\n\n{PROBLEM}{row['prompt']}"
        )

    def main_prompt(self, row: dict[str, Any]) -> str:
        """Agent 1's prompt: write the function, which may call the helper."""
        return (
            f"Implement the function `{row['entry_point']}` below in Python. A teammate writes a helper function "
            f"`{self.helper_name}` that you may call. Write the complete function in a ```python block.\n\n"
            f"{PROBLEM}{row['prompt']}"
        )

    @property
    def formatters(self) -> list[Callable[[dict[str, Any]], str]]:
        """`[helper_prompt, main_prompt]`, for the trainer's `formatters=`."""
        return [self.helper_prompt, self.main_prompt]

    # ------------------------------------------------------------------ programs and runs

    def compose(self, helper: Any, main: Any, prompt: str, entry_point: str) -> TeamProgram:
        """One program from the two completions: the prompt's imports, the helper, the main function.

        A main part that does not define `entry_point` but completes the prompt's function body (HumanEval's
        completion style) is appended to the prompt instead.
        """
        helper_code, main_code = extract_code(helper), extract_code(main)
        main_tree = parses(main_code)
        first_line = next((line for line in main_code.splitlines() if line.strip()), "")
        continues_body = first_line[:1] in (" ", "\t")  # an indented body for the prompt's own `def`
        if (
            continues_body
            and entry_point not in defined_functions(main_tree)
            and entry_point in defined_functions(parses(prompt + main_code))
        ):
            main_code = prompt + main_code
            main_tree = parses(main_code)
        helper_tree = parses(helper_code)
        main_function = defined_functions(main_tree).get(entry_point)
        syntax_ok = helper_tree is not None and main_function is not None
        calls_helper = (
            syntax_ok and self.helper_name in defined_functions(helper_tree) and calls(main_function, self.helper_name)
        )
        program = "\n\n\n".join(
            part for part in (prompt_imports(prompt), helper_code.strip(), main_code.strip()) if part
        )
        return TeamProgram(program + "\n", syntax_ok, calls_helper)

    def run(self, jobs: Sequence[Job]) -> list[ExecutionResult]:
        """Results of `jobs`, from the cache where they ran before, the others in one `run_many` call."""
        missing = list(dict.fromkeys(job for job in jobs if job not in self._cache))
        for job, result in zip(missing, self.sandbox.run_many(missing) if missing else []):
            self._cache[job] = result
        results = []
        for job in jobs:
            self._cache.move_to_end(job)
            results.append(self._cache[job])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return results

    def status_counts(self) -> dict[str, int]:
        """How many of the distinct programs run lately (the cache's) ended in each status."""
        return dict(Counter(result.status for result in self._cache.values()))

    def score(self, team: TeamProgram, result: ExecutionResult) -> float:
        """The reward levels reached by one composed program and its run."""
        levels = self.levels
        if not team.syntax_ok or result.status == "syntax_error":
            return 0.0
        reward = levels.syntax
        if result.status not in ("passed", "failed"):
            return reward
        reward += levels.runs + levels.tests * result.fraction
        if team.calls_helper and result.tests_passed > 0:
            reward += levels.helper_call
        return reward

    # ------------------------------------------------------------------ the trainer's hooks

    def code_reward(
        self, prompts: list, completions: list, test: list[str], entry_point: list[str], **kwargs
    ) -> list[float]:
        """TRL-style joint reward: `completions[j]` is (helper, main); `test`, `entry_point` are dataset columns.

        The problem (for its imports) is read from the main agent's prompt, `prompts[j][1]`; every program of the
        batch runs in one `Sandbox.run_many` call.
        """
        if completions and (not isinstance(completions[0], (tuple, list)) or len(completions[0]) != 2):
            raise ValueError("`CodeTeam.code_reward` scores two agents (helper, main); use num_agents=2.")
        problems = [problem_text(p[-1] if isinstance(p, tuple) else p) for p in prompts]
        teams = [
            self.compose(helper, main, problem, entry)
            for (helper, main), problem, entry in zip(completions, problems, entry_point)
        ]
        results = self.run([Job(t.program, tests, entry) for t, tests, entry in zip(teams, test, entry_point)])
        return [self.score(team, result) for team, result in zip(teams, results)]

    def transition(self, row: dict[str, Any], histories: list[list[Any]], turn: int) -> list[str]:
        """Native multi-turn transition: each agent's next prompt is its first prompt, its last code, and the test
        report of the team's program (which tests failed, the error), cut to `feedback_chars`."""
        helper, main = histories[0][-1], histories[1][-1]
        team = self.compose(helper, main, row["prompt"], row["entry_point"])
        (result,) = self.run([Job(team.program, row["test"], row["entry_point"])])
        report = self.feedback(team, result)
        return [
            f"{self.helper_prompt(row)}{PREVIOUS}helper:\n```python\n{extract_code(helper).strip()}\n```\n"
            f"{report}\nWrite an improved `{self.helper_name}`.\n",
            f"{self.main_prompt(row)}{PREVIOUS}function:\n```python\n{extract_code(main).strip()}\n```\n"
            f"{report}\nWrite an improved `{row['entry_point']}`.\n",
        ]

    def feedback(self, team: TeamProgram, result: ExecutionResult) -> str:
        """A short test report of the team's program, as the next turn's prompt shows it."""
        if not team.syntax_ok:
            text = f"The team's code is incomplete: it must define `{self.helper_name}` and the main function."
        elif result.status in ("passed", "failed"):
            text = f"Tests of the team's program: {result.tests_passed}/{result.tests_total} passed."
            if result.failed_tests:
                text += "\nFailed:\n" + "\n".join(result.failed_tests[:3])
            if result.error:
                text += f"\nError: {result.error}"
        else:
            text = f"The team's program did not run ({result.status}): {result.error}"
        return _truncate(text, self.feedback_chars)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["CodeLevels", "CodeTeam", "TeamProgram", "extract_code", "problem_text"]
