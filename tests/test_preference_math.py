"""The preference core (`multiagent_trl.preference`) against CoMLRL 1.4.3 itself: pair selection, MADPO's
joint-factorised DPO loss and gradient, and MARLHF's joint reward model (text, head, scores, Bradley-Terry gradient).

CoMLRL's math lives in trainer methods that need only a few attributes of their trainer; they are called on a bare
instance (`bare`) holding the tiny test models. Its updates run with SGD(lr=1), so that each parameter's change is
minus its gradient: comparing changes with our gradients compares the losses' gradients exactly.
"""

from __future__ import annotations

import copy
import json
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from multiagent_trl.preference.losses import (
    bradley_terry_loss,
    joint_dpo_losses,
    pack_rows,
    preference_logratios,
    sequence_logprobs,
    trim_completion,
)
from multiagent_trl.preference.pairs import PAIR_SELECTIONS, check_pair_set, select_pairs
from multiagent_trl.preference.reward_model import JointRewardModel, joint_text
from multiagent_trl.testing import tiny_model_path, tiny_tokenizer

from .parity import assert_same_forward, assert_same_gradients


@pytest.fixture(scope="module")
def comlrl():
    """CoMLRL 1.4.3's preference trainers (the dev extra installs it)."""
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers.preference import collaboration, madpo, marlhf

    return SimpleNamespace(madpo=madpo, marlhf=marlhf, joint_sequence_log_prob=collaboration.joint_sequence_log_prob)


def bare(trainer_class, **attributes):
    """A trainer instance without its constructor, holding only what the called methods read."""
    trainer = object.__new__(trainer_class)
    trainer.__dict__.update(attributes)
    return trainer


def sgd(modules):
    return [torch.optim.SGD(m.parameters(), lr=1.0) for m in modules]


def param_changes(before, module):
    return {name: p.detach() - before[name] for name, p in module.named_parameters()}


def snapshot(module):
    return {name: p.detach().clone() for name, p in module.named_parameters()}


# ---- pairs

REWARDS = [
    [0.0, 1.0, 0.5, 1.0, -2.0],  # a tie at the top and equal gaps
    [3, 1, 2],  # ints
    [1.0, 1.0, 0.0, 0.0, 1.0, 0.5],  # several ties
    [0.2, 0.1],
    [5.0, 5.0, 5.0],  # no pair
    [-1e-9, 0.0, 1e-9, 2.0, 2.0, -3.0, 0.7, 0.7],
]


@pytest.mark.parametrize("rewards", REWARDS)
@pytest.mark.parametrize(
    ("selection", "limit"),
    [("reward_gap", 16), ("reward_gap", 3), ("reward_gap", None), ("all", None), ("random", 4), ("random", None)],
)
def test_pairs_match_comlrl(comlrl, rewards, selection, limit):
    theirs = bare(
        comlrl.madpo.MADPOTrainer, args=SimpleNamespace(pair_selection=selection, preference_pairs_per_sample=limit)
    )
    for seed in (0, 1, 7):
        random.seed(seed)
        expected = theirs._select_preference_pair_indices(list(rewards))
        random.seed(seed)
        assert select_pairs(rewards, selection, limit) == expected
        assert select_pairs(rewards, selection, limit, rng=random.Random(seed)) == expected
        assert all(rewards[win] > rewards[lose] for win, lose in expected)


def test_pair_selection_is_checked():
    assert PAIR_SELECTIONS == ("reward_gap", "all", "random")
    assert select_pairs([0, 1], "Reward_Gap") == [(1, 0)]
    with pytest.raises(ValueError, match="pair_selection must be one of"):
        select_pairs([0, 1], "comparator_reward")
    with pytest.raises(ValueError, match="at least 1"):
        select_pairs([0, 1], "reward_gap", 0)


def test_empty_pair_set_raises_with_the_fix():
    pairs = [p for rewards in ([1, 1, 1], [0.5, 0.5]) for p in select_pairs(rewards)]
    assert pairs == []
    with pytest.raises(ValueError, match="preference_num_candidates") as error:
        check_pair_set(len(pairs), num_items=2, num_candidates=3)
    assert "partial credit" in str(error.value)
    check_pair_set(1, num_items=2, num_candidates=3)  # one pair is enough


