"""MADPO (`multiagent_trl.preference.MultiAgentDPOTrainer`, `multiagent_trl.comlrl.preference`): against CoMLRL 1.4.3
itself (the same pairs, losses, gradients and weights after one update), a CoMLRL MADPO script with only its imports
changed, the native trainer on separate models and a LoRA team (with and without a reference), and the config's
fields and checks.

The parity tests replace both libraries' sampling with one deterministic `generate` (`test_actor_critic.fake_generate`)
so that both train on the same candidates.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from peft import PeftModel
from transformers import AutoModelForCausalLM

from multiagent_trl import MADPOConfig, MADPOTrainer, MultiAgentDPOConfig, MultiAgentDPOTrainer
from multiagent_trl.testing import tiny_model_path

from .conftest import changed, launch_two_processes, lora_config, small_args, snapshot
from .parity import FORWARD_REL, GRADIENT_REL, TINY, assert_close_to_scale, assert_same_update, weight_rounding
from .test_actor_critic import LR, MAX_NEW, fake_generate, parity_reward, run_script

K = 4  # candidates per prompt


@pytest.fixture(scope="module")
def comlrl():
    pytest.importorskip("comlrl", reason="the parity tests need comlrl==1.4.3 (pip install -e '.[dev]')")
    from comlrl.trainers import preference

    return preference


def comlrl_generate(agent: int, eos: int, pad: int):
    """`fake_generate`, answering CoMLRL's `return_dict_in_generate=True` with an object holding `sequences`."""
    generate = fake_generate(agent, eos, pad)

    def wrapped(**kwargs):
        sequences = generate(**{k: v for k, v in kwargs.items() if k != "return_dict_in_generate"})
        return SimpleNamespace(sequences=sequences) if kwargs.get("return_dict_in_generate") else sequences

    return wrapped


