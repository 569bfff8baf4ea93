"""Multi-turn episodes: transitions, per-turn rewards, advantages of the discounted return-to-go, early termination."""

import re

import pytest
import torch

from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, MultiAgentGRPOTrainer
from multiagent_trl.turns import returns_to_go

from .conftest import G, completion_ids_of, generation_batch, id_reward, normalize, small_args


def feedback(row, histories, turn):
    """A checker: tells each agent the length of what it wrote, and the row's target."""
    return [f"{row['prompt']} [turn {turn}] you wrote {len(h[-1])}, target {row['target']}" for h in histories]


def trainer_for(tmp_path, tiny_path, dataset, transition=feedback, reward=id_reward, **overrides):
    args = small_args(tmp_path, num_agents=2, num_turns=2, **overrides)
    return MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=reward, args=args, train_dataset=dataset, external_transition=transition
    )


def decoded_prompts(trainer, output, agent, turn):
    ids, mask = output[f"agent_{agent}/turn_{turn}/prompt_ids"], output[f"agent_{agent}/turn_{turn}/prompt_mask"]
    return trainer.processing_class.batch_decode([row[m.bool()] for row, m in zip(ids, mask)])


def test_returns_to_go():
    nan = float("nan")
    rewards = torch.tensor([[1.0, 2.0, 3.0], [10.0, nan, 30.0], [100.0, nan, nan]])
    expected = torch.tensor(
        [[1 + 0.5 * 10 + 0.25 * 100, 2.0, 3 + 0.5 * 30], [10 + 0.5 * 100, nan, 30.0], [100, nan, nan]]
    )
    torch.testing.assert_close(returns_to_go(rewards, 0.5), expected, equal_nan=True)


def test_two_turn_advantages_and_transition(tmp_path, tiny_path, prompts_dataset):
    calls = []

    def transition(row, histories, turn):
        calls.append((row, [list(h) for h in histories], turn))
        return feedback(row, histories, turn)

    trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, transition, discount=0.5)
    trainer.model.train()
    batch = generation_batch(prompts_dataset)
    output = trainer._generate_and_score_completions(batch)

    # One transition per trajectory, after turn 0, with the row's columns and each agent's turn-0 completion.
    assert len(calls) == len(batch) and {turn for *_, turn in calls} == {0}
    completions = [trainer.processing_class.batch_decode(completion_ids_of_turn(output, a, 0)) for a in range(2)]
    for j, (row, histories, _) in enumerate(calls):
        assert row == batch[j]
        assert histories == [[completions[0][j]], [completions[1][j]]]
    # Turn 1 prompts are what the transition returned, per trajectory.
    for agent in range(2):
        assert decoded_prompts(trainer, output, agent, 1) == [feedback(*c)[agent] for c in calls]

    # Advantages: group-normalized return-to-go, R_0 = r_0 + 0.5 r_1 and R_1 = r_1, the same for both agents.
    r = [id_reward(None, None, list(zip(*[completion_ids_of_turn(output, a, t) for a in range(2)]))) for t in range(2)]
    returns = [[r0 + 0.5 * r1 for r0, r1 in zip(*r)], r[1]]
    for turn in range(2):
        for agent in range(2):
            advantages = output[f"agent_{agent}/turn_{turn}/advantages"]
            torch.testing.assert_close(advantages, normalize(returns[turn]), rtol=1e-4, atol=1e-5)
    assert normalize(returns[0]).abs().sum() > 0

    # The loss is the sum of both agents' losses on both turns; it has a gradient for every agent.
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
    loss = trainer.compute_loss(trainer.model, output)
    loss.backward()
    for agent in trainer.model.agents:
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in agent.parameters() if p.requires_grad)


def completion_ids_of_turn(output, agent, turn):
    prefix = f"agent_{agent}/turn_{turn}/"
    return completion_ids_of(
        {f"agent_{agent}/{k[len(prefix) :]}": v for k, v in output.items() if k.startswith(prefix)}, agent
    )


def test_early_termination_masks_ended_trajectories(tmp_path, tiny_path, prompts_dataset):
    calls = []

    def transition(row, histories, turn):
        calls.append(turn)
        return feedback(row, histories, turn)

    def by_target(prompts, completions, target, **kwargs):  # above the threshold for the rows of target 3 only
        return [2.0 if t == 3 else 0.0 for t in target]

    trainer = trainer_for(
        tmp_path, tiny_path, prompts_dataset, transition, reward=by_target, early_termination_threshold=1.0
    )
    trainer.model.train()
    batch = generation_batch(prompts_dataset)
    output = trainer._generate_and_score_completions(batch)

    ended = torch.tensor([row["target"] == 3 for row in batch])
    assert 0 < ended.sum() < len(batch), "the test needs both ended and continuing trajectories"
    assert len(calls) == (~ended).sum()  # no transition for ended trajectories
    for agent in range(2):
        turn_1 = {k.split("/", 2)[2]: v for k, v in output.items() if k.startswith(f"agent_{agent}/turn_1/")}
        assert (turn_1["tool_mask"][ended] == 0).all()  # no loss on ended trajectories' tokens
        assert (turn_1["advantages"][ended] == 0).all()
        assert (turn_1["tool_mask"][~ended].sum(1) > 0).all()
    metrics = trainer._metrics["train"]
    assert metrics["turn_1/active"] == [pytest.approx((~ended).float().mean().item())]


