"""Multi-turn training: tree rollouts (CoMLRL's MAGRPO), linear trajectories, transitions, early termination.

The rollout's expected returns and advantages are recomputed here from the completions, with CoMLRL 1.4.3's
formulas (`magrpo.py`, `_train_step_returns`): a node's return for sample j is its reward plus the mean return of its
child's samples; advantages are group-relative within a node.
"""

import re

import pytest
import torch

from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, MultiAgentGRPOTrainer
from multiagent_trl.rollout.tree import cross_tuples

from .conftest import completion_ids_of, id_reward, small_args

G2 = 2  # num_generations in these tests: the tree stays small (B + B*G nodes over two turns)


def feedback(row, histories, turn):
    """A checker: tells each agent the length of what it wrote, and the row's target."""
    return [f"{row['prompt']} [turn {turn}] you wrote {len(h[-1])}, target {row['target']}" for h in histories]


def batch_of(dataset, rows=2, width=G2):
    return [dataset[i] for i in range(rows) for _ in range(width)]


def trainer_for(tmp_path, tiny_path, dataset, transition=feedback, reward=id_reward, **overrides):
    settings = dict(num_agents=2, num_turns=2, num_generations=G2, per_device_train_batch_size=4)
    args = small_args(tmp_path, **{**settings, **overrides})
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path, reward_funcs=reward, args=args, train_dataset=dataset, external_transition=transition
    )
    trainer.model.train()
    return trainer


def counting(trainer):
    """Record how many rows each generation call of the team had (the trainer's own `_rollouts`)."""
    calls = []
    rollouts = trainer._rollouts

    def counted(agent_inputs, mode):
        calls.append([len(rows) for rows in agent_inputs])
        return rollouts(agent_inputs, mode)

    trainer._rollouts = counted
    return calls


def rows_of(trainer, output, agent, key="prompt"):
    ids, mask = output[f"agent_{agent}/{key}_ids"], output[f"agent_{agent}/{key}_mask"]
    return trainer.processing_class.batch_decode([row[m.bool()] for row, m in zip(ids, mask)])


def group_normalize(values, width):
    grouped = torch.tensor(values, dtype=torch.float32).view(-1, width)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()


def test_tree_nodes_returns_and_advantages_follow_comlrl(tmp_path, tiny_path, prompts_dataset):
    transitions = []

    def transition(row, histories, turn):
        transitions.append([list(h) for h in histories])
        return feedback(row, histories, turn)

    trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, transition)
    generated = counting(trainer)
    output = trainer._generate_and_score_completions(batch_of(prompts_dataset))

    # Turn 1: 2 nodes of G samples; every joint sample spawns a node: turn 2 has 2 * G nodes of G samples each.
    assert generated == [[4, 4], [8, 8]]
    assert len(transitions) == 4 and len(output["agent_0/advantages"]) == 4 + 8
    ids = [completion_ids_of(output, a) for a in range(2)]
    completions = [trainer.processing_class.batch_decode(ids[a]) for a in range(2)]
    # Child c = n * G + j continues sample j of node n: its transition saw that sample, its prompts are the result.
    for c in range(4):
        assert transitions[c] == [[completions[0][c]], [completions[1][c]]]
        for agent in range(2):
            child_prompts = rows_of(trainer, output, agent)[4 + c * G2 : 4 + (c + 1) * G2]
            assert child_prompts == [feedback(prompts_dataset[c // G2], transitions[c], 0)[agent]] * G2

    # CoMLRL's returns (undiscounted here: discount=1.0), then advantages normalized within each node.
    r = id_reward(None, None, list(zip(*ids)))
    turn_2 = r[4:]
    returns_1 = [r[c] + sum(turn_2[c * G2 : (c + 1) * G2]) / G2 for c in range(4)]
    expected = torch.cat([group_normalize(returns_1, G2), group_normalize(turn_2, G2)])
    for agent in range(2):
        torch.testing.assert_close(output[f"agent_{agent}/advantages"], expected, rtol=1e-4, atol=1e-5)
    assert expected.abs().sum() > 0
    metrics = trainer._metrics["train"]
    assert metrics["turn_1/nodes"] == [2] and metrics["turn_2/nodes"] == [4]
    assert metrics["turn_2/expected_return"] == [pytest.approx(sum(turn_2) / 8, abs=1e-5)]
    assert "turn_0/reward" not in metrics and metrics["turn_1/reward"] == [pytest.approx(sum(r[:4]) / 4, abs=1e-5)]

    # The loss is the sum of both agents' losses over the whole tree; every agent gets a gradient.
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
    trainer.compute_loss(trainer.model, output).backward()
    for agent in trainer.model.agents:
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in agent.parameters() if p.requires_grad)


def test_discount_weighs_the_child_mean(tmp_path, tiny_path, prompts_dataset):
    trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, discount=0.5, scale_rewards="none")
    output = trainer._generate_and_score_completions(batch_of(prompts_dataset))
    r = id_reward(None, None, list(zip(*[completion_ids_of(output, a) for a in range(2)])))
    returns_1 = torch.tensor([r[c] + 0.5 * sum(r[4 + c * G2 : 4 + (c + 1) * G2]) / G2 for c in range(4)])
    centered = (returns_1.view(-1, G2) - returns_1.view(-1, G2).mean(1, keepdim=True)).flatten()
    torch.testing.assert_close(output["agent_0/advantages"][:4], centered, rtol=1e-4, atol=1e-5)


def test_node_termination_skips_generation_rewards_and_transitions(tmp_path, tiny_path, prompts_dataset):
    scored, transitions = [], []

    def by_target(prompts, completions, target, **kwargs):  # above the threshold for the rows of target 3 only
        scored.append(len(completions))
        return [2.0 if t == 3 else 0.0 for t in target]

    def transition(row, histories, turn):
        transitions.append(row["target"])
        return feedback(row, histories, turn)

    trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, transition, by_target, early_termination_threshold=1.0)
    generated = counting(trainer)
    batch = batch_of(prompts_dataset)  # targets 3 (ends at turn 1) and 5 (goes on)
    output = trainer._generate_and_score_completions(batch)

    # The ended node has no children: no transition, no generation and no reward call below it.
    assert transitions == [5, 5]
    assert generated == [[4, 4], [4, 4]] and scored == [4, 4]
    assert len(output["agent_0/advantages"]) == 4 + 4
    # Its return is its reward (CoMLRL: no child, no future); the other's is its reward plus its children's mean.
    assert trainer._metrics["train"]["turn_2/nodes"] == [2]