def build_pair(comlrl, tmp_path, optimizer: str):
    """CoMLRL's MADPOTrainer and ours with the same settings on one item: K candidates, every pair in one update."""
    settings = dict(
        num_agents=2,
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
    dataset = Dataset.from_dict({"prompt": ["Name a red fruit:"]})
    ours_extra = dict(
        report_to="none", generation_mode="per_agent", output_dir=str(tmp_path / "ours"), drop_last_token=True
    )
    if optimizer == "sgd":
        ours_extra.update(optim="sgd", weight_decay=0.0)
    trainers = []
    for config_cls, trainer_cls, extra in (
        (comlrl.MADPOConfig, comlrl.MADPOTrainer, {}),
        (MADPOConfig, MADPOTrainer, ours_extra),
    ):
        torch.manual_seed(0)
        trainer = trainer_cls(
            agent_model=tiny_model_path(),
            reward_func=parity_reward,
            args=config_cls(**settings, **extra),
            train_dataset=dataset,
        )
        trainer.verbose = False
        trainers.append(trainer)
    theirs, ours = trainers
    tokenizer = ours.processing_class
    for i in range(2):
        theirs.agents[i].generate = comlrl_generate(i, tokenizer.eos_token_id, tokenizer.pad_token_id)
        ours.model.agents[i].generate = fake_generate(i, tokenizer.eos_token_id, tokenizer.pad_token_id)
        if optimizer == "sgd":  # a step of -lr * gradient: the weights' change compares the gradients themselves
            theirs.optimizers[i] = torch.optim.SGD(theirs.agents[i].parameters(), lr=LR)
    return theirs, ours


def recorded_batches(trainer) -> list[dict]:
    """Record every training batch `_generate_and_score_completions` hands to TRL."""
    batches, original = [], trainer._generate_and_score_completions

    def recording(inputs):
        batch = original(inputs)
        if "pair_weight" in batch:
            batches.append(batch)
        return batch

    trainer._generate_and_score_completions = recording
    return batches


def our_pairs(batch: dict, agent: int) -> list[tuple[list[int], list[int]]]:
    """Agent `agent`'s (chosen, rejected) scored completion tokens of the real pairs of a batch."""
    pairs = []
    for row in (batch["pair_weight"] > 0).nonzero().squeeze(1).tolist():
        sides = []
        for side in ("chosen", "rejected"):
            ids = batch[f"agent_{agent}/{side}_input_ids"][row]
            sides.append(ids[batch[f"agent_{agent}/{side}_mask"][row]].tolist())
        pairs.append(tuple(sides))
    return pairs


def their_pairs(pairs, agent: int, pad: int) -> list[tuple[list[int], list[int]]]:
    """The same from CoMLRL's pairs: the completion cut at the first pad, its last token left out (as it scores)."""

    def scored(ids):
        ids = ids.tolist()
        return (ids[: ids.index(pad)] if pad in ids else ids)[:-1]

    tensors = [pair.agent_tensors[agent] for pair in pairs]
    return [(scored(t.winner_completion_ids), scored(t.loser_completion_ids)) for t in tensors]


# ---- 1. the same pairs, losses, gradients and weights as CoMLRL 1.4.3


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_update_matches_comlrl(comlrl, tmp_path, optimizer):
    theirs, ours = build_pair(comlrl, tmp_path, optimizer)
    pad = ours.processing_class.pad_token_id
    for agent in theirs.agents:
        agent.train()
    pairs = theirs._build_preference_dataset()  # what `train()` builds again (the same generate, the same pairs)
    assert 1 < len(pairs) <= K * (K - 1) // 2
    detached = theirs._detached_agent_deltas(pairs)
    their_losses = [theirs._agent_preference_loss(i, pairs, detached).item() for i in range(2)]

    batches = recorded_batches(ours)
    theirs.train()
    ours.train()
    assert ours.state.global_step == 1  # every pair in one update, as CoMLRL's batch
    assert len(batches) == 1
    for i in range(2):
        assert our_pairs(batches[0], i) == their_pairs(pairs, i, pad)  # the same pairs, in CoMLRL's order
    logged = ours.state.log_history[0]
    for i in range(2):
        assert logged[f"agent_{i}/loss"] == pytest.approx(their_losses[i], rel=FORWARD_REL, abs=TINY)
    assert logged["pairs/count"] == len(pairs)

    modules = [(f"agent_{i}", ours.model.agents[i], theirs.agents[i]) for i in range(2)]
    if optimizer == "adamw":
        assert_same_update(modules, LR)
    else:  # SGD: each weight's change is -lr * its gradient: the gradients' noise floor, and the weights' rounding
        start = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        for name, mine, their in modules:
            for (key, p), q, s in zip(mine.named_parameters(), their.parameters(), start.parameters()):
                atol = TINY + weight_rounding(s)
                assert_close_to_scale(p.detach() - s, q.detach() - s, GRADIENT_REL, atol=atol, msg=f"{name}.{key}")
        assert max((p.detach() - s).abs().max().item() for p, s in zip(mine.parameters(), start.parameters())) > 0


# ---- 2. the native trainer: separate models and a LoRA team, with and without a reference


def native_args(tmp_path, **overrides):
    settings = dict(
        num_agents=2,
        per_device_train_batch_size=4,
        steps_per_generation=2,
        num_generations=K,
        max_completion_length=6,
        max_steps=2,
        preference_pairs_per_sample=3,
        generation_mode="per_agent",
    )
    return small_args(tmp_path, MultiAgentDPOConfig, **{**settings, **overrides})


DATASET = {"prompt": ["Name a red fruit:", "Name a sea fish:"] * 2}


@pytest.mark.parametrize(
    ("lora", "reference_free", "loss_type"),
    [(False, True, "sigmoid"), (False, False, "sigmoid"), (True, False, "sigmoid"), (False, False, "hinge")],
    ids=["models", "models-ref", "lora-ref", "models-ref-hinge"],
)
def test_native_trainer_trains_every_agent_and_saves(tmp_path, lora, reference_free, loss_type):
    kwargs = dict(peft_config=lora_config()) if lora else {}
    trainer = MultiAgentDPOTrainer(
        model=tiny_model_path(),
        reward_funcs=parity_reward,
        args=native_args(tmp_path, reference_free=reference_free, dpo_loss_type=loss_type),
        train_dataset=Dataset.from_dict(DATASET),
        **kwargs,
    )
    before = snapshot(trainer.model)
    references = None if reference_free or lora else [snapshot(r) for r in trainer._reference_models]
    trainer.train()
    trained = changed(before, trainer.model)
    if lora:
        assert trained == {n for n in before if ".lora_" in n}  # every agent's adapter, not the base
        assert any(".agent_0." in n for n in trained) and any(".agent_1." in n for n in trained)
    else:
        assert trained == set(before)  # every parameter of both agents
    if references is not None:  # the frozen references stay the starting models
        for reference, saved in zip(trainer._reference_models, references):
            assert not changed(saved, reference)
    logged = trainer.state.log_history[0]
    names = ("loss", "rewards/chosen", "rewards/margins", "rewards/accuracies", "logps/rejected")
    assert {f"agent_{i}/{name}" for i in range(2) for name in names} <= set(logged)
    assert {"pairs/count", "pairs/trained", "rewards/joint_margins"} <= set(logged)
    assert logged["pairs/count"] <= 2 * 3 * 2  # 2 prompts per generation batch, 3 pairs each, 2 agents' rows shared
    ids = torch.tensor([[45, 64, 76, 68]])
    if not reference_free and not lora:  # against the starting policy: no reward margin before the first update
        assert logged["rewards/joint_margins"] == pytest.approx(0.0, abs=1e-5)
        assert trainer.state.log_history[1]["rewards/joint_margins"] > 0  # after one DPO step, winners gained
    if lora:  # the reference of a LoRA agent is the base with the adapters disabled (TRL's DPO convention)
        module, context = trainer._reference_context(1)
        with torch.no_grad(), context:
            reference = module(input_ids=ids.to(trainer.accelerator.device)).logits.cpu()
        base = AutoModelForCausalLM.from_pretrained(tiny_model_path())
        torch.testing.assert_close(reference, base(input_ids=ids).logits.detach())

    trainer.save_model(str(tmp_path / "final"))
    for i in range(2):
        folder = str(tmp_path / "final" / f"agent_{i}")
        if lora:
            loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_path()), folder)
        else:
            loaded = AutoModelForCausalLM.from_pretrained(folder)
        with torch.no_grad(), trainer.model.use(i):
            expected = trainer.model(input_ids=ids.to(trainer.accelerator.device)).logits.cpu()
            torch.testing.assert_close(loaded(input_ids=ids).logits, expected)


