"""The end-of-run HF export and the checkpoint-file layout shared by the offline modes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from roll.workers.roles.clusters import HFExporter

logger = logging.getLogger(__name__)

HF_DIR = "hf"
"""``<output_dir>/hf``: the ``save_pretrained`` folder (safetensors, config, tokenizer) written at the end."""


def export_hf(cluster: HFExporter, output_dir: Path) -> Path:
    """Write the role's model and tokenizer as a transformers ``save_pretrained`` folder; returns its path."""
    target = output_dir / HF_DIR
    target.mkdir(parents=True, exist_ok=True)
    cluster.export_hf(str(target))
    logger.info("exported %s to %s", cluster.role, target)
    return target