@pytest.mark.parametrize("api", ["native", "comlrl"])
def test_an_ended_nodes_answer_stands_and_the_others_add_their_childs_mean(tmp_path, tiny_path, prompts_dataset, api):
    """Node-level termination: the node of target 3 passes (every sample scores above the threshold) and has no
    children; the other node's samples return reward + discount * mean of their child's rewards. The ended node's
    answer stands (its reward again for the remaining turn, discounted: issue #28, 5), except in CoMLRL's layer,
    which keeps CoMLRL's sum (`ended_return="reward"`: its reward alone)."""

    def scored(prompts, completions, completion_ids, target, **kwargs):
        return [id_reward(None, None, [ids])[0] + (100.0 if t == 3 else 0.0) for ids, t in zip(completion_ids, target)]

    if api == "native":
        discount, stood = 0.5, 1.5
        trainer = trainer_for(
            tmp_path,
            tiny_path,
            prompts_dataset,
            reward=scored,
            early_termination_threshold=50.0,
            scale_rewards="none",
            discount=discount,
        )
    else:
        discount, stood = 1.0, 1.0  # CoMLRL's returns are undiscounted
        args = MAGRPOConfig(
            output_dir=str(tmp_path / "out"),
            num_generations=G2,
            early_termination_threshold=50.0,
            advantage_normalization=False,
            max_new_tokens=8,
            max_steps=1,
            report_to="none",
        )
        assert args.ended_return == "reward"
        trainer = MAGRPOTrainer(
            agents=[tiny_path, tiny_path],
            reward_func=scored,
            args=args,
            train_dataset=prompts_dataset,
            external_transition=feedback,
        )
        trainer.model.train()
    output = trainer._generate_and_score_completions(batch_of(prompts_dataset))
    ids = [completion_ids_of(output, a) for a in range(2)]
    r = id_reward(None, None, list(zip(*ids)))
    assert len(r) == 4 + 2 * G2  # node 0 (target 3) ended: only node 1's 2 samples spawned nodes
    ended = [(100.0 + v) * stood for v in r[:2]]
    returns_1 = ended + [r[2 + j] + discount * sum(r[4 + j * G2 : 4 + (j + 1) * G2]) / G2 for j in range(G2)]
    expected = []
    for values in (returns_1[:2], returns_1[2:], r[4:6], r[6:8]):  # one group per node, centered
        expected += [v - sum(values) / len(values) for v in values]
    torch.testing.assert_close(output["agent_0/advantages"], torch.tensor(expected), rtol=1e-4, atol=1e-4)
    assert torch.tensor(expected[:2]).abs().sum() > 0


