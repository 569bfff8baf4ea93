"""Centralized MADPO: `MADPOConfig(collaboration_mode="centralized")` trains one model that
writes every role. Against CoMLRL 1.4.3's own centralized MADPO (the same pairs, loss and weights after one update),
a CoMLRL script with only its imports changed, the reward on the parsed roles, evaluation split into roles, and the
arguments refused at construction.

The parity and reward tests replace both libraries' sampling with one deterministic `generate` (`tagged_generate`)
that writes `<agent_i>` sections, so that both train on the same candidates and the tags parse; the script test
samples from the tiny model itself.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from multiagent_trl import MADPOConfig, MADPOTrainer, TaggedCentralizedComparatorAdapter
from multiagent_trl.testing import tiny_model_path

from .conftest import changed, snapshot
from .parity import FORWARD_REL, GRADIENT_REL, TINY, assert_close_to_scale, assert_same_update, weight_rounding
from .test_actor_critic import LR, parity_reward, run_script
from .test_madpo import our_pairs, recorded_batches

K = 4  # joint candidates per item
MAX_NEW = 48  # the joint completion's budget, for both roles
ITEM = {"prompt": "Name a red fruit:"}


@pytest.fixture(scope="module")
def comlrl():
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers import preference

    return preference


def joint_text(rng: random.Random) -> tuple[str, bool]:
    """A joint answer and whether it ends (with the end token) before the budget: both roles tagged; letters
    without any tag (a parse failure); or long roles cut at the budget (the second role's section unfinished)."""
    word = lambda n: "".join(rng.choice("abcde") for _ in range(n))  # noqa: E731
    kind = rng.random()
    if kind < 0.6:
        return f"<agent_0>{word(rng.randint(0, 4))}</agent_0><agent_1>{word(rng.randint(0, 4))}</agent_1>", True
    if kind < 0.8:
        return word(rng.randint(1, 8)), True
    return f"<agent_0>{word(rng.randint(1, 6))}</agent_0><agent_1>{word(30)}</agent_1>", False


def tagged_generate(tokenizer, texts: list | None = None):
    """A deterministic `generate`, called as CoMLRL calls it (one prompt, `num_return_sequences`,
    `return_dict_in_generate`) or as TRL does (a batch of repeated prompts): the k-th answer to a prompt is the same
    in both. `texts` collects each answer as written (before cutting at the budget)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id

    def generate(input_ids=None, attention_mask=None, **kwargs):
        count = kwargs.get("num_return_sequences") or 1
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        rows, seen = [], {}
        for row, row_mask in zip(input_ids, mask):
            prompt = tuple(row[row_mask.bool()].tolist())
            for _ in range(count):
                k = seen[prompt] = seen.get(prompt, -1) + 1
                text, ends = joint_text(random.Random(hash((prompt, k))))
                if texts is not None:
                    texts.append(text)
                tokens = tokenizer.encode(text, add_special_tokens=False) + ([eos] if ends else [])
                tokens = tokens[:MAX_NEW]
                rows.append(row.tolist() + tokens + [pad] * (MAX_NEW - len(tokens)))
        sequences = torch.tensor(rows, device=input_ids.device)
        return SimpleNamespace(sequences=sequences) if kwargs.get("return_dict_in_generate") else sequences

    return generate


def settings(**overrides):
    fields = dict(
        collaboration_mode="centralized",
        num_agents=2,  # roles
        preference_num_candidates=K,
        preference_pairs_per_sample=16,
        rollout_buffer_size=1,
        train_batch_size=16,  # more than the pairs of one item: one update on all of them
        max_new_tokens=MAX_NEW,
        num_train_epochs=1,
        agent_learning_rate=LR,
        eval_interval=0,
        logging_steps=1,
        dpo_beta=0.5,
    )
    return {**fields, **overrides}


def build_pair(comlrl, tmp_path, optimizer: str, pad_is_eos: bool = False):
    """CoMLRL's centralized MADPOTrainer and ours with the same settings on one item (default adapter). With
    `pad_is_eos` both get a tokenizer whose pad token is the end token (CoMLRL then keeps the first one scored)."""
    ours_extra = dict(report_to="none", output_dir=str(tmp_path / "ours"))  # drop_last_token=False: CoMLRL's here
    if optimizer == "sgd":
        ours_extra.update(optim="sgd", weight_decay=0.0)
    dataset = Dataset.from_dict({"prompt": [ITEM["prompt"]]})
    trainers = []
    for config_cls, trainer_cls, extra in (
        (comlrl.MADPOConfig, comlrl.MADPOTrainer, {}),
        (MADPOConfig, MADPOTrainer, ours_extra),
    ):
        torch.manual_seed(0)
        tokenizer = None
        if pad_is_eos:
            tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
            tokenizer.pad_token = tokenizer.eos_token
        trainer = trainer_cls(
            agent_model=tiny_model_path(),
            num_agents=2,
            tokenizer=tokenizer,
            reward_func=parity_reward,
            args=config_cls(**settings(**extra)),
            train_dataset=dataset,
        )
        trainer.verbose = False
        trainers.append(trainer)
    theirs, ours = trainers
    tokenizer = ours.processing_class
    theirs.agents[0].generate = tagged_generate(tokenizer)
    ours.model.agents[0].generate = tagged_generate(tokenizer)
    if optimizer == "sgd":  # a step of -lr * gradient: the weights' change compares the gradients themselves
        theirs.optimizers[0] = torch.optim.SGD(theirs.agents[0].parameters(), lr=LR)
    return theirs, ours


def their_scored(pairs, pad: int, eos: int) -> list[tuple[list[int], list[int]]]:
    """The completion tokens CoMLRL's centralized log-probability scores: every token up to the first pad (the end
    token included; CoMLRL adds it back where pad == eos)."""

    def scored(ids):
        ids = ids.tolist()
        return ids[: ids.index(pad) + int(pad == eos)] if pad in ids else ids

    tensors = [pair.agent_tensors[0] for pair in pairs]
    return [(scored(t.winner_completion_ids), scored(t.loser_completion_ids)) for t in tensors]


# ---- 1. the same pairs, loss and weights as CoMLRL 1.4.3's centralized MADPO


@pytest.mark.parametrize(
    ("optimizer", "pad_is_eos"), [("adamw", False), ("sgd", False), ("adamw", True)], ids=["adamw", "sgd", "pad=eos"]
)
def test_update_matches_comlrl(comlrl, tmp_path, optimizer, pad_is_eos):
    theirs, ours = build_pair(comlrl, tmp_path, optimizer, pad_is_eos)
    assert theirs.num_agents == ours.num_agents == 1 and ours.num_roles == 2
    pad, ends = ours.processing_class.pad_token_id, ours.processing_class.eos_token_id
    assert (pad == ends) == pad_is_eos
    theirs.agents[0].train()
    pairs = theirs._build_preference_dataset()  # what `train()` builds again (the same generate, the same pairs)
    assert 1 < len(pairs) <= K * (K - 1) // 2
    detached = theirs._detached_agent_deltas(pairs)
    their_loss = theirs._agent_preference_loss(0, pairs, detached).item()
    scored = their_scored(pairs, pad, ends)
    # Completions that ended (the end token is scored) and completions cut at the budget (their last word is).
    assert {side[-1] == ends for pair in scored for side in pair} == {True, False}

    batches = recorded_batches(ours)
    theirs.train()
    ours.train()
    assert ours.state.global_step == 1 and len(batches) == 1
    assert our_pairs(batches[0], 0) == scored  # the same pairs in CoMLRL's order, every token scored
    logged = ours.state.log_history[0]
    assert logged["loss"] == pytest.approx(their_loss, rel=FORWARD_REL, abs=TINY)  # one agent: the loss is its own
    assert logged["pairs/count"] == len(pairs)

    ours_model, their_model = ours.model.agents[0], theirs.agents[0]
    if optimizer == "adamw":
        assert_same_update([("agent_0", ours_model, their_model)], LR)
    else:  # SGD: each weight's change is -lr * its gradient: the gradients' noise floor, and the weights' rounding
        start = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        for (key, p), q, s in zip(ours_model.named_parameters(), their_model.parameters(), start.parameters()):
            atol = TINY + weight_rounding(s)
            assert_close_to_scale(p.detach() - s, q.detach() - s, GRADIENT_REL, atol=atol, msg=key)
        assert max((p.detach() - s).abs().max().item() for p, s in zip(ours_model.parameters(), start.parameters()))


# ---- 2. the reward sees the roles; evaluation splits them


def test_reward_and_eval_logger_see_the_parsed_roles(tmp_path):
    seen, logged = [], []

    def reward(completions1, completions2, *, batch_items):
        seen.append((completions1[0], completions2[0], batch_items[0]["topic"]))
        return [len(completions1[0]) - 0.5 * len(completions2[0])]

    def eval_logger(agent_completions_turns, batch_items, prompts):
        logged.append(agent_completions_turns)
        return [{"roles": float(len(agent_completions_turns))} for _ in batch_items]

    dataset = Dataset.from_dict({"prompt": ["Name a fruit:", "Name a fish:"], "topic": ["fruit", "fish"]})
    trainer = MADPOTrainer(
        agent_model=tiny_model_path(),
        num_agents=2,
        reward_func=reward,
        formatters=[lambda item: "A: " + item["prompt"], lambda item: "B: " + item["prompt"]],
        eval_logger=eval_logger,
        eval_aggregator=lambda rows, num_turns: {"roles": rows[0]["roles"]},
        args=MADPOConfig(**settings(rollout_buffer_size=2, train_batch_size=12, report_to="none")),
        train_dataset=dataset,
        eval_dataset=dataset,
    )
    trainer.verbose = False
    texts = []
    trainer.model.agents[0].generate = tagged_generate(trainer.processing_class, texts)
    trainer.train()

    # One reward call per joint candidate, on its own row, with the adapter's roles ("" for both where none parses).
    adapter = TaggedCentralizedComparatorAdapter()

    def roles(text):
        try:
            return tuple(adapter.parse_completion(text, {}, 2))
        except ValueError:
            return ("", "")

    assert len(seen) == len(texts) == 2 * K
    assert [(a, b) for a, b, _ in seen] == [roles(text) for text in texts]
    assert sorted({topic for *_, topic in seen}) == ["fish", "fruit"]
    assert any(roles(t) == ("", "") for t in texts), "no parse failure among the candidates: change the seeds"
    assert any(all(roles(t)) for t in texts)
    assert trainer.state.global_step == 1

    # The joint prompt is CoMLRL's tagged text built from the role formatters.
    joint = trainer.centralized_collaboration.build_prompt({"prompt": "Name a fruit:"})
    assert joint == adapter.build_prompt({}, ["A: Name a fruit:", "B: Name a fruit:"])

    texts.clear()
    metrics = trainer.evaluate(num_eval_samples=2)
    assert metrics["eval_roles"] == 2.0
    assert len(logged[-1]) == 2 and [len(r) for r in logged[-1]] == [2, 2]  # [role][item][turn]
    assert [[logged[-1][r][i][0] for r in range(2)] for i in range(2)] == [list(roles(t)) for t in texts]


# ---- 3. a CoMLRL centralized MADPO script with only its imports changed

SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MADPOConfig, MADPOTrainer


class HalvesAdapter:
    def build_prompt(self, batch_item, agent_prompts):
        return "Write both parts, one after the other.\\n" + "\\n".join(
            f"Part {i}: {p}" for i, p in enumerate(agent_prompts)
        ) + "\\n"

    def parse_completion(self, completion, batch_item, num_agents):
        half = len(completion) // 2
        return [completion[:half], completion[half:]]


def role_reward(completions1, completions2):
    return [len(set(a)) - 0.5 * len(set(b)) for a, b in zip(completions1, completions2)]


def main(model_path, output_dir):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MADPOConfig(
        collaboration_mode="centralized", num_agents=2, num_train_epochs=1, agent_learning_rate=1e-4,
        max_new_tokens=8, preference_num_candidates=4, preference_pairs_per_sample=2, dpo_beta=0.1,
        rollout_buffer_size=2, train_batch_size=2, eval_interval=0, logging_steps=1,
    )
    trainer = MADPOTrainer(
        agent_model=model_path,
        num_agents=2,
        reward_func=role_reward,
        formatters=[lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]],
        args=config,
        train_dataset=dataset,
        centralized_comparator_adapter=HalvesAdapter(),
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir)
    return trainer
"""

