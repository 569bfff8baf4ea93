"""The actor-critic core against CoMLRL 1.4.3 itself: estimators (`multiagent_trl.actor_critic.estimators`) and value
models (`multiagent_trl.actor_critic.value_model`).

CoMLRL's math lives in trainer methods. Where a method needs nothing of its trainer, it is called on a bare
instance (`bare`); where it needs models, a real `IACTrainer` / `MAACTrainer` is built on the tiny test models, its
rollouts are collected by its own code, and its `_ac_step` is run with its optimizers swapped for SGD(lr=1), so that
each parameter's change is minus its gradient: comparing changes compares the losses' gradients exactly, where
Adam's first step (about lr * sign(gradient)) would hide a wrong scale.
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import pytest
import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from multiagent_trl.actor_critic.estimators import (
    advantages,
    joint_critic_text,
    policy_gradient_loss,
    response_lengths,
    response_mask,
    reward_to_go,
    sequence_logprobs,
    td_targets,
    value_loss,
    value_positions,
    values_at,
)
from multiagent_trl.actor_critic.value_model import (
    VALUE_HEAD_FILE,
    AdapterValueModel,
    CausalLMWithValueHead,
    ValueHead,
)
from multiagent_trl.testing import tiny_model_path

from .conftest import changed, lora_config, snapshot
from .parity import assert_same_forward, assert_same_gradients

# ---- CoMLRL, its objects, and rollouts made by its own code


@pytest.fixture(scope="module")
def comlrl():
    """CoMLRL 1.4.3's actor-critic classes (the dev extra installs it)."""
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.models.actor_critic import CausalLMWithValueHead as Model
    from comlrl.models.actor_critic import ValueHead as Head
    from comlrl.trainers.actor_critic import ActorCriticTrainerBase, IACConfig, IACTrainer, MAACConfig, MAACTrainer
    from comlrl.trainers.actor_critic.iac import RolloutSample

    return SimpleNamespace(
        Base=ActorCriticTrainerBase,
        IACConfig=IACConfig,
        IACTrainer=IACTrainer,
        MAACConfig=MAACConfig,
        MAACTrainer=MAACTrainer,
        RolloutSample=RolloutSample,
        Model=Model,
        Head=Head,
    )


def bare(trainer_class, args):
    """A CoMLRL trainer without its constructor: enough to call a method that reads only `self.args`."""
    trainer = trainer_class.__new__(trainer_class)
    trainer.args = args
    return trainer


def rollout_sample(comlrl, target: float, old_value: torch.Tensor, turn: int = 0):
    """A CoMLRL `RolloutSample` carrying only what its advantage step reads."""
    return comlrl.RolloutSample(
        agent_idx=0,
        prompt="",
        completion="",
        full_input_ids=torch.zeros(1, dtype=torch.long),
        attention_mask=torch.ones(1, dtype=torch.long),
        prompt_len=1,
        response_len=0,
        old_logprob=torch.zeros(1),
        old_value=old_value,
        reward=torch.tensor([target]),
        returns=torch.tensor([target], dtype=torch.float32),
        advantage=torch.zeros(1),
        metadata={"turn_idx": turn, "value_target": torch.tensor([target])},
    )


class Rewards:
    """A CoMLRL reward function (one list of completions per agent) returning a scripted mean reward per call: one
    value per agent, `mean + 0.1` and `mean - 0.1`, so that the agents' targets differ."""

    def __init__(self, means):
        self.means, self.calls = list(means), 0

    def __call__(self, completions1, completions2):
        mean = self.means[self.calls % len(self.means)]
        self.calls += 1
        return [mean + 0.1, mean - 0.1]


def transition(prompt, agent_completions, num_agents, prompt_history_per_agent, response_history_per_agent):
    """CoMLRL's multi-turn transition: each agent's next prompt quotes its last answer."""
    return [f"Again, agent {i} (you said {agent_completions[i][:3]!r}):" for i in range(num_agents)]


ITEMS = [{"prompt": "Describe a city in the clouds:"}, {"prompt": "Tell a joke:"}, {"prompt": "Name a color:"}]


def trajectories(rollouts, num_agents: int, num_turns: int):
    """Per agent, the samples of each item's episode in turn order: `[agent][episode] -> samples`."""
    episodes = [[] for _ in range(num_agents)]
    for sample in rollouts:
        if sample.metadata["turn_idx"] == 0:
            episodes[sample.agent_idx].append([])
        episodes[sample.agent_idx][-1].append(sample)
    return episodes


