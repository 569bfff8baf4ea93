"""Reward models for teams: a sequence classifier in `reward_funcs` scores each joint sample as one text.

With one policy, TRL scores `prompt + completion` with the reward model. A joint sample holds one completion per
agent, so it is first written as one text: by `default_joint_text` (the prompt, then each agent's completion under
an `[agent_i]` header), or by the user's `joint_text(prompts, completions) -> str` (the trainer's `joint_text=`
argument). `JointRewardModel` does the rest as TRL does: the model is loaded with `num_labels=1`, its tokenizer comes
from `reward_processing_classes` (or from the model's id), texts are padded on the right, and the reward is the
first logit. All joint samples of a batch are scored in one forward (or in chunks of `batch_size`). It then counts as
one more reward function: mixed with the others through `reward_weights`, logged as `rewards/<model name>/mean`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from accelerate import PartialState
from torch import nn
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase
from trl.trainer.utils import get_config_model_id

JointText = Callable[[Sequence, Sequence], str]


def check_model_rewards(values: Sequence[float], name: str) -> None:
    """Raise if reward model `name` scored a joint sample NaN or infinite (TRL would read NaN as "no reward").

    >>> check_model_rewards([0.5, float("inf")], "rm")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: Reward model 'rm' returned inf for joint sample 1; ...
    """
    for j, value in enumerate(values):
        if not math.isfinite(value):
            raise ValueError(
                f"Reward model '{name}' returned {value} for joint sample {j}; its scores must be finite (check its "
                "weights and dtype)."
            )


def _as_text(value) -> str:
    """A prompt or completion as text: plain text as it is, a conversation as `role: content` lines."""
    if isinstance(value, str):
        return value
    return "\n".join(f"{message.get('role', 'user')}: {message.get('content', '')}" for message in value)


def default_joint_text(prompts: Sequence, completions: Sequence) -> str:
    """The text a reward model reads for one joint sample: the prompt, then each agent's completion under its
    header. Agents with different prompts (`formatters`) each get their prompt inside their own block.

    Args:
        prompts: Agent i's prompt at index i (text, or a conversation: a list of messages).
        completions: Agent i's completion at index i (text, or a list of messages).

    >>> print(default_joint_text(("Plan a trip:", "Plan a trip:"), ("Go north.", "Pack a coat.")))
    Plan a trip:
    <BLANKLINE>
    [agent_0]
    Go north.
    <BLANKLINE>
    [agent_1]
    Pack a coat.
    >>> print(default_joint_text(("Draft:", "Edit:"), ("a", "b")))
    [agent_0]
    Draft:
    a
    <BLANKLINE>
    [agent_1]
    Edit:
    b
    """
    prompt_texts = [_as_text(p) for p in prompts]
    if len(set(prompt_texts)) == 1:
        blocks = [f"[agent_{i}]\n{_as_text(c)}" for i, c in enumerate(completions)]
        return prompt_texts[0] + "\n\n" + "\n\n".join(blocks)
    return "\n\n".join(f"[agent_{i}]\n{p}\n{_as_text(c)}" for i, (p, c) in enumerate(zip(prompt_texts, completions)))


class JointRewardModel:
    """A sequence-classification reward model as a joint reward function `f(prompts, completions, **kwargs)`.

    Args:
        model: A model id or path (loaded with `AutoModelForSequenceClassification`, `num_labels=1`, as TRL does), or
            a loaded `nn.Module` whose output has `.logits`.
        processing_class: Its tokenizer; `None` loads the one saved with the model.
        joint_text: `joint_text(prompts, completions) -> str` for one joint sample; `None` is `default_joint_text`.
        model_init_kwargs: Passed to `from_pretrained` when `model` is an id or path.
        batch_size: Joint samples per forward; `None` scores the whole batch in one forward.

    Example:
        >>> from transformers import AutoModelForSequenceClassification, Qwen2Config
        >>> from multiagent_trl.testing import tiny_tokenizer
        >>> tokenizer = tiny_tokenizer()
        >>> config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                      num_attention_heads=2, num_key_value_heads=1, num_labels=1)
        >>> scorer = JointRewardModel(AutoModelForSequenceClassification.from_config(config), tokenizer)
        >>> len(scorer(prompts=[("Hi", "Hi")], completions=[("a", "b")]))
        1
    """

    def __init__(
        self,
        model: str | nn.Module,
        processing_class: PreTrainedTokenizerBase | None = None,
        joint_text: JointText | None = None,
        *,
        model_init_kwargs: dict | None = None,
        batch_size: int | None = None,
    ):
        if isinstance(model, str):
            model = AutoModelForSequenceClassification.from_pretrained(
                model, num_labels=1, **(model_init_kwargs or {})
            )
        elif not isinstance(model, nn.Module):
            raise TypeError(f"A reward model is a model id, a path or an nn.Module; got {type(model).__name__}.")
        if processing_class is None:
            processing_class = AutoTokenizer.from_pretrained(get_config_model_id(model.config))
        if processing_class.pad_token_id is None:
            processing_class.pad_token = processing_class.eos_token
        # The reward is read at the last non-padding token, found through the model's pad token id (as in TRL).
        model.config.get_text_config().pad_token_id = processing_class.pad_token_id
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"`batch_size` must be at least 1, got {batch_size}.")
        self.model = model.eval().requires_grad_(False)
        self.processing_class = processing_class
        self.joint_text = joint_text or default_joint_text
        self.batch_size = batch_size
        self.__name__ = get_config_model_id(model.config).split("/")[-1]  # TRL's name for a reward model

    def texts(self, prompts: Sequence[Sequence], completions: Sequence[Sequence]) -> list[str]:
        """The text of each joint sample (`prompts[j]`, `completions[j]`: the agents' prompts and completions)."""
        texts = [self.joint_text(p, c) for p, c in zip(prompts, completions, strict=True)]
        bad = [t for t in texts if not isinstance(t, str)]
        if bad:
            raise TypeError(
                f"`joint_text` must return a str for each joint sample; it returned {type(bad[0]).__name__}."
            )
        return texts

    @torch.inference_mode()
    def score(self, texts: list[str]) -> list[float]:
        """The reward model's first logit for each text."""
        device = PartialState().device  # this process's device; moved once
        if next(self.model.parameters()).device != device:
            self.model.to(device)
        step = self.batch_size or max(len(texts), 1)
        rewards = []
        for start in range(0, len(texts), step):
            inputs = self.processing_class(
                text=texts[start : start + step],
                return_tensors="pt",
                padding=True,
                padding_side="right",
                add_special_tokens=False,
            ).to(device)
            rewards.extend(self.model(**inputs).logits[:, 0].float().tolist())
        return rewards

    def __call__(self, prompts: Sequence, completions: Sequence, **kwargs) -> list[float]:
        rewards = self.score(self.texts(prompts, completions))
        check_model_rewards(rewards, self.__name__)
        return rewards


def as_joint_reward_model(
    func: str | nn.Module, processing_class, joint_text: JointText | None, model_init_kwargs: dict | None
) -> JointRewardModel:
    """A reward model given in `reward_funcs` (an id, a path or a module) as a joint reward function."""
    return JointRewardModel(func, processing_class, joint_text, model_init_kwargs=model_init_kwargs)


__all__ = ["JointRewardModel", "as_joint_reward_model", "default_joint_text"]
