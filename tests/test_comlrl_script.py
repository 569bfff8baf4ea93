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