def padded_turns(episodes, num_turns: int, read):
    """`(episodes, num_turns)` of `read(sample)`, 0 after an episode's last turn, and the `played` mask."""
    values = torch.zeros(len(episodes), num_turns, dtype=torch.float64)
    played = torch.zeros(len(episodes), num_turns, dtype=torch.bool)
    for e, samples in enumerate(episodes):
        for t, sample in enumerate(samples):
            values[e, t], played[e, t] = float(read(sample)), True
    return values, played


def first(tensor: torch.Tensor) -> float:
    return float(tensor.reshape(-1)[0])


# ---- 1. sequence log-probabilities


@pytest.mark.parametrize(
    "prompt_len, response_len, masked",
    [(1, 5, None), (3, 3, None), (4, 0, None), (2, 4, [True, False, True, True]), (6, 0, [])],
)
def test_sequence_logprobs_match_comlrl(comlrl, prompt_len, response_len, masked):
    torch.manual_seed(0)
    total = 6 + 2  # two trailing pads, never scored
    logits = torch.randn(1, total, 11)
    ids = torch.randint(0, 11, (1, total))
    loss_mask = None if masked is None else torch.tensor(masked, dtype=torch.bool)
    theirs = comlrl.Base._compute_sequence_stats(
        bare(comlrl.IACTrainer, None), ids, logits, prompt_len, response_len, completion_loss_mask=loss_mask
    )
    mask = response_mask(torch.tensor([prompt_len]), torch.tensor([response_len]), total)
    if loss_mask is not None:  # the completion loss mask, placed at the completion's positions
        mask[0, prompt_len : prompt_len + response_len] &= loss_mask
    ours = sequence_logprobs(logits, ids, mask)
    assert_same_forward(ours, theirs)


def test_sequence_logprobs_batch_rows_match_comlrl_one_by_one(comlrl):
    """One batched call over rows of different prompt and response lengths gives each row CoMLRL's own value."""
    torch.manual_seed(1)
    prompts, responses = torch.tensor([2, 5, 3]), torch.tensor([4, 1, 0])
    logits, ids = torch.randn(3, 9, 7), torch.randint(0, 7, (3, 9))
    ours = sequence_logprobs(logits, ids, response_mask(prompts, responses, 9))
    stub = bare(comlrl.IACTrainer, None)
    theirs = torch.cat(
        [
            comlrl.Base._compute_sequence_stats(stub, ids[b : b + 1], logits[b : b + 1], int(p), int(r))
            for b, (p, r) in enumerate(zip(prompts, responses))
        ]
    )
    assert_same_forward(ours, theirs)


# ---- 2. advantages


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize(
    "targets, old_values",
    [
        ([1.0], [0.25]),  # one sample: CoMLRL keeps its raw advantage even when normalizing
        ([1.0, 1.0], [0.5, 0.5]),  # zero spread: the 1e-6 clamp
        ([1.0, -2.0, 0.5, 3.0, 0.0], [0.1, -0.4, 0.9, 2.0, -1.5]),
        ([0.3, 0.7, -0.2], [0.123456789, -0.5, 0.25]),
    ],
)
@pytest.mark.parametrize("value_dtype", [torch.float32, torch.bfloat16])  # a bf16 critic's stored values
def test_advantages_match_comlrl(comlrl, normalize, targets, old_values, value_dtype):
    old = torch.tensor(old_values, dtype=value_dtype)
    samples = [rollout_sample(comlrl, y, v) for y, v in zip(targets, old)]
    stub = bare(comlrl.IACTrainer, comlrl.IACConfig(num_turns=1, advantage_normalization=normalize))
    comlrl.Base._prepare_advantages(stub, samples)
    theirs = torch.tensor([first(s.normalized_advantage) for s in samples])
    ours = advantages(torch.tensor(targets), old, normalize=normalize)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_advantages_group_by_turn_like_comlrl_buffer(comlrl):
    """A buffer holding two turns: CoMLRL normalizes each turn's samples on their own (`_process_buffer`)."""
    targets = torch.tensor([1.0, 2.0, 5.0, -1.0, 0.0, 4.0, 3.0])
    old = torch.tensor([0.5, 0.0, 1.0, 0.0, 0.5, 1.0, 2.0])
    turns = torch.tensor([0, 1, 0, 1, 0, 1, 1])
    stub = bare(comlrl.IACTrainer, comlrl.IACConfig(num_turns=1))
    samples = [rollout_sample(comlrl, float(y), v.view(1), int(t)) for y, v, t in zip(targets, old, turns)]
    for turn in (0, 1):
        comlrl.Base._prepare_advantages(stub, [s for s in samples if s.metadata["turn_idx"] == turn])
    theirs = torch.tensor([first(s.normalized_advantage) for s in samples])
    torch.testing.assert_close(advantages(targets, old, groups=turns), theirs, rtol=0, atol=0)


