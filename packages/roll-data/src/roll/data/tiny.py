"""Tiny Qwen2 models for offline runs: named presets, deterministic random init, a cached HF model folder.

``model: tiny-10m`` in a config works like a hub id: :func:`roll.data.models.resolve_model_path` maps the preset
to a folder built once under ``<cache>/models/`` (safetensors weights, ``config.json`` with ``model_type: qwen2``,
the offline tokenizer's files and a ``generation_config.json``), so the real loading code
(``AutoModelForCausalLM`` / ``AutoTokenizer.from_pretrained(path)``) runs unchanged. Hub ids and local paths pass
through.

Importing this module imports neither torch nor transformers (configs and ``roll list`` stay fast); functions
that need them import them when called.

Parameter counts (vocab 512, tied embeddings; asserted in tests): tiny-1m 0.85M, tiny-10m 9.5M, tiny-50m 48.5M.
Measured on the reference 2-core CPU (design.md §5): ~10k, ~2k and ~550 training tokens/s respectively.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from roll.core.config.base import RollModel
from roll.data._presets import cached_model_folder, lookup, seeded_model

if TYPE_CHECKING:
    from transformers import Qwen2Config, Qwen2ForCausalLM


class TinyPreset(RollModel):
    """The shape of a tiny Qwen2. ``vocab_size`` is not here: it is always the offline tokenizer's."""

    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    tokenizer: str = "roll-tiny"


PRESETS: dict[str, TinyPreset] = {
    "tiny-1m": TinyPreset(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
    ),
    # tiny-1m's shape with the thinking kit's tokenizer (Qwen3-like template that drops past reasoning).
    "tiny-think-1m": TinyPreset(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        tokenizer="roll-tiny-think",
    ),
    "tiny-10m": TinyPreset(
        hidden_size=320,
        num_hidden_layers=8,
        num_attention_heads=5,
        num_key_value_heads=1,
        intermediate_size=960,
    ),
    "tiny-50m": TinyPreset(
        hidden_size=512,
        num_hidden_layers=16,
        num_attention_heads=8,
        num_key_value_heads=2,
        intermediate_size=1536,
    ),
}

# Bump when the folder layout or init changes, so old cached folders are not reused.
_MODEL_RECIPE_VERSION = 1


def get_preset(preset: str | TinyPreset) -> TinyPreset:
    """The preset named ``preset`` (or ``preset`` itself); unknown names list the known ones."""
    return lookup(PRESETS, preset, "tiny model")


def is_preset(name: str) -> bool:
    """Whether ``name`` is a tiny-model preset name."""
    return name in PRESETS


def qwen2_config(preset: str | TinyPreset) -> Qwen2Config:
    """The ``Qwen2Config`` of a preset, with vocab and special-token ids of its offline tokenizer."""
    from transformers import Qwen2Config

    from roll.data.tokenizer import build_tokenizer

    spec = get_preset(preset)
    tok = build_tokenizer(spec.tokenizer)
    return Qwen2Config(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        intermediate_size=spec.intermediate_size,
        max_position_embeddings=spec.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )


def build_tiny_model(preset: str | TinyPreset, seed: int = 0) -> Qwen2ForCausalLM:
    """A randomly initialised fp32 ``Qwen2ForCausalLM``; equal ``(preset, seed)`` give equal parameters.

    Seeds a forked RNG, so the caller's global torch random state is left as it was.
    """
    from transformers import Qwen2ForCausalLM

    config = qwen2_config(preset)
    return seeded_model(lambda: Qwen2ForCausalLM(config), seed, config)  # type: ignore[no-any-return]


def tiny_model_path(preset: str | TinyPreset, seed: int = 0) -> Path:
    """The cached HF folder of ``preset`` (built on first use, atomically; parallel callers wait for one)."""
    spec = get_preset(preset)
    label = preset if isinstance(preset, str) else "tiny-custom"
    return cached_model_folder(
        label, spec, spec.tokenizer, seed, _MODEL_RECIPE_VERSION, lambda tmp: _save_model(spec, seed, tmp)
    )


def _save_model(spec: TinyPreset, seed: int, folder: Path) -> None:
    from roll.data.tokenizer import save_tokenizer_into

    build_tiny_model(spec, seed).save_pretrained(folder, safe_serialization=True)
    save_tokenizer_into(folder, spec.tokenizer)
