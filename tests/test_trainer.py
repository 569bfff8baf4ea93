"""Training a team: which parameters move, per-agent learning rates and gradients, heterogeneous agents, saving."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOTrainer

from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, MultiAgentGRPOTrainer

from .conftest import changed, length_ratio, small_args, snapshot


def test_every_agent_trains_and_logs_its_own_metrics(tmp_path, tiny_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, beta=0.05),
        train_dataset=prompts_dataset,
    )
    before = [snapshot(agent) for agent in trainer.model.agents]
    trainer.train()
    for i, agent in enumerate(trainer.model.agents):
        assert changed(before[i], agent) == set(before[i]), f"agent {i}: some parameters did not train"

    logs = trainer.state.log_history[0]
    for key in ("loss", "reward", "reward_std", "grad_norm", "num_tokens", "rewards/length_ratio/mean"):
        assert key in logs, key
    for i in range(2):
        for key in ("completions/mean_length", "kl", "entropy", "clip_ratio/region_mean", "grad_norm", "reward"):
            assert f"agent_{i}/{key}" in logs, f"agent_{i}/{key}"
    assert "agent_0/num_tokens" not in logs  # a trainer-wide counter, logged once
    # The team's grad norm is the norm of the agents' norms.
    norms = torch.tensor([logs["agent_0/grad_norm"], logs["agent_1/grad_norm"]])
    assert logs["grad_norm"] == torch.linalg.vector_norm(norms).item()


def test_gradients_stay_within_each_agent(tmp_path, tiny_path, prompts_dataset):
    """The team loss's gradient on agent i equals the gradient of agent i's own GRPO loss alone."""
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, gradient_checkpointing=False),
        train_dataset=prompts_dataset,
    )
    team = trainer.model
    team.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this test calls around
    batch = trainer._generate_and_score_completions([prompts_dataset[i] for i in range(2) for _ in range(4)])
    trainer._compute_loss(team, batch).backward()
    team_grads = [{n: p.grad.clone() for n, p in agent.named_parameters()} for agent in team.agents]

    for i in range(2):
        team.zero_grad(set_to_none=True)
        agent_batch = {k.split("/", 1)[1]: v for k, v in batch.items() if k.startswith(f"agent_{i}/")}
        with trainer._agent_view(i):
            GRPOTrainer._compute_loss(trainer, team, agent_batch).backward()
        for name, p in team.agents[i].named_parameters():
            torch.testing.assert_close(p.grad, team_grads[i][name], msg=name)
        assert all(g.abs().sum() > 0 for g in team_grads[i].values())  # all-zero gradients would match too
        assert all(p.grad is None for p in team.agents[1 - i].parameters())


def test_per_agent_learning_rates(tmp_path, tiny_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, agent_learning_rates=[1e-3, 0.0]),
        train_dataset=prompts_dataset,
    )
    before = [snapshot(agent) for agent in trainer.model.agents]
    trainer.train()
    assert changed(before[0], trainer.model.agents[0]) == set(before[0])
    assert changed(before[1], trainer.model.agents[1]) == set()  # learning rate 0: untouched
    groups = trainer.optimizer.param_groups
    assert sorted({(g["agent"], g["initial_lr"]) for g in groups}) == [(0, 1e-3), (1, 0.0)]


def test_heterogeneous_agents_train_save_and_load(tmp_path, tiny_path, tiny_llama_path, prompts_dataset):
    tokenizers = [AutoTokenizer.from_pretrained(p) for p in (tiny_path, tiny_llama_path)]
    trainer = MultiAgentGRPOTrainer(
        model=[tiny_path, AutoModelForCausalLM.from_pretrained(tiny_llama_path)],
        reward_funcs=length_ratio,
        processing_class=tokenizers,
        args=small_args(tmp_path, beta=0.1),  # beta > 0 with an in-memory agent: its reference is its initial copy
        train_dataset=prompts_dataset,
    )
    assert trainer.num_agents == 2
    before = [snapshot(agent) for agent in trainer.model.agents]
    trainer.train()
    for i, agent in enumerate(trainer.model.agents):
        assert changed(before[i], agent) == set(before[i])

    trainer.save_model(tmp_path / "saved")
    for i, (model_type, agent) in enumerate(zip(("qwen2", "llama"), trainer.model.agents)):
        loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved" / f"agent_{i}")
        tokenizer = AutoTokenizer.from_pretrained(tmp_path / "saved" / f"agent_{i}")
        assert loaded.config.model_type == model_type
        assert tokenizer("héllo 🙂")["input_ids"] == tokenizers[i]("héllo 🙂")["input_ids"]
        for name, p in agent.named_parameters():
            torch.testing.assert_close(loaded.get_parameter(name), p, rtol=0, atol=0, msg=name)
        # The loaded agent generates what the trained one does.
        inputs = tokenizer(["Tell a joke:"], return_tensors="pt")
        expected = agent.generate(**inputs, max_new_tokens=8, do_sample=False)
        assert torch.equal(loaded.generate(**inputs, max_new_tokens=8, do_sample=False), expected)


def test_evaluation_logs_joint_and_per_agent_metrics(tmp_path, tiny_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, per_device_eval_batch_size=4),
        train_dataset=prompts_dataset,
        eval_dataset=prompts_dataset.select(range(2)),
    )
    metrics = trainer.evaluate()
    for key in ("eval_loss", "eval_reward", "eval_agent_0/completions/mean_length", "eval_agent_1/reward"):
        assert key in metrics, key


@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_completions_table_shows_agents_side_by_side(tmp_path, tiny_path, prompts_dataset, joint_mode):
    import pandas as pd

    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, log_completions=True, max_steps=1, joint_mode=joint_mode),
        train_dataset=prompts_dataset,
    )
    trainer.train()
    table = pd.read_parquet(tmp_path / "out" / "completions" / "completions_00001.parquet")
    assert len(table) == 8
    for column in ("prompt", "completion", "length_ratio", "advantage", "agent_0/completion", "agent_1/advantage"):
        assert column in table.columns, column
    expected = length_ratio(list(table["agent_0/completion"]), list(table["agent_1/completion"]))
    assert list(table["length_ratio"]) == pytest.approx(expected, rel=1e-6)  # each row's own tuple (float32)
    assert table["completion"][0].startswith("[agent_0] ")


class LearningRates(TrainerCallback):
    """Records, after every optimizer step, the learning rate that each agent's parameters were updated with."""

    def __init__(self, agent_parameters):
        self.agent_parameters = agent_parameters
        self.rates = []

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        rates = []
        for params in self.agent_parameters:
            ids = {id(p) for p in params}
            rates.append({group["lr"] for group in optimizer.param_groups if ids & {id(p) for p in group["params"]}})
        self.rates.append(rates)