# ---- MADPO: sequence log-probabilities, loss, gradient


@pytest.fixture(scope="module")
def agents():
    return [AutoModelForCausalLM.from_pretrained(tiny_model_path(seed=s)) for s in (0, 1)]


def make_pairs(comlrl, tokenizer):
    """Three pairs of 2-agent joint candidates: generated-style completions (end token, then padding; one hitting the
    length limit without an end token; one a single token)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def ids(text, end=(), width=12):
        tokens = tokenizer.encode(text, add_special_tokens=False) + list(end)
        return torch.tensor(tokens + [pad] * (width - len(tokens)))

    prompts = [["Sum 2 and 3:", "Check the sum:"], ["Name a fruit.", "Name a colour."], ["Hi", "Yo"]]
    winners = [[("5", [eos]), ("ok", [eos])], [("apple pie", []), ("red", [eos])], [("a", []), ("b", [eos])]]
    losers = [[("six", [eos]), ("no!", [eos])], [("rock", [eos]), ("x", [])], [("zz", [eos]), ("", [eos])]]
    pairs = []
    for p, w, lo in zip(prompts, winners, losers):
        tensors = [
            comlrl.madpo.AgentPreferenceTensors(
                prompt_input_ids=torch.tensor(tokenizer.encode(p[i], add_special_tokens=False)),
                winner_completion_ids=ids(*w[i]),
                loser_completion_ids=ids(*lo[i]),
            )
            for i in range(2)
        ]
        pairs.append(
            comlrl.madpo.PreferencePair(
                prompts=p,
                winner_completions=[c for c, _ in w],
                loser_completions=[c for c, _ in lo],
                agent_tensors=tensors,
                winner_reward=1.0,
                loser_reward=0.0,
                candidate_reward_mean=0.5,
            )
        )
    return pairs


def our_logratios(models, pairs, pad_token_id, drop_last_token):
    """`(N, B)` each agent's log-ratio on each pair, from one batched forward per agent."""
    rows = []
    for i, model in enumerate(models):
        prompts = [p.agent_tensors[i].prompt_input_ids for p in pairs] * 2
        completions = [trim_completion(p.agent_tensors[i].winner_completion_ids, pad_token_id) for p in pairs]
        completions += [trim_completion(p.agent_tensors[i].loser_completion_ids, pad_token_id) for p in pairs]
        input_ids, attention_mask, mask = pack_rows(prompts, completions, pad_token_id, drop_last_token)
        logps = sequence_logprobs(model(input_ids=input_ids, attention_mask=attention_mask).logits, input_ids, mask)
        rows.append(preference_logratios(logps[: len(pairs)], logps[len(pairs) :]))
    return torch.stack(rows)  # (N, B)


def test_sequence_logprobs_match_comlrl(comlrl, agents):
    """Default: every completion token up to the first pad (CoMLRL's centralized scorer, pad != eos); with
    `drop_last_token`, CoMLRL's decentralized MADPO scorer."""
    tokenizer = tiny_tokenizer()
    pairs = make_pairs(comlrl, tokenizer)
    madpo = bare(comlrl.madpo.MADPOTrainer, agents=agents, tokenizers=[tokenizer] * 2, centralized_collaboration=None)
    for i, model in enumerate(agents):
        for pair in pairs:
            t = pair.agent_tensors[i]
            for completion in (t.winner_completion_ids, t.loser_completion_ids):
                trimmed = trim_completion(completion, tokenizer.pad_token_id)
                for drop, expected in (
                    (False, comlrl.joint_sequence_log_prob(model, tokenizer, t.prompt_input_ids, completion)),
                    (True, madpo._sequence_log_prob(i, t.prompt_input_ids, completion)),
                ):
                    ids, attention, mask = pack_rows([t.prompt_input_ids], [trimmed], tokenizer.pad_token_id, drop)
                    ours = sequence_logprobs(model(input_ids=ids, attention_mask=attention).logits, ids, mask)
                    assert_same_forward(ours[0], expected)