def test_advantages_leave_nan_targets_out():
    """A row with no target (NaN: no reward, a turn not played) gets 0 and does not move its group's statistics."""
    full = advantages(torch.tensor([1.0, 2.0, 4.0]), torch.zeros(3))
    with_gap = advantages(torch.tensor([1.0, float("nan"), 2.0, 4.0]), torch.zeros(4))
    assert with_gap[1] == 0
    torch.testing.assert_close(with_gap[[0, 2, 3]], full)


# ---- 3. TD targets, from CoMLRL's own multi-turn rollouts


@pytest.fixture(scope="module")
def tiny_paths():
    return tiny_model_path(), tiny_model_path(seed=1)


def build_iac(comlrl, paths, rewards, **config):
    settings = dict(num_turns=1, max_new_tokens=5, early_termination_threshold=None, num_generations=1)
    args = comlrl.IACConfig(**{**settings, **config})
    kwargs = dict(critic_model=paths[1]) if args.use_separate_critic else {}
    trainer = comlrl.IACTrainer(
        agent_model=paths[0],
        reward_func=rewards,
        args=args,
        external_transition=transition if args.num_turns > 1 else None,
        **kwargs,
    )
    trainer.verbose = False
    return trainer


def build_maac(comlrl, paths, rewards, **config):
    settings = dict(num_turns=1, max_new_tokens=5, early_termination_threshold=None, num_generations=1)
    args = comlrl.MAACConfig(**{**settings, **config})
    trainer = comlrl.MAACTrainer(
        agent_model=paths[0],
        critic_model=paths[1],
        reward_func=rewards,
        args=args,
        external_transition=transition if args.num_turns > 1 else None,
    )
    trainer.verbose = False
    return trainer


# Scripted mean rewards per call (items in order, turns in order). With threshold 0.5, item 1 stops after turn 2
# (0.6 > 0.5), item 2 plays all three turns, item 3 stops after turn 1.
MEANS = [0.1, 0.6, 0.2, 0.3, 0.4, 0.9]


@pytest.mark.parametrize("family", ["iac", "maac"])
@pytest.mark.parametrize("discount, threshold", [(0.9, None), (1.0, 0.5), (0.7, 0.5)])
def test_td_targets_and_advantages_match_comlrl_rollouts(comlrl, tiny_paths, family, discount, threshold):
    torch.manual_seed(0)
    build = build_iac if family == "iac" else build_maac
    num_turns = 3
    trainer = build(
        comlrl,
        tiny_paths,
        Rewards(MEANS),
        num_turns=num_turns,
        discount=discount,
        early_termination_threshold=threshold,
    )
    rollouts = [s for item in ITEMS for s in trainer._collect_rollouts(item)]
    per_agent = trajectories(rollouts, 2, num_turns)
    if threshold is not None:
        assert [len(e) for e in per_agent[0]] == [2, 3, 1]  # the script's early stops happened

    tokenizer = trainer.tokenizers[0]
    for episodes in per_agent:
        rewards, played = padded_turns(episodes, num_turns, lambda s: first(s.reward))
        old_values, _ = padded_turns(episodes, num_turns, lambda s: first(s.old_value))
        targets = td_targets(rewards.float(), old_values.float(), discount, played)
        theirs, _ = padded_turns(episodes, num_turns, lambda s: first(s.metadata["adv_target"]))
        torch.testing.assert_close(targets[played], theirs[played].float(), rtol=0, atol=0)
        assert torch.isnan(targets[~played]).all()
        value_targets, _ = padded_turns(episodes, num_turns, lambda s: first(s.metadata["value_target"]))
        torch.testing.assert_close(targets[played], value_targets[played].float(), rtol=0, atol=0)
        # CoMLRL's logged `returns`: the undiscounted reward-to-go.
        logged, _ = padded_turns(episodes, num_turns, lambda s: first(s.returns))
        torch.testing.assert_close(reward_to_go(rewards.float(), played)[played], logged[played].float())
        # Completion lengths as CoMLRL reads them (first padding token), from the stored token ids.
        for sample in (s for e in episodes for s in e):
            completion = sample.full_input_ids[sample.prompt_len :][None]
            assert int(response_lengths(completion, tokenizer.pad_token_id)) == sample.response_len

    # Advantages: CoMLRL normalizes one agent's samples of one turn over its buffer (here: the three items).
    groups = torch.tensor([s.agent_idx * num_turns + s.metadata["turn_idx"] for s in rollouts])
    targets = torch.tensor([first(s.metadata["adv_target"]) for s in rollouts])
    old_values = torch.tensor([first(s.old_value) for s in rollouts])
    for group in groups.unique():
        trainer._prepare_advantages([s for s, g in zip(rollouts, groups) if g == group])
    theirs = torch.tensor([first(s.normalized_advantage) for s in rollouts])
    torch.testing.assert_close(advantages(targets, old_values, groups=groups), theirs, rtol=0, atol=0)