OURS = {
    "from comlrl.trainers.preference import MADPOConfig, MADPOTrainer": (
        "from multiagent_trl import MADPOConfig, MADPOTrainer"
    ),
}


def test_centralized_script_runs_with_only_its_imports_changed(tmp_path, comlrl):
    initial = snapshot(AutoModelForCausalLM.from_pretrained(tiny_model_path()))
    trainer = run_script(SCRIPT, OURS, tiny_model_path(), str(tmp_path / "ours"))
    assert trainer.num_agents == 1 and trainer.num_roles == 2 and trainer.args.num_agents == 1
    # 4 items, 2 per generation batch with up to 2 pairs each: 2 steps of 2 pair slots per generation batch.
    assert trainer.state.global_step == 4
    logged = trainer.state.log_history[0]
    assert {"loss", "pairs/count", "rewards/margins", "turn_1/reward_mean"} <= set(logged)
    assert not any(key.startswith("agent_1/") for entry in trainer.state.log_history for key in entry)
    # One model, saved where CoMLRL saves it (agent_0/), loadable, its weights changed.
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "ours" / "agent_0")
    assert changed(initial, saved)
    assert not (tmp_path / "ours" / "agent_1").exists()
    # The same script under CoMLRL 1.4.3 writes the same layout.
    run_script(SCRIPT, {}, tiny_model_path(), str(tmp_path / "theirs"))
    assert (tmp_path / "theirs" / "agent_0" / "config.json").is_file()
    assert not (tmp_path / "theirs" / "agent_1").exists()


