"""Rows for the offline training modes: load, tokenize, clean, and turn index lists into batches.

Data is small enough to hold in memory as lists of token ids (offline SFT/DPO/RM sets are; a streaming source
is read once into memory). The training split is read by a :class:`~roll.pipelines.common.feed.RowFeeder`,
the held-out split whole at evaluation.

Batch layouts (column names carry their axes; ``labels_BT`` is unshifted, ``-100`` where no loss is taken, so
``labels_BT[b, t] != -100`` marks exactly the tokens whose ``logp_BT[b, t]`` the loss uses):

- SFT: :data:`INPUT_IDS`, :data:`ATTENTION_MASK` and :data:`LABELS` ``[B, T]``, right-padded.
- pairs (DPO, reward model): the same three columns with chosen and rejected *interleaved* (row ``2i`` chosen,
  ``2i + 1`` rejected of pair ``i``), so any even split of the rows (data-parallel, micro-batches) keeps every
  pair on one worker.
- unpaired (KTO): one ``prompt + completion`` per row, and its label in :data:`DESIRABLE` ``[B]``.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import datasets

from roll.core.batch import Batch
from roll.core.columns import ATTENTION_MASK, DESIRABLE, IGNORE_INDEX, INPUT_IDS, LABELS
from roll.core.errors import DataError
from roll.data.config import DataConfig, TokenizeConfig
from roll.data.loading import AnyDataset, column_names, load_data
from roll.data.media import attach_vision
from roll.data.tokenize import Kind, LengthReport, tokenize_dataset
from roll.data.video import row_videos
from roll.data.vision import IMAGE_PAD, VIDEO_PAD, row_images, vision_columns

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Row = dict[str, Any]


@dataclass
class PreparedData:
    """Tokenized training and held-out rows, and what cleaning did to them."""

    train: list[Row]
    eval: list[Row]
    report: LengthReport
    skipped: dict[str, int] = field(default_factory=dict)


def load_tokenizer(model_path: str) -> Any:
    """The tokenizer saved with the model (a tiny preset's folder holds the offline tokenizer).

    In a process without torch (an RL driver) it loads in a short-lived child process and comes back pickled:
    transformers' ``AutoTokenizer`` imports torch (its config classes do), the tokenizer itself does not, and
    the child's torch is gone before the run's actors load theirs."""
    if "torch" in sys.modules:
        return _load_tokenizer(model_path)
    code = (
        "import pickle, sys; from roll.pipelines.common.data import _load_tokenizer; "
        "sys.stdout.buffer.write(pickle.dumps(_load_tokenizer(sys.argv[1])))"
    )
    child = subprocess.run([sys.executable, "-c", code, model_path], capture_output=True, check=False)
    if child.returncode != 0:
        tail = child.stderr.decode(errors="replace")[-2000:]
        raise DataError(f"could not load the tokenizer of {model_path!r} (in a child process):\n{tail}")
    return pickle.loads(child.stdout)  # written just now by our own child process


def _load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    from roll.data.models import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(model_path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def prepare_data(
    data: DataConfig, tokenize: TokenizeConfig, *, kind: Kind, tokenizer: Any, image_processor: Any = None
) -> PreparedData:
    """Load every source, tokenize both splits for ``kind`` and, for pairs, skip those that teach nothing.

    Rows with ``images`` get their patches and expanded image tokens (:func:`roll.data.media.attach_vision`)
    with ``image_processor`` (a vision-language model's); without one they are an error naming the model.
    """
    splits = load_data(data)
    if kind == "unpaired":
        return _unpaired_data(splits.train, splits.eval, tokenizer, tokenize)
    train, report = _tokenized_rows(splits.train, kind, tokenizer, tokenize, "train")
    held_out = (
        _tokenized_rows(splits.eval, kind, tokenizer, tokenize, "eval")[0] if splits.eval is not None else []
    )
    train = _with_images(train, image_processor, tokenizer, "train data")
    held_out = _with_images(held_out, image_processor, tokenizer, "eval data")
    prepared = PreparedData(train=train, eval=held_out, report=report)
    if kind == "preference":
        prepared.train, prepared.skipped["identical_pairs"] = drop_identical_pairs(train, split="train")
        prepared.eval, prepared.skipped["identical_pairs_eval"] = drop_identical_pairs(held_out, split="eval")
    return prepared


def _unpaired_data(
    train: AnyDataset, held_out: AnyDataset | None, tokenizer: Any, cfg: TokenizeConfig
) -> PreparedData:
    """KTO's rows: unpaired ``(prompt, completion, label)`` as they are, or preference pairs split into a desirable
    and an undesirable row each (pairs whose answers are equal are skipped first: their labels would contradict)."""
    skipped: dict[str, int] = {}
    prepared: list[tuple[list[Row], LengthReport | None]] = []
    for split, ds in (("train", train), ("eval", held_out)):
        if ds is None:
            prepared.append(([], None))
            continue
        if all(c in column_names(ds) for c in ("completion", "label")):
            prepared.append(_tokenized_rows(ds, "unpaired", tokenizer, cfg, split))
            continue
        rows, report = _tokenized_rows(ds, "preference", tokenizer, cfg, split)
        rows, skipped[f"identical_pairs{'' if split == 'train' else '_eval'}"] = drop_identical_pairs(
            rows, split=split
        )
        prepared.append((unpair(rows), report))
    (train_rows, train_report), (eval_rows, _) = prepared
    assert train_report is not None  # the train split always exists
    return PreparedData(train=train_rows, eval=eval_rows, report=train_report, skipped=skipped)


def unpair(rows: Sequence[Row]) -> list[Row]:
    """Each preference pair as two unpaired rows: ``(prompt, chosen, True)`` then ``(prompt, rejected, False)``."""
    out: list[Row] = []
    for row in rows:
        for key, label in (("chosen_ids", True), ("rejected_ids", False)):
            out.append({"prompt_ids": row["prompt_ids"], "completion_ids": row[key], "label": label})
    return out


def _with_images(rows: list[Row], image_processor: Any, tokenizer: Any, source: str) -> list[Row]:
    with_images = any(row_images(r) for r in rows)
    if not with_images and not any(row_videos(r) for r in rows):
        return rows
    if image_processor is None:
        raise DataError(
            f"{source}: rows carry {'images' if with_images else 'videos'} but the model is not a vision-language "
            "model (no image processor); use a VLM (a tiny-vl-* preset, a Qwen2-VL / Qwen2.5-VL folder or hub id)"
        )
    pad_id, video_pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (IMAGE_PAD, VIDEO_PAD))
    return attach_vision(rows, image_processor, image_pad_id=pad_id, video_pad_id=video_pad_id, source=source)


def load_image_processor_for(model_path: str) -> Any:
    """The image processor of a vision-language model, ``None`` for a text model."""
    from roll.data.models import is_vision_language, load_image_processor

    return load_image_processor(model_path) if is_vision_language(model_path) else None


def _tokenized_rows(
    ds: AnyDataset, kind: Kind, tokenizer: Any, cfg: TokenizeConfig, split: str = ""
) -> tuple[list[Row], LengthReport]:
    mapped, report = tokenize_dataset(ds, kind=kind, tokenizer=tokenizer, cfg=cfg, split=split)
    if isinstance(mapped, datasets.IterableDataset):
        return [dict(row) for row in mapped], report
    return mapped.to_list(), report


def drop_identical_pairs(rows: Sequence[Row], *, split: str) -> tuple[list[Row], int]:
    """Rows whose chosen and rejected continuations differ; a pair with equal ones has no preference signal
    (its DPO gradient is zero and a reward model could only learn noise), so it is counted and skipped."""
    kept = [r for r in rows if list(r["chosen_ids"]) != list(r["rejected_ids"])]
    skipped = len(rows) - len(kept)
    if skipped:
        logger.warning("%s: skipped %d preference pair(s) whose chosen equals rejected", split, skipped)
    return kept, skipped


# --------------------------------------------------------------------------------------------- batches


def sft_batch(rows: Sequence[Row], *, pad_id: int) -> Batch:
    """Right-padded SFT batch (see the module docstring)."""
    from roll.data.collate import collate_sft  # torch: imported where batches are built, not on import

    tensors = collate_sft(rows, pad_id=pad_id)  # input_ids_BT, attention_mask_BT, labels_BT
    return Batch(tensors, vision_columns(rows))  # image rows: their patches travel with them


def pair_sequences(row: Row) -> tuple[list[int], list[int], int]:
    """``(chosen sequence, rejected sequence, prompt length)`` of one tokenized preference row."""
    prompt = list(row["prompt_ids"])
    return prompt + list(row["chosen_ids"]), prompt + list(row["rejected_ids"]), len(prompt)


def pair_batch(rows: Sequence[Row], *, pad_id: int) -> Batch:
    """Interleaved chosen/rejected batch of ``2 * len(rows)`` sequences (see the module docstring)."""
    seqs: list[list[int]] = []
    labels: list[list[int]] = []
    for row in rows:
        chosen, rejected, n_prompt = pair_sequences(row)
        for seq in (chosen, rejected):
            seqs.append(seq)
            labels.append([IGNORE_INDEX] * n_prompt + seq[n_prompt:])
    width = max(len(s) for s in seqs)
    input_ids = _pad(seqs, pad_id, width)  # [2B, T]
    return Batch(
        {
            INPUT_IDS: input_ids,
            ATTENTION_MASK: _pad([[1] * len(s) for s in seqs], 0, width),  # [2B, T]
            LABELS: _pad(labels, IGNORE_INDEX, width),  # [2B, T]
        }
    )


def unpaired_batch(rows: Sequence[Row], *, pad_id: int, completions: Sequence[Row] | None = None) -> Batch:
    """Right-padded batch of ``prompt + completion`` per row, with :data:`LABELS` on the completion and the
    rows' :data:`DESIRABLE` labels. ``completions`` (as many rows) supplies the completions instead: KTO's
    mismatched pairs ``(x_i, y_j)``."""
    import torch

    donors = rows if completions is None else completions
    seqs = [list(r["prompt_ids"]) + list(d["completion_ids"]) for r, d in zip(rows, donors, strict=True)]
    labels = [[IGNORE_INDEX] * len(r["prompt_ids"]) + list(d["completion_ids"]) for r, d in zip(rows, donors)]
    width = max(len(s) for s in seqs)
    return Batch(
        {
            INPUT_IDS: _pad(seqs, pad_id, width),  # [B, T]
            ATTENTION_MASK: _pad([[1] * len(s) for s in seqs], 0, width),  # [B, T]
            LABELS: _pad(labels, IGNORE_INDEX, width),  # [B, T]
            DESIRABLE: torch.tensor([bool(r["label"]) for r in rows]),  # [B]
        }
    )


def _pad(seqs: Sequence[Sequence[int]], value: int, width: int) -> torch.Tensor:
    import torch

    out = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return out


def select(rows: Sequence[Row], indices: Sequence[int]) -> list[Row]:
    return [rows[i] for i in indices]


def chunks(rows: Sequence[Row], size: int) -> list[list[Row]]:
    """``rows`` in consecutive chunks of at most ``size`` (evaluation batches)."""
    return [list(rows[i : i + size]) for i in range(0, len(rows), size)]
