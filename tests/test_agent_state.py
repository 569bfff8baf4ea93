"""One agent's state is never another's: reward-function logs, adapter configs, the entropy controller, the team's
properties, and the reference of an agent that arrives with a trained adapter."""

import copy
import json
import math

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from multiagent_trl import MultiAgentGRPOTrainer
from multiagent_trl.team.modules import LoraAgentTeam
from multiagent_trl.team.views import ENTROPY_STATE_FILE, load_entropy_states

from .conftest import generation_batch, length_ratio, lora_config, small_args


def logging_reward(prompts, completions, log_metric, log_extra, **kwargs):
    """Records with TRL's reward-function logging: one metric per call, one extra column value per joint sample."""
    log_metric("judge_calls", 1.0)
    log_extra("judge_note", [f"{len(a)}-{len(b)}" for a, b in completions])
    return [float(len(b) > len(a)) for a, b in completions]


@pytest.mark.parametrize("joint_mode", ["aligned", "cross"])
def test_reward_function_logs_land_under_joint_names_and_in_the_table(
    tmp_path, tiny_path, prompts_dataset, joint_mode
):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=logging_reward,
        args=small_args(tmp_path, num_agents=2, max_steps=1, joint_mode=joint_mode),
        train_dataset=prompts_dataset,
    )
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["judge_calls"] == 1.0
    assert not [key for key in logs if key.endswith("/judge_calls")], "the joint metric was logged under an agent"
    # One value per row of the completions table (the aligned joint samples, also in cross mode), each matching the
    # completions shown in that row.
    notes = list(trainer._logs["extra"]["judge_note"])
    shown = zip(trainer._logs["extra"]["agent_0/completion"], trainer._logs["extra"]["agent_1/completion"])
    assert len(notes) == 8
    assert notes == [f"{len(a)}-{len(b)}" for a, b in shown]


def test_multiturn_reward_logs_are_per_turn(tmp_path, tiny_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=logging_reward,
        args=small_args(tmp_path, num_agents=2, max_steps=1, num_turns=2),
        train_dataset=prompts_dataset,
        external_transition=lambda row, histories, turn: [row["prompt"] + " Again:"] * 2,
    )
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["turn_1/judge_calls"] == logs["turn_2/judge_calls"] == 1.0  # turns are named from 1
    assert len(trainer._logs["extra"]["turn_1/judge_note"]) == len(trainer._logs["extra"]["turn_2/judge_note"]) == 8


def test_each_adapter_config_names_its_own_base(tmp_path, tiny_path, tiny_llama_path, prompts_dataset):
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = MultiAgentGRPOTrainer(
        model=[tiny_path, tiny_llama_path],
        reward_funcs=length_ratio,
        args=small_args(tmp_path, max_steps=1),
        train_dataset=prompts_dataset,
        peft_config=config,
    )
    trainer.save_model(str(tmp_path / "final"))
    for i, path in enumerate([tiny_path, tiny_llama_path]):
        saved = json.loads((tmp_path / "final" / f"agent_{i}" / "adapter_config.json").read_text())
        assert saved["base_model_name_or_path"] == path
    assert config.base_model_name_or_path is None  # the user's object is left as it was given


def test_entropy_control_is_per_agent(tmp_path, tiny_path, prompts_dataset):
    # Agent 1's logits are scaled up, so its entropy is near 0; agent 0's, from a random init, is high.
    sharp = AutoModelForCausalLM.from_pretrained(tiny_path)
    sharp.lm_head.weight.data *= 200.0
    delta = 0.01
    args = small_args(
        tmp_path,
        max_steps=1,
        use_adaptive_entropy=True,
        entropy_coef=0.05,
        entropy_coef_delta=delta,
        entropy_coef_min=0.0,
        entropy_coef_max=1.0,
        entropy_target=1.0,
        save_strategy="steps",
        save_steps=1,
    )
    trainer = MultiAgentGRPOTrainer(
        model=[AutoModelForCausalLM.from_pretrained(tiny_path), sharp],
        reward_funcs=length_ratio,
        args=args,
        train_dataset=prompts_dataset,
    )
    trainer.train()
    logs = trainer.state.log_history[0]
    assert logs["agent_0/entropy"] > 1.0 > logs["agent_1/entropy"]
    coefs = [view["entropy_coef"] for view in trainer._agent_views]
    # Each agent's controller moved once, by its own entropy: above the target lowers the coefficient, below raises.
    assert coefs == pytest.approx([0.05 - delta, 0.05 + delta])
    assert logs["agent_0/entropy_coef"] == pytest.approx(coefs[0]) and logs["agent_1/entropy_coef"] == pytest.approx(
        coefs[1]
    )
    checkpoint = tmp_path / "out" / "checkpoint-1"
    saved = json.loads((checkpoint / ENTROPY_STATE_FILE).read_text())
    assert [s["entropy_coef"] for s in saved] == pytest.approx(coefs)
    views = [dict(entropy_coef=0.0, _last_world_entropy=math.inf) for _ in range(2)]
    load_entropy_states(views, str(checkpoint))
    assert [v["entropy_coef"] for v in views] == pytest.approx(coefs)
    assert views[0]["_last_world_entropy"] > 1.0 > views[1]["_last_world_entropy"]


