"""One LoRA adapter per agent on a shared base: exact gradients, batched generation, saving (resume: in
test_checkpoints.py, for both team kinds)."""

import pytest
import torch
from peft import PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOTrainer

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.team.modules import LoraAgentTeam

from .conftest import PROMPTS, generation_batch, length_ratio, lora_config, small_args


def lora_trainer(tmp_path, tiny_path, dataset, **arg_overrides):
    return MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, **arg_overrides),
        train_dataset=dataset,
        peft_config=lora_config(),
    )


def adapters(team, index):
    marker = f".agent_{index}."
    return {n: p.detach().clone() for n, p in team.peft_model.named_parameters() if marker in n}


def test_only_the_adapters_train_and_the_reference_is_free(tmp_path, tiny_path, prompts_dataset):
    trainer = lora_trainer(tmp_path, tiny_path, prompts_dataset, beta=0.1)
    team = trainer.model
    assert isinstance(team, LoraAgentTeam)
    base_params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_path).parameters())
    adapter_params = sum(p.numel() for i in range(2) for p in team.agent_parameters(i))
    # One base in memory, no reference copy: the reference is the base with the adapter disabled.
    assert sum(p.numel() for p in team.parameters()) == base_params + adapter_params
    assert all(view["ref_model"] is None for view in trainer._agent_views)

    base = {n: p.clone() for n, p in team.peft_model.named_parameters() if "lora_" not in n}
    before = [adapters(team, i) for i in range(2)]
    trainer.train()
    for name, p in team.peft_model.named_parameters():
        if name in base:
            assert torch.equal(p, base[name]), f"base weight {name} changed"
    after = [adapters(team, i) for i in range(2)]
    for i in range(2):
        assert all(not torch.equal(after[i][n], before[i][n]) for n in before[i]), f"agent {i} did not train"
    assert any(not torch.equal(a, b) for a, b in zip(after[0].values(), after[1].values()))
    logs = trainer.state.log_history[-2]
    assert logs["agent_0/kl"] > 0 and logs["agent_1/kl"] > 0


def generate_with_the_last_agent(trainer, dataset):
    """Agent 1 writes a completion under `no_grad`, as a user's look at the agents before training does."""
    ids = trainer.processing_class(dataset[0]["prompt"], return_tensors="pt").input_ids
    with trainer.model.use(1), torch.no_grad():
        trainer.model.generate(ids, max_new_tokens=4, do_sample=False)


def reference_pass_of_the_last_agent(trainer, dataset):
    """Agent 1's reference log-probs (the base, its adapter disabled) under `no_grad`, as TRL's reference pass."""
    ids = trainer.processing_class(dataset[0]["prompt"], return_tensors="pt").input_ids
    with trainer.model.use(1), torch.no_grad(), trainer.model.disable_adapter():
        trainer.model(input_ids=ids)


@pytest.mark.parametrize(
    "before_training, beta",
    [
        (lambda trainer, dataset: trainer.evaluate(dataset), 0.0),
        (lambda trainer, dataset: trainer.evaluate(dataset), 0.1),
        (generate_with_the_last_agent, 0.0),
        (reference_pass_of_the_last_agent, 0.0),
    ],
    ids=["evaluate", "evaluate-beta", "generate", "reference-pass"],
)
def test_every_adapter_trains_after_the_team_ran_without_gradients(
    tmp_path, tiny_path, prompts_dataset, before_training, beta
):
    """PEFT's `set_adapter` (and leaving `disable_adapter`) freezes the other adapters; run under `no_grad` before
    `train()`, that left only the last agent's adapter in the optimizer, and the other agents never trained."""
    trainer = lora_trainer(tmp_path, tiny_path, prompts_dataset, beta=beta, per_device_eval_batch_size=8)
    before_training(trainer, prompts_dataset)
    before = [adapters(trainer.model, i) for i in range(2)]
    trainer.train()
    after = [adapters(trainer.model, i) for i in range(2)]
    for i in range(2):
        assert all(not torch.equal(after[i][n], before[i][n]) for n in before[i]), f"agent {i} did not train"