def test_maac_joint_values_are_shared_by_the_agents_of_a_turn(comlrl, tiny_paths):
    trainer = build_maac(comlrl, tiny_paths, Rewards([0.1]), num_turns=2)
    rollouts = trainer._collect_rollouts(ITEMS[0])
    for turn in (0, 1):
        values = [first(s.old_value) for s in rollouts if s.metadata["turn_idx"] == turn]
        assert len(values) == 2 and values[0] == values[1]


# ---- 4. MAAC's joint critic text


@pytest.mark.parametrize("critic_type", ["v", "q", "Q"])
@pytest.mark.parametrize(
    "prompts, completions",
    [
        (["Solve x+1=2."], ["x=1"]),
        (["Write a haiku.", "Review the haiku."], ["Autumn moon\nrises", ""]),
        (["a\n\nb", "", "c [Agent 9] d"], ["1", "two\nlines", "  three  "]),
    ],
)
def test_joint_critic_text_matches_comlrl(comlrl, critic_type, prompts, completions):
    stub = bare(comlrl.MAACTrainer, comlrl.MAACConfig(num_turns=1, critic_type=critic_type))
    theirs = comlrl.MAACTrainer._build_critic_input(stub, prompts, completions)
    ours = joint_critic_text(prompts, completions if critic_type.lower() == "q" else None)
    assert ours == theirs


# ---- 5. losses: one CoMLRL `_ac_step` against ours, gradient for gradient


def sgd(trainer):
    """Swap every CoMLRL optimizer for SGD(lr=1): a step then moves each parameter by minus its gradient."""
    trainer.agent_optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in trainer.agents]
    if getattr(trainer, "critic_optimizers", None):
        trainer.critic_optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in trainer.critics]
    if getattr(trainer, "critic_optimizer", None) is not None:
        trainer.critic_optimizer = torch.optim.SGD(trainer.critics[0].parameters(), lr=1.0)


def steps(module, before):
    """Minus each parameter's change since `before` (a `snapshot`): its gradient under SGD(lr=1)."""
    return {name: before[name] - p.detach() for name, p in module.named_parameters()}


def ours_from(comlrl_model) -> CausalLMWithValueHead:
    """Our value model on a copy of a CoMLRL model's backbone, with a copy of its head's weights."""
    head = comlrl_model.value_head
    ours = CausalLMWithValueHead(
        copy.deepcopy(comlrl_model.model),
        value_head_hidden_dim=None
        if head is None or head.pre_projection is None
        else head.pre_projection[0].out_features,
        attach_value_head=head is not None,
    )
    if head is not None:
        ours.value_head.load_state_dict(head.state_dict())
    return ours


def batch_of(samples):
    """Our row layout of CoMLRL samples (same length within one generate call): ids `(B, T)`, P `(B,)`, R `(B,)`."""
    ids = torch.stack([s.full_input_ids for s in samples])
    prompt_lengths = torch.tensor([s.prompt_len for s in samples])
    lengths = torch.tensor([s.response_len for s in samples])
    return ids, prompt_lengths, lengths


