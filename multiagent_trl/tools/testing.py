"""A tiny tool-calling model built in code, for the tool tests and the offline tool demo (no download needed).

`tiny_tool_caller_path()` builds a tiny Qwen2 with a byte-level tokenizer and a compact chat template that writes
tool calls in Qwen's format (`<tool_call>{json}</tool_call>`, parsed by TRL's own `qwen3_template` response
template; Qwen2.5's full template makes 900-byte prompts, too slow to train on a CPU in a test). It fine-tunes it for
a few hundred steps on `CONVERSATIONS` (a question, the tool call that answers it, the tool's result, the final
answer), caches it on disk like `multiagent_trl.testing.tiny_model_path`, and returns the folder. Asked one of those
questions with those tools, the model emits the tool call in the template's format, so TRL's real parser and
tool-calling loop run on it.
"""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from trl.chat_template_utils import qwen3_template

from ..testing import byte_level_backend, byte_level_config, cache_dir, is_model_folder, save_model_folder

CAPITALS = {"France": "Paris", "Peru": "Lima", "Japan": "Tokyo"}


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def capital(country: str) -> str:
    """Look up the capital city of a country.

    Args:
        country: The country's English name.
    """
    return CAPITALS.get(country, "unknown")


# (question, tool, arguments): what the model is trained to do. Agent 0 of the tests and demo is the calculator
# (`add`), agent 1 the lookup table (`capital`).
CALCULATOR_QUESTIONS = [("What is 2 plus 3?", {"a": 2, "b": 3}), ("What is 6 plus 1?", {"a": 6, "b": 1})]
LOOKUP_QUESTIONS = [
    ("What is the capital of France?", {"country": "France"}),
    ("What is the capital of Peru?", {"country": "Peru"}),
]
CONVERSATIONS = [(q, add, a) for q, a in CALCULATOR_QUESTIONS] + [(q, capital, a) for q, a in LOOKUP_QUESTIONS]
TRAIN_STEPS = 300
FORMAT_VERSION = "1"  # bump when what is built or trained changes


# Qwen's turn markers and tool-call format, with a one-line tool list instead of Qwen's JSON schemas.
CHAT_TEMPLATE = """{%- if tools %}<|im_start|>system
Tools:{% for tool in tools %} {{ tool.function.name }}({{ tool.function.parameters.properties | list | join(', ') }})\
{% endfor %}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'user' %}<|im_start|>user
{{ message.content }}<|im_end|>
{% elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls or [] %}<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def tool_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer with Qwen's chat markers as single tokens, `CHAT_TEMPLATE`, and TRL's response template
    for Qwen's tool calls (saved with the tokenizer, so `parse_response` finds the tool calls)."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=byte_level_backend(),
        eos_token="<|im_end|>",  # the end of an assistant turn in Qwen's template: generation stops there
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = copy.deepcopy(qwen3_template)
    return tokenizer


def conversation(question: str, tool, arguments: dict) -> list[dict]:
    """The whole exchange the model learns: question, tool call, tool result, answer (the result itself)."""
    result = tool(**arguments)
    call = {"type": "function", "function": {"name": tool.__name__, "arguments": arguments}}
    return [
        {"role": "user", "content": question},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": tool.__name__, "content": str(result)},
        {"role": "assistant", "content": str(result)},
    ]


def _examples(tokenizer) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) of each conversation, rendered with its own tool and with both tools."""
    examples = []
    for question, tool, arguments in CONVERSATIONS:
        messages = conversation(question, tool, arguments)
        for tools in ([tool], [add, capital]):
            prompt = tokenizer.apply_chat_template(messages[:1], tools=tools, add_generation_prompt=True)
            full = tokenizer.apply_chat_template(messages, tools=tools)
            examples.append((full["input_ids"] if isinstance(full, dict) else full, len(_ids(prompt))))
    return [(_ids(ids), n) for ids, n in examples]


def _ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def tiny_tool_caller_path(seed: int = 0, hidden_size: int = 64) -> str:
    """Build, fine-tune (once, about 30 s on a CPU) and return the folder of the tiny tool-calling model.

    Args:
        seed: Seed of the initial weights.
        hidden_size: 64 (head size 16), or 128 (head size 32, which vLLM's CPU build serves: the vLLM tests).

    Returns:
        A folder that `AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained` load.
    """
    width_tag = "" if hidden_size == 64 else f"-h{hidden_size}"
    path = cache_dir() / f"tiny-tool-caller{width_tag}-seed{seed}-v{FORMAT_VERSION}"
    if is_model_folder(path):
        return str(path)
    tokenizer = tool_tokenizer()
    config = byte_level_config(
        tokenizer, hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
    )  # fmt: skip
    examples = _examples(tokenizer)
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), tokenizer.pad_token_id)
    labels = torch.full((len(examples), width), -100)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for k, (ids, prompt_length) in enumerate(examples):
        input_ids[k, : len(ids)] = torch.tensor(ids)
        attention_mask[k, : len(ids)] = 1
        labels[k, prompt_length : len(ids)] = torch.tensor(ids[prompt_length:])  # loss on what the model writes
    with torch.random.fork_rng(devices=[]):  # leave the caller's random state untouched
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        model.train()
        for _ in range(TRAIN_STEPS):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    return save_model_folder(path, model, tokenizer, files={"final_loss.txt": f"{loss.item():.6f}\n"})
