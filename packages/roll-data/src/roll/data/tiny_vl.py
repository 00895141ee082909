"""Tiny vision-language models for offline runs: ``tiny-vl-*`` presets of transformers' Qwen2-VL, cached as HF
folders like the text presets of :mod:`roll.data.tiny`.

A preset is a ``Qwen2VLConfig`` (a small vision tower: patch 8, spatial merge 2, so a 32 x 32 image is 4 tokens;
and a small Qwen2 text model with 3-D rotary sections), the offline tokenizer ``roll-tiny-vl`` (roll-tiny's
ChatML plus Qwen2-VL's vision tokens as specials) and a Qwen2-VL image processor built here (PIL backend, no
torchvision). The folder holds what a real Qwen2-VL folder holds, so ``AutoProcessor`` /
``AutoModelForImageTextToText.from_pretrained(folder)`` load it, and a real VLM folder or hub id runs through
the same code.

Parameter counts (asserted in tests): tiny-vl-1m 1.1M, tiny-vl-10m 8.2M.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from roll.core.config.base import RollModel
from roll.data._presets import cached_model_folder, lookup, seeded_model

if TYPE_CHECKING:
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration


class TinyVLPreset(RollModel):
    """The shape of a tiny Qwen2-VL (text model and vision tower); vocab is the offline tokenizer's."""

    hidden_size: int = Field(gt=0)
    num_hidden_layers: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    vision_depth: int = Field(gt=0)
    vision_embed_dim: int = Field(gt=0)
    vision_num_heads: int = Field(gt=0)
    patch_size: int = 8
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 16 * 16
    max_pixels: int = 128 * 128
    rope_theta: float = 10000.0
    tokenizer: str = "roll-tiny-vl"


VL_PRESETS: dict[str, TinyVLPreset] = {
    "tiny-vl-1m": TinyVLPreset(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
        vision_depth=2,
        vision_embed_dim=64,
        vision_num_heads=4,
    ),
    "tiny-vl-10m": TinyVLPreset(
        hidden_size=256,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=768,
        vision_depth=4,
        vision_embed_dim=128,
        vision_num_heads=4,
    ),
}

_MODEL_RECIPE_VERSION = 1


def get_vl_preset(preset: str | TinyVLPreset) -> TinyVLPreset:
    """The preset named ``preset`` (or ``preset`` itself); unknown names list the known ones."""
    return lookup(VL_PRESETS, preset, "tiny VLM")


def is_vl_preset(name: str) -> bool:
    return name in VL_PRESETS


def mrope_section(head_dim: int) -> list[int]:
    """Rotary frequencies per axis (temporal, height, width): a quarter for time, the rest split in two; they
    sum to ``head_dim // 2`` as Qwen2-VL requires (Qwen2-VL-7B's 128 gives [16, 24, 24])."""
    half = head_dim // 2
    t = half // 4
    rest = half - t
    return [t, rest // 2, rest - rest // 2]


def qwen2_vl_config(preset: str | TinyVLPreset) -> Qwen2VLConfig:
    """The ``Qwen2VLConfig`` of a preset, with the vocab and special-token ids of its offline tokenizer."""
    from transformers import Qwen2VLConfig

    from roll.data.tokenizer import build_tokenizer
    from roll.data.vision import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START

    spec = get_vl_preset(preset)
    tok = build_tokenizer(spec.tokenizer)
    ids = {t: int(tok.convert_tokens_to_ids(t)) for t in (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)}  # type: ignore[arg-type]
    specials = {
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }
    head_dim = spec.hidden_size // spec.num_attention_heads
    text = {
        "vocab_size": len(tok),
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "intermediate_size": spec.intermediate_size,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": spec.rope_theta,
            "mrope_section": mrope_section(head_dim),
        },
        "tie_word_embeddings": True,
        **specials,
    }
    vision = {
        "depth": spec.vision_depth,
        "embed_dim": spec.vision_embed_dim,
        "hidden_size": spec.hidden_size,
        "num_heads": spec.vision_num_heads,
        "patch_size": spec.patch_size,
        "spatial_merge_size": spec.spatial_merge_size,
        "temporal_patch_size": spec.temporal_patch_size,
    }
    return Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids[IMAGE_PAD],
        video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True,
        **specials,
    )


def build_tiny_vl_model(preset: str | TinyVLPreset, seed: int = 0) -> Qwen2VLForConditionalGeneration:
    """A randomly initialised fp32 ``Qwen2VLForConditionalGeneration``; equal ``(preset, seed)``, equal weights."""
    from transformers import Qwen2VLForConditionalGeneration

    config = qwen2_vl_config(preset)
    factory = lambda: Qwen2VLForConditionalGeneration(config)  # noqa: E731
    return seeded_model(factory, seed, config.text_config)  # type: ignore[no-any-return]


def build_image_processor(preset: str | TinyVLPreset) -> Any:
    """The preset's Qwen2-VL image processor (PIL backend: needs no torchvision)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    spec = get_vl_preset(preset)
    return Qwen2VLImageProcessorPil(
        patch_size=spec.patch_size,
        merge_size=spec.spatial_merge_size,
        temporal_patch_size=spec.temporal_patch_size,
        min_pixels=spec.min_pixels,
        max_pixels=spec.max_pixels,
    )


def tiny_vl_model_path(preset: str | TinyVLPreset, seed: int = 0) -> Path:
    """The cached HF folder of ``preset`` (built on first use, atomically; parallel callers wait for one)."""
    spec = get_vl_preset(preset)
    label = preset if isinstance(preset, str) else "tiny-vl-custom"
    return cached_model_folder(
        label, spec, spec.tokenizer, seed, _MODEL_RECIPE_VERSION, lambda tmp: _save(spec, seed, tmp)
    )


def _save(spec: TinyVLPreset, seed: int, folder: Path) -> None:
    from roll.data.tokenizer import save_tokenizer_into

    build_tiny_vl_model(spec, seed).save_pretrained(folder, safe_serialization=True)
    build_image_processor(spec).save_pretrained(folder)
    save_tokenizer_into(folder, spec.tokenizer)