def test_evaluation_is_greedy_on_request_and_logs_per_turn(tmp_path, tiny_path, prompts_dataset):
    def evaluate(do_sample):
        trainer = trainer_for(
            tmp_path,
            tiny_path,
            prompts_dataset,
            eval_do_sample=do_sample,
            per_device_eval_batch_size=4,
            num_generations_eval=4,
        )
        metrics = trainer.evaluate(prompts_dataset.select(range(2)))
        return metrics, list(trainer._logs["completion"])

    metrics, greedy = evaluate(do_sample=False)
    for key in ("eval_reward", "eval_turn_0/reward", "eval_turn_1/reward", "eval_agent_1/completions/mean_length"):
        assert key in metrics, key
    # One table row per trajectory, both turns. Greedy: the G trajectories of a prompt are identical; sampled: not.
    assert len(greedy) == 8 and all("[turn 1]" in text for text in greedy)
    assert all(len(set(greedy[k : k + G])) == 1 for k in range(0, 8, G))
    _, sampled = evaluate(do_sample=True)
    assert all(len(set(sampled[k : k + G])) > 1 for k in range(0, 8, G))


def test_trains_with_lora_team(tmp_path, tiny_path, prompts_dataset):
    from peft import LoraConfig

    args = small_args(tmp_path, num_agents=2, num_turns=2, max_steps=1)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=id_reward,
        args=args,
        train_dataset=prompts_dataset,
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"]),
        external_transition=feedback,
    )
    before = {k: v.clone() for k, v in trainer.model.named_parameters() if v.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    for agent in range(2):
        changed = [k for k in before if f".agent_{agent}." in k and not torch.equal(before[k], after[k])]
        assert changed, f"agent_{agent}'s adapter did not train"
    assert "turn_1/reward" in trainer.state.log_history[0]


def test_comlrl_transition_and_config(tmp_path, tiny_path, prompts_dataset):
    seen = []

    def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
        seen.append(
            (
                prompt,
                num_agents,
                len(prompt_history_per_agent[0]),
                agent_completions == [h[-1] for h in response_history_per_agent],
            )
        )
        return ["fix it", "check it"]

    def formatter(row, external_prompts=None):
        return row["prompt"] if external_prompts is None else f"{row['prompt']} -> {external_prompts}"

    args = MAGRPOConfig(
        output_dir=str(tmp_path / "out"),
        num_turns=2,
        early_termination_threshold=None,
        max_new_tokens=8,
        rollout_buffer_size=2,
        max_steps=1,
        report_to="none",
        save_strategy="no",
    )
    trainer = MAGRPOTrainer(
        agents=[tiny_path, tiny_path],
        reward_func=lambda c1, c2: [float(len(a) > len(b)) for a, b in zip(c1, c2)],
        args=args,
        train_dataset=prompts_dataset,
        formatters=formatter,
        external_transition=transition,
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset)[: 2 * G])
    assert seen and all(s[1] == 2 and s[2] == 1 and s[3] for s in seen)
    assert seen[0][0] == prompts_dataset[0]["prompt"]
    assert decoded_prompts(trainer, output, 1, 1)[0] == f"{prompts_dataset[0]['prompt']} -> check it"


@pytest.mark.parametrize(
    "overrides, transition, message",
    [
        (dict(), None, "`num_turns=2` needs `external_transition=`"),
        (dict(), lambda row, histories, turn: ["only one"], "returned 1 values after turn 0"),
        (dict(), lambda row: [], "must take `(row, histories, turn)`"),
    ],
)
def test_multiturn_errors(tmp_path, tiny_path, prompts_dataset, overrides, transition, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, transition, **overrides)
        trainer.model.train()
        trainer._generate_and_score_completions(generation_batch(prompts_dataset))


def test_multiturn_needs_aligned_joint_mode(tmp_path):
    with pytest.raises(ValueError, match="needs `joint_mode='aligned'`"):
        small_args(tmp_path, num_agents=2, num_turns=2, joint_mode="cross")