def test_reading_team_properties_changes_no_state(tiny_path):
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    peft_model = get_peft_model(base, lora_config(), adapter_name="agent_0")
    peft_model.add_adapter("agent_1", lora_config())
    team = LoraAgentTeam(peft_model, ["agent_0", "agent_1"])
    with team.use(1):
        team.active_model()
    frozen = team.agent_parameters(0)[0]
    frozen.requires_grad_(False)  # as PEFT's `set_adapter("agent_1")` would leave it
    flags = {n: p.requires_grad for n, p in peft_model.named_parameters()}
    assert team.active == 0 and peft_model.active_adapter == "agent_1"
    _ = team.config, team.dtype, team.generation_config, team.peft_config
    assert peft_model.active_adapter == "agent_1"
    assert {n: p.requires_grad for n, p in peft_model.named_parameters()} == flags


def test_a_pretrained_adapter_agent_keeps_its_adapter_as_reference(tmp_path, tiny_path, prompts_dataset):
    # Agents that arrive as PeftModels with trained (here: random, non-zero) adapters: their KL reference is a frozen
    # copy of that adapter, as TRL's GRPOTrainer makes for such a model, not the bare base.
    def pretrained_agent(seed):
        torch.manual_seed(seed)
        return get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_path), lora_config())

    agents = [pretrained_agent(0), pretrained_agent(1)]
    initial = [copy.deepcopy(agent) for agent in agents]
    trainer = MultiAgentGRPOTrainer(
        model=agents,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, beta=0.04, num_iterations=2),
        train_dataset=prompts_dataset,
    )
    trl_trainer = GRPOTrainer(
        model=initial[0],
        reward_funcs=length_ratio,
        args=GRPOConfig(output_dir=str(tmp_path / "trl"), beta=0.04, bf16=False, report_to="none", num_generations=4),
        train_dataset=prompts_dataset,
    )
    trl_ref = {n: p for n, p in trl_trainer.model.named_parameters() if ".ref." in n}
    ours = {n: p for n, p in agents[0].named_parameters() if ".ref." in n}
    assert trl_ref and ours.keys() == trl_ref.keys()
    assert all(torch.equal(ours[n], trl_ref[n]) for n in ours)
    for agent, start in zip(agents, initial):
        assert isinstance(agent, PeftModel) and "ref" in agent.peft_config
        default = dict(start.named_parameters())
        for name, param in agent.named_parameters():
            if ".ref." in name:
                assert not param.requires_grad
                assert torch.equal(param, default[name.replace(".ref.", ".default.")])

    # Before any update, each agent's reference log-probs are its own policy's (the old log-probs of this batch).
    output = trainer._generate_and_score_completions(generation_batch(prompts_dataset))
    for i in range(2):
        mask = output[f"agent_{i}/completion_mask"].bool()
        ref, old = output[f"agent_{i}/ref_per_token_logps"], output[f"agent_{i}/old_per_token_logps"]
        torch.testing.assert_close(ref[mask], old[mask])
    assert all(p.requires_grad for i in range(2) for p in trainer.model.agent_parameters(i))
    assert not any(p.requires_grad for n, p in trainer.model.named_parameters() if ".ref." in n)