def test_state_only_reward_gives_no_advantage_at_later_turns(tmp_path, tiny_path, prompts_dataset):
    """A turn-2 reward that depends on the state only (the prompt), not the answer: siblings share a state, so the
    tree's turn-2 advantages are exactly 0 (linear trajectories compare different states there)."""

    def state_reward(prompts, completions, **kwargs):
        return [float(len(p[0]) % 7) if "[turn" in p[0] else 0.0 for p in prompts]

    def transition(row, histories, turn):  # the next state depends on the turn-1 answer
        return [f"{row['prompt']} [turn {turn}] {'#' * (len(histories[0][-1]) % 5)}"] * 2

    kwargs = dict(transition=transition, reward=state_reward, scale_rewards="none")
    tree = trainer_for(tmp_path, tiny_path, prompts_dataset, **kwargs)
    output = tree._generate_and_score_completions(batch_of(prompts_dataset, width=G2))
    assert output["agent_0/advantages"][4:].abs().max() == 0
    linear = trainer_for(
        tmp_path,
        tiny_path,
        prompts_dataset,
        rollout="linear",
        num_generations=4,
        per_device_train_batch_size=8,
        **kwargs,
    )
    for seed in range(5):  # sampled states differ within a prompt's trajectories (almost surely in a few draws)
        torch.manual_seed(seed)
        output = linear._generate_and_score_completions(batch_of(prompts_dataset, width=4))
        if output["agent_0/advantages"][8:].abs().max() > 0:
            break
    else:
        pytest.fail("linear trajectories never differed in state")


def test_linear_trajectory_that_succeeded_early_stands(tmp_path, tiny_path, prompts_dataset):
    """Linear trajectories: one that passes the threshold plays no more turns (no generation, no reward call) and its
    answer stands, so it is never ranked below one that failed and went on."""
    scored = []

    def pass_by_length(prompts, completions, completion_ids, **kwargs):
        scored.append(len(completions))
        return [1.0 if sum(a) % 2 == 0 else 0.4 for a, _ in completion_ids]

    trainer = trainer_for(
        tmp_path,
        tiny_path,
        prompts_dataset,
        reward=pass_by_length,
        rollout="linear",
        num_generations=4,
        per_device_train_batch_size=8,
        early_termination_threshold=0.45,
    )
    generated = counting(trainer)
    for seed in range(10):
        torch.manual_seed(seed)
        generated.clear(), scored.clear()
        output = trainer._generate_and_score_completions(batch_of(prompts_dataset, width=4))
        ids = completion_ids_of(output, 0)
        passed = [sum(a) % 2 == 0 for a in ids[:8]]
        if 0 < sum(passed) < 8:
            break
    else:
        pytest.fail("no batch with both passing and failing trajectories")
    went_on = passed.count(False)
    assert generated == [[8, 8], [went_on, went_on]] and scored == [8, went_on]
    advantages = output["agent_0/advantages"]
    for group in range(2):
        first = [(advantages[k].item(), passed[k]) for k in range(group * 4, (group + 1) * 4)]
        winners = [a for a, p in first if p]
        losers = [a for a, p in first if not p]
        if winners and losers:
            assert min(winners) > max(losers)  # success at turn 1 ranks above every failure
    # Turn 2 holds every trajectory's row: the ended ones untrained, standing with their last answer.
    assert len(advantages) == 16
    masks = output["agent_0/tool_mask"] * output["agent_0/completion_mask"]
    assert [bool(masks[8 + k].sum()) for k in range(8)] == [not p for p in passed]


class EndsTwoTrajectories:
    """Turn 1: the batch's first two trajectories pass the threshold (0.5), the others score below it; later turns
    score `id_reward`. With linear trajectories, two rows of turn 2 stand untrained."""

    __name__ = "ends_two"

    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, completions, completion_ids, **kwargs):
        self.calls += 1
        if self.calls % 2 == 0:
            return id_reward(prompts, completions, completion_ids)
        return [1.0 if j < 2 else 0.1 * (sum(a) % 4) for j, (a, _) in enumerate(completion_ids)]