def test_adapters_frozen_when_the_team_is_reindexed_are_still_made_trainable(tmp_path, tiny_path, prompts_dataset):
    """FSDP sharding replaces the parameters and the team indexes them again (`refresh_parameters`); adapters that
    PEFT had frozen then (an evaluation before `train()`) must still be in the index that makes them trainable."""
    team = lora_trainer(tmp_path, tiny_path, prompts_dataset).model
    with torch.no_grad():
        team.peft_model.set_adapter("agent_1")  # PEFT freezes agent_0's adapter
    assert not any(p.requires_grad for p in team.agent_parameters(0))
    team.refresh_parameters()
    team.keep_adapters_trainable()
    assert all(p.requires_grad for i in range(2) for p in team.agent_parameters(i))


def test_batched_generation_matches_per_agent_generation(tmp_path, tiny_path, prompts_dataset):
    completions = {}
    for mode in ("batched", "per_agent"):
        trainer = lora_trainer(
            tmp_path, tiny_path, prompts_dataset, generation_mode=mode, generation_kwargs={"do_sample": False}
        )
        trainer.model.train()
        output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
        completions[mode] = [output[f"agent_{i}/completion_ids"] for i in range(2)]
    for i in range(2):
        assert torch.equal(completions["batched"][i], completions["per_agent"][i]), f"agent {i}"
    assert not torch.equal(completions["batched"][0], completions["batched"][1])  # the adapters do differ


# Equal rows and ranks: one stacked matmul per layer for both agents; otherwise one slice of rows per agent.
@pytest.mark.parametrize("rows, ranks", [((4, 4), (4, 4)), ((3, 5), (4, 4)), ((4, 4), (4, 8))])
def test_mixed_batch_generates_what_peft_mixed_adapter_batches_do(tiny_path, rows, ranks):
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_path), lora_config(r=ranks[0]), adapter_name="agent_0"
    )
    model.add_adapter("agent_1", lora_config(r=ranks[1]))
    team = LoraAgentTeam(model, ["agent_0", "agent_1"])
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    inputs = tokenizer((PROMPTS * 3)[: sum(rows)], return_tensors="pt", padding=True)
    settings = dict(max_new_tokens=8, do_sample=False)

    model.eval()
    expected = model.generate(**inputs, adapter_names=["agent_0"] * rows[0] + ["agent_1"] * rows[1], **settings)
    team.train()
    with team.mixed_batch(rows):
        assert team._agent_rows_layers({}) is not None  # the team's own path runs, not PEFT's
        completions = team.generate(**inputs, **settings)
    assert torch.equal(completions, expected)
    assert team.peft_model.training
    assert all(p.requires_grad for i in range(2) for p in team.agent_parameters(i))


@pytest.mark.parametrize("checkpointing", [True, False])
def test_each_adapter_gets_exactly_its_own_gradient(tmp_path, tiny_path, prompts_dataset, checkpointing):
    trainer = lora_trainer(tmp_path, tiny_path, prompts_dataset, gradient_checkpointing=checkpointing)
    team = trainer.model
    if checkpointing:
        team.gradient_checkpointing_enable()
    team.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop, which this test calls around
    inputs = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    trainer._compute_loss(team, inputs).backward()  # agent 0 inside, agent 1 here
    team_grads = [
        {n: p.grad.clone() for n, p in team.peft_model.named_parameters() if f".agent_{i}." in n} for i in range(2)
    ]

    for i in range(2):  # each agent's own loss, alone
        team.zero_grad(set_to_none=True)
        agent_batch = {k.split("/", 1)[1]: v for k, v in inputs.items() if k.startswith(f"agent_{i}/")}
        with trainer._agent_view(i):
            GRPOTrainer._compute_loss(trainer, team, agent_batch).backward()
        for name, grad in team_grads[i].items():
            torch.testing.assert_close(team.peft_model.get_parameter(name).grad, grad, msg=name)
        assert all(g.abs().sum() > 0 for g in team_grads[i].values())


