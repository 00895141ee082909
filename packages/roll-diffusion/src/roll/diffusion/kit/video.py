"""The tiny video stack of the Wan family: ``WanTransformer3DModel`` + ``AutoencoderKLWan`` + a tiny
``UMT5EncoderModel`` with the kit's word tokenizer and a ``FlowMatchEulerDiscreteScheduler``, saved as a
``WanPipeline`` folder (4 frames of 16x16). Random weights, not warmed: it proves the video path (sampling with
gradients through the flow-matching steps, frame rewards, frame strips and GIFs), not video quality.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roll.data._cache import build_once, cache_root, recipe_hash

FRAMES = 4
SIZE = 16
_RECIPE = {"frames": FRAMES, "size": SIZE, "v": 1}


def tiny_wan_path() -> Path:
    target = cache_root() / "diffusion" / f"tiny-wan-{recipe_hash(_RECIPE)}"
    return build_once(target, _build)


def build_wan_components(seed: int = 0) -> dict[str, Any]:
    import torch
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from roll.diffusion.kit.tiny import build_tokenizer

    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = UMT5EncoderModel(
            UMT5Config(
                vocab_size=len(tokenizer),
                d_model=32,
                d_kv=16,
                d_ff=64,
                num_layers=1,
                num_heads=2,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        )
        vae = AutoencoderKLWan(
            base_dim=8,
            z_dim=4,
            dim_mult=[1, 2],
            num_res_blocks=1,
            temperal_downsample=[False],
            latents_mean=[0.0] * 4,
            latents_std=[1.0] * 4,
            scale_factor_temporal=1,
            scale_factor_spatial=2,
        )
        transformer = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=2,
            attention_head_dim=8,
            in_channels=4,
            out_channels=4,
            text_dim=32,
            freq_dim=16,
            ffn_dim=32,
            num_layers=1,
            rope_max_seq_len=32,
        )
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    return {
        "tokenizer": tokenizer,
        "text_encoder": text_encoder,
        "vae": vae,
        "transformer": transformer,
        "scheduler": scheduler,
    }


def _build(folder: Path) -> None:
    from diffusers import WanPipeline

    pipe: Any = WanPipeline(**build_wan_components())
    pipe.save_pretrained(folder, safe_serialization=True)