# ---- 4. bad inputs raise at construction


class NoParse:
    def build_prompt(self, batch_item, agent_prompts):
        return "joint"


def centralized_args(tmp_path, **overrides):
    return MADPOConfig(**{**settings(report_to="none", output_dir=str(tmp_path)), **overrides})


CASES = {
    "adapter without parse_completion": (
        dict(centralized_comparator_adapter=NoParse()),
        TypeError,
        "parse_completion",
    ),
    "two agent models": (dict(agent_model=None, agents=["a", "b"]), ValueError, "exactly one actor"),
    "two tokenizers": (dict(tokenizer=[None, None]), ValueError, "one tokenizer"),
    "num_agents mismatch": (dict(num_agents=3), ValueError, "num_agents=3"),
    "no reward": (dict(reward_func=None), ValueError, "reward_func"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_arguments_raise_at_construction(case, tmp_path, comlrl):
    overrides, error, message = CASES[case]
    kwargs = {"agent_model": tiny_model_path(), "reward_func": parity_reward, **overrides}
    with pytest.raises(error, match=message):
        MADPOTrainer(args=centralized_args(tmp_path), **kwargs)
    with pytest.raises(error):  # CoMLRL refuses them too
        comlrl.MADPOTrainer(args=comlrl.MADPOConfig(**settings()), **kwargs)


def test_adapter_is_checked_in_either_mode_as_comlrl(tmp_path):
    args = MADPOConfig(report_to="none", output_dir=str(tmp_path), preference_num_candidates=K, train_batch_size=12)
    with pytest.raises(TypeError, match="centralized_comparator_adapter"):
        MADPOTrainer(
            agent_model=tiny_model_path(),
            reward_func=parity_reward,
            args=args,
            centralized_comparator_adapter=NoParse(),
        )
    # A valid adapter is accepted and unused by decentralized agents, as in CoMLRL.
    trainer = MADPOTrainer(
        agent_model=tiny_model_path(),
        reward_func=parity_reward,
        args=args,
        centralized_comparator_adapter=TaggedCentralizedComparatorAdapter(),
    )
    assert trainer.num_agents == 2 and trainer.centralized_collaboration is None


def test_config_keeps_the_role_count_and_one_actor(tmp_path):
    config = centralized_args(tmp_path, num_agents=3, parallel_training="mp", agent_devices=["cpu"])
    assert (config.collaboration_mode, config.num_agents) == ("centralized", 3)
    assert config.agent_devices == ["cpu"]  # the one actor's device
    assert not config.drop_last_token  # every completion token scored, as CoMLRL's centralized log-probability
    assert MADPOConfig(collaboration_mode=" Centralized ", report_to="none").collaboration_mode == "centralized"