def test_checkpointing_does_not_change_training(tmp_path, tiny_path, prompts_dataset):
    results = []
    for checkpointing in (True, False):
        trainer = lora_trainer(tmp_path, tiny_path, prompts_dataset, gradient_checkpointing=checkpointing)
        trainer.train()
        assert trainer.model.is_gradient_checkpointing == checkpointing  # the two runs do differ in checkpointing
        results.append([adapters(trainer.model, i) for i in range(2)])
    for i in range(2):
        for name, p in results[0][i].items():
            torch.testing.assert_close(p, results[1][i][name], rtol=1e-5, atol=1e-6, msg=name)


def test_saved_adapters_load_back_and_generate_the_same(tmp_path, tiny_path, prompts_dataset):
    trainer = lora_trainer(tmp_path, tiny_path, prompts_dataset, save_merged_models=True)
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "saved" / "agent_0")
    inputs = tokenizer(["Tell a joke:"], return_tensors="pt")
    team = trainer.model
    team.eval()
    for i in range(2):
        with team.use(i):
            expected = team.generate(**inputs, max_new_tokens=8, do_sample=False)
        agent_dir = tmp_path / "saved" / f"agent_{i}"
        loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_path), agent_dir)
        # Its own adapter, as trained (equal generations alone could come from an untrained or the other adapter).
        saved = {n.replace(".default.", f".agent_{i}."): p for n, p in loaded.named_parameters() if "lora_" in n}
        assert saved.keys() == adapters(team, i).keys()
        for name, p in adapters(team, i).items():
            assert torch.equal(saved[name], p), name
        assert torch.equal(loaded.generate(**inputs, max_new_tokens=8, do_sample=False), expected)
        merged = AutoModelForCausalLM.from_pretrained(agent_dir / "merged")
        assert torch.equal(merged.generate(**inputs, max_new_tokens=8, do_sample=False), expected)


def test_lora_on_separate_heterogeneous_models(tmp_path, tiny_path, tiny_llama_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=[tiny_path, tiny_llama_path],
        reward_funcs=length_ratio,
        processing_class=[AutoTokenizer.from_pretrained(p) for p in (tiny_path, tiny_llama_path)],
        args=small_args(tmp_path, beta=0.1),
        train_dataset=prompts_dataset,
        peft_config=lora_config(target_modules=["q_proj", "v_proj"]),
    )
    assert all(isinstance(agent, PeftModel) for agent in trainer.model.agents)
    before = [{n: p.clone() for n, p in agent.named_parameters()} for agent in trainer.model.agents]
    trainer.train()
    for agent, snapshot in zip(trainer.model.agents, before):
        for name, p in agent.named_parameters():
            assert torch.equal(p, snapshot[name]) != ("lora_" in name), name  # adapters moved, bases did not
    trainer.save_model(tmp_path / "saved")
    assert (tmp_path / "saved" / "agent_1" / "adapter_config.json").exists()


def test_a_dora_team_generates_one_agent_at_a_time_and_trains(tmp_path, tiny_path, prompts_dataset, caplog):
    with caplog.at_level("WARNING", logger="multiagent_trl"):
        trainer = MultiAgentGRPOTrainer(
            model=tiny_path,
            reward_funcs=length_ratio,
            args=small_args(tmp_path, num_agents=2),
            train_dataset=prompts_dataset,
            peft_config=lora_config(use_dora=True),
        )
    # PEFT refuses mixed-adapter batches with DoRA: the team says so once and generates per agent.
    assert len([m for m in caplog.messages if "DoRA" in m]) == 1
    assert not trainer.model.batches_generation()
    before = [adapters(trainer.model, i) for i in range(2)]
    trainer.train()
    assert trainer.state.global_step == 2
    for i in range(2):
        after = adapters(trainer.model, i)
        assert any(".lora_magnitude_vector." in n for n in after)  # DoRA's magnitudes are the agent's too
        assert all(not torch.equal(after[n], before[i][n]) for n in before[i]), f"agent {i} did not train"


