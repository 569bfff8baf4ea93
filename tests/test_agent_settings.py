"""Per-agent generation and loss settings: one value for all or one per agent, resolved into each agent's view."""

import logging

import pytest
import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import TrlParser

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

from .conftest import small_args

G = 4


def length_ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def batch(dataset, rows=2):
    """What TRL's sampler hands over: each of the first `rows` rows repeated G times."""
    return [dataset[i] for i in range(rows) for _ in range(G)]


def trained_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def manual_logps(model, output, temperature):
    """Per-token log-probs of the completion, from plain logits divided by `temperature` (what TRL's fused head must
    compute)."""
    ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1] / temperature
    logps = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    width = output["completion_ids"].shape[1]
    return logps[:, -width:] * output["completion_mask"]


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=[0.5, 0.7, 0.9]), r"`temperature` has 3 values \(\[0.5, 0.7, 0.9\]\) for 2 agents"),
        (dict(beta=[0.1, 0.0, 0.0]), r"`beta` has 3 values"),
        (dict(generation_kwargs=[{}, {}, {}]), r"`generation_kwargs` has 3 values"),
        (dict(max_completion_length=[]), r"`max_completion_length` is an empty list"),
        (dict(generation_kwargs=[{}, "top_k=3"]), r"each a dict or None; got 'top_k=3'"),
    ],
)
def test_a_wrong_length_list_is_an_error_in_the_config(tmp_path, settings, message):
    with pytest.raises((ValueError, TypeError), match=message):
        small_args(tmp_path, num_agents=2, **settings)


def test_a_wrong_length_list_is_an_error_at_construction(tmp_path, tiny_path, prompts_dataset):
    # `num_agents` unset: the trainer knows it only from the models, and checks before loading anything else.
    with pytest.raises(ValueError, match=r"`top_p` has 3 values \(\[0.5, 0.6, 0.7\]\) for 2 agents"):
        MultiAgentGRPOTrainer(
            model=[tiny_path, tiny_path],
            reward_funcs=length_ratio,
            args=small_args(tmp_path, top_p=[0.5, 0.6, 0.7]),
            train_dataset=prompts_dataset,
        )


def test_one_value_for_all_and_the_command_line(tmp_path):
    config = small_args(tmp_path, temperature=[0.8], beta=0.1)
    assert (config.temperature, config.beta, config.per_agent_settings()) == (0.8, 0.1, {})
    assert config.agent_setting("temperature", 5) == 0.8  # one value serves any agent
    parser = TrlParser(MultiAgentGRPOConfig)
    argv = ["--output_dir", str(tmp_path), "--report_to", "none", "--temperature", "0.7", "1.1", "--beta", "0.04"]
    argv += ["--max_completion_length", "16", "--generation_kwargs", '[{"no_repeat_ngram_size": 2}, null]']
    (config,) = parser.parse_args_and_config(argv)
    assert config.per_agent_settings() == {
        "temperature": [0.7, 1.1],
        "generation_kwargs": [{"no_repeat_ngram_size": 2}, None],
    }
    assert (config.beta, config.max_completion_length, config.top_k, config.min_p) == (0.04, 16, 0, None)