def test_equal_rewards_raise_no_preference_pair(tmp_path):
    trainer = MultiAgentDPOTrainer(
        model=tiny_model_path(),
        reward_funcs=lambda completions1, completions2: [1.0] * len(completions1),
        args=native_args(tmp_path, max_steps=1),
        train_dataset=Dataset.from_dict(DATASET),
    )
    with pytest.raises(ValueError, match="No preference pair: on each of the 2 items all 4 joint candidates"):
        trainer.train()


def test_a_batch_without_pairs_after_pairs_trains_nothing_and_goes_on(tmp_path, caplog):
    """Once pairs were found, a generation batch where every candidate ties (the agents agree, e.g. converged) trains
    nothing and is logged, instead of stopping the run."""
    calls = []

    def graded_then_flat(completions1, completions2):
        calls.append(1)
        if len(calls) == 1:
            return [float(len(a)) + 0.1 * k for k, a in enumerate(completions1)]
        return [1.0] * len(completions1)

    trainer = MultiAgentDPOTrainer(
        model=tiny_model_path(),
        reward_funcs=graded_then_flat,
        args=native_args(tmp_path, max_steps=2, steps_per_generation=1),
        train_dataset=Dataset.from_dict(DATASET),
    )
    before = snapshot(trainer.model)
    with caplog.at_level("WARNING"):
        trainer.train()
    assert trainer.state.global_step == 2 and len(calls) == 2
    first, second = trainer.state.log_history[:2]
    assert first["pairs/count"] > 0 and second["pairs/count"] == 0 and second["pairs/trained"] == 0
    assert "no preference pair in this generation batch" in caplog.text
    assert changed(before, trainer.model)  # the first batch trained


