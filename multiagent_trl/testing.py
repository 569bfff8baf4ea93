"""Tiny causal language models built in code, for tests, CI and the offline demo (no download needed).

`tiny_model_path()` builds a model once, saves it in the standard Hugging Face format (weights, config, generation
config and tokenizer), caches it on disk and returns the folder, which `from_pretrained` loads like any hub model.
The tokenizer is byte-level: every byte is a token, so any text round-trips.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, LlamaConfig, PreTrainedTokenizerFast, Qwen2Config

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
# A minimal chat template, so that conversational datasets work with the tiny models too.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# name: (config class, config kwargs). "tiny" is a Qwen2 like the default `Qwen/Qwen2.5-0.5B`; "tiny-llama" is a
# different architecture and size, for heterogeneous teams.
ARCHITECTURES = {
    "tiny": (
        Qwen2Config,
        dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
    ),
    "tiny-llama": (
        LlamaConfig,
        dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4),
    ),
    # vLLM's CPU attention needs head size >= 32 (hidden_size // num_attention_heads): the vLLM tests' model.
    "tiny-vllm": (
        Qwen2Config,
        dict(
            hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
        ),
    ),
    # Benchmarks: big enough that matrix work (4M) or model memory (270M) dominates Python overhead and baseline.
    "bench-4m": (
        Qwen2Config,
        dict(
            hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4
        ),
    ),
    "bench-270m": (
        Qwen2Config,
        dict(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=24,
            num_attention_heads=16,
            num_key_value_heads=4,
        ),
    ),
}
FORMAT_VERSION = "1"  # bump when what is built changes, so stale caches are not reused


def cache_dir() -> Path:
    """Where tiny models are cached: `$MULTIAGENT_TRL_CACHE`, else `~/.cache/multiagent_trl`."""
    return Path(os.environ.get("MULTIAGENT_TRL_CACHE", Path.home() / ".cache" / "multiagent_trl"))


def byte_level_backend() -> Tokenizer:
    """The tokenizers' model of the tiny tokenizers: one token per byte (256), no merges; special tokens come after."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: index for index, char in enumerate(sorted(alphabet, key=lambda c: ord(c)))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: 256 byte tokens, then an end-of-text and a padding token."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=byte_level_backend(),
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        padding_side="left",
        truncation_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_model_path(architecture: str = "tiny", seed: int = 0) -> str:
    """Build (once) and return the folder of a tiny causal LM with its tokenizer, saved like a hub model.

    Args:
        architecture: `"tiny"` (Qwen2, about 90k parameters), `"tiny-llama"` (Llama, a different size, for
            heterogeneous teams), `"tiny-vllm"` (Qwen2 with head size 32, which vLLM's CPU build serves), or the
            benchmark sizes `"bench-4m"` and `"bench-270m"`.
        seed: Seed of the random initial weights; different seeds give different models.

    Returns:
        The path of a folder that `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load.
    """
    if architecture not in ARCHITECTURES:
        raise ValueError(f"Unknown tiny architecture {architecture!r}; choose one of {sorted(ARCHITECTURES)}.")
    path = cache_dir() / f"{architecture}-seed{seed}-v{FORMAT_VERSION}"
    if is_model_folder(path):
        return str(path)

    tokenizer = tiny_tokenizer()
    config_class, sizes = ARCHITECTURES[architecture]
    config = byte_level_config(tokenizer, config_class, max_position_embeddings=1024, **sizes)
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state untouched
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return save_model_folder(path, model, tokenizer)


def byte_level_config(tokenizer: PreTrainedTokenizerFast, config_class=Qwen2Config, **fields):
    """A causal LM config for a byte-level tokenizer: its vocabulary and special tokens (no BOS), tied embeddings;
    `fields` sets the sizes and anything else."""
    return config_class(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **fields,
    )


def is_model_folder(path: Path) -> bool:
    """Whether `path` holds a model and tokenizer that `save_model_folder` finished writing."""
    return (path / "config.json").exists() and (path / "tokenizer.json").exists()


def save_model_folder(path: Path, model, tokenizer, files: dict[str, str] | None = None) -> str:
    """Save `model` (its generation config given the tokenizer's end and padding tokens), `tokenizer` and `files`
    (name -> text) to `path`, like a hub model, and return it as a string.

    The folder is written under a temporary name and renamed, so a concurrent or interrupted build never leaves a
    half-written model; when another process finished first, its folder is kept.
    """
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name, text in (files or {}).items():
        (tmp / name).write_text(text)
    try:
        tmp.rename(path)
    except OSError:  # another process finished first
        if not (path / "config.json").exists():
            raise
    return str(path)


def end_launched_process() -> NoReturn:
    """End a process of a multi-process test launch (gloo on the CPU) once its work is written, skipping the
    interpreter's teardown, with exit status 0.

    In torch 2.13, a gloo worker thread can still hold tensors when the interpreter tears down: the process then aborts
    ("terminate called without an active exception") or deadlocks on the GIL, after its work is done, whether or not
    the process group was destroyed first (pytorch/pytorch#190489 and #179291; 1 to 2 launches in 10 here)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
