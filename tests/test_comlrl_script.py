"""The CoMLRL-style script `benchmarks/comlrl_script.py` (which runs under comlrl==1.4.3) runs under multiagent_trl
with only its two import lines changed."""

from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "comlrl_script.py"
COMLRL_IMPORTS = (
    "from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer\n"
    "from comlrl.utils.reward_processor import RewardProcessors\n"
)
OUR_IMPORTS = "from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, RewardProcessors\n"


def test_comlrl_script_runs_with_only_its_imports_changed(tmp_path, tiny_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    source = SCRIPT.read_text()
    assert source.count(COMLRL_IMPORTS) == 1
    namespace = {"__name__": "comlrl_script"}
    exec(compile(source.replace(COMLRL_IMPORTS, OUR_IMPORTS), str(SCRIPT), "exec"), namespace)
    import wandb

    try:
        trainer, metrics = namespace["main"](tiny_path, str(tmp_path))
        assert wandb.run.config["dataset"] == {"name": "names", "type": "toy"}
        # In wandb the evaluation metrics carry CoMLRL's own names (Trainer's `eval_` becomes `eval/` there).
        summary = wandb.run.summary
        assert summary["eval/turn_2/expected_return"] == metrics["eval_turn_2/expected_return"]
        assert {"eval/turn_1/length_error", "eval/turn_1/reward_mean"} <= set(summary.keys())
    finally:
        wandb.finish()

    args = trainer.args
    assert (args.advantage_baseline, args.scale_rewards, args.top_k) == ("leave_one_out", "none", 0)
    assert (args.per_device_train_batch_size, args.steps_per_generation) == (1 * 2, 2)  # train_batch_size=1 of 2
    assert args.agent_devices == ["cpu", "cpu"] and not trainer.verbose
    # CoMLRL's evaluation metrics: per turn, the rewards and returns, and the aggregator's.
    for turn in (1, 2):
        for name in ("reward_mean", "expected_return", "length_error"):
            assert f"eval_turn_{turn}/{name}" in metrics, sorted(metrics)
    assert metrics["eval_turn_1/reward_mean"] >= 0 and metrics["eval_turn_2/length_error"] >= 0
    logged = [h for h in trainer.state.log_history if "eval_turn_1/length_error" in h]
    assert len(logged) >= 2  # before training and every eval_interval steps
    # One checkpoint kept (checkpoint_total_limit=1) and the final models, loadable.
    assert len(list((tmp_path / "checkpoints").glob("checkpoint-*"))) == 1
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(tmp_path / "final" / f"agent_{i}").config.model_type == "qwen2"


TWO_TURN_SCRIPT = Path(__file__).parent.parent / "benchmarks" / "comlrl_two_turn_script.py"
TWO_TURN_IMPORTS = "from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer\n"


def run_two_turn_script(imports: str, tiny_path: str):
    source = TWO_TURN_SCRIPT.read_text()
    assert source.count(TWO_TURN_IMPORTS) == 1
    namespace = {"__name__": "two_turn_script"}
    exec(compile(source.replace(TWO_TURN_IMPORTS, imports), str(TWO_TURN_SCRIPT), "exec"), namespace)
    return namespace["main"](tiny_path)


def test_two_turn_script_runs_under_both_libraries(tmp_path, tiny_path, monkeypatch):
    """A CoMLRL project's multi-turn script (a feedback transition, a reward reading element [0]) runs with only its
    imports changed, and plays CoMLRL's tree: both libraries call the reward once per joint sample of every node
    (2 prompts x (G + G*G) = 12 at G=2) and the transition once per joint sample of turn 1 (2 x G = 4)."""
    monkeypatch.chdir(tmp_path)  # both write under the config's default output_dir
    trainer, calls = run_two_turn_script("from multiagent_trl import MAGRPOConfig, MAGRPOTrainer\n", tiny_path)
    assert calls == {"reward": 12, "transition": 4}
    assert trainer.state.global_step == 1 and trainer.args.rollout == "tree"
    logged = trainer.state.log_history[0]
    assert {"turn_1/reward_mean", "turn_2/reward_mean", "turn_2/expected_return"} <= set(logged)
    pytest.importorskip("comlrl", reason="CoMLRL's half needs comlrl==1.4.3 (the dev extra installs it)")
    _, comlrl_calls = run_two_turn_script(TWO_TURN_IMPORTS, tiny_path)
    assert comlrl_calls == calls
