"""The tiny offline models: built once, cached, loadable like hub models, any text round-trips."""

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from multiagent_trl.testing import tiny_model_path


def test_tiny_model_is_cached_and_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIAGENT_TRL_CACHE", str(tmp_path))
    path = tiny_model_path()
    assert path.startswith(str(tmp_path))
    mtime = (tmp_path / path.split("/")[-1] / "model.safetensors").stat().st_mtime
    assert tiny_model_path() == path  # built once
    assert (tmp_path / path.split("/")[-1] / "model.safetensors").stat().st_mtime == mtime

    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) < 200_000
    text = "Ünïcödé, emoji 🐉 and\ttabs\n"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id


def test_seeds_and_architectures_differ(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIAGENT_TRL_CACHE", str(tmp_path))
    qwen, other_seed, llama = tiny_model_path(), tiny_model_path(seed=1), tiny_model_path("tiny-llama")
    a, b = (AutoModelForCausalLM.from_pretrained(p) for p in (qwen, other_seed))
    assert not (a.lm_head.weight == b.lm_head.weight).all()
    assert AutoModelForCausalLM.from_pretrained(llama).config.model_type == "llama"
    with pytest.raises(ValueError, match="Unknown tiny architecture"):
        tiny_model_path("gpt-huge")


def test_a_launched_process_ends_with_its_output_and_without_teardown():
    """`end_launched_process` keeps what the process printed, exits 0 and runs no teardown (where torch's gloo threads
    can abort or deadlock the interpreter)."""
    import subprocess
    import sys

    script = (
        "import atexit, sys\n"
        "from multiagent_trl.testing import end_launched_process\n"
        "atexit.register(print, 'teardown')\n"
        "print('work', end='')\n"
        "sys.stderr.write('log')\n"
        "end_launched_process()\n"
        "print('after')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.endswith("work") and result.stderr.endswith("log")
    assert "teardown" not in result.stdout and "after" not in result.stdout