@pytest.mark.parametrize("beta", [0.1, 2.0])
def test_joint_dpo_loss_and_gradient_match_comlrl(comlrl, agents, beta):
    tokenizer = tiny_tokenizer()
    pairs = make_pairs(comlrl, tokenizer)
    theirs = [copy.deepcopy(m) for m in agents]
    ours = [copy.deepcopy(m) for m in agents]
    madpo = bare(
        comlrl.madpo.MADPOTrainer,
        agents=theirs,
        tokenizers=[tokenizer] * 2,
        centralized_collaboration=None,
        num_agents=2,
        args=SimpleNamespace(dpo_beta=beta),
        optimizers=sgd(theirs),
    )
    detached = madpo._detached_agent_deltas(pairs)
    expected_losses = [madpo._agent_preference_loss(i, pairs, detached).item() for i in range(2)]
    before = [snapshot(m) for m in theirs]
    madpo._update_from_preference_batch(pairs)

    logratios = our_logratios(ours, pairs, tokenizer.pad_token_id, drop_last_token=True)
    assert_same_forward(logratios, torch.tensor(detached, dtype=torch.float32).T, msg="log-ratios")
    losses = joint_dpo_losses(logratios, beta)
    assert_same_forward(losses, torch.tensor(expected_losses), msg="losses")
    losses.sum().backward()  # one backward: each agent gets its own loss's gradient
    for i in range(2):
        gradients = {name: -change for name, change in param_changes(before[i], theirs[i]).items()}
        ours_gradients = {name: p.grad for name, p in ours[i].named_parameters()}
        assert_same_gradients(ours_gradients, gradients, prefix=f"agent {i} ", weights=before[i])


def test_reference_logratios_follow_trl_dpo():
    chosen, rejected = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-3.0, -1.0]])
    ref_chosen, ref_rejected = torch.tensor([[-2.0, -2.0]]), torch.tensor([[-2.5, -1.5]])
    delta = preference_logratios(chosen, rejected, ref_chosen, ref_rejected)
    # TRL's DPOTrainer: logits = (chosen - ref_chosen) - (rejected - ref_rejected), sigmoid loss -logsigmoid(b*logits)
    torch.testing.assert_close(delta, (chosen - ref_chosen) - (rejected - ref_rejected))
    single = joint_dpo_losses(delta, beta=0.1)  # one agent: plain DPO
    torch.testing.assert_close(single, -torch.nn.functional.logsigmoid(0.1 * delta).mean(dim=1))
    with pytest.raises(ValueError, match="both"):
        preference_logratios(chosen, rejected, ref_chosen)


def test_hinge_joint_loss_is_trls_hinge_on_the_joint_margin():
    """`dpo_loss_type="hinge"`: TRL's DPO hinge `relu(1 - beta * delta)` on the team's margin; agent i's gradient is
    `-beta / B` where the joint margin is below 1, through its own log-ratio only."""
    beta = 0.5
    deltas = torch.tensor([[1.0, -2.0, 4.0], [0.5, 0.0, 0.1]], requires_grad=True)  # 2 agents, 3 pairs
    losses = joint_dpo_losses(deltas, beta, loss_type="hinge")
    joint = deltas.detach().sum(dim=0)  # margins 0.75, -1.0, 2.05 (times beta)
    torch.testing.assert_close(losses, torch.relu(1 - beta * joint).mean().expand(2))
    losses.sum().backward()
    active = (beta * joint < 1).float()
    torch.testing.assert_close(deltas.grad, (-beta / 3 * active).expand(2, 3))
    single = joint_dpo_losses(deltas[:1].detach(), beta, loss_type="hinge")  # one agent: TRL's hinge
    torch.testing.assert_close(single, torch.relu(1 - beta * deltas[:1].detach()).mean(dim=1))
    with pytest.raises(ValueError, match="loss_type must be one of"):
        joint_dpo_losses(deltas, beta, loss_type="ipo")


# ---- MARLHF: the joint reward model


