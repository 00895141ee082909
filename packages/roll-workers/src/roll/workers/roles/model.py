"""Loading a role's model and tokenizer from a :class:`~roll.workers.roles.config.ModelConfig`, with errors that
name the role and the config key to change.

Three failures users hit first get their own message instead of a transformers stack trace:

- a local path that does not exist: ``actor_train.model.path: /x does not exist``;
- a hub id that cannot be fetched (no network here, or a typo): ``could not load model 'org/name' for
  actor_train: ... (offline? pass a local path or a preset: tiny-1m, ...)``;
- a tokenizer with more tokens than the model's embedding: both numbers and the key to change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch

from roll.core.errors import ConfigError, DataError
from roll.data.models import is_vision_language, resolve_model_path
from roll.data.tiny import PRESETS
from roll.workers.roles.config import ModelConfig

Head = Literal["causal_lm", "value", "score"]
"""``causal_lm``: ``AutoModelForCausalLM``; ``value``: ``AutoModelForTokenClassification`` (1 label, a value per
token); ``score``: ``AutoModelForSequenceClassification`` (1 label, a scalar per sequence)."""

_DTYPES = {
    "auto": torch.float32,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def resolve_path(reference: str, role: str, key: str) -> str:
    """:func:`resolve_model_path`, with a missing local path reported as ``<role>.<key>: <path> does not exist``."""
    try:
        return resolve_model_path(reference)
    except DataError as err:
        raise ConfigError(f"{role}.{key}: {reference} does not exist ({err})") from err


def load_causal_lm(cfg: ModelConfig, role: str) -> torch.nn.Module:
    """The role's causal LM (``AutoModelForCausalLM``), in ``cfg.dtype``, in eval mode."""
    return load_model(cfg, role, head="causal_lm")


def load_model(cfg: ModelConfig, role: str, head: Head = "causal_lm") -> torch.nn.Module:
    """Load ``cfg.path`` with the given head; see the module docstring for the errors."""
    import transformers

    path = resolve_path(cfg.path, role, "model.path")
    classes = {
        "causal_lm": transformers.AutoModelForCausalLM,
        "value": transformers.AutoModelForTokenClassification,
        "score": transformers.AutoModelForSequenceClassification,
    }
    kwargs: dict[str, Any] = {"dtype": _DTYPES[cfg.dtype], "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation is not None:
        kwargs["attn_implementation"] = cfg.attn_implementation
    if head != "causal_lm":
        kwargs["num_labels"] = 1
    model_class = classes[head]
    if head == "causal_lm" and is_vision_language(path):
        # Qwen2-VL and kin have no AutoModelForCausalLM entry; their image-text class is the causal LM with images
        model_class = transformers.AutoModelForImageTextToText
    torch.manual_seed(cfg.seed)
    # Every process that runs a model flushes denormals: tiny fp32 models on CPU drift into denormal values
    # (small gradients, Adam moments), which made steps several times slower. A process-wide switch, set here
    # because each role loads its model through this function, inside its own Ray actor.
    torch.set_flush_denormal(True)
    try:
        model: torch.nn.Module = model_class.from_pretrained(path, **kwargs)
    except OSError as err:
        raise _unreachable(cfg.path, role, err) from err
    config: Any = model.config
    if head != "causal_lm" and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = getattr(config, "eos_token_id", None)
    return model


def load_tokenizer(cfg: ModelConfig, role: str = "model") -> Any:
    """The tokenizer of ``cfg.tokenizer`` (default ``cfg.path``), via ``AutoTokenizer``."""
    from transformers import AutoTokenizer

    reference = cfg.tokenizer or cfg.path
    key = "model.tokenizer" if cfg.tokenizer else "model.path"
    path = resolve_path(reference, role, key)
    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.trust_remote_code)
    except OSError as err:
        raise _unreachable(reference, role, err) from err


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")
"""Files of a model folder that describe its image/video processing (a VLM's), copied into exports."""


def copy_processor_files(cfg: ModelConfig, target: Path, role: str) -> None:
    """Copy the processor configs of the role's local model folder (if any) into an export folder."""
    import shutil

    source = Path(resolve_path(cfg.path, role, "model.path"))
    for name in PROCESSOR_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)


def check_vocab(tokenizer: Any, model: torch.nn.Module, cfg: ModelConfig, role: str) -> None:
    """Reject a tokenizer that can produce ids the model has no embedding row for.

    ``len(tokenizer) < vocab_size`` is fine (models pad their vocab to a multiple of 64 or 128); the reverse
    gives out-of-range embedding lookups, which on CUDA surface as an opaque device-side assert.
    """
    vocab_size = int(getattr(model.config, "vocab_size", 0) or 0)
    if vocab_size and len(tokenizer) > vocab_size:
        key = f"{role}.model.tokenizer" if cfg.tokenizer else f"{role}.model.path"
        raise ConfigError(
            f"{role}: tokenizer {cfg.tokenizer or cfg.path!r} has {len(tokenizer)} tokens but model "
            f"{cfg.path!r} has config.vocab_size={vocab_size}; ids >= {vocab_size} would index past the embedding. "
            f"Set {key} to the tokenizer the model was trained with"
        )


def _unreachable(reference: str, role: str, err: Exception) -> ConfigError:
    presets = ", ".join(sorted(PRESETS))
    return ConfigError(
        f"could not load model {reference!r} for {role}: {type(err).__name__}: {str(err).splitlines()[0]} "
        f"(offline? pass a local path or a preset: {presets})"
    )


__all__ = ["Head", "check_vocab", "load_causal_lm", "load_model", "load_tokenizer", "resolve_path"]