LOSS_TYPES = ["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"]  # every loss_type of TRL 1.16


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_untrained_rows_do_not_change_a_trained_rows_gradient(tmp_path, tiny_path, prompts_dataset, loss_type):
    """Issue #28, 6: rows that are not trained (here two linear rows that stand; placeholders and padding groups
    alike) once counted as rows in the losses that average over rows (`grpo`, `sapo`, `luspo`) or divide by them
    (`dr_grpo`), shrinking every trained row's gradient by a factor that changed with the rollout's shape."""
    trainer = trainer_for(
        tmp_path,
        tiny_path,
        prompts_dataset,
        reward=EndsTwoTrajectories(),
        rollout="linear",
        num_generations=4,
        per_device_train_batch_size=8,
        early_termination_threshold=0.5,
        loss_type=loss_type,
        beta=0.1,  # the KL term too
        gradient_checkpointing=False,
    )
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's training loop
    batch = trainer._generate_and_score_completions(batch_of(prompts_dataset, width=4))
    masks = batch["agent_0/completion_mask"] * batch["agent_0/tool_mask"]
    keep = masks.sum(1) > 0
    assert keep.tolist() == [True] * 8 + [False, False] + [True] * 6  # turn 2: trajectories 0 and 1 stand

    def gradients(inputs):
        trainer.model.zero_grad(set_to_none=True)
        trainer.compute_loss(trainer.model, inputs).backward()
        return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}

    with_untrained = gradients(batch)
    only_trained = gradients({k: v[keep] if v.dim() and len(v) == len(keep) else v for k, v in batch.items()})
    assert with_untrained.keys() == only_trained.keys() and len(with_untrained) > 0
    for name, grad in with_untrained.items():
        torch.testing.assert_close(grad, only_trained[name], msg=name)
    assert sum(g.abs().sum() for g in with_untrained.values()) > 0


def test_cross_mode_tree_credits_each_completion_with_its_tuples(tmp_path, tiny_path, prompts_dataset):
    trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, joint_mode="cross", scale_rewards="none")
    generated = counting(trainer)
    output = trainer._generate_and_score_completions(batch_of(prompts_dataset))
    # Every one of the G**2 = 4 cross tuples of each root node spawns a node: 8 nodes at turn 2.
    assert generated == [[4, 4], [16, 16]]
    ids = [completion_ids_of(output, a) for a in range(2)]
    tuples = cross_tuples(G2, 2)

    def rewards_of(start, nodes):  # (nodes, tuples): the reward of each cross tuple of each node
        return [
            id_reward(None, None, [(ids[0][start + n * G2 + a], ids[1][start + n * G2 + b]) for a, b in tuples])
            for n in range(nodes)
        ]

    r1, r2 = rewards_of(0, 2), rewards_of(4, 8)
    returns = [[r1[n][s] + sum(r2[n * 4 + s]) / 4 for s in range(4)] for n in range(2)]
    for agent in range(2):
        credit = [
            sum(ret[s] for s, t in enumerate(tuples) if t[agent] == k) / G2 for ret in returns for k in range(G2)
        ]
        centered = torch.tensor(credit).view(-1, G2)
        centered = (centered - centered.mean(1, keepdim=True)).flatten()
        torch.testing.assert_close(output[f"agent_{agent}/advantages"][:4], centered, rtol=1e-4, atol=1e-4)


def test_env_mask_of_a_rollout_func_survives_every_turn(tmp_path, tiny_path, prompts_dataset):
    """A `rollout_func` masks the tokens it did not generate (`env_mask`); they get no loss at any turn."""

    def rollout_func(prompts, trainer):
        tokenizer = trainer.processing_class
        prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
        completion_ids = [tokenizer("ab[env]cd")["input_ids"] for _ in prompts]
        env_mask = [[1, 1, 0, 0, 0, 0, 0, 1, 1][: len(ids)] for ids in completion_ids]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None, "env_mask": env_mask}

    args = small_args(tmp_path, num_agents=2, num_turns=2, num_generations=G2, per_device_train_batch_size=4)
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=id_reward,
        args=args,
        train_dataset=prompts_dataset,
        external_transition=feedback,
        rollout_func=rollout_func,
    )
    trainer.model.train()
    output = trainer._generate_and_score_completions(batch_of(prompts_dataset))
    for agent in range(2):
        mask = output[f"agent_{agent}/tool_mask"]
        assert mask.shape[0] == 12  # both turns
        assert (mask[:, 2:7] == 0).all() and (mask[:, :2] == 1).all()


