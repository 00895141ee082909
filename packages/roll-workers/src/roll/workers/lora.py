"""LoRA adapters on the wire: the trainer sends ``A`` and ``B`` only; inference workers apply them.

A LoRA policy is ``W + B @ A * alpha / r`` on each adapted module, with ``W`` frozen. A model update of such a
policy therefore sends the adapter alone (``r * (in + out)`` numbers per module instead of ``in * out``) plus its
:class:`~roll.workers.config.LoraConfig`, and each inference backend applies it its own way:

- **hf** (:class:`AdapterMerger`): merges into its dense weights, from a pristine copy of each adapted base weight
  kept at the first update, so the next update replaces the previous adapter instead of adding to it.
- **vllm**: writes a peft folder (:func:`write_peft_adapter`) and serves it through a ``LoRARequest``.

Wire names: the base model's module name plus ``.lora_A.weight`` (``[r, in]``) or ``.lora_B.weight``
(``[out, r]``), e.g. ``model.layers.0.self_attn.q_proj.lora_A.weight``. :func:`merge_weight` is the one merge
formula, used by the trainer's merged state dict and by the hf merger alike, so both give the same bits.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from roll.core.errors import WorkerError
from roll.workers.config import LoraConfig

__all__ = [
    "LORA_A",
    "LORA_B",
    "AdapterMerger",
    "adapter_modules",
    "merge_weight",
    "wire_name",
    "write_peft_adapter",
]

LORA_A = ".lora_A.weight"
LORA_B = ".lora_B.weight"
_PEFT_PREFIX = "base_model.model."


def merge_weight(W: torch.Tensor, A: torch.Tensor, B: torch.Tensor, scaling: float) -> torch.Tensor:
    """``W + B @ A * scaling`` in float32, cast back to ``W``'s dtype (a new tensor; ``W`` is not touched)."""
    return W + (B.float() @ A.float() * scaling).to(device=W.device, dtype=W.dtype)


def wire_name(peft_name: str) -> str | None:
    """The wire name of a peft LoRA parameter (``None`` for any other parameter).

    ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight`` ->
    ``model.layers.0.self_attn.q_proj.lora_A.weight``.
    """
    for part in (".lora_A.", ".lora_B."):
        if part in peft_name and peft_name.endswith(".weight"):
            module = peft_name.split(part)[0].removeprefix(_PEFT_PREFIX)
            return module + (LORA_A if part == ".lora_A." else LORA_B)
    return None


def adapter_modules(names: Iterable[str]) -> list[str]:
    """The module names of a set of wire names, sorted; each must come with both its ``A`` and its ``B``."""
    a = {n.removesuffix(LORA_A) for n in names if n.endswith(LORA_A)}
    b = {n.removesuffix(LORA_B) for n in names if n.endswith(LORA_B)}
    other = [n for n in names if not n.endswith((LORA_A, LORA_B))]
    if other or a != b:
        raise WorkerError(
            f"a LoRA update must hold lora_A and lora_B of each module and nothing else; unpaired: "
            f"{sorted(a ^ b)[:5]}, not LoRA: {other[:5]}"
        )
    return sorted(a)


class AdapterMerger:
    """Applies LoRA updates to a plain (un-wrapped) model's dense weights, never twice.

    The first update of a module keeps a copy of its base weight; every update writes ``base + B A s`` from that
    copy. :meth:`forget` drops copies when full weights overwrite a module (they are the new base).
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._base: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def apply(self, named: Mapping[str, torch.Tensor], config: LoraConfig) -> int:
        """Merge the adapter ``named`` (wire names) with ``config``'s scaling; returns the modules updated."""
        params = dict(self.model.named_parameters())
        modules = adapter_modules(list(named))
        missing = [m for m in modules if f"{m}.weight" not in params]
        if missing:
            raise WorkerError(f"LoRA update names modules this model lacks, e.g. {missing[:5]}")
        scaling = config.alpha / config.r
        for module in modules:
            weight = params[f"{module}.weight"]
            base = self._base.setdefault(module, weight.detach().clone())
            weight.copy_(merge_weight(base, named[module + LORA_A], named[module + LORA_B], scaling))
        return len(modules)

    def to(self, device: str | torch.device) -> None:
        """Move the pristine copies with the model (offload / reload)."""
        self._base = {name: t.to(device) for name, t in self._base.items()}

    def forget(self, weight_names: Iterable[str]) -> None:
        """Full weights were loaded under ``weight_names``: their modules' pristine copies are stale now."""
        for name in weight_names:
            self._base.pop(name.removesuffix(".weight"), None)


def write_peft_adapter(
    path: str | Path, named: Mapping[str, torch.Tensor], config: LoraConfig, base_model: str
) -> Path:
    """Save the adapter ``named`` (wire names) as a peft folder (``adapter_config.json`` plus
    ``adapter_model.safetensors``) that peft and vLLM load; returns the folder."""
    from safetensors.torch import save_file

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    modules = adapter_modules(list(named))
    tensors = {_PEFT_PREFIX + n: t.detach().cpu().contiguous() for n, t in named.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    peft_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": config.r,
        "lora_alpha": config.alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted({m.rsplit(".", 1)[-1] for m in modules}),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(peft_config, indent=2))
    return folder