DDP_SCRIPT = """
import json, sys
from datasets import Dataset
from multiagent_trl import MultiAgentDPOConfig, MultiAgentDPOTrainer
from multiagent_trl.testing import end_launched_process, tiny_model_path

out_dir = sys.argv[1]
args = MultiAgentDPOConfig(
    output_dir=out_dir + "/run", num_agents=2, num_generations=4, per_device_train_batch_size=4,
    steps_per_generation=2, max_completion_length=6, max_steps=2, learning_rate=1e-2, report_to="none",
    save_strategy="no", seed=0, preference_pairs_per_sample=3, reference_free=False, logging_steps=1,
)
trainer = MultiAgentDPOTrainer(
    model=tiny_model_path(),
    reward_funcs=lambda c1, c2: [len(b) / (1 + len(a)) for a, b in zip(c1, c2)],
    args=args,
    train_dataset=Dataset.from_dict({"prompt": [f"Row {i}: tell a story." for i in range(8)]}),
)
sums = lambda: [[float(p.detach().double().sum()) for p in trainer.model.agent_parameters(i)] for i in range(2)]
initial = sums()
trainer.train()
with open(f"{out_dir}/rank{trainer.accelerator.process_index}.json", "w") as f:
    json.dump({"initial": initial, "agents": sums(), "logs": trainer.state.log_history}, f)
end_launched_process()
"""


