"""What the tiny text and vision-language kits share: a named preset table and a cached, seeded model folder.

:mod:`roll.data.tiny` (Qwen2) and :mod:`roll.data.tiny_vl` (Qwen2-VL) each keep their own preset model and table
and their public names (``get_preset`` / ``get_vl_preset``, ``tiny_model_path`` / ``tiny_vl_model_path``); the
lookup, the folder recipe, the seeded init and the generation config's special ids are written once here.
Importing this module imports neither torch nor transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from roll.core.config.base import RollModel
from roll.core.errors import DataError
from roll.data._cache import build_once, cache_root, recipe_hash

P = TypeVar("P", bound=RollModel)


def lookup(table: Mapping[str, P], preset: str | P, kind: str) -> P:
    """``table[preset]`` (or ``preset`` itself when it is already a preset); unknown names list the known ones."""
    if not isinstance(preset, str):
        return preset
    if preset not in table:
        raise DataError(f"unknown {kind} preset {preset!r}; known presets: {', '.join(sorted(table))}")
    return table[preset]


def cached_model_folder(
    label: str, spec: RollModel, tokenizer: str, seed: int, version: int, save: Callable[[Path], None]
) -> Path:
    """``<cache>/models/<label>-seed<seed>-<hash>``, built once by ``save(tmp_dir)``; the hash covers the preset,
    the seed, the folder of the offline ``tokenizer`` and the recipe ``version``, so a changed recipe never reads
    an old folder."""
    from roll.data.tokenizer import ensure_tokenizer_files

    tokenizer_dir = ensure_tokenizer_files(tokenizer)
    recipe = {"preset": spec.model_dump(), "seed": seed, "tokenizer": tokenizer_dir.name, "v": version}
    return build_once(cache_root() / "models" / f"{label}-seed{seed}-{recipe_hash(recipe)}", save)


def seeded_model(factory: Callable[[], Any], seed: int, special_ids: Any) -> Any:
    """``factory()`` under ``torch.manual_seed(seed)`` in a forked RNG (the caller's random state is left as it
    was), in eval mode as ``from_pretrained`` returns it, its generation config given the special ids (pad, eos,
    bos) of ``special_ids`` (a config)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = factory()
    gen = model.generation_config
    gen.pad_token_id, gen.eos_token_id, gen.bos_token_id = (
        special_ids.pad_token_id,
        special_ids.eos_token_id,
        special_ids.bos_token_id,
    )
    model.eval()
    return model
