"""Bad input fails early, with a message that names the argument and the fix."""

import math
import re

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from multiagent_trl import MAGRPOConfig, MAGRPOTrainer, MultiAgentGRPOConfig, MultiAgentGRPOTrainer

from .conftest import small_args


def good_reward(completions1, completions2):
    return [0.0] * len(completions1)


def three_way(completions1, completions2, completions3):
    return [0.0] * len(completions1)


def no_completions(threshold=0.5):
    return []


def build(tmp_path, tiny_path, dataset, trainer_class=MultiAgentGRPOTrainer, **overrides):
    kwargs = dict(model=tiny_path, reward_funcs=good_reward, args=small_args(tmp_path, num_agents=2))
    kwargs.update(overrides)
    return trainer_class(train_dataset=dataset, **kwargs)


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (dict(reward_funcs=three_way), TypeError, "takes 3 completion arguments .* but there are 2 agents"),
        (dict(reward_funcs=no_completions), TypeError, "'no_completions' fits neither reward convention"),
        (dict(reward_funcs=None), ValueError, "Pass a joint reward function"),
        (dict(formatters=[str, str, str]), ValueError, "3 formatters were given for 2 agents"),
    ],
)
def test_construction_errors(tmp_path, tiny_path, prompts_dataset, overrides, error, message):
    with pytest.raises(error, match=message):
        build(tmp_path, tiny_path, prompts_dataset, **overrides)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(reward_func=good_reward), "either `reward_funcs` or its CoMLRL name `reward_func`"),
        (dict(agents=["x"]), "either `model` or its CoMLRL name `agents`"),
        (dict(tokenizer="t", processing_class="t"), "either `processing_class` or its CoMLRL name `tokenizer`"),
        (dict(model=None, reward_funcs=None, agents=["x"]), "Pass a joint reward function: `reward_func=`"),
    ],
)
def test_comlrl_names_and_their_twins_are_exclusive(tmp_path, tiny_path, prompts_dataset, overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(tmp_path, tiny_path, prompts_dataset, trainer_class=MAGRPOTrainer, **overrides)


def test_the_core_trainer_does_not_take_comlrl_names(tmp_path, tiny_path, prompts_dataset):
    with pytest.raises(TypeError, match="agents"):
        build(tmp_path, tiny_path, prompts_dataset, agents=[tiny_path] * 2)


def test_agents_and_num_agents_must_agree(tmp_path, tiny_path, prompts_dataset):
    with pytest.raises(ValueError, match=r"3 agents were given but `num_agents=2`"):
        build(tmp_path, tiny_path, prompts_dataset, model=[tiny_path] * 3)


def test_one_model_object_cannot_be_several_agents(tmp_path, tiny_path, prompts_dataset):
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    with pytest.raises(ValueError, match="One model object was given with `num_agents=2`"):
        build(tmp_path, tiny_path, prompts_dataset, model=model)
    with pytest.raises(ValueError, match="must not share weights"):
        build(tmp_path, tiny_path, prompts_dataset, model=[model, model])


def test_number_of_tokenizers_must_match(tmp_path, tiny_path, prompts_dataset):
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    with pytest.raises(ValueError, match=r"3 tokenizers \(`processing_class`\) were given for 2 agents"):
        build(tmp_path, tiny_path, prompts_dataset, trainer_class=MAGRPOTrainer, tokenizer=[tokenizer] * 3)


def test_dataset_needs_a_prompt_column_or_formatters(tmp_path, tiny_path):
    dataset = Dataset.from_dict({"question": ["What is 2+2?"] * 8})
    with pytest.raises(ValueError, match=r"`train_dataset` has no 'prompt' column .* pass `formatters=`"):
        build(tmp_path, tiny_path, dataset)
    build(tmp_path, tiny_path, dataset, formatters=lambda row: row["question"])  # the fix works


def test_grpo_config_is_refused_with_the_fix(tmp_path, tiny_path, prompts_dataset):
    args = GRPOConfig(output_dir=str(tmp_path), bf16=False)
    with pytest.raises(TypeError, match="replace `GRPOConfig\\(` with `MultiAgentGRPOConfig\\(`"):
        build(tmp_path, tiny_path, prompts_dataset, args=args)


@pytest.mark.parametrize(
    "config_kwargs, error, message",
    [
        (dict(num_generations=1), ValueError, "`num_generations` must be at least 2"),
        (dict(joint_mode="pairwise"), ValueError, r"`joint_mode` must be one of \('aligned', 'cross'\)"),
        (dict(num_agents=2, agent_learning_rates=[1e-3]), ValueError, "1 values but `num_agents` is 2"),
        (dict(use_vllm=True, vllm_mode="remote"), ValueError, "`vllm_mode` must be 'colocate' or 'server'"),
        (dict(num_turns=0), ValueError, "`num_turns` must be at least 1"),
        (dict(discount=1.5), ValueError, r"`discount` must be in \[0, 1\]"),
    ],
)
def test_config_errors(tmp_path, config_kwargs, error, message):
    with pytest.raises(error, match=message):
        MultiAgentGRPOConfig(output_dir=str(tmp_path), **config_kwargs)


@pytest.mark.parametrize(
    "config_kwargs, message",
    [(dict(advantage_mode="median"), "`advantage_mode` must be one of ['mean', 'raw', 'max', 'rloo']")],
)
def test_magrpo_unsupported_fields_are_not_ignored(tmp_path, config_kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MAGRPOConfig(output_dir=str(tmp_path), **config_kwargs)


@pytest.mark.parametrize(
    "returned, error, message",
    [
        (lambda n: [0.0] * (n - 1), ValueError, r"'bad_reward' returned 7 rewards but 8 joint samples"),
        (lambda n: [math.nan] * n, ValueError, r"'bad_reward' returned nan for joint sample 0"),
        (lambda n: [0.0, -math.inf] + [0.0] * (n - 2), ValueError, r"'bad_reward' returned -inf for joint sample 1"),
        (lambda n: [None] * (n - 1) + [math.inf], ValueError, r"'bad_reward' returned inf for joint sample 7"),
        (lambda n: ["great"] * n, TypeError, r"'bad_reward' returned 'great'"),
    ],
)
def test_bad_reward_values_fail_at_the_first_step(tmp_path, tiny_path, prompts_dataset, returned, error, message):
    def bad_reward(completions1, completions2):
        return returned(len(completions1))

    trainer = build(tmp_path, tiny_path, prompts_dataset, reward_funcs=bad_reward)
    with pytest.raises(error, match=message):
        trainer.train()


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_reward_processor_that_returns_a_non_finite_reward_fails(tmp_path, tiny_path, prompts_dataset, value):
    def spiky(reward):
        return value if reward == 3.0 else reward

    def rewards(completions1, completions2):  # joint sample 3 gets the reward the processor spoils
        return [float(j) for j in range(len(completions1))]

    trainer = build(tmp_path, tiny_path, prompts_dataset, reward_funcs=rewards, reward_processor=spiky)
    message = rf"Reward processor 'spiky' returned {value} for joint sample 3 \(reward 3.0\)"
    with pytest.raises(ValueError, match=message):
        trainer.train()


# ------------------------------------------------------------------------ one table of bad inputs, both trainers


def _returns(value):
    def bad(completions1, completions2):
        return value(len(completions1))

    return bad


def _formatter_returning(value):
    return lambda row: value


# (case id, trainer arguments, config fields, error, the message: it names the argument and says the fix). CoMLRL
# calls a reward once per joint sample and takes its first value (`COMLRL_MESSAGES`: what its layer says instead).
BAD_INPUTS = [
    ("reward not callable", dict(reward_funcs=42), {}, TypeError, r"`reward_funcs` must be callables"),
    ("reward count", dict(reward_funcs=_returns(lambda n: [0.0])), {}, ValueError, r"'bad' returned 1 rewards but 8"),
    ("reward empty", dict(reward_funcs=_returns(lambda n: [])), {}, ValueError, r"'bad' returned 0 rewards but 8"),
    ("reward nan", dict(reward_funcs=_returns(lambda n: [math.nan] * n)), {}, ValueError, r"'bad' returned nan"),
    ("reward type", dict(reward_funcs=_returns(lambda n: "0.5")), {}, TypeError, r"'bad' returned str; it must"),
    ("formatter not callable", dict(formatters=["a", "b"]), {}, TypeError, r"`formatters` must be callables"),
    (
        "formatter output",
        dict(formatters=_formatter_returning(None)),
        {},
        ValueError,
        r"`formatters` \(agent 0's, <lambda>\) returned None for row 0",
    ),
    ("formatter count", dict(formatters=[str] * 3), {}, ValueError, r"3 formatters were given for 2 agents"),
    ("processor", dict(reward_processor=5), {}, TypeError, r"`reward_processor` must be a callable"),
    ("transition", dict(external_transition=5), dict(num_turns=2), TypeError, r"`external_transition` must be"),
    ("no transition", {}, dict(num_turns=2), ValueError, r"`num_turns=2` needs `external_transition=`"),
    ("no prompts", dict(train_dataset="no prompt"), {}, ValueError, r"`train_dataset` has no 'prompt' column"),
    ("eval prompts", dict(eval_dataset="no prompt"), {}, ValueError, r"`eval_dataset` has no 'prompt' column"),
    ("tokenizers", dict(processing_class="3 tokenizers"), {}, ValueError, r"3 tokenizers \(`processing_class`\)"),
    ("one generation", {}, dict(num_generations=1), ValueError, r"`num_generations` must be at least 2"),
    ("per-agent list", {}, dict(temperature=[0.5, 0.6, 0.7]), ValueError, r"`temperature` has 3 values"),
    ("learning rates", {}, dict(agent_learning_rates=[1e-3]), ValueError, r"`agent_learning_rates` has 1 value"),
    ("completion length", {}, dict(max_completion_length=0), ValueError, r"`max_completion_length` must be"),
    ("turns", {}, dict(num_turns=0), ValueError, r"`num_turns` must be at least 1"),
    ("rollout shape", {}, dict(rollout="graph"), ValueError, r"`rollout` must be one of"),
]
COMLRL_MESSAGES = {
    "reward count": None,  # one value per call, the first used: a longer list is CoMLRL's convention, not an error
    "reward empty": r"'bad' returned no value for joint sample 0",
    "reward type": r"'bad' returned '0.5' \(str\) for joint sample 0",
    "completion length": r"`max_new_tokens` must be at least 1",  # CoMLRL's name (it maps onto the GRPO field)
}
COMLRL_FIELDS = {"completion length": dict(max_new_tokens=0)}


@pytest.mark.parametrize("trainer_class", [MultiAgentGRPOTrainer, MAGRPOTrainer])
@pytest.mark.parametrize("case, arguments, fields, error, message", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_names_the_argument(
    tmp_path, tiny_path, prompts_dataset, trainer_class, case, arguments, fields, error, message
):
    config_class = MAGRPOConfig if trainer_class is MAGRPOTrainer else MultiAgentGRPOConfig
    if trainer_class is MAGRPOTrainer and case in COMLRL_MESSAGES:
        message = COMLRL_MESSAGES[case]
        fields = COMLRL_FIELDS.get(case, fields)
    arguments = dict(arguments)
    no_prompts = Dataset.from_dict({"question": ["What is 2+2?"] * 8})
    for name in ("train_dataset", "eval_dataset"):
        if arguments.get(name) == "no prompt":
            arguments[name] = no_prompts
    if arguments.get("processing_class") == "3 tokenizers":
        arguments["processing_class"] = [AutoTokenizer.from_pretrained(tiny_path)] * 3
    settings = dict(
        output_dir=str(tmp_path / "out"), num_agents=2, num_turns=1, num_generations=4, max_completion_length=8,
        per_device_train_batch_size=8, max_steps=1, report_to="none", save_strategy="no",
    )  # fmt: skip

    def run():
        args = config_class(**{**settings, **fields})
        kwargs = dict(model=tiny_path, reward_funcs=good_reward, args=args, train_dataset=prompts_dataset)
        trainer = trainer_class(**{**kwargs, **arguments})
        trainer.train()  # errors that only a step can find are raised at the first step

    if message is None:
        run()
        return
    with pytest.raises(error, match=message):
        run()


@pytest.mark.parametrize(
    "drop, mask_length, message",
    [
        (1, None, r"agent 0's `rollout_func` returned 7 `prompt_ids` for 8 prompts"),
        (0, 2, r"agent 0's `rollout_func` returned an `env_mask` that does not match its completions \(row 0\)"),
    ],
)
def test_a_rollout_funcs_output_is_checked_where_it_enters(
    tmp_path, tiny_path, prompts_dataset, drop, mask_length, message
):
    def rollout_func(prompts, trainer):
        tokenizer = trainer.processing_class
        kept = prompts[: len(prompts) - drop]
        completion_ids = [tokenizer("abcd")["input_ids"] for _ in kept]
        output = {"prompt_ids": [tokenizer(p)["input_ids"] for p in kept], "completion_ids": completion_ids}
        if mask_length is not None:
            output["env_mask"] = [[1] * mask_length for _ in kept]
        return {**output, "logprobs": None}

    trainer = build(tmp_path, tiny_path, prompts_dataset, rollout_func=rollout_func)
    with pytest.raises(ValueError, match=message):
        trainer.train()