def test_two_processes_train_the_same_agents(tmp_path):
    """DDP (two gloo processes on CPU): every process trains the same weights; pair counts are the team's."""
    import json

    script = tmp_path / "ddp_madpo.py"
    script.write_text(DDP_SCRIPT)
    launch_two_processes(script, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["agents"] == ranks[1]["agents"]
    for initial, trained in zip(ranks[0]["initial"], ranks[0]["agents"]):
        assert all(a != b for a, b in zip(initial, trained))
    first = ranks[0]["logs"][0]
    # 2 prompts per process, 3 pair slots each: at most 12 pairs over both processes, 6 trained per step.
    assert 0 < first["pairs/count"] <= 12 and 0 < first["pairs/trained"] <= 6
    assert first["rewards/joint_margins"] == pytest.approx(0.0, abs=1e-5)  # the reference is the start policy


def test_custom_rollouts_raise(tmp_path):
    with pytest.raises(NotImplementedError, match="`rollout_func` are not supported yet"):
        MultiAgentDPOTrainer(
            model=tiny_model_path(),
            reward_funcs=parity_reward,
            args=native_args(tmp_path),
            train_dataset=Dataset.from_dict(DATASET),
            rollout_func=lambda prompts, trainer: {},
        )


# ---- 3. a CoMLRL MADPO script with only its imports changed

MADPO_SCRIPT = """
from datasets import Dataset
from comlrl.trainers.preference import MADPOConfig, MADPOTrainer
from comlrl.utils.reward_processor import RewardProcessors


def length_reward(completions1, completions2):
    return [min(len(b) / max(len(a), 1), 2.0) for a, b in zip(completions1, completions2)]


def main(model_path, output_dir):
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:", "Pick a word:", "Say hi:"]})
    config = MADPOConfig(
        num_agents=2, num_train_epochs=1, agent_learning_rate=1e-4, max_new_tokens=6,
        preference_num_candidates=4, preference_pairs_per_sample=2, pair_selection="reward_gap", dpo_beta=0.1,
        rollout_buffer_size=2, train_batch_size=2, eval_interval=0, logging_steps=1,
    )
    trainer = MADPOTrainer(
        agent_model=model_path,
        num_agents=2,
        reward_func=length_reward,
        reward_processor=RewardProcessors.scale(2.0),
        formatters=[lambda item: item["prompt"], lambda item: "Expand: " + item["prompt"]],
        args=config,
        train_dataset=dataset,
    )
    trainer.verbose = False
    trainer.train()
    trainer.save_model(output_dir)
    return trainer
"""

OURS_MADPO = {
    "from comlrl.trainers.preference import MADPOConfig, MADPOTrainer": (
        "from multiagent_trl import MADPOConfig, MADPOTrainer"
    ),
    "from comlrl.utils.reward_processor import RewardProcessors": "from multiagent_trl import RewardProcessors",
}


def test_madpo_script_runs_with_only_its_imports_changed(tmp_path, comlrl):
    trainer = run_script(MADPO_SCRIPT, OURS_MADPO, tiny_model_path(), str(tmp_path / "ours"))
    # 4 items, 2 per generation batch with up to 2 pairs each: 2 steps of 2 pair slots per generation batch.
    assert trainer.state.global_step == 4
    assert trainer.args.per_device_train_batch_size == 4 and trainer.args.steps_per_generation == 2
    logged = trainer.state.log_history[0]
    assert {"turn_1/reward_mean", "agent_0/loss", "agent_1/rewards/margins", "pairs/count"} <= set(logged)
    for i in range(2):
        assert AutoModelForCausalLM.from_pretrained(tmp_path / "ours" / f"agent_{i}").config.model_type == "qwen2"
    # The same script under CoMLRL 1.4.3 writes the same layout.
    run_script(MADPO_SCRIPT, {}, tiny_model_path(), str(tmp_path / "theirs"))
    for i in range(2):
        assert (tmp_path / "theirs" / f"agent_{i}" / "config.json").is_file()


def test_checkpoints_and_evaluate_as_comlrl_calls_them(tmp_path):
    args = MADPOConfig(
        num_train_epochs=1,
        preference_num_candidates=K,
        preference_pairs_per_sample=2,
        max_new_tokens=4,
        rollout_buffer_size=2,
        eval_interval=0,
        eval_num_samples=2,
        report_to="none",
        output_dir=str(tmp_path / "out"),
    )
    dataset = Dataset.from_dict({"prompt": ["Write a title:", "Name a planet:"]})
    trainer = MADPOTrainer(
        agent_model=tiny_model_path(),
        reward_func=parity_reward,
        args=args,
        train_dataset=dataset,
        eval_dataset=dataset,
    )
    trainer.verbose = False
    trainer.train(checkpoint_dir=str(tmp_path / "checkpoints"), checkpoint_interval=1)
    checkpoint = tmp_path / "checkpoints" / f"checkpoint-{trainer.state.global_step}"
    assert (checkpoint / "agent_1" / "config.json").is_file()
    metrics = trainer.evaluate(num_eval_samples=2)  # CoMLRL's signature: one completion per item, no pair needed
    assert {"eval_turn_1/reward_mean", "eval_turn_1/expected_return"} <= set(metrics)
    assert metrics["eval_loss"] == 0.0  # no preference loss in evaluation


# ---- 4. the config: CoMLRL's fields, defaults and checks


def comlrl_fields():
    from comlrl.trainers.preference.madpo import MADPOConfig as Theirs

    return [(f.name, f.default) for f in dataclasses.fields(Theirs)]


def test_every_comlrl_field_is_accepted_with_its_default(comlrl):
    fields = comlrl_fields()
    assert len(fields) == 32
    ours = {f.name: f.default for f in dataclasses.fields(MADPOConfig)}
    for name, default in fields:
        assert name in ours, name
        assert ours[name] == default, name  # CoMLRL's default
        MADPOConfig(**{name: default}, report_to="none")  # accepted
    config = MADPOConfig(report_to="none")
    assert (config.learning_rate, config.max_completion_length, config.num_generations) == (5e-6, 256, 80)
    assert (config.weight_decay, config.max_grad_norm, config.lr_scheduler_type) == (0.01, 0.0, "constant")
    # 2 items of 80 candidates, up to 16 pairs each, 2 pairs per step: 16 steps of 10 completions.
    assert (config.steps_per_generation, config.per_device_train_batch_size) == (16, 10)
    assert config.reference_free and not config.drop_last_token


def test_fields_madpo_does_not_read_are_accepted_with_a_warning(caplog):
    with caplog.at_level("WARNING", logger="multiagent_trl.comlrl.preference"):
        MADPOConfig(report_to="none")
        assert not caplog.records
        MADPOConfig(advantage_mode="rloo", discount=0.9, report_to="none")
    assert "`discount=0.9`, `advantage_mode='rloo'` have no effect on MADPO" in caplog.text


BAD = [
    (dict(pair_selection="all"), "preference_pairs_per_sample=None"),
    (dict(dpo_beta=0.0), "dpo_beta"),
    (dict(dpo_beta=-1.0), "dpo_beta"),
    (dict(preference_num_candidates=1), "preference_num_candidates"),
    (dict(num_turns=2), "num_turns=1"),
    (dict(pair_selection="best"), "pair_selection"),
    (dict(preference_pairs_per_sample=0), "preference_pairs_per_sample"),
    (dict(environment_steps_per_pair=0), "environment_steps_per_pair"),
    (dict(collaboration_mode="solo"), "collaboration_mode"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[next(iter(f)) + str(i) for i, (f, _) in enumerate(BAD)])
def test_bad_configs_raise_with_the_fix(comlrl, fields, message):
    with pytest.raises(ValueError):  # CoMLRL refuses them too
        comlrl.MADPOConfig(**fields)
    with pytest.raises(ValueError, match=message):
        MADPOConfig(**fields, report_to="none")


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [(dict(reference_kl_enabled=True), ValueError, "reference_free=False")],
)
def test_unsupported_comlrl_settings_raise_with_the_fix(fields, error, message):
    with pytest.raises(error, match=message):
        MADPOConfig(**fields, report_to="none")


def test_pair_steps_that_do_not_divide_the_completions_are_accepted():
    """CoMLRL accepts them: 3 items of 3 candidates (9 completions) make 9 pairs, 5 steps of 2 on average; the
    completions make one TRL step and the pairs are split into 5 (`pair_steps_per_generation`)."""
    config = MADPOConfig(rollout_buffer_size=3, preference_num_candidates=3, train_batch_size=2, report_to="none")
    assert (config.per_device_train_batch_size, config.steps_per_generation, config.pair_steps) == (9, 1, 5)
    divisible = MADPOConfig(
        rollout_buffer_size=2, preference_num_candidates=4, preference_pairs_per_sample=2, report_to="none"
    )  # 4 pairs, 2 steps: TRL's split of the 8 completions, as before
    assert (divisible.per_device_train_batch_size, divisible.steps_per_generation, divisible.pair_steps) == (4, 2, 2)
    assert divisible.pair_steps_per_generation is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(pair_selection="all"), "preference_pairs_per_sample=None"),
        (dict(dpo_beta=0.0), "dpo_beta"),
        (dict(dpo_loss_type="ipo"), "dpo_loss_type"),
        (dict(num_turns=2), "num_turns=1"),
        (dict(joint_mode="cross"), "joint_mode='aligned'"),
        (dict(beta=0.1), "dpo_beta"),
        # Fewer pairs than optimizer steps: before, the steps without one trained on weight-0 rows (loss 0), and the
        # weights still moved.
        (
            dict(per_device_train_batch_size=2, steps_per_generation=4, preference_pairs_per_sample=1),
            r"2 prompt\(s\) per process .* at most 1 pair\(s\) each, fewer pairs than its 4 optimizer steps",
        ),
        (dict(pair_steps_per_generation=7), r"than its 7 optimizer steps \(`pair_steps_per_generation`\)"),
    ],
)
def test_native_config_checks(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        native_args(tmp_path, **fields)