def rm_pairs(comlrl):
    texts = [
        (["Sum 2 and 3:", "Check:"], ["5", "correct"], ["6", "wrong, it is 5"]),
        (["Name a fruit.", "Name a colour."], ["apple", "red"], ["rock", ""]),
        (["Hi", "Yo"], ["hello there, how are you doing today?", "fine"], ["x", "y"]),
    ]
    return [
        comlrl.madpo.PreferencePair(
            prompts=p,
            winner_completions=w,
            loser_completions=lo,
            agent_tensors=[],
            winner_reward=1.0,
            loser_reward=0.0,
            candidate_reward_mean=0.5,
        )
        for p, w, lo in texts
    ]


def rm_trainers(comlrl, max_length):
    """CoMLRL's and our reward models on the same backbone weights and (seeded) head."""
    path = tiny_model_path()
    tokenizer = tiny_tokenizer()
    tokenizer.padding_side = "right"  # CoMLRL pads on the tokenizer's side and passes no positions; ours: right
    torch.manual_seed(3)
    theirs = comlrl.marlhf.JointRewardModel(AutoModelForCausalLM.from_pretrained(path))
    torch.manual_seed(3)
    ours = JointRewardModel(AutoModelForCausalLM.from_pretrained(path), tiny_tokenizer(), max_length=max_length)
    marlhf = bare(
        comlrl.marlhf.MARLHFTrainer,
        num_agents=2,
        reward_model=theirs,
        reward_tokenizer=tokenizer,
        reward_device=torch.device("cpu"),
        verbose=False,
        reward_optimizer=sgd([theirs])[0],
        args=SimpleNamespace(reward_max_length=max_length, reward_train_batch_size=3, reward_num_train_epochs=1),
    )
    return marlhf, theirs, ours


@pytest.mark.parametrize("max_length", [None, 24])
def test_reward_model_scores_match_comlrl(comlrl, max_length):
    marlhf, theirs, ours = rm_trainers(comlrl, max_length)
    torch.testing.assert_close(ours.reward_head.state_dict(), theirs.reward_head.state_dict())  # same seeded init
    pairs = rm_pairs(comlrl)
    texts = [marlhf._format_joint_reward_text(p, use_winner=w) for p in pairs for w in (True, False)]
    assert texts == [joint_text(p.prompts, c) for p in pairs for c in (p.winner_completions, p.loser_completions)]
    with torch.no_grad():
        assert_same_forward(ours.score(texts), marlhf._score_reward_texts(texts), msg="scores")
        # as a reward function: prompts[j], completions[j] hold every agent's prompt and completion
        scores = ours(prompts=[p.prompts for p in pairs], completions=[p.winner_completions for p in pairs])
        assert_same_forward(torch.tensor(scores), marlhf._score_reward_texts(texts[::2]), msg="reward function")
        # left padding scores as right padding (positions counted over attended tokens, any position scheme)
        left = tiny_tokenizer()(texts, padding=True, padding_side="left", return_tensors="pt")
        if max_length is None:
            assert_same_forward(ours(**left), ours.score(texts), msg="left padding")


def test_bradley_terry_gradient_matches_comlrl(comlrl):
    marlhf, theirs, ours = rm_trainers(comlrl, None)
    pairs = rm_pairs(comlrl)
    before = snapshot(theirs)
    marlhf._train_reward_model(pairs)  # one batch of all pairs (the mean is order-free), one SGD(lr=1) step
    loss = bradley_terry_loss(
        ours.score([joint_text(p.prompts, p.winner_completions) for p in pairs]),
        ours.score([joint_text(p.prompts, p.loser_completions) for p in pairs]),
    )
    loss.backward()
    gradients = {name: -change for name, change in param_changes(before, theirs).items()}
    assert_same_gradients({name: p.grad for name, p in ours.named_parameters()}, gradients, weights=before)