def hand_made(samples, old_offsets, targets):
    """Give CoMLRL's samples rollout-time values off the current ones (so that clipping bites) and hand-made
    targets, as `(1,)` float32 tensors like CoMLRL's own."""
    for sample, offset, target in zip(samples, old_offsets, targets):
        sample.old_value = sample.old_value.float().reshape(()) + offset
        sample.metadata["value_target"] = torch.tensor([target])
        sample.metadata.pop("adv_target", None)
        sample.returns = torch.tensor([target])


def assert_same_steps(ours: torch.nn.Module, theirs: torch.nn.Module, before: dict):
    """Our module's gradients against CoMLRL's SGD(lr=1) step from `before`, to GRADIENT_REL of each tensor's scale
    (tests/parity.py: the measured noise floor) and the rounding of the weights CoMLRL's side is read back from."""
    assert_same_gradients({n: p.grad for n, p in ours.named_parameters()}, steps(theirs, before), weights=before)


# Rollout-time values on the far side of the targets for the first two samples: the current values are then more
# than the clip range closer to their targets, and the clipped error (the larger) is the one that counts.
OFFSETS, TARGETS = [-0.5, 0.5, 0.05], [1.0, -2.0, 0.3]


@pytest.mark.parametrize("critic_type", ["v", "q"])
@pytest.mark.parametrize("clip", [0.2, None])
def test_iac_shared_head_step_matches_comlrl(comlrl, tiny_paths, critic_type, clip):
    """IAC with the value head on the agent: one backward of actor + clipped value loss, one optimizer."""
    torch.manual_seed(0)
    trainer = build_iac(
        comlrl,
        tiny_paths,
        lambda c1: [0.0, 1.0, 2.0],
        num_agents=1,
        num_generations=3,
        use_separate_critic=False,
        value_clip_range=clip,
        value_head_hidden_dim=8,
        critic_type=critic_type,
        value_loss_coef=0.6,
        advantage_normalization=True,
    )
    samples = trainer._collect_rollouts(ITEMS[0])
    hand_made(samples, OFFSETS, TARGETS)
    trainer._prepare_advantages(samples)
    model = ours_from(trainer.agents[0])
    before = snapshot(trainer.agents[0])
    sgd(trainer)
    trainer._ac_step(0, samples)

    ids, prompt_lengths, lengths = batch_of(samples)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    logps = sequence_logprobs(out.logits, ids, response_mask(prompt_lengths, lengths, ids.shape[1]))
    values = values_at(out.values, value_positions(critic_type, prompt_lengths, lengths))
    old = torch.stack([s.old_value.reshape(()) for s in samples])
    advantage = torch.stack([s.normalized_advantage.reshape(()) for s in samples])
    loss = policy_gradient_loss(logps, advantage) + value_loss(
        values, torch.tensor(TARGETS), old, clip_range=clip, coef=0.6
    )
    loss.backward()
    assert_same_steps(model, trainer.agents[0], before)
    if clip is not None:  # the clip was active for the first two samples
        unclipped = value_loss(values.detach(), torch.tensor(TARGETS), coef=0.6)
        assert not torch.isclose(value_loss(values.detach(), torch.tensor(TARGETS), old, clip, 0.6), unclipped)


@pytest.mark.parametrize("critic_type", ["v", "q"])
def test_iac_separate_critic_step_matches_comlrl(comlrl, tiny_paths, critic_type):
    """IAC with a critic model per agent: never clipped (value_clip_range is set and ignored), two optimizers."""
    torch.manual_seed(0)
    trainer = build_iac(
        comlrl,
        tiny_paths,
        lambda c1, c2: [0.5, -1.0],  # per agent
        num_agents=2,
        num_generations=3,
        use_separate_critic=True,
        value_clip_range=0.2,
        critic_type=critic_type,
        value_loss_coef=0.6,
    )
    samples = [s for s in trainer._collect_rollouts(ITEMS[1]) if s.agent_idx == 1]
    hand_made(samples, OFFSETS, TARGETS)
    trainer._prepare_advantages(samples)
    actor, critic = ours_from(trainer.agents[1]), ours_from(trainer.critics[1])
    actor_before, critic_before = snapshot(trainer.agents[1]), snapshot(trainer.critics[1])
    sgd(trainer)
    trainer._ac_step(1, samples)

    ids, prompt_lengths, lengths = batch_of(samples)
    mask = torch.ones_like(ids)
    logps = sequence_logprobs(
        actor(input_ids=ids, attention_mask=mask).logits, ids, response_mask(prompt_lengths, lengths, ids.shape[1])
    )
    advantage = torch.stack([s.normalized_advantage.reshape(()) for s in samples])
    policy_gradient_loss(logps, advantage).backward()
    values = values_at(critic.values(ids, mask), value_positions(critic_type, prompt_lengths, lengths))
    value_loss(values, torch.tensor(TARGETS), coef=0.6).backward()
    assert_same_steps(actor, trainer.agents[1], actor_before)
    assert_same_steps(critic, trainer.critics[1], critic_before)