def test_a_team_continues_from_saved_adapters_on_one_base(tmp_path, tiny_path, prompts_dataset):
    first = lora_trainer(tmp_path / "first", tiny_path, prompts_dataset)
    first.train()
    first.save_model(tmp_path / "saved")
    saved = [adapters(first.model, i) for i in range(2)]

    # The user's PeftModel: one fresh base, each agent's adapter loaded from its folder under the agent's name.
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    base_params = {n: p for n, p in base.named_parameters()}
    model = PeftModel.from_pretrained(base, tmp_path / "saved" / "agent_0", adapter_name="agent_0", is_trainable=True)
    model.load_adapter(tmp_path / "saved" / "agent_1", adapter_name="agent_1", is_trainable=True)
    trainer = MultiAgentGRPOTrainer(
        model=model,
        reward_funcs=length_ratio,
        args=small_args(tmp_path / "second", num_agents=2),
        train_dataset=prompts_dataset,
    )
    team = trainer.model
    assert isinstance(team, LoraAgentTeam) and team.peft_model is model
    for i in range(2):
        loaded = adapters(team, i)
        assert loaded.keys() == saved[i].keys() and all(torch.equal(loaded[n], saved[i][n]) for n in loaded)
    # One base in memory: the team's base parameters are the fresh base's own objects, used by both agents.
    team_base = {n: p for n, p in team.named_parameters() if "lora_" not in n}
    assert {id(p) for p in team_base.values()} == {id(p) for p in base_params.values()}
    base_before = {n: p.detach().clone() for n, p in team_base.items()}

    trainer.train()
    for i in range(2):
        after = adapters(team, i)
        assert all(not torch.equal(after[n], saved[i][n]) for n in saved[i]), f"agent {i} did not train"
    assert all(torch.equal(p, base_before[n]) for n, p in team_base.items())


@pytest.mark.parametrize("as_list", [False, True])
def test_a_peft_model_and_a_peft_config_together_are_refused(tmp_path, tiny_path, prompts_dataset, as_list):
    # As GRPOTrainer refuses it: the new adapter would sit beside the model's own, which no agent would own.
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_path), lora_config())
    which = "Agent 0 in `model`" if as_list else "`model`"
    with pytest.raises(
        ValueError, match=rf"{which} is a PeftModel .* `peft_config`.*drop `peft_config`.*merge_and_unload"
    ):
        MultiAgentGRPOTrainer(
            model=[model, tiny_path] if as_list else model,
            reward_funcs=length_ratio,
            args=small_args(tmp_path, num_agents=2),
            train_dataset=prompts_dataset,
            peft_config=lora_config(),
        )


@pytest.mark.parametrize(
    "names, overrides, error, message",
    [
        (["agent_0", "agent_1"], dict(num_agents=3), ValueError, r"needs exactly one per agent, named \['agent_0', "),
        (["agent_0", "default"], dict(), ValueError, r"holds the adapters \['agent_0', 'default'\]"),
        (["agent_0", "agent_1"], dict(beta=0.1), NotImplementedError, "`beta != 0` with a LoRA team continued"),
    ],
)
def test_a_peft_model_of_agent_adapters_is_checked(
    tmp_path, tiny_path, prompts_dataset, names, overrides, error, message
):
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_path), lora_config(), adapter_name=names[0])
    model.add_adapter(names[1], lora_config())
    with pytest.raises(error, match=message):
        MultiAgentGRPOTrainer(
            model=model,
            reward_funcs=length_ratio,
            args=small_args(tmp_path, **overrides),
            train_dataset=prompts_dataset,
        )