def test_separate_models_generate_and_score_with_their_own_settings(tmp_path, tiny_path, prompts_dataset):
    settings = dict(
        temperature=[0.5, 1.3],
        top_k=[0, 7],
        max_completion_length=[3, 9],
        beta=[0.0, 0.2],
        generation_kwargs=[None, {"no_repeat_ngram_size": 2}],
    )
    trainer = MultiAgentGRPOTrainer(
        model=[tiny_path, tiny_path],
        reward_funcs=length_ratio,
        args=small_args(tmp_path, **settings),
        train_dataset=prompts_dataset,
    )
    first, second = trainer._agent_views
    assert (first["temperature"], first["beta"], first["max_completion_length"]) == (0.5, 0.0, 3)
    assert (second["temperature"], second["beta"], second["max_completion_length"]) == (1.3, 0.2, 9)
    config0, config1 = first["generation_config"], second["generation_config"]
    assert (config0.temperature, config0.top_k, config0.max_new_tokens) == (0.5, 0, 3)
    assert (config1.temperature, config1.top_k, config1.max_new_tokens, config1.no_repeat_ngram_size) == (1.3, 7, 9, 2)
    assert first["ref_model"] is None and second["ref_model"] is not None  # a reference only where beta != 0
    assert trainer.args.temperature == [0.5, 1.3]  # the config keeps what the user gave

    trainer.model.train()
    torch.manual_seed(0)
    output = trainer._generate_and_score_completions(batch(prompts_dataset))
    # Each agent's completions are padded to its own length and masked past its own end.
    for agent, limit in ((0, 3), (1, 9)):
        ids, mask = output[f"agent_{agent}/completion_ids"], output[f"agent_{agent}/completion_mask"]
        assert ids.shape[0] == 2 * G and ids.shape[1] <= limit and int(mask.sum(1).max()) <= limit
    assert output["agent_1/completion_ids"].shape[1] > 3  # agent 1 wrote past agent 0's limit
    # Agent 1's reference log-probs are its initial weights' at its own temperature (1.3), not agent 0's (0.5).
    expected = manual_logps(AutoModelForCausalLM.from_pretrained(tiny_path), _agent(output, 1), 1.3)
    torch.testing.assert_close(output["agent_1/ref_per_token_logps"] * output["agent_1/completion_mask"], expected)
    assert "agent_0/ref_per_token_logps" not in output

    before = [trained_params(agent) for agent in trainer.model.agents]
    trainer.train()
    for i, agent in enumerate(trainer.model.agents):
        after = trained_params(agent)
        assert all(not torch.equal(before[i][n], after[n]) for n in after), f"agent {i} did not train"
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert "agent_1/kl" in logged and "agent_0/kl" not in logged  # the KL term is agent 1's only


def _agent(output, agent):
    return {key.split("/", 1)[1]: value for key, value in output.items() if key.startswith(f"agent_{agent}/")}


def test_a_lora_team_uses_each_agents_temperature_and_falls_back_to_one_generate_per_agent(
    tmp_path, tiny_path, prompts_dataset, caplog
):
    with caplog.at_level(logging.WARNING, logger="multiagent_trl.team.views"):
        trainer = MultiAgentGRPOTrainer(
            model=tiny_path,
            reward_funcs=length_ratio,
            args=small_args(tmp_path, num_agents=2, temperature=[0.6, 1.4], max_completion_length=[4, 8]),
            train_dataset=prompts_dataset,
            peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
        )
    fallbacks = [r for r in caplog.records if "generates one agent at a time" in r.getMessage()]
    assert len(fallbacks) == 1 and "temperature, max_completion_length" in fallbacks[0].getMessage()
    assert not trainer._batched_generation()

    # The shared base computes each agent's log-probs at that agent's temperature (TRL patches it once).
    team = trainer.model
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    for agent, temperature in ((0, 0.6), (1, 1.4)):
        with trainer._agent_view(agent), torch.no_grad():
            fused = team(input_ids=ids, labels=ids, fused_lm_head=True).log_probs
            logits = team(input_ids=ids).logits[:, :-1] / temperature
        expected = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(fused, expected)

    trainer.model.train()
    output = trainer._generate_and_score_completions(batch(prompts_dataset))
    assert output["agent_0/completion_ids"].shape[1] <= 4 < output["agent_1/completion_ids"].shape[1] <= 8
    trainer.train()  # one generate per agent, its own settings, to the end
    assert trainer.state.global_step == 2


def test_a_lora_team_with_equal_settings_keeps_batched_generation(tmp_path, tiny_path, prompts_dataset):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_path,
        reward_funcs=length_ratio,
        args=small_args(tmp_path, num_agents=2, temperature=[0.9, 0.9]),
        train_dataset=prompts_dataset,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    assert trainer._batched_generation()