def test_per_agent_rewards_over_turns(tmp_path, tiny_path, prompts_dataset):
    """A function that scores each agent on its own: each agent's returns come from its own rewards."""

    def own(prompts, completions, completion_ids, **kwargs):
        return [[float(len(a) % 5), float(len(b) % 3)] for a, b in completion_ids]

    trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, reward=own, scale_rewards="none")
    output = trainer._generate_and_score_completions(batch_of(prompts_dataset))
    ids = [completion_ids_of(output, a) for a in range(2)]
    for agent, modulo in ((0, 5), (1, 3)):
        r = [float(len(x) % modulo) for x in ids[agent]]
        returns_1 = torch.tensor([r[c] + sum(r[4 + c * G2 : 4 + (c + 1) * G2]) / G2 for c in range(4)])
        centered = (returns_1.view(-1, G2) - returns_1.view(-1, G2).mean(1, keepdim=True)).flatten()
        torch.testing.assert_close(output[f"agent_{agent}/advantages"][:4], centered, rtol=1e-4, atol=1e-5)


def test_evaluation_logs_turns_from_one(tmp_path, tiny_path, prompts_dataset):
    trainer = trainer_for(
        tmp_path,
        tiny_path,
        prompts_dataset,
        eval_do_sample=False,
        per_device_eval_batch_size=2,
        num_generations_eval=2,
    )
    metrics = trainer.evaluate(prompts_dataset.select(range(2)))
    for key in ("eval_reward", "eval_turn_1/reward", "eval_turn_2/reward", "eval_turn_2/nodes"):
        assert key in metrics, key
    assert not any(key.startswith("eval_turn_0") for key in metrics)
    table = list(trainer._logs["completion"])
    # One table row per root sample, both turns; greedy: a prompt's samples are identical.
    assert len(table) == 4 and all("[turn 2]" in text for text in table)
    assert table[0] == table[1] and table[2] == table[3]


def test_trains_with_lora_team(tmp_path, tiny_path, prompts_dataset):
    from peft import LoraConfig

    args = small_args(tmp_path, num_agents=2, num_turns=2, max_steps=1, num_generations=G2)
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
    assert "turn_2/reward" in trainer.state.log_history[0]


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
        num_generations=G2,
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
    output = trainer._generate_and_score_completions(batch_of(prompts_dataset))
    assert len(seen) == 4 and all(s[1] == 2 and s[2] == 1 and s[3] for s in seen)
    assert seen[0][0] == prompts_dataset[0]["prompt"]
    assert rows_of(trainer, output, 1)[4] == f"{prompts_dataset[0]['prompt']} -> check it"


@pytest.mark.parametrize(
    "transition, message",
    [
        (None, "`num_turns=2` needs `external_transition=`"),
        (lambda row, histories, turn: ["only one"], "returned 1 values after turn 0"),
        (lambda row, histories, turn: [None, None], "agent 0's prompt is a NoneType"),
        (lambda row, histories, turn: "one prompt", "returned a str after turn 0: 'one prompt'"),
        (lambda row: [], "must take `(row, histories, turn)`"),
    ],
)
def test_multiturn_errors(tmp_path, tiny_path, prompts_dataset, transition, message):
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        trainer = trainer_for(tmp_path, tiny_path, prompts_dataset, transition)
        trainer._generate_and_score_completions(batch_of(prompts_dataset))


def test_linear_rollout_needs_aligned_joint_mode(tmp_path):
    with pytest.raises(ValueError, match="`rollout='linear'` with `num_turns > 1` needs `joint_mode='aligned'`"):
        small_args(tmp_path, num_agents=2, num_turns=2, joint_mode="cross", rollout="linear")


def test_tree_size_limit_raises_at_construction(tmp_path):
    with pytest.raises(ValueError, match=r"needs up to 680 completions per agent, more than `max_rollout_completions"):
        small_args(tmp_path, num_agents=2, num_turns=4, num_generations=4, max_rollout_completions=600)
    small_args(tmp_path, num_agents=2, num_turns=4, num_generations=4, rollout="linear", max_rollout_completions=600)


def test_tree_size_limit_counts_the_team_the_trainer_infers(tmp_path, tiny_path, prompts_dataset):
    """With `num_agents=None` the config cannot know the team: it counts one agent (2 prompts * 4 * (1 + 4 + 16 +
    64) = 680, under the limit). The trainer, given two models, counts the cross tree of two agents before anything
    is generated: 2 * 4 * (1 + 16 + 256 + 4096) = 34952."""
    args = small_args(tmp_path, num_turns=4, num_generations=4, joint_mode="cross")  # accepted: counted as one agent
    with pytest.raises(ValueError, match=r"2 agents, cross\) needs up to 34952 completions per agent"):
        MultiAgentGRPOTrainer(
            model=[tiny_path, tiny_path],
            reward_funcs=id_reward,
            args=args,
            train_dataset=prompts_dataset,
            external_transition=feedback,
        )
