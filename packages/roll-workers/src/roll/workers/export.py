"""One trained role of a checkpoint as a transformers ``save_pretrained`` folder, in this process, without Ray.

A train role's checkpoint files (:mod:`roll.workers.roles.checkpoint`) hold its full weights in
``model.safetensors``: fsdp2 gathers its shards on rank 0 before writing (``full_state_dict``), megatron writes HF
names, so there is nothing left to gather here. Under LoRA the names are peft's (``base_model.model...``,
``lora_A``/``lora_B``), kept unmerged so training resumes with the adapter; the export folds the adapter into
the base weights (:func:`~roll.workers.fsdp2.merge_lora_state_dict`), since a plain
``AutoModelForCausalLM.from_pretrained`` has no adapter to attach.

The model is rebuilt from the role's :class:`~roll.workers.roles.config.ModelConfig` exactly as the role built
it (:func:`~roll.workers.roles.model.load_model`: the same class, head and dtype; a tiny preset is rebuilt
offline), then every weight is replaced by the checkpoint's: a checkpoint key the model lacks, or a model weight
the checkpoint lacks (besides one tied to another), is an error, never a silent partial load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from roll.core.errors import CheckpointError
from roll.data.models import is_vision_language
from roll.workers.roles.checkpoint import MODEL_FILE
from roll.workers.roles.model import Head, copy_processor_files, load_model, load_tokenizer, resolve_path

LOADERS: dict[Head, str] = {
    "causal_lm": "AutoModelForCausalLM",
    "value": "AutoModelForTokenClassification",
    "score": "AutoModelForSequenceClassification",
}
"""The transformers class that loads an export of each head (a VLM's causal LM: ``AutoModelForImageTextToText``)."""


def export_role(model_cfg: Any, strategy_cfg: Any, files: Path, out: Path, *, role: str, head: Head) -> str:
    """Write role ``role``'s weights from checkpoint files ``files`` into ``out`` with its tokenizer (generation
    config and chat template included) and, for a VLM, its processor configs; returns the loader class name."""
    from safetensors.torch import load_file

    model_file = files / MODEL_FILE
    if not model_file.is_file():
        raise CheckpointError(f"no {MODEL_FILE} for role {role} in {files}", path=str(files))
    state = load_file(str(model_file))
    lora = getattr(strategy_cfg, "lora", None)
    if lora is not None:
        from roll.workers.fsdp2 import merge_lora_state_dict

        state = merge_lora_state_dict(state, lora)
    model = load_model(model_cfg, role, head=head)
    _load_all(model, state, files)
    model.save_pretrained(str(out), safe_serialization=True)  # type: ignore[operator]
    load_tokenizer(model_cfg, role).save_pretrained(str(out))
    copy_processor_files(model_cfg, out, role)
    vlm = head == "causal_lm" and is_vision_language(resolve_path(model_cfg.path, role, "model.path"))
    return "AutoModelForImageTextToText" if vlm else LOADERS[head]


def _load_all(model: torch.nn.Module, state: dict[str, torch.Tensor], files: Path) -> None:
    """Every weight from ``state``; a tied weight (``lm_head`` sharing the embedding) may be absent."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = _tied_names(model)
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise CheckpointError(
            f"the weights in {files / MODEL_FILE} do not fit the model its run config names: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'...' if len(unexpected) > 5 else ''}",
            path=str(files),
        )


def _tied_names(model: torch.nn.Module) -> set[str]:
    """Names of parameters that share storage with an earlier one (tied embeddings)."""
    seen: dict[int, str] = {}
    tied: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        ptr = param.data_ptr()
        if ptr in seen:
            tied.add(name)
        seen.setdefault(ptr, name)
    return tied


__all__ = ["LOADERS", "export_role"]
