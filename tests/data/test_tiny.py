"""Tiny Qwen2 presets: sizes, deterministic init, and a cached folder the ordinary HF loaders open."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from roll.core.errors import DataError
from roll.data.models import resolve_model_path
from roll.data.tiny import (
    PRESETS,
    TinyPreset,
    build_tiny_model,
    get_preset,
    tiny_model_path,
)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("roll-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLL_CACHE_DIR", str(root))
        yield root


@pytest.fixture(scope="module")
def tiny_1m_path(cache_dir: Path) -> Path:
    return tiny_model_path("tiny-1m")


def _n_params(model) -> int:  # type: ignore[no-untyped-def]
    return sum(p.numel() for p in model.parameters())


def test_import_is_light() -> None:
    code = "import sys, roll.data.tiny, roll.data.models; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize(
    ("preset", "low", "high"),
    [("tiny-1m", 0.7e6, 1.3e6), ("tiny-10m", 8e6, 12e6), ("tiny-50m", 40e6, 60e6)],
)
def test_parameter_counts(cache_dir: Path, preset: str, low: float, high: float) -> None:
    model = build_tiny_model(preset)
    assert low <= _n_params(model) <= high
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_init_is_deterministic_and_leaves_global_rng_alone(cache_dir: Path) -> None:
    import torch

    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    a, b, c = build_tiny_model("tiny-1m"), build_tiny_model("tiny-1m"), build_tiny_model("tiny-1m", seed=1)
    torch.testing.assert_close(torch.rand(3), expected_next)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_cached_folder_loads_with_auto_classes(tiny_1m_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.tokenizer import build_tokenizer

    names = {p.name for p in tiny_1m_path.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    model = AutoModelForCausalLM.from_pretrained(tiny_1m_path)
    for pa, pb in zip(model.parameters(), build_tiny_model("tiny-1m").parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0)
    tok, ours = AutoTokenizer.from_pretrained(tiny_1m_path), build_tokenizer()
    assert tok("What is 12+34?")["input_ids"] == ours("What is 12+34?")["input_ids"]
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.config.vocab_size == len(tok)


def test_forward_and_generate(tiny_1m_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, BatchEncoding

    model = AutoModelForCausalLM.from_pretrained(tiny_1m_path)
    tok = AutoTokenizer.from_pretrained(tiny_1m_path)
    chat = [{"role": "user", "content": "What is 2+3?"}]
    inputs = tok.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    assert isinstance(inputs, BatchEncoding)
    with torch.no_grad():
        logits_BTV = model(**inputs).logits
    assert logits_BTV.shape == (1, inputs["input_ids"].shape[1], len(tok))
    assert torch.isfinite(logits_BTV).all()
    out = model.generate(**inputs, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 5


def test_cached_folder_is_built_once(tiny_1m_path: Path) -> None:
    stamp = (tiny_1m_path / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert tiny_model_path("tiny-1m") == tiny_1m_path
    assert time.perf_counter() - start < 10  # generous: the unchanged mtime below is what shows no rebuild
    assert (tiny_1m_path / "model.safetensors").stat().st_mtime_ns == stamp
    assert tiny_model_path("tiny-1m", seed=1) != tiny_1m_path


def test_resolve_model_path(tiny_1m_path: Path, tmp_path: Path) -> None:
    assert resolve_model_path("tiny-1m") == str(tiny_1m_path)
    assert resolve_model_path(str(tmp_path)) == str(tmp_path)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert resolve_model_path("gpt2") == "gpt2"
    for missing in (str(tmp_path / "nope"), "./nope", "~/nope-roll-test", "a/b/c"):
        with pytest.raises(DataError, match="does not exist") as info:
            resolve_model_path(missing)
        assert missing in str(info.value)


def test_presets() -> None:
    assert set(PRESETS) == {"tiny-1m", "tiny-think-1m", "tiny-10m", "tiny-50m"}
    with pytest.raises(DataError, match="known presets: tiny-10m, tiny-1m, tiny-50m, tiny-think-1m"):
        get_preset("tiny-7b")
    custom = TinyPreset(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
    )
    assert get_preset(custom) is custom
    with pytest.raises(ValueError):
        TinyPreset(
            hidden_size=0,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            intermediate_size=1,
        )