@pytest.mark.parametrize("critic_type", ["v", "q"])
def test_maac_step_matches_comlrl(comlrl, tiny_paths, critic_type):
    """MAAC: the joint critic reads CoMLRL's joint text; agent 0's step moves agent 0 and the critic."""
    torch.manual_seed(0)
    trainer = build_maac(
        comlrl,
        tiny_paths,
        lambda c1, c2: [0.25, 1.5],  # per generation
        num_agents=2,
        num_generations=2,
        critic_type=critic_type,
        value_loss_coef=0.6,
    )
    samples = trainer._collect_rollouts(ITEMS[2])
    tokenizer = trainer.tokenizers[0]
    prompts = [next(s.prompt for s in samples if s.agent_idx == i) for i in range(2)]
    texts = []
    for g in range(2):
        completions = [
            next(s.completion for s in samples if s.agent_idx == i and s.metadata["generation_idx"] == g)
            for i in range(2)
        ]
        texts.append(joint_critic_text(prompts, completions if critic_type == "q" else None))
    for s in samples:  # our joint text tokenizes to CoMLRL's critic input
        expected = tokenizer(texts[s.metadata["generation_idx"]], return_tensors="pt", truncation=True)["input_ids"]
        assert torch.equal(s.metadata["joint_input_ids"], expected)

    agent0 = [s for s in samples if s.agent_idx == 0]
    hand_made(agent0, OFFSETS[:2], TARGETS[:2])
    trainer._prepare_advantages(agent0)
    actor, critic = ours_from(trainer.agents[0]), ours_from(trainer.critics[0])
    actor_before, critic_before = snapshot(trainer.agents[0]), snapshot(trainer.critics[0])
    sgd(trainer)
    trainer._ac_step(0, agent0)

    ids, prompt_lengths, lengths = batch_of(agent0)
    logits = actor(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    logps = sequence_logprobs(logits, ids, response_mask(prompt_lengths, lengths, ids.shape[1]))
    advantage = torch.stack([s.normalized_advantage.reshape(()) for s in agent0])
    policy_gradient_loss(logps, advantage).backward()
    values = torch.cat([critic.values(s.metadata["joint_input_ids"])[:, -1] for s in agent0])  # rows differ in length
    value_loss(values, torch.tensor(TARGETS[:2]), coef=0.6).backward()
    assert_same_steps(actor, trainer.agents[0], actor_before)
    assert_same_steps(critic, trainer.critics[0], critic_before)


# ---- 6. the value model


@pytest.mark.parametrize("hidden_dim", [None, 0, 16])
def test_value_head_draws_comlrl_head_from_the_same_seed(comlrl, hidden_dim):
    torch.manual_seed(3)
    theirs = comlrl.Head(64, hidden_dim)
    torch.manual_seed(3)
    ours = ValueHead(64, hidden_dim)
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[key], value), key