def test_a_users_optimizer_and_schedule_drive_every_agent(tmp_path, tiny_path, prompts_dataset):
    agents = [AutoModelForCausalLM.from_pretrained(tiny_path) for _ in range(2)]
    optimizer = torch.optim.AdamW(
        [p for agent in agents for p in agent.parameters()], lr=2e-3, betas=(0.8, 0.95), weight_decay=0.05
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (step + 1))
    rates = LearningRates([list(agent.parameters()) for agent in agents])
    trainer = MultiAgentGRPOTrainer(
        model=agents,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, max_steps=3),
        train_dataset=prompts_dataset,
        optimizers=(optimizer, schedule),
        callbacks=[rates],
    )
    before = [snapshot(agent) for agent in agents]
    trainer.train()
    # After step s the schedule sets 2e-3 / (s + 1), for every agent's parameters alike.
    assert rates.rates == [[{2e-3 / (s + 1)}] * 2 for s in range(1, 4)]
    assert [log["learning_rate"] for log in trainer.state.log_history[:3]] == [2e-3 / (s + 1) for s in range(3)]
    for group in optimizer.param_groups:  # the user's hyperparameters, not Trainer's defaults
        assert group["betas"] == (0.8, 0.95) and group["weight_decay"] == 0.05 and group["initial_lr"] == 2e-3
    for i, agent in enumerate(agents):
        assert changed(before[i], agent) == set(before[i])


@pytest.mark.parametrize("given_optimizer", [False, True], ids=["trainers", "users"])
def test_an_agent_left_out_of_the_optimizer_is_named_in_a_warning(
    tmp_path, tiny_path, prompts_dataset, caplog, given_optimizer
):
    """An agent none of whose parameters the optimizer holds never trains: said once, when the optimizer is built,
    naming the agent (a frozen partner may be meant; a forgotten one is lost work)."""
    agents = [AutoModelForCausalLM.from_pretrained(tiny_path) for _ in range(2)]
    agents[0].requires_grad_(False)
    optimizers = (torch.optim.AdamW(agents[1].parameters(), lr=1e-3), None) if given_optimizer else (None, None)
    trainer = MultiAgentGRPOTrainer(
        model=agents,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, max_steps=1),
        train_dataset=prompts_dataset,
        optimizers=optimizers,
    )
    before = [snapshot(agent) for agent in agents]
    with caplog.at_level("WARNING", logger="multiagent_trl"):
        trainer.train()
    left_out = [r.getMessage() for r in caplog.records if "no parameter in the optimizer" in r.getMessage()]
    assert len(left_out) == 1 and left_out[0].startswith("Agent 0 ")
    assert changed(before[0], agents[0]) == set() and changed(before[1], agents[1]) == set(before[1])


