"""Faster generation for teams: batched generation of separate models, continuous batching and compiled decoding
give the plain path's greedy tokens."""

import pytest
import torch
from peft import LoraConfig
from transformers.generation import ContinuousBatchingConfig

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
from multiagent_trl.rollout import generation
from multiagent_trl.team import agent_rows
from multiagent_trl.team.modules import AgentTeam

from .conftest import small_args

G = 4


def ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def by_target(prompts, completions, target, **kwargs):
    return [2.0 if t == 3 else 0.0 for t in target]


def feedback(row, histories, turn):
    return [f"{row['prompt']} [turn {turn}] you wrote {len(h[-1])}" for h in histories]


def varied_model(tmp_path_factory, path: str, seed: int) -> str:
    """The tiny architecture at `path` with larger, untied random weights drawn with `seed`: the tiny models repeat
    the prompt's last token under greedy decoding, which would make an equality of tokens hold trivially; these write
    varied tokens."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(path, initializer_range=0.1, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config = AutoModelForCausalLM.from_pretrained(path).generation_config
    out = tmp_path_factory.mktemp(f"varied-{seed}")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(path).save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def varied_paths(tmp_path_factory, tiny_path, tiny_llama_path) -> tuple[str, str]:
    """Two architectures (Qwen2, Llama) with varied weights."""
    return varied_model(tmp_path_factory, tiny_path, 0), varied_model(tmp_path_factory, tiny_llama_path, 1)


@pytest.fixture(scope="session")
def twin_paths(tmp_path_factory, varied_paths, tiny_path) -> tuple[str, str]:
    """Two models of one architecture and config (Qwen2) with different varied weights."""
    return varied_paths[0], varied_model(tmp_path_factory, tiny_path, 2)


def team(tmp_path, kind, paths, dataset, reward=ratio, **overrides):
    """A 2-agent team decoding greedily: separate models of two architectures, or two LoRA adapters on one base."""
    overrides.setdefault("generation_kwargs", {"do_sample": False})
    args = small_args(tmp_path, num_agents=2, **overrides)
    if kind == "lora":
        # Random adapters (init_lora_weights=False), so that the agents generate differently from the start.
        peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        model = paths[0]
    else:
        peft, model = None, list(paths)
    transition = feedback if args.num_turns > 1 else None
    return MultiAgentGRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, peft_config=peft,
        external_transition=transition,
    )  # fmt: skip


def completions(trainer, dataset) -> dict[str, torch.Tensor]:
    trainer.model.train()
    batch = [dataset[i] for i in range(2) for _ in range(G)]
    output = trainer._generate_and_score_completions(batch)
    # Completion ids with everything the masks drop set to -1: padding (which differs between the paths; tokens must
    # not) and the turns of trajectories that have ended (`tool_mask` 0).
    masked = {}
    for key in (k for k in output if k.endswith("completion_ids")):
        keep = output[key.replace("_ids", "_mask")].bool()
        tool_mask = output.get(key.replace("completion_ids", "tool_mask"))
        if tool_mask is not None:
            keep &= tool_mask.bool()
        masked[key] = output[key].masked_fill(~keep, -1)
    return masked


@pytest.fixture
def count_batch_calls(monkeypatch):
    """Count the `generate_batch` calls the team makes (the real ones run)."""
    calls = []
    original = generation.generate_batch

    def counting(model, inputs, **kwargs):
        calls.append(len(inputs))
        return original(model, inputs, **kwargs)

    monkeypatch.setattr(generation, "generate_batch", counting)
    return calls


@pytest.mark.parametrize("kind", ["separate", "lora"])
def test_continuous_batching_generates_the_plain_greedy_tokens(
    tmp_path, varied_paths, prompts_dataset, kind, count_batch_calls
):
    paths = varied_paths
    plain = completions(team(tmp_path, kind, paths, prompts_dataset), prompts_dataset)
    assert count_batch_calls == []
    paged = completions(
        team(tmp_path, kind, paths, prompts_dataset, use_transformers_continuous_batching=True), prompts_dataset
    )
    # One paged call per agent (a LoRA team too: see `rollout.generation`), each with the agent's 8 rows.
    assert count_batch_calls == [2 * G, 2 * G]
    assert plain.keys() == paged.keys() == {"agent_0/completion_ids", "agent_1/completion_ids"}
    for key in plain:
        assert torch.equal(plain[key], paged[key]), key
    assert not torch.equal(plain["agent_0/completion_ids"], plain["agent_1/completion_ids"])  # the agents differ


def test_continuous_batching_plays_multi_turn_episodes_with_early_termination(
    tmp_path, varied_paths, prompts_dataset, count_batch_calls
):
    tiny_path = varied_paths[0]
    # The rows of target 3 score above the threshold: their node ends after turn 1 (no turn-2 node below it).
    settings = dict(num_turns=2, early_termination_threshold=1.0, reward=by_target)
    plain = completions(team(tmp_path, "lora", (tiny_path,), prompts_dataset, **settings), prompts_dataset)
    paged = completions(
        team(tmp_path, "lora", (tiny_path,), prompts_dataset, use_transformers_continuous_batching=True, **settings),
        prompts_dataset,
    )
    assert len(count_batch_calls) == 4  # 2 turns x 2 agents
    assert sorted(plain) == sorted(paged) and len(plain) == 2  # agent_{i}/completion_ids, every turn's rows
    for key in plain:
        assert torch.equal(plain[key], paged[key]), key
    # Turn 1: 2 nodes of G rows; turn 2: only the continuing node's G samples spawned nodes, G rows each.
    assert len(plain["agent_0/completion_ids"]) == 2 * G + G * G


def test_continuous_batching_trains(tmp_path, varied_paths, prompts_dataset):
    # Untied embeddings: TRL's `cast_lm_head_to_fp32` refuses tied ones.
    trainer = team(
        tmp_path, "lora", varied_paths[:1], prompts_dataset, generation_kwargs={}, max_steps=1,
        use_transformers_continuous_batching=True, cast_lm_head_to_fp32=True,  # TRL's paged path casts the team's head
    )  # fmt: skip
    before = [[p.detach().clone() for p in trainer.model.agent_parameters(i)] for i in range(2)]
    trainer.train()
    for i in range(2):
        after = trainer.model.agent_parameters(i)
        assert all(not torch.equal(a, b) for a, b in zip(after, before[i])), f"agent {i} did not train"


@pytest.mark.parametrize("kind", ["separate", "lora"])
def test_compiled_decoding_generates_the_plain_greedy_tokens(tmp_path, varied_paths, prompts_dataset, kind):
    paths = (varied_paths[0], varied_paths[0])
    plain = completions(team(tmp_path, kind, paths, prompts_dataset), prompts_dataset)
    # The eager backend runs dynamo's capture of the decoding step without inductor's code generation (a minute on
    # this CPU), so the test checks the compiled path's plumbing and tokens quickly.
    trainer = team(tmp_path, kind, paths, prompts_dataset, compile_generation=True, compile_generation_kwargs={
        "backend": "eager"})  # fmt: skip
    for view in trainer._agent_views:
        config = view["generation_config"]
        assert config.cache_implementation == "static" and not config.disable_compile
        assert config.compile_config.backend == "eager"
    compiled = completions(trainer, prompts_dataset)
    for key in plain:
        assert torch.equal(plain[key], compiled[key]), key
    # transformers keeps one compiled call per model: the generating model was compiled once, and a second generation
    # reuses it. Both kinds generate for the two agents in one call: the LoRA team through its base, separate models
    # of one architecture through agent 0's model (`agent_rows.AgentRowsModels`).
    models = [m.get_base_model() if hasattr(m, "get_base_model") else m for m in trainer.model.models()]
    if kind == "separate":
        assert not hasattr(models[1], "_compiled_call")
        models = models[:1]
    compiled_calls = [m._compiled_call for m in models]
    completions(trainer, prompts_dataset)
    assert [m._compiled_call for m in models] == compiled_calls


def test_decoding_options_are_checked(tmp_path):
    with pytest.raises(ValueError, match="compile_generation_kwargs"):
        small_args(tmp_path, compile_generation_kwargs={"backend": "eager"})
    with pytest.raises(ValueError, match="cache_implementation"):
        small_args(tmp_path, compile_generation=True, cache_implementation="dynamic")
    with pytest.raises(ValueError, match="default_compile_level"):
        small_args(tmp_path, compile_generation=True, use_transformers_continuous_batching=True)
    assert isinstance(small_args(tmp_path, use_transformers_continuous_batching=True), MultiAgentGRPOConfig)


def test_paged_cache_is_sized_from_the_workload_on_cpu():
    from transformers import GenerationConfig

    inputs = [[1] * 10, [1] * 30, [1] * 20]
    config = generation.sized_continuous_batching_config(
        ContinuousBatchingConfig(page_size=16), inputs, GenerationConfig(max_new_tokens=17), torch.device("cpu")
    )
    # ceil((30 + 17 + 1) / 16) = 3 pages per request; every prompt fits in one batch.
    assert (config.num_blocks, config.max_batch_tokens) == (3 * 3 + 1, 60)
    given = ContinuousBatchingConfig(num_blocks=7)
    assert generation.sized_continuous_batching_config(given, inputs, None, torch.device("cpu")) is given
    assert generation.sized_continuous_batching_config(None, inputs, None, torch.device("meta")).num_blocks is None


@pytest.fixture
def count_agent_rows(monkeypatch):
    """The rows of every batched generation of separate models (the real one runs)."""
    calls = []

    class Counting(agent_rows.AgentRowsModels):
        def __enter__(self):
            calls.append(list(self.rows))
            return super().__enter__()

    monkeypatch.setattr("multiagent_trl.team.modules.AgentRowsModels", Counting)
    return calls


def test_separate_models_of_one_architecture_generate_in_one_call(
    tmp_path, twin_paths, prompts_dataset, count_agent_rows
):
    per_agent = completions(team(tmp_path, "separate", twin_paths, prompts_dataset, generation_mode="per_agent"),
                            prompts_dataset)  # fmt: skip
    assert count_agent_rows == []
    trainer = team(tmp_path, "separate", twin_paths, prompts_dataset)
    assert trainer.args.generation_mode == "batched" and trainer._batched_generation()
    modules = [m for agent in trainer.model.agents for m in agent.modules()]
    forwards = [vars(m).get("forward") for m in modules]  # TRL wraps some forwards itself (the fused LM head)
    batched = completions(trainer, prompts_dataset)
    assert count_agent_rows == [[2 * G, 2 * G]]  # one call, each agent's 8 rows
    for key in per_agent:
        assert torch.equal(per_agent[key], batched[key]), key
    assert not torch.equal(batched["agent_0/completion_ids"], batched["agent_1/completion_ids"])  # the agents differ
    # Every module is back to the forward it had: a later call of one agent alone is unchanged.
    assert [vars(m).get("forward") for m in modules] == forwards


@pytest.mark.parametrize("rows", [(4, 4), (3, 5), (2, 3, 3)])
def test_each_agent_rows_get_the_tokens_of_the_agent_alone(twin_paths, rows):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths = [twin_paths[i % 2] for i in range(len(rows))]
    team = AgentTeam([AutoModelForCausalLM.from_pretrained(path) for path in paths])
    tokenizer = AutoTokenizer.from_pretrained(paths[0])
    inputs = tokenizer([f"prompt {i} " + "x" * i for i in range(sum(rows))], return_tensors="pt", padding=True)
    settings = dict(max_new_tokens=8, do_sample=False)
    bounds = torch.tensor([0, *rows]).cumsum(0).tolist()
    expected = [
        agent.generate(**{k: v[start:end] for k, v in inputs.items()}, **settings)
        for agent, start, end in zip(team.agents, bounds[:-1], bounds[1:])
    ]
    assert team.batches_generation()
    with team.mixed_batch(rows):
        together = team.generate(**inputs, **settings)
    assert torch.equal(together, torch.cat(expected))
    assert not torch.equal(expected[0][:2], expected[1][:2])  # the two weights do give different tokens


def test_only_models_of_one_architecture_and_config_batch(tiny_path, tiny_llama_path, twin_paths):
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    def load(path, **config):
        return AutoModelForCausalLM.from_pretrained(path, **config)

    assert agent_rows.same_architecture([load(twin_paths[0]), load(twin_paths[1])])
    assert not agent_rows.same_architecture([load(tiny_path), load(tiny_llama_path)])  # two architectures
    # One architecture and the same parameters, another config (the norms' epsilon is no parameter or buffer).
    other = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_path, rms_norm_eps=1e-2))
    assert not agent_rows.same_architecture([load(tiny_path), other])
    assert not agent_rows.same_architecture([load(tiny_path), load(tiny_path, dtype=torch.bfloat16)])
    lora = get_peft_model(load(tiny_path), LoraConfig(r=4, target_modules=["q_proj"]))
    assert not agent_rows.same_architecture([load(tiny_path), lora])  # an adapter changes what a layer computes
    assert not AgentTeam([load(tiny_path)]).batches_generation()  # a team of one has nothing to batch


@pytest.mark.parametrize("kind", ["separate", "lora"])
def test_steps_add_no_input_embedding_hooks(tmp_path, twin_paths, prompts_dataset, kind):
    # TRL switches checkpointing off and on around every generation; transformers adds a hook to the input
    # embeddings at every enable (two per step and model, each run at every decoding step) unless the team drops it.
    trainer = team(tmp_path, kind, twin_paths, prompts_dataset, max_steps=1, gradient_checkpointing=True)
    embeddings = [model.get_input_embeddings() for model in trainer.model.models()]

    def hooks():
        return [len(e._forward_hooks) for e in embeddings]

    trainer.train()
    after_one = hooks()
    assert all(n >= 1 for n in after_one)  # checkpointing's own hook is there, once
    trainer.args.max_steps = 4
    trainer.train()
    assert hooks() == after_one
    assert trainer.model.is_gradient_checkpointing
