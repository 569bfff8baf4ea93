"""MARLHF's joint reward model, as CoMLRL 1.4.3 defines it: a causal LM backbone with a scalar head that reads one
text holding every agent's prompt and response.

- Text (`joint_text`): a title line, then for each agent (numbered from 1) its prompt and its response, blocks joined
  by blank lines.
- Score: the backbone's last hidden state at each row's last attended token, through `nn.Linear(hidden, 1)` (with a
  bias, PyTorch's default init, in the backbone's dtype and device).
- Training: `bradley_terry_loss` on the scores of the winner's and the loser's joint texts (`multiagent_trl.preference
  .losses`), the texts tokenized with padding and truncation at `max_length`, no end token added.

Beyond CoMLRL: the forward passes `position_ids` counted over the attended tokens, so a left-padded row scores as it
does unpadded. CoMLRL passes none, which shifts a left-padded row's positions: harmless for rotary backbones (Qwen,
Llama see only offsets), not for absolute-position ones (GPT-2). The scorer pads on the right whatever the tokenizer's
side. `save_pretrained` / `from_pretrained` keep the model (CoMLRL never saves it; a save is atomic and a folder
missing any part is refused), `from_causal_lm` starts one with a new head, and
calling the model on `(prompts, completions)` makes it a joint reward function for the team trainer's `reward_funcs`.

Pooling (`pooling=`, beyond CoMLRL; `"last"` is CoMLRL's and the default): what the head reads.

- `"last"`: the last hidden state at the last attended token (CoMLRL's).
- `"mean"`: the mean of the last hidden states over the attended tokens.
- `"spans"`: for each agent, the mean of the last hidden states over the tokens of its response (the text after
  `Agent i response:`), the N means concatenated: a head of `N * hidden` inputs (`num_agents` required).
- `"span_sums"`: as `"spans"` with sums instead of means, so the head also sees how long each response is.

A response's tokens are found with the tokenizer's offsets (a fast tokenizer): a token belongs to agent i's response
when its characters lie inside it. An empty or truncated-away response pools to zeros. The pooling and the agent
count are saved with the model (`joint_reward_model.json`); a folder saved before them loads as `"last"`.
docs/benchmarks.md measures them on the tutorial task: held-out ranking accuracy per pooling.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Sequence

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from ..team.folders import check_folder, check_saved_file, model_files

REWARD_HEAD_FILE = "reward_head.pt"  # next to the backbone's files
REWARD_MODEL_MARKER = "joint_reward_model.json"  # written last by `save_pretrained`: the files it wrote
REWARD_POOLINGS = ("last", "mean", "spans", "span_sums")
SPAN_POOLINGS = ("spans", "span_sums")  # read each agent's response tokens: need `num_agents` and token offsets
JOINT_TITLE = "Joint multi-agent response"  # the first line of every joint text (CoMLRL's)


def _as_text(value) -> str:
    """Plain text as it is; a conversation (a list of messages) as `role: content` lines."""
    if isinstance(value, str):
        return value
    return "\n".join(f"{message.get('role', 'user')}: {message.get('content', '')}" for message in value)


def joint_text_spans(prompts: Sequence, completions: Sequence) -> tuple[str, list[tuple[int, int]]]:
    """`joint_text(prompts, completions)` and the `(start, end)` character span of each agent's response in it.

    >>> text, spans = joint_text_spans(["Write.", "Review."], ["Draft", "OK"])
    >>> [text[start:end] for start, end in spans]
    ['Draft', 'OK']
    """
    pieces, spans, length = [JOINT_TITLE], [], len(JOINT_TITLE)
    for i in range(max(len(prompts), len(completions))):
        prompt = _as_text(prompts[i]) if i < len(prompts) else ""
        completion = _as_text(completions[i]) if i < len(completions) else ""
        head = f"\n\nAgent {i + 1} prompt:\n{prompt}\n\nAgent {i + 1} response:\n"
        pieces += [head, completion]
        length += len(head)
        spans.append((length, length + len(completion)))
        length += len(completion)
    return "".join(pieces), spans


def joint_text(prompts: Sequence, completions: Sequence) -> str:
    """The text the joint reward model reads for one joint sample (CoMLRL's MARLHF text, agents numbered from 1).

    Args:
        prompts: Agent i's prompt at index i (text or a list of messages).
        completions: Agent i's completion at index i; the longer of the two sets the agent count, a missing entry is
            empty.

    >>> print(joint_text(["Write.", "Review."], ["Draft", "OK"]))
    Joint multi-agent response
    <BLANKLINE>
    Agent 1 prompt:
    Write.
    <BLANKLINE>
    Agent 1 response:
    Draft
    <BLANKLINE>
    Agent 2 prompt:
    Review.
    <BLANKLINE>
    Agent 2 response:
    OK
    """
    return joint_text_spans(prompts, completions)[0]


def _hidden_size(config) -> int:
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"Cannot read the hidden size of a {type(config).__name__}: no hidden_size, n_embd or d_model.")


class JointRewardModel(nn.Module):
    """A causal LM with a scalar reward head over one joint text per row.

    Args:
        backbone: A causal LM (`AutoModelForCausalLM`); its last hidden state feeds the head.
        tokenizer: Its tokenizer, for scoring texts (`score`, `__call__`); a missing pad token is set to the end token.
        freeze_backbone: Train the head only (CoMLRL's `reward_freeze_backbone`).
        max_length: Truncate texts to this many tokens (CoMLRL's `reward_max_length`; `None`: the tokenizer's limit),
            on the tokenizer's `truncation_side`.
        pooling: What the head reads, one of `REWARD_POOLINGS` (see the module docstring): `"last"` (CoMLRL's),
            `"mean"`, `"spans"` or `"span_sums"` (per-agent response features, concatenated).
        num_agents: The agent count, required by the span poolings (their head has `num_agents * hidden` inputs).

    The head is built first, with one `nn.Linear(hidden, 1)`, so that under the same torch seed its initial weights
    are CoMLRL's. CoMLRL's own call, `JointRewardModel(backbone, freeze_backbone)` with a bool second, works too.
    A backbone without a hidden size, a tokenizer with neither a padding nor an end token, an unknown pooling or a
    span pooling without `num_agents` (or with a tokenizer that gives no offsets) raises here.

    Example:
        >>> from multiagent_trl.testing import tiny_model_path
        >>> path = tiny_model_path()
        >>> model = JointRewardModel(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path))
        >>> len(model(prompts=[("Hi", "Hi")], completions=[("a", "b")]))
        1
    """

    def __init__(
        self,
        backbone: nn.Module,
        tokenizer: PreTrainedTokenizerBase | None = None,
        freeze_backbone: bool = False,
        max_length: int | None = None,
        pooling: str = "last",
        num_agents: int | None = None,
    ):
        if isinstance(tokenizer, bool):  # CoMLRL's positional order: (backbone, freeze_backbone)
            tokenizer, freeze_backbone = None, tokenizer
        if pooling not in REWARD_POOLINGS:
            raise ValueError(f"pooling must be one of {REWARD_POOLINGS}; got {pooling!r}.")
        if pooling in SPAN_POOLINGS and (num_agents is None or num_agents < 1):
            raise ValueError(
                f"pooling={pooling!r} reads each agent's response: pass num_agents (>= 1), the team's agent count; "
                f"got {num_agents}."
            )
        if pooling in SPAN_POOLINGS and tokenizer is not None and not tokenizer.is_fast:
            raise ValueError(
                f"pooling={pooling!r} finds each response's tokens by their character offsets, which only a fast "
                "tokenizer gives: load the tokenizer with `use_fast=True`, or use pooling='last' or 'mean'."
            )
        super().__init__()
        self.backbone = backbone
        hidden = _hidden_size(getattr(backbone, "config", None))
        self.reward_head = nn.Linear(hidden * (num_agents if pooling in SPAN_POOLINGS else 1), 1)
        weight = next(backbone.parameters())
        self.reward_head.to(device=weight.device, dtype=weight.dtype)
        if freeze_backbone:
            self.backbone.requires_grad_(False)
        if tokenizer is not None and tokenizer.pad_token_id is None:
            if tokenizer.eos_token is None:
                raise ValueError(
                    "The reward model's tokenizer has neither a padding nor an end token, so joint texts cannot be "
                    "batched: set `tokenizer.pad_token` before building the JointRewardModel."
                )
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.pooling = pooling
        self.num_agents = num_agents if pooling in SPAN_POOLINGS else None
        self.__name__ = "joint_reward_model"  # TRL names reward functions by __name__ in its metrics

    # The team trainer binds a module with this flag as a joint reward function (`rewards.joint.bind_reward_funcs`),
    # not as a sequence classifier.
    scores_joint_samples = True

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, span_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`(B,)` scores of `(B, T)` token rows (either padding side), pooled as `pooling` says.

        `span_mask` `(B, N, T)` marks agent i's response tokens (`tokenize` builds it); the span poolings need it.
        """
        return self.score_features(self.features_of_rows(input_ids, attention_mask, span_mask))

    def features_of_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, span_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`(B, F)`: what the head reads from `(B, T)` token rows, the backbone's last hidden states pooled."""
        position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, T): left padding scores as none
        rows = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        decoder = self.backbone.get_decoder() if hasattr(self.backbone, "get_decoder") else None
        if isinstance(decoder, nn.Module) and decoder is not self.backbone:
            # The decoder alone: the same last hidden states, without the LM head's logits over the vocabulary and
            # every layer's states (half the time on the tiny model, far more with a real vocabulary).
            hidden = decoder(**rows).last_hidden_state  # (B, T, H)
        else:
            hidden = self.backbone(**rows, output_hidden_states=True).hidden_states[-1]
        return self.pool(hidden, attention_mask, span_mask)

    def score_features(self, features: torch.Tensor) -> torch.Tensor:
        """`(B,)` scores of `(B, F)` head inputs (`features_of_rows`, `joint_features`)."""
        return self.reward_head(features).squeeze(-1)

    @property
    def frozen_backbone(self) -> bool:
        """Whether only the head trains (`freeze_backbone=True`, or every backbone weight set not to): then a joint
        sample's features never change, and `train_reward_model` computes them once."""
        return not any(parameter.requires_grad for parameter in self.backbone.parameters())

    def pool(
        self, hidden: torch.Tensor, attention_mask: torch.Tensor, span_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The head's input `(B, F)` from the last hidden states `(B, T, H)`, as `pooling` says (F = H, or N * H for
        the span poolings)."""
        if self.pooling == "last":
            positions = torch.arange(attention_mask.shape[1], device=hidden.device).expand_as(attention_mask)  # (B, T)
            last = positions.masked_fill(attention_mask == 0, 0).max(dim=1).values  # (B,)
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)
        if self.pooling == "mean":
            weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
            return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)  # (B, H)
        if span_mask is None or span_mask.shape[1] != self.num_agents:
            raise ValueError(
                f"pooling={self.pooling!r} needs a span_mask of shape (batch, {self.num_agents}, tokens) marking each "
                "agent's response: score joint samples with `score_joint` (or pass `tokenize(...)`'s span_mask)."
            )
        weights = span_mask.to(hidden.dtype)  # (B, N, T)
        pooled = weights @ hidden  # (B, N, H): each agent's response summed
        if self.pooling == "spans":
            pooled = pooled / weights.sum(dim=-1, keepdim=True).clamp(min=1)  # an empty response pools to zeros
        return pooled.flatten(1)  # (B, N * H)

    def tokenize(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]] | None = None
    ) -> dict[str, torch.Tensor]:
        """Token rows for `texts`, padded on the right, truncated at `max_length`, on the model's device.

        With `spans` (each text's `(start, end)` character span per agent, `joint_text_spans`) the rows also get
        `span_mask` `(B, N, T)`: True at the tokens whose characters lie inside agent i's span.
        """
        if self.tokenizer is None:
            raise ValueError("This JointRewardModel has no tokenizer: pass one to score texts.")
        encoded = self.tokenizer(
            list(texts),
            padding=True,
            padding_side="right",
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
            return_offsets_mapping=spans is not None,
        )
        device = self.reward_head.weight.device
        rows = {"input_ids": encoded["input_ids"].to(device), "attention_mask": encoded["attention_mask"].to(device)}
        if spans is not None:
            offsets = encoded["offset_mapping"]  # (B, T, 2): character start and end of each token
            bounds = torch.tensor([list(row) for row in spans], dtype=offsets.dtype).view(len(texts), -1, 1, 2)
            starts, ends = offsets[:, None, :, 0], offsets[:, None, :, 1]  # (B, 1, T)
            inside = (starts >= bounds[..., 0]) & (ends <= bounds[..., 1]) & (ends > starts)  # (B, N, T)
            rows["span_mask"] = (inside & encoded["attention_mask"].bool()[:, None, :]).to(device)
        return rows

    def score(self, texts: Sequence[str]) -> torch.Tensor:
        """`(B,)` scores of joint texts, with gradients when the model trains (the Bradley-Terry step).

        The span poolings need to know where each response lies: use `score_joint` for them."""
        return self(**self.tokenize(texts))

    def score_joint(self, prompts: Sequence[Sequence], completions: Sequence[Sequence]) -> torch.Tensor:
        """`(B,)` scores of B joint samples (`prompts[j]`, `completions[j]`: every agent's), read as `joint_text`,
        with gradients when the model trains. Every pooling works here."""
        return self(**self.joint_rows(prompts, completions))

    def joint_features(self, prompts: Sequence[Sequence], completions: Sequence[Sequence]) -> torch.Tensor:
        """`(B, F)`: what the head reads of B joint samples; `score_features` of them is `score_joint`."""
        return self.features_of_rows(**self.joint_rows(prompts, completions))

    def joint_rows(self, prompts: Sequence[Sequence], completions: Sequence[Sequence]) -> dict[str, torch.Tensor]:
        """The token rows of B joint samples, read as `joint_text` (with each response's `span_mask` for the span
        poolings)."""
        if self.pooling not in SPAN_POOLINGS:
            return self.tokenize([joint_text(p, c) for p, c in zip(prompts, completions)])
        texts, spans = zip(*(joint_text_spans(p, c) for p, c in zip(prompts, completions)))
        if any(len(row) != self.num_agents for row in spans):
            raise ValueError(
                f"This reward model pools {self.num_agents} agents' responses (num_agents), but a joint sample has "
                f"{sorted({len(row) for row in spans})} agents."
            )
        return self.tokenize(texts, spans)

    def __call__(self, *args, prompts: Sequence | None = None, completions: Sequence | None = None, **kwargs):
        """As a module, `forward`; as a reward function (`prompts=`, `completions=` given), the list of scores.

        In the team trainer's convention `prompts[j]` and `completions[j]` hold every agent's prompt and completion of
        joint sample j; the scores are raw, without gradient (CoMLRL's MARLHF rewards).
        """
        if completions is None:
            return super().__call__(*args, **kwargs)
        if prompts is None or len(prompts) != len(completions):
            raise ValueError("A joint reward model needs one tuple of agents' prompts per tuple of completions.")
        with torch.no_grad():
            scores = self.score_joint(prompts, completions)
        return scores.float().tolist()

    def save_pretrained(self, directory: str) -> None:
        """Write the backbone (and tokenizer) with their `save_pretrained`, the head to `reward_head.pt` and, last,
        `joint_reward_model.json`, which lists every file written: `from_pretrained` refuses a folder missing any.

        The files are written to a staging folder beside `directory` and renamed to it once complete, so that an
        interrupted save leaves no folder under the name. An earlier reward model save there is replaced; a folder
        holding anything else is refused (`FileExistsError`), so that nothing of it is lost.
        """
        target = os.path.abspath(directory)
        if os.path.isdir(target) and os.listdir(target) and not self.is_saved(target):
            raise FileExistsError(
                f"Refusing to replace {target}: it is not a saved JointRewardModel (it holds "
                f"{sorted(os.listdir(target))[:5]}). Save the reward model to its own folder."
            )
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        staging = os.path.join(parent, f".{os.path.basename(target)}-{uuid.uuid4().hex[:8]}")  # the umask's mode
        os.makedirs(staging)
        replaced = f"{staging}-replaced"
        try:
            self.backbone.save_pretrained(staging)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(staging)
            state = {k: v.detach().cpu() for k, v in self.reward_head.state_dict().items()}
            torch.save(state, os.path.join(staging, REWARD_HEAD_FILE))
            files = sorted(os.path.relpath(os.path.join(root, name), staging) for root, _, names in os.walk(staging)
                           for name in names)  # fmt: skip
            marker = {
                "files": files,
                "tokenizer": self.tokenizer is not None,
                "pooling": self.pooling,
                "num_agents": self.num_agents,
            }
            with open(os.path.join(staging, REWARD_MODEL_MARKER), "w", encoding="utf-8") as f:
                json.dump(marker, f, indent=2)
            if os.path.isdir(target):  # moved aside, then removed: `target` is never a partial save
                os.rename(target, replaced)
            os.rename(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(replaced, ignore_errors=True)

    @staticmethod
    def is_saved(path: str) -> bool:
        """Whether `path` is a folder written by `save_pretrained` (complete or not): it holds its marker
        `joint_reward_model.json` or, for one saved before the marker, `reward_head.pt`."""
        return os.path.isfile(os.path.join(path, REWARD_MODEL_MARKER)) or os.path.isfile(
            os.path.join(path, REWARD_HEAD_FILE)
        )

    @staticmethod
    def saved_files(path: str) -> list[str]:
        """The files (relative to `path`) a saved reward model needs: those its marker lists, or for a folder saved
        before the marker, the backbone's weights, `reward_head.pt` and `tokenizer_config.json`.

        Raises `FileNotFoundError` when `path` is no saved reward model at all (see `from_causal_lm`)."""
        marker = os.path.join(path, REWARD_MODEL_MARKER)
        if os.path.isfile(marker):
            check_saved_file(marker)
            with open(marker, encoding="utf-8") as f:
                return [REWARD_MODEL_MARKER, *json.load(f)["files"]]
        if os.path.isfile(os.path.join(path, REWARD_HEAD_FILE)):
            return [*model_files(path), REWARD_HEAD_FILE, "tokenizer_config.json"]
        raise FileNotFoundError(
            f"{path} is not a saved JointRewardModel: it has no {REWARD_HEAD_FILE} (nor {REWARD_MODEL_MARKER}); an "
            "interrupted save, or a plain causal LM. For a new head on a causal LM, use "
            "`JointRewardModel.from_causal_lm(path)`."
        )

    @staticmethod
    def saved_pooling(path: str) -> tuple[str, int | None]:
        """The `(pooling, num_agents)` a saved reward model was built with; `("last", None)` for a folder saved
        before they were recorded (its head reads the last token)."""
        marker = os.path.join(path, REWARD_MODEL_MARKER)
        if not os.path.isfile(marker):
            return "last", None
        with open(marker, encoding="utf-8") as f:
            saved = json.load(f)
        return saved.get("pooling", "last"), saved.get("num_agents")

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        freeze_backbone: bool = False,
        max_length: int | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        **model_kwargs,
    ) -> JointRewardModel:
        """Load what `save_pretrained` wrote; `model_kwargs` go to `AutoModelForCausalLM.from_pretrained`.

        Every file the save wrote is checked first (present and readable): a folder missing one, its head or its
        tokenizer included, raises `FileNotFoundError` (or `ValueError` for a damaged file) naming it. A plain causal
        LM is refused too: `from_causal_lm` gives it a new head. `tokenizer` replaces the saved one (required for a
        model saved without one). The pooling and agent count are the saved ones (`saved_pooling`).
        """
        files = cls.saved_files(path)
        check_folder(path, files)
        if tokenizer is None:
            if "tokenizer_config.json" not in files:
                raise FileNotFoundError(
                    f"{path} has no tokenizer_config.json: the reward model was saved without a tokenizer. Pass "
                    "`tokenizer=` to load it."
                )
            tokenizer = AutoTokenizer.from_pretrained(path)
        backbone = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
        pooling, num_agents = cls.saved_pooling(path)
        model = cls(backbone, tokenizer, freeze_backbone, max_length, pooling=pooling, num_agents=num_agents)
        head_file = os.path.join(path, REWARD_HEAD_FILE)
        state = torch.load(head_file, map_location="cpu", weights_only=True)
        expected = {k: tuple(v.shape) for k, v in model.reward_head.state_dict().items()}
        found = {k: tuple(v.shape) for k, v in state.items()}
        if found != expected:
            raise ValueError(
                f"{head_file} holds a reward head of shapes {found}, but the backbone in {path} needs {expected}: "
                "the head was trained on another backbone. Save the reward model's backbone and head together "
                "(`JointRewardModel.save_pretrained`), or start from the plain causal LM for a new head "
                "(`JointRewardModel.from_causal_lm`)."
            )
        model.reward_head.load_state_dict(state)
        return model

    @classmethod
    def from_causal_lm(
        cls,
        path: str,
        freeze_backbone: bool = False,
        max_length: int | None = None,
        pooling: str = "last",
        num_agents: int | None = None,
        **model_kwargs,
    ) -> JointRewardModel:
        """A new reward model on a causal LM (an id or a path) and its tokenizer: a freshly drawn head, as MARLHF
        starts from (CoMLRL's reward model, with `pooling="last"`). `model_kwargs` go to
        `AutoModelForCausalLM.from_pretrained`."""
        backbone = AutoModelForCausalLM.from_pretrained(path, **model_kwargs)
        tokenizer = AutoTokenizer.from_pretrained(path)
        return cls(backbone, tokenizer, freeze_backbone, max_length, pooling=pooling, num_agents=num_agents)


__all__ = [
    "REWARD_HEAD_FILE",
    "REWARD_MODEL_MARKER",
    "REWARD_POOLINGS",
    "JointRewardModel",
    "joint_text",
    "joint_text_spans",
]
