"""Start-up checks of a model reference that read small files only (``config.json``, tokenizer files), never
weights, and build no tiny preset: ``roll validate`` and ``roll train`` (before Ray starts) run them from the
pipelines' pre-flight hooks.

A reference is a tiny preset, a local ``save_pretrained`` folder, or a hub id. A hub id is never fetched to check
it: what it holds is known only when the local Hugging Face cache has its files, else the answer is ``None``
(unknown) and the run itself finds out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from roll.core.errors import ConfigIssue
from roll.data.models import missing_model_path
from roll.data.tiny import is_preset
from roll.data.tiny_vl import is_vl_preset

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def model_path_issues(ref: str, *, where: str, tokenizer_only: bool = False) -> list[ConfigIssue]:
    """A missing local path, a folder that is no ``save_pretrained`` folder (no ``config.json``), or one without
    tokenizer files when ``tokenizer_only``; ``where`` is the key path of ``ref`` (``actor_train.model.path``)."""
    problem = missing_model_path(ref)
    if problem is not None:
        return [ConfigIssue(where, problem, "fix the path, or train the model that writes it first")]
    folder = Path(ref).expanduser()
    if not folder.is_dir():
        return []
    if tokenizer_only:
        if not any((folder / name).is_file() for name in TOKENIZER_FILES):
            message = f"{ref!r} holds no tokenizer files ({', '.join(TOKENIZER_FILES)})"
            return [ConfigIssue(where, message, "point it at a folder saved with tokenizer.save_pretrained")]
        return []
    if not (folder / "config.json").is_file():
        message = f"{ref!r} is a folder without config.json, so it is not a save_pretrained model folder"
        return [ConfigIssue(where, message, "point it at the folder model.save_pretrained wrote")]
    return []


def has_chat_template(ref: str) -> bool | None:
    """Whether the tokenizer at ``ref`` has a chat template; ``None`` when that cannot be read here (a hub id
    that is not in the local cache). Presets always have one (the offline tokenizer's)."""
    if is_preset(ref) or is_vl_preset(ref):
        return True
    folder = _local_files(ref, "tokenizer_config.json")
    if folder is None:
        return None
    if any((folder / name).is_file() for name in ("chat_template.jinja", "chat_template.json")):
        return True
    config = _read_json(folder / "tokenizer_config.json")
    return bool(config.get("chat_template")) if config is not None else None


def is_vision_language_files(ref: str) -> bool | None:
    """Whether ``ref``'s ``config.json`` has a ``vision_config`` (a VLM); ``None`` when it cannot be read here."""
    if is_vl_preset(ref):
        return True
    if is_preset(ref):
        return False
    folder = _local_files(ref, "config.json")
    config = _read_json(folder / "config.json") if folder is not None else None
    return "vision_config" in config if config is not None else None


def _local_files(ref: str, name: str) -> Path | None:
    """The folder that holds ``ref``'s file ``name``: the local folder, or the hub cache's snapshot of a hub id."""
    folder = Path(ref).expanduser()
    if folder.is_dir():
        return folder
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(ref, name)
    except Exception:  # not a valid repo id, or no cache: unknown, the run finds out
        return None
    return Path(cached).parent if isinstance(cached, str) else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