def test_reward_model_save_load_and_freeze(tmp_path):
    path = tiny_model_path()
    model = JointRewardModel(AutoModelForCausalLM.from_pretrained(path), tiny_tokenizer(), freeze_backbone=True)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["reward_head.weight", "reward_head.bias"]
    with torch.no_grad():
        model.reward_head.bias.fill_(0.25)
    model.save_pretrained(str(tmp_path))
    loaded = JointRewardModel.from_pretrained(str(tmp_path))
    texts = [joint_text(["a", "b"], ["c", "d"])]
    with torch.no_grad():
        torch.testing.assert_close(loaded.score(texts), model.score(texts))
    fresh = JointRewardModel.from_causal_lm(path)  # a plain causal LM folder: a new head, when asked for
    assert fresh.reward_head.weight.shape == model.reward_head.weight.shape


# ---- beyond CoMLRL: what the reward head reads (`pooling`), a margin in the Bradley-Terry loss


POOLING_PROMPTS = [("Write a tale:", "Write it longer:"), ("Hi", "Hey")]
# an empty response and multi-byte characters
POOLING_COMPLETIONS = [("short", "a much longer answer"), ("", "\u00e9t\u00e9 \ufffd")]


def last_hidden(model: JointRewardModel, texts: list[str]) -> list[torch.Tensor]:
    """Each text's last hidden states `(T_b, H)`, one unpadded forward per text (no batching to trust)."""
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = model.tokenizer(text, return_tensors="pt")["input_ids"]  # (1, T): one token per byte
            assert ids.shape[1] == len(text.encode("utf-8"))
            outputs = model.backbone(input_ids=ids, output_hidden_states=True, use_cache=False)
            rows.append(outputs.hidden_states[-1][0])
    return rows


def response_tokens(prompts, completions, agent: int) -> slice:
    """Agent `agent`'s response tokens, found without offsets: the byte length of the text before it and of it."""
    text = joint_text(prompts, completions)
    before = text[: text.index(f"Agent {agent + 1} response:\n") + len(f"Agent {agent + 1} response:\n")]
    start = len(before.encode("utf-8"))
    return slice(start, start + len(completions[agent].encode("utf-8")))


