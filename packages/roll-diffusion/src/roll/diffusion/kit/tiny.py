"""The tiny text-to-image stack, built from configs and warmed on rendered captioned shapes.

:func:`tiny_sd_path` returns a cached diffusers folder (``StableDiffusionPipeline`` layout: ``unet``, ``vae``,
``text_encoder``, ``tokenizer``, ``scheduler``, ``model_index.json``) plus ``roll_scorer/`` (the colour/shape
scorer of :mod:`.scorer`). Built once per recipe under ``<cache>/diffusion/``, atomically (``roll.data``'s cache).

The warm-up, in order (fixed seeds, about 30 s on 2 cores): the VAE learns to reconstruct 16x16 shapes
(``AutoencoderKL``, 16x16 images, latents 4x8x8); its latent scale is set to ``1 / std``; the UNet and the text encoder learn
eps-prediction on those latents with 10% empty captions (so classifier-free guidance has an unconditional
branch); the scorer learns the three labels. Short on purpose: the warmed model draws roughly the right colours
but often the wrong shape, which is what reward fine-tuning then improves.

Importing this module imports neither torch nor diffusers; the functions do.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from roll.data._cache import build_once, cache_root, recipe_hash
from roll.diffusion.kit import shapes

logger = logging.getLogger(__name__)

IMAGE_SIZE = 16
MAX_TOKENS = 8
SCORER_DIR = "roll_scorer"
WARMUP = {"vae_steps": 150, "unet_steps": 200, "scorer_steps": 500, "batch": 32, "seed": 0}
_RECIPE_VERSION = 1


def tiny_sd_path() -> Path:
    """The cached, warmed tiny stack (built on first use; parallel callers wait for one builder)."""
    recipe = {"warmup": WARMUP, "v": _RECIPE_VERSION, "size": IMAGE_SIZE}
    target = cache_root() / "diffusion" / f"tiny-sd-{recipe_hash(recipe)}"
    return build_once(target, _build)


def build_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over the kit's words: ``<s> words </s>``, padded to 8."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate([*specials, *shapes.WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=MAX_TOKENS,
        padding_side="right",
    )


def build_components(seed: int = 0) -> dict[str, Any]:
    """Randomly initialised ``unet``, ``vae``, ``text_encoder``, ``tokenizer`` and ``scheduler``."""
    import torch
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    tokenizer = build_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        text_encoder = CLIPTextModel(
            CLIPTextConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=MAX_TOKENS,
                pad_token_id=tokenizer.pad_token_id,
                bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        )
        vae = AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
            up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
            block_out_channels=(8, 16),
            layers_per_block=1,
            latent_channels=4,
            norm_num_groups=4,
            mid_block_add_attention=False,
            sample_size=IMAGE_SIZE,
        )
        unet = UNet2DConditionModel(
            sample_size=IMAGE_SIZE // 2,
            in_channels=4,
            out_channels=4,
            down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
            block_out_channels=(32, 64),
            layers_per_block=1,
            cross_attention_dim=32,
            attention_head_dim=8,
            norm_num_groups=8,
        )
    scheduler = DDIMScheduler(
        num_train_timesteps=1000,
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
    )
    return {
        "unet": unet,
        "vae": vae,
        "text_encoder": text_encoder,
        "tokenizer": tokenizer,
        "scheduler": scheduler,
    }


def shapes_dataset(per_caption: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """Every caption rendered ``per_caption`` times: captions and ``[N, 3, H, W]`` float images in [-1, 1]."""
    captions, images = [], []
    for i, text in enumerate(shapes.all_captions()):
        for j in range(per_caption):
            captions.append(text)
            images.append(shapes.render(text, seed=seed * 100_000 + i * 1000 + j, size=IMAGE_SIZE))
    pixels = np.stack(images).astype(np.float32).transpose(0, 3, 1, 2) / 127.5 - 1.0
    return captions, pixels


def encode_prompts(tokenizer: Any, text_encoder: Any, prompts: list[str]) -> Any:
    """``[B, T, D]`` text-encoder hidden states, tokenized as ``StableDiffusionPipeline`` does."""
    ids = tokenizer(
        prompts,
        padding="max_length",
        max_length=tokenizer.model_max_length,
        truncation=True,
        return_tensors="pt",
    ).input_ids
    return text_encoder(ids.to(text_encoder.device))[0]


def _build(folder: Path) -> None:
    import torch

    start = time.perf_counter()
    torch.set_flush_denormal(True)  # denormals made CPU steps several times slower
    threads = torch.get_num_threads()
    # One thread: these ops are too small to split, and on a loaded box two spinning OpenMP threads waiting
    # for each other made a VAE step 15x slower (7 s against 0.5 s, measured).
    torch.set_num_threads(1)
    try:
        _warm_all(folder)
    finally:
        torch.set_num_threads(threads)
    logger.info("tiny-sd warmed in %.1f s into %s", time.perf_counter() - start, folder)


def _warm_all(folder: Path) -> None:
    import torch
    from diffusers import StableDiffusionPipeline

    from roll.diffusion.kit.scorer import train_scorer

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WARMUP["seed"])
        parts = build_components(WARMUP["seed"])
        captions, pixels = shapes_dataset(per_caption=8, seed=WARMUP["seed"])
        images = torch.from_numpy(pixels)
        _warm_vae(parts["vae"], images)
        _warm_denoiser(parts, captions, images)
        scorer = train_scorer(captions, images, steps=WARMUP["scorer_steps"])
    pipe: Any = StableDiffusionPipeline(
        **parts, safety_checker=None, feature_extractor=None, requires_safety_checker=False
    )
    pipe.save_pretrained(folder, safe_serialization=True)
    scorer.save(folder / SCORER_DIR)


def _batches(n: int, steps: int, batch: int) -> list[Any]:
    import torch

    gen = torch.Generator().manual_seed(WARMUP["seed"])
    return [torch.randint(0, n, (batch,), generator=gen) for _ in range(steps)]


def _warm_vae(vae: Any, images_NCHW: Any) -> None:
    """Reconstruction (MSE) plus a small KL; then ``scaling_factor = 1 / std(latent means)``."""
    import torch

    opt = torch.optim.AdamW(vae.parameters(), lr=2e-3)
    vae.train()
    for idx in _batches(len(images_NCHW), WARMUP["vae_steps"], WARMUP["batch"]):
        x = images_NCHW[idx]
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        loss = torch.nn.functional.mse_loss(recon, x) + 1e-6 * posterior.kl().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    logger.info("tiny-sd VAE warm-up: %d steps", WARMUP["vae_steps"])
    vae.eval()
    vae.requires_grad_(False)
    with torch.no_grad():
        std = vae.encode(images_NCHW[:256]).latent_dist.mean.std()
    vae.register_to_config(scaling_factor=float(1.0 / std))
    logger.info(
        "tiny-sd VAE: reconstruction MSE %.4f, latent scale %.3f", float(loss.detach()), float(1 / std)
    )


def _warm_denoiser(parts: dict[str, Any], captions: list[str], images_NCHW: Any) -> None:
    """eps-prediction on scaled VAE latents; text encoder trained along; 10% of captions dropped to ''."""
    import torch

    unet, vae, text_encoder = parts["unet"], parts["vae"], parts["text_encoder"]
    scheduler = parts["scheduler"]
    with torch.no_grad():
        latents = vae.encode(images_NCHW).latent_dist.mean * vae.config.scaling_factor
    params = [*unet.parameters(), *text_encoder.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-3)
    gen = torch.Generator().manual_seed(WARMUP["seed"] + 1)
    unet.train()
    text_encoder.train()
    for idx in _batches(len(latents), WARMUP["unet_steps"], WARMUP["batch"]):
        x0 = latents[idx]
        prompts = [captions[i] for i in idx.tolist()]
        drop = torch.rand(len(prompts), generator=gen) < 0.1
        prompts = ["" if d else p for p, d in zip(prompts, drop.tolist())]
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.randint(0, scheduler.config.num_train_timesteps, (len(x0),), generator=gen)
        noisy = scheduler.add_noise(x0, noise, t)
        eps = unet(
            noisy, t, encoder_hidden_states=encode_prompts(parts["tokenizer"], text_encoder, prompts)
        ).sample
        loss = torch.nn.functional.mse_loss(eps, noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
    unet.eval()
    text_encoder.eval()
    logger.info("tiny-sd denoiser: final eps MSE %.4f", float(loss.detach()))