@pytest.mark.parametrize("hidden_dim", [None, 256])
def test_value_head_init(hidden_dim):
    head = ValueHead(4096, hidden_dim)
    for name, p in head.named_parameters():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        elif p.numel() > 1000:  # enough draws to read the standard deviation
            assert abs(p.std().item() - 0.02) < 0.002, name
    with pytest.raises(ValueError, match="hidden_dim"):
        ValueHead(8, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden_dim", [None, 8])
def test_value_model_matches_comlrl(comlrl, tiny_paths, dtype, hidden_dim):
    backbone = AutoModelForCausalLM.from_pretrained(tiny_paths[0], dtype=dtype)
    theirs = comlrl.Model(copy.deepcopy(backbone), value_head_hidden_dim=hidden_dim)
    ours = CausalLMWithValueHead(backbone, value_head_hidden_dim=hidden_dim)
    assert ours.value_head.value_projection.weight.dtype == dtype == theirs.value_head.value_projection.weight.dtype
    ours.value_head.load_state_dict(theirs.value_head.state_dict())
    ids = torch.randint(0, 256, (3, 7))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # a left-padded row
    out, ref = ours(input_ids=ids, attention_mask=mask), theirs(input_ids=ids, attention_mask=mask)
    assert out.values.shape == (3, 7) and out.values.dtype == dtype
    assert torch.equal(out.values, ref.values) and torch.equal(out.logits, ref.logits)
    assert torch.equal(ours.values(ids, mask), ref.values)  # without the vocabulary-sized logits
    assert ours(input_ids=ids, output_values=False).values is None
    assert ours.generate(input_ids=ids[:1], max_new_tokens=2, do_sample=False).shape[1] > ids.shape[1]


def test_value_model_v_from_full_sequence_equals_comlrl_prompt_forward(comlrl, tiny_paths):
    """V(prompt) read from the full sequence's forward equals CoMLRL's forward over the prompt alone (causal)."""
    theirs = comlrl.Model(AutoModelForCausalLM.from_pretrained(tiny_paths[1]))
    ours = ours_from(theirs)
    ids = torch.randint(0, 256, (2, 10))
    prompt_lengths = torch.tensor([4, 4])
    stub = bare(comlrl.IACTrainer, None)
    reference = comlrl.Base._value_on_prompt_only(stub, theirs, ids, torch.ones_like(ids), 4)
    ours_v = values_at(ours.values(ids), value_positions("v", prompt_lengths))
    assert_same_forward(ours_v, reference)


@pytest.mark.parametrize("hidden_dim", [None, 8])
def test_value_model_save_and_load_round_trip_in_comlrl_layout(comlrl, tiny_paths, tmp_path, hidden_dim):
    ours = CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_paths[0]), hidden_dim)
    torch.nn.init.normal_(ours.value_head.value_projection.bias)  # not the initial head
    ours.save_pretrained(str(tmp_path / "critic"))
    assert (tmp_path / "critic" / VALUE_HEAD_FILE).is_file() and (tmp_path / "critic" / "config.json").is_file()
    ids = torch.randint(0, 256, (2, 6))
    expected = ours.values(ids)

    loaded = CausalLMWithValueHead.from_pretrained(str(tmp_path / "critic"))
    assert loaded.value_head.hidden_dim == ours.value_head.hidden_dim
    assert torch.equal(loaded.values(ids), expected)
    # CoMLRL's way to read the same folder: its wrapper on the LM, then `value_head.pt`.
    theirs = comlrl.Model(AutoModelForCausalLM.from_pretrained(str(tmp_path / "critic")), hidden_dim)
    theirs.value_head.load_state_dict(torch.load(tmp_path / "critic" / VALUE_HEAD_FILE, weights_only=True))
    assert torch.equal(theirs(input_ids=ids).values, expected)
    with pytest.raises(ValueError, match="hidden_dim"):
        CausalLMWithValueHead.from_pretrained(str(tmp_path / "critic"), value_head_hidden_dim=99)
    # A plain LM loads without a head, or with a fresh one for a new critic.
    assert CausalLMWithValueHead.from_pretrained(tiny_paths[0]).value_head is None
    assert CausalLMWithValueHead.from_pretrained(tiny_paths[0], attach_value_head=True).value_head is not None


def test_value_model_loads_comlrl_save_model(comlrl, tiny_paths, tmp_path):
    """What CoMLRL's IAC `save_model` writes (one agent with its own head: the LM and `value_head.pt`) loads here
    with the same values."""
    trainer = build_iac(
        comlrl, tiny_paths, lambda c1: [1.0], num_agents=1, use_separate_critic=False, value_head_hidden_dim=8
    )
    torch.nn.init.normal_(trainer.agents[0].value_head.value_projection.bias)
    trainer.save_model(str(tmp_path / "saved"))
    ids = torch.randint(0, 256, (2, 6))
    loaded = CausalLMWithValueHead.from_pretrained(str(tmp_path / "saved"))
    assert torch.equal(loaded.values(ids), trainer.agents[0](input_ids=ids).values)


# ---- 7. a LoRA critic: one more adapter and a head on the team's shared base