@pytest.mark.parametrize("pooling", ["mean", "spans", "span_sums"])
def test_reward_model_pooling_reads_the_hand_computed_features(pooling):
    torch.manual_seed(0)
    model = JointRewardModel.from_causal_lm(tiny_model_path(), pooling=pooling, num_agents=2).eval()
    texts = [joint_text(p, c) for p, c in zip(POOLING_PROMPTS, POOLING_COMPLETIONS)]
    expected = []
    for prompts, completions, hidden in zip(POOLING_PROMPTS, POOLING_COMPLETIONS, last_hidden(model, texts)):
        if pooling == "mean":
            expected.append(hidden.mean(dim=0))
            continue
        features = []
        for agent in range(2):
            span = hidden[response_tokens(prompts, completions, agent)]  # (S, H); S = 0 for the empty response
            if pooling == "spans":
                features.append(span.mean(dim=0) if len(span) else torch.zeros(hidden.shape[1]))
            else:
                features.append(span.sum(dim=0))
        expected.append(torch.cat(features))
    expected = torch.stack(expected)  # (B, F)
    with torch.no_grad():
        scores = model.score_joint(POOLING_PROMPTS, POOLING_COMPLETIONS)  # one right-padded batch of both rows
        as_reward = model(prompts=POOLING_PROMPTS, completions=POOLING_COMPLETIONS)
    torch.testing.assert_close(scores, model.reward_head(expected).squeeze(-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(as_reward), scores)
    assert model.reward_head.in_features == (64 if pooling == "mean" else 128)


def test_reward_model_last_pooling_is_unchanged_by_score_joint():
    torch.manual_seed(0)
    model = JointRewardModel.from_causal_lm(tiny_model_path()).eval()
    assert model.pooling == "last" and model.reward_head.in_features == 64  # CoMLRL's head, the default
    with torch.no_grad():
        torch.testing.assert_close(
            model.score_joint(POOLING_PROMPTS, POOLING_COMPLETIONS),
            model.score([joint_text(p, c) for p, c in zip(POOLING_PROMPTS, POOLING_COMPLETIONS)]),
        )


def test_reward_model_pooling_round_trips_and_old_folders_load_as_last(tmp_path):
    torch.manual_seed(0)
    model = JointRewardModel.from_causal_lm(tiny_model_path(), pooling="span_sums", num_agents=2).eval()
    with torch.no_grad():
        model.reward_head.bias.fill_(0.5)
    model.save_pretrained(str(tmp_path / "spans"))
    loaded = JointRewardModel.from_pretrained(str(tmp_path / "spans"))
    assert (loaded.pooling, loaded.num_agents) == ("span_sums", 2)
    with torch.no_grad():
        torch.testing.assert_close(
            loaded.score_joint(POOLING_PROMPTS, POOLING_COMPLETIONS),
            model.score_joint(POOLING_PROMPTS, POOLING_COMPLETIONS),
        )
    # A folder saved before the pooling was recorded: its marker has no "pooling"; older still, no marker at all.
    old = JointRewardModel.from_causal_lm(tiny_model_path()).eval()
    old.save_pretrained(str(tmp_path / "old"))
    marker = tmp_path / "old" / "joint_reward_model.json"
    saved = json.loads(marker.read_text())
    marker.write_text(json.dumps({"files": saved["files"], "tokenizer": True}))
    loaded = JointRewardModel.from_pretrained(str(tmp_path / "old"))
    assert (loaded.pooling, loaded.num_agents) == ("last", None)
    with torch.no_grad():
        torch.testing.assert_close(loaded.score(["x"]), old.score(["x"]))
    marker.unlink()
    assert JointRewardModel.from_pretrained(str(tmp_path / "old")).pooling == "last"


def test_reward_model_pooling_bad_input():
    path = tiny_model_path()
    with pytest.raises(ValueError, match="pooling must be one of"):
        JointRewardModel.from_causal_lm(path, pooling="max")
    with pytest.raises(ValueError, match="pass num_agents"):
        JointRewardModel.from_causal_lm(path, pooling="spans")
    model = JointRewardModel.from_causal_lm(path, pooling="spans", num_agents=3)
    with pytest.raises(ValueError, match="pools 3 agents' responses"):
        model.score_joint(POOLING_PROMPTS, POOLING_COMPLETIONS)
    with pytest.raises(ValueError, match="needs a span_mask"):
        model.score(["text without spans"])


def test_bradley_terry_margin_is_subtracted_from_the_score_difference():
    chosen, rejected, margin = torch.tensor([1.0, 0.5]), torch.tensor([0.0, 1.0]), torch.tensor([0.3, 2.0])
    expected = -torch.nn.functional.logsigmoid(chosen - rejected - margin).mean()
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected, margin), expected)
    no_margin = bradley_terry_loss(chosen, rejected)
    torch.testing.assert_close(bradley_terry_loss(chosen, rejected, torch.zeros(2)), no_margin)


def test_train_reward_model_margin_scale_uses_the_reward_gap():
    from multiagent_trl.preference.reward_training import JointPreferencePair, train_reward_model

    pairs = [
        JointPreferencePair(("Q", "Q"), ("a", "bb"), ("aa", "b"), chosen_reward=1.0, rejected_reward=0.25),
        JointPreferencePair(("R", "R"), ("c", "dd"), ("cc", "d"), chosen_reward=0.5, rejected_reward=0.0),
    ]
    torch.manual_seed(0)
    model = JointRewardModel.from_causal_lm(tiny_model_path()).eval()
    with torch.no_grad():
        chosen = model.score_joint([p.prompts for p in pairs], [p.chosen for p in pairs])
        rejected = model.score_joint([p.prompts for p in pairs], [p.rejected for p in pairs])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the loss before any update, one batch of both
    history = train_reward_model(model, pairs, batch_size=2, optimizer=optimizer, margin_scale=4.0)
    expected = -torch.nn.functional.logsigmoid(chosen - rejected - 4.0 * torch.tensor([0.75, 0.5])).mean()
    assert history[0]["loss"] == pytest.approx(expected.item(), rel=1e-5)
    with pytest.raises(ValueError, match="margin_scale"):
        train_reward_model(model, pairs, margin_scale=-1.0)