def test_a_users_schedule_and_agent_learning_rates_are_refused(tmp_path, tiny_path, prompts_dataset):
    agents = [AutoModelForCausalLM.from_pretrained(tiny_path) for _ in range(2)]
    optimizer = torch.optim.AdamW([p for agent in agents for p in agent.parameters()], lr=2e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(ValueError, match="`agent_learning_rates` .* `optimizers=`"):
        MultiAgentGRPOTrainer(
            model=agents,
            reward_funcs=length_ratio,
            args=small_args(tmp_path, agent_learning_rates=[1e-3, 2e-3]),
            train_dataset=prompts_dataset,
            optimizers=(optimizer, schedule),
        )


@pytest.mark.parametrize("trainer_class", [MultiAgentGRPOTrainer, MAGRPOTrainer])
def test_cross_mode_evaluates_one_completion_per_prompt(tmp_path, tiny_path, prompts_dataset, trainer_class):
    if trainer_class is MAGRPOTrainer:  # CoMLRL's defaults: num_generations_eval=1
        args = MAGRPOConfig(
            output_dir=str(tmp_path / "out"),
            num_turns=1,
            joint_mode="cross",
            max_new_tokens=8,
            report_to="none",
            eval_batch_size=2,
        )
        assert args.num_generations_eval == 1
        kwargs = dict(agent_model=tiny_path, num_agents=2, reward_func=length_ratio)
    else:
        args = small_args(tmp_path, num_agents=2, joint_mode="cross", num_generations_eval=1)
        kwargs = dict(model=tiny_path, reward_funcs=length_ratio)
    trainer = trainer_class(
        args=args, train_dataset=prompts_dataset, eval_dataset=prompts_dataset.select(range(2)), **kwargs
    )
    metrics = trainer.evaluate()
    assert math.isfinite(metrics["eval_reward"])
    # One row per prompt in the completions table, each the joint sample that was scored.
    table = trainer._logs
    assert len(table["prompt"]) == 2
    expected = length_ratio(list(table["extra"]["agent_0/completion"]), list(table["extra"]["agent_1/completion"]))
    assert list(table["rewards"]["length_ratio"]) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("accumulation", [1, 2])
def test_each_agents_loss_is_logged_and_they_sum_to_the_loss(tmp_path, tiny_path, prompts_dataset, accumulation):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(
            tmp_path,
            num_agents=2,
            max_steps=3,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=accumulation,
            num_iterations=2,  # the second pass over a batch has a ratio != 1, so a nonzero loss
            beta=0.1,
        ),
        train_dataset=prompts_dataset,
    )
    trainer.train()
    steps = [log for log in trainer.state.log_history if "loss" in log and "train_runtime" not in log]
    assert len(steps) == 3
    for log in steps:
        losses = [log["agent_0/loss"], log["agent_1/loss"]]
        assert all(math.isfinite(loss) for loss in losses)
        # Trainer logs the sum over the accumulation window of the (window-normalized) losses, per optimizer step.
        assert sum(losses) == pytest.approx(log["loss"], abs=1e-6, rel=1e-4)
    assert any(log["agent_0/loss"] != log["agent_1/loss"] for log in steps)
    assert any(log["loss"] != 0 for log in steps)


def test_sample_plays_one_turn_and_metrics_aside_keeps_it_out_of_the_logs(tmp_path, tiny_path, prompts_dataset):
    """The team core's public seams (`team.protocol.TeamTrainer`): `sample` plays one turn of joint candidates,
    scored by the trainer's reward; inside `metrics_aside` it records nothing in the trainer's own metrics."""
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2),
        train_dataset=prompts_dataset,
    )
    rows = [{"prompt": "Tell a story:"}, {"prompt": "Tell a joke:"}]
    with trainer.metrics_aside() as aside:
        level = trainer.sample(rows, 3)
    assert not trainer._metrics["train"] and aside["train"]  # recorded, but set aside
    assert [len(rollout.completions) for rollout in level.rollouts] == [6, 6]
    assert [node.prompts[0] for node in level.nodes] == ["Tell a story:", "Tell a joke:"]
    expected = length_ratio([r.completions for r in level.rollouts][0], [r.completions for r in level.rollouts][1])
    assert level.joint.tolist() == pytest.approx(expected)
    trainer.sample(rows, 3)
    assert trainer._metrics["train"]  # outside the block, the records go to the next training log