@pytest.fixture
def lora_team(tiny_paths):
    """A PEFT base with two agents' adapters and a critic's (random, so that each one changes the values)."""
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_paths[0]), lora_config(), "agent_0")
    model.add_adapter("agent_1", lora_config())
    model.add_adapter("critic", lora_config(r=2))
    model.set_adapter("agent_0")
    return model


def test_lora_critic_values_and_gradients_reach_only_its_adapter_and_head(lora_team):
    critic = AdapterValueModel(lora_team, "critic", value_head_hidden_dim=8)
    ids = torch.randint(0, 256, (2, 6))
    values = critic(ids, torch.ones_like(ids))
    assert values.shape == (2, 6)

    # The same head on the agent's adapter, and on the base alone, read different hidden states.
    agent = AdapterValueModel(lora_team, "agent_0", value_head_hidden_dim=8)
    agent.value_head.load_state_dict(critic.value_head.state_dict())
    with torch.no_grad():
        assert not torch.allclose(agent(ids), values)
        lora_team.set_adapter("critic")
        with lora_team.disable_adapter():
            base = critic.value_head(lora_team(input_ids=ids, output_hidden_states=True).hidden_states[-1]).squeeze(-1)
    assert not torch.allclose(base, values)

    # TRL's reference pass (`disable_adapter`) and the team's next agent freeze adapters: the critic's own forward
    # makes its adapter trainable again.
    lora_team.set_adapter("agent_1")
    with lora_team.disable_adapter():
        pass
    values = critic(ids)
    values.sum().backward()
    with_grad = {n for n, p in lora_team.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    critic_adapter = {n for n, p in lora_team.named_parameters() if ".critic." in n}
    assert with_grad == critic_adapter
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in critic.value_head.parameters())
    # The module's own parameters are the head's (the base belongs to the team); the optimizer gets both.
    assert {id(p) for p in critic.parameters()} == {id(p) for p in critic.value_head.parameters()}
    assert len(critic.trainable_parameters()) == len(critic_adapter) + len(list(critic.value_head.parameters()))

    before = snapshot(lora_team)
    torch.optim.SGD(critic.trainable_parameters(), lr=0.1).step()
    assert changed(before, lora_team) == critic_adapter


def test_lora_critic_save_and_load_round_trip(lora_team, tiny_paths, tmp_path):
    critic = AdapterValueModel(lora_team, "critic", value_head_hidden_dim=8)
    torch.nn.init.normal_(critic.value_head.value_projection.bias)
    ids = torch.randint(0, 256, (2, 6))
    with torch.no_grad():
        expected = critic(ids)
    critic.save_pretrained(str(tmp_path / "critic"))
    assert {"adapter_config.json", "adapter_model.safetensors", VALUE_HEAD_FILE} <= set(
        os.listdir(tmp_path / "critic")
    )

    # Back into the same critic after its weights changed...
    with torch.no_grad():
        for p in critic.trainable_parameters():
            p.add_(0.5)
    critic.load_pretrained(str(tmp_path / "critic"))
    with torch.no_grad():
        assert torch.equal(critic(ids), expected)
    # ... and as a plain PEFT adapter folder on a fresh base, plus the head.
    fresh = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_paths[0]), str(tmp_path / "critic"), adapter_name="critic"
    )
    reloaded = AdapterValueModel(fresh, "critic", value_head_hidden_dim=8)
    reloaded.value_head.load_state_dict(torch.load(tmp_path / "critic" / VALUE_HEAD_FILE, weights_only=True))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids), expected)


def test_adapter_value_model_errors(lora_team, tiny_paths):
    with pytest.raises(ValueError, match="no adapter named 'judge'"):
        AdapterValueModel(lora_team, "judge")
    with pytest.raises(TypeError, match="PeftModel"):
        AdapterValueModel(AutoModelForCausalLM.from_pretrained(tiny_paths[0]), "critic")


def test_value_model_without_head(tiny_paths):
    actor = CausalLMWithValueHead(AutoModelForCausalLM.from_pretrained(tiny_paths[0]), attach_value_head=False)
    assert actor.value_head is None and actor(input_ids=torch.tensor([[1, 2]])).values is None
    with pytest.raises(ValueError, match="no value head"):
        actor.values(torch.tensor([[1, 2]]))
    tokenizer = AutoTokenizer.from_pretrained(tiny_paths[0])
    assert actor.config.pad_token_id == tokenizer.pad_token_id
