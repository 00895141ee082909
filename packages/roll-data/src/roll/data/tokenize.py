"""Tokenization of canonical rows for SFT, preference pairs and RL prompts, with counted length limits.

Three encoders, each a batched ``datasets.map`` function (cached by fingerprint, ``num_proc`` for big sets):

- **sft**: the whole conversation, ``labels`` equal to ``input_ids`` on assistant turns and ``-100`` elsewhere.
  Turn boundaries come from :func:`roll.data.templates.segments` (incremental prefix rendering), and each
  segment is tokenized on its own, so a boundary never falls inside a token, for any template.
- **preference**: the prompt once (rendered with the generation prompt) and the chosen and rejected
  continuations (the rest of each full render), so ``prompt_ids + chosen_ids`` is the chosen sequence.
- **unpaired**: as preference, with one ``completion`` and its boolean ``label`` (desirable or not; KTO), giving
  ``prompt_ids``, ``completion_ids`` and ``label``.
- **prompt**: the prompt rendered with the generation prompt, for generation in RL.

Templates insert their own special tokens, so texts are tokenized with ``add_special_tokens=False``.

Length policy (``TokenizeConfig.length_policy``), never silent: every row is counted in a :class:`LengthReport`.

- ``truncate``: SFT keeps the *start* (the prompt and the first part of the response; the cut end loses its
  end-of-turn token, a deliberate trade against dropping data). Preference continuations keep their start.
  Prompts keep their *end* (left truncation), because the end holds the question and the generation prompt the
  model must answer from. A row left with no trainable token (prompt alone fills the budget) is dropped.
- ``drop``: rows over a limit are removed. ``error``: the first one raises, naming the row.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import datasets

from roll.core import columns as C
from roll.core.columns import IGNORE_INDEX
from roll.core.errors import DataError
from roll.data.config import TokenizeConfig
from roll.data.loading import AnyDataset, ensure_not_empty, require_columns
from roll.data.media import place_vision_tokens
from roll.data.templates import Message, render, row_messages, segments

log = logging.getLogger(__name__)

KEPT, TRUNCATED, DROPPED = 0, 1, 2
STATUS = "_length_status"
Kind = Literal["sft", "preference", "unpaired", "prompt"]
Batch = dict[str, list[Any]]

REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    "sft": (("messages",), ("prompt", "response")),
    "preference": (
        ("prompt", "chosen", "rejected"),
        ("messages", "chosen", "rejected"),
        ("chosen", "rejected"),
    ),
    "unpaired": (("prompt", "completion", "label"), ("messages", "completion", "label")),
    "prompt": (("prompt",), ("messages",)),
}


@dataclass
class LengthReport:
    """What the length policy did: ``kept`` rows fit as they were, ``truncated`` were shortened and kept,
    ``dropped`` were removed. ``kept + truncated + dropped`` is every row seen."""

    policy: str
    max_length: int
    kept: int = 0
    truncated: int = 0
    dropped: int = 0

    @property
    def total(self) -> int:
        return self.kept + self.truncated + self.dropped

    def add(self, status: int) -> None:
        if status == KEPT:
            self.kept += 1
        elif status == TRUNCATED:
            self.truncated += 1
        else:
            self.dropped += 1

    def __str__(self) -> str:
        return (
            f"length policy {self.policy} (max_length {self.max_length}): of {self.total} rows, {self.kept} fit, "
            f"{self.truncated} truncated, {self.dropped} dropped"
        )


# ---------------------------------------------------------------------------------- pure length limits


def _too_long(what: str, n: int, limit: int, index: int | None) -> DataError:
    row = f"row {index}" if index is not None else "a row"
    return DataError(
        f"{row}: {what} has {n} tokens > {limit} (length_policy=error); raise the limit or set "
        "length_policy to drop or truncate",
        row=index,
    )


def limit_sft(
    ids: list[int], labels: list[int], max_length: int, policy: str, index: int | None = None
) -> tuple[list[int], list[int], int]:
    """Apply the policy to one SFT sequence; truncation keeps the start. Returns ``(ids, labels, status)``."""
    if len(ids) <= max_length:
        return ids, labels, KEPT
    if policy == "error":
        raise _too_long("sequence", len(ids), max_length, index)
    if policy == "drop":
        return [], [], DROPPED
    ids, labels = ids[:max_length], labels[:max_length]
    if all(label == IGNORE_INDEX for label in labels):
        return [], [], DROPPED  # the prompt fills the budget: nothing left to learn from
    return ids, labels, TRUNCATED


def limit_prompt(ids: list[int], limit: int, policy: str, index: int | None = None) -> tuple[list[int], int]:
    """Apply the policy to one prompt; truncation keeps the end (left truncation)."""
    if len(ids) <= limit:
        return ids, KEPT
    if policy == "error":
        raise _too_long("prompt", len(ids), limit, index)
    if policy == "drop":
        return [], DROPPED
    return ids[len(ids) - limit :], TRUNCATED


def limit_pair(
    prompt: list[int],
    chosen: list[int],
    rejected: list[int],
    cfg: TokenizeConfig,
    index: int | None = None,
) -> tuple[list[int], list[int], list[int], int]:
    """Limit a preference pair: the prompt by ``max_prompt_length`` (keeping its end), then each continuation so
    that prompt plus continuation fits ``max_length`` (keeping their starts)."""
    prompt, status = limit_prompt(prompt, cfg.max_prompt_length or cfg.max_length, cfg.length_policy, index)
    if status == DROPPED:
        return [], [], [], DROPPED
    room = cfg.max_length - len(prompt)
    longest = max(len(chosen), len(rejected))
    if longest <= room:
        return prompt, chosen, rejected, status
    if cfg.length_policy == "error":
        raise _too_long("prompt + continuation", len(prompt) + longest, cfg.max_length, index)
    if cfg.length_policy == "drop" or room <= 0:
        return [], [], [], DROPPED
    return prompt, chosen[:room], rejected[:room], TRUNCATED


# ------------------------------------------------------------------------------------------- encoders


def _rows(batch: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(batch)
    return [dict(zip(keys, values)) for values in zip(*(batch[k] for k in keys))]


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return list(tokenizer(texts, add_special_tokens=False)["input_ids"]) if texts else []


def encode_sft(batch: Batch, indices: Sequence[int], *, tokenizer: Any, cfg: TokenizeConfig) -> Batch:
    """Batched map function: ``input_ids``, ``labels`` (assistant tokens only), ``length`` and the status."""
    pieces = [
        segments(_messages(r, i, with_response=True), template=cfg.template, tokenizer=tokenizer)
        for r, i in zip(_rows(batch), indices)
    ]
    flat = iter(_encode(tokenizer, [text for row in pieces for text, _ in row]))
    out: Batch = {"input_ids": [], "labels": [], "length": [], STATUS: []}
    for row, index in zip(pieces, indices):
        ids: list[int] = []
        labels: list[int] = []
        for _, trained in row:
            seg = next(flat)
            ids += seg
            labels += seg if trained else [IGNORE_INDEX] * len(seg)
        if all(label == IGNORE_INDEX for label in labels):
            raise DataError(f"row {index}: the conversation has no assistant turn to train on", row=index)
        ids, labels, status = limit_sft(ids, labels, cfg.max_length, cfg.length_policy, index)
        _append(out, input_ids=ids, labels=labels, length=len(ids), **{STATUS: status})
    return out


def _messages(row: Mapping[str, Any], index: int, *, with_response: bool) -> list[Message]:
    """The row's conversation; with images or videos, their vision tokens in place (see :mod:`roll.data.vision`)."""
    return place_vision_tokens(row_messages(row, with_response=with_response), row, index=index)


def _append(out: Batch, **values: Any) -> None:
    for key, value in values.items():
        out[key].append(value)


def _pair_texts(
    row: Mapping[str, Any], tokenizer: Any, template: str | None, keys: Sequence[str] = ("chosen", "rejected")
) -> list[str]:
    """``[prompt_text, chosen_continuation, rejected_continuation]`` for one preference row (the continuations of
    ``keys``)."""
    prompt = _pair_prompt(row)
    prompt_text = render(prompt, template=template, tokenizer=tokenizer, add_generation_prompt=True)
    texts = [prompt_text]
    for key in keys:
        reply = _reply(row[key], key)
        full = render([*prompt, reply], template=template, tokenizer=tokenizer, add_generation_prompt=False)
        if not full.startswith(prompt_text):
            raise DataError(f"chat template: the {key} render does not start with the prompt render")
        texts.append(full[len(prompt_text) :])
    return texts


def _pair_prompt(row: Mapping[str, Any]) -> list[Message]:
    if row.get("messages") or row.get("prompt") is not None:
        return row_messages(row, with_response=False)
    chosen = row["chosen"]
    if isinstance(chosen, list) and len(chosen) > 1:
        return row_messages({"messages": chosen[:-1]})
    raise DataError(
        "a preference row needs a prompt: a prompt or messages field, or chosen as a conversation"
    )


def _reply(value: Any, key: str) -> Message:
    if isinstance(value, str):
        return {"role": "assistant", "content": value}
    if isinstance(value, list) and value and value[-1].get("role") == "assistant":
        return {"role": "assistant", "content": str(value[-1]["content"])}
    raise DataError(f"{key} must be a string or a conversation ending with an assistant message")


def encode_preference(batch: Batch, indices: Sequence[int], *, tokenizer: Any, cfg: TokenizeConfig) -> Batch:
    """Batched map function: ``prompt_ids`` once, ``chosen_ids`` and ``rejected_ids`` continuations."""
    texts = [_pair_texts(r, tokenizer, cfg.template) for r in _rows(batch)]
    flat = _encode(tokenizer, [t for triple in texts for t in triple])
    out: Batch = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": [], "length": [], STATUS: []}
    for n, index in enumerate(indices):
        prompt, chosen, rejected = flat[3 * n : 3 * n + 3]
        prompt, chosen, rejected, status = limit_pair(prompt, chosen, rejected, cfg, index)
        length = len(prompt) + max(len(chosen), len(rejected))
        _append(
            out,
            prompt_ids=prompt,
            chosen_ids=chosen,
            rejected_ids=rejected,
            length=length,
            **{STATUS: status},
        )
    return out


def encode_unpaired(batch: Batch, indices: Sequence[int], *, tokenizer: Any, cfg: TokenizeConfig) -> Batch:
    """Batched map function: ``prompt_ids``, one ``completion_ids`` continuation and its boolean ``label``."""
    rows = _rows(batch)
    for row, index in zip(rows, indices):
        if not isinstance(row["label"], bool):
            raise DataError(
                f"row {index}: label must be true (desirable) or false (undesirable), got {row['label']!r}",
                row=index,
            )
    texts = [_pair_texts(r, tokenizer, cfg.template, keys=("completion",)) for r in rows]
    flat = _encode(tokenizer, [t for pair in texts for t in pair])
    out: Batch = {"prompt_ids": [], "completion_ids": [], "label": [], "length": [], STATUS: []}
    for n, (row, index) in enumerate(zip(rows, indices)):
        prompt, completion = flat[2 * n : 2 * n + 2]
        prompt, completion, _, status = limit_pair(prompt, completion, completion, cfg, index)
        _append(out, prompt_ids=prompt, completion_ids=completion, label=row["label"],
                length=len(prompt) + len(completion), **{STATUS: status})  # fmt: skip
    return out


def encode_prompt(batch: Batch, indices: Sequence[int], *, tokenizer: Any, cfg: TokenizeConfig) -> Batch:
    """Batched map function: ``prompt_ids`` rendered with the generation prompt, left-truncated if allowed."""
    texts = [
        render(
            _messages(r, i, with_response=False),
            template=cfg.template,
            tokenizer=tokenizer,
            add_generation_prompt=True,
        )
        for r, i in zip(_rows(batch), indices)
    ]
    out: Batch = {"prompt_ids": [], "length": [], STATUS: [], C.PROMPT_TRUNCATED: []}
    limit = cfg.max_prompt_length or cfg.max_length
    for ids, index in zip(_encode(tokenizer, texts), indices):
        ids, status = limit_prompt(ids, limit, cfg.length_policy, index)
        _append(
            out, prompt_ids=ids, length=len(ids), **{STATUS: status, C.PROMPT_TRUNCATED: status == TRUNCATED}
        )
    return out


ENCODERS: dict[str, Callable[..., Batch]] = {
    "sft": encode_sft,
    "preference": encode_preference,
    "unpaired": encode_unpaired,
    "prompt": encode_prompt,
}


# --------------------------------------------------------------------------------------------- datasets


def tokenize_dataset(
    ds: AnyDataset,
    *,
    kind: Kind,
    tokenizer: Any,
    cfg: TokenizeConfig,
    batch_size: int = 256,
    split: str = "",
) -> tuple[AnyDataset, LengthReport]:
    """Tokenize ``ds`` for ``kind`` and apply the length policy; return the rows kept and the report.

    Original columns are kept (RL needs ``ground_truth`` and ``tag`` next to ``prompt_ids``). For an in-memory
    dataset the report is complete on return and logged; for a streaming one it fills as rows are read. Rows cut
    or dropped are said once, at WARNING, naming ``split``.
    """
    require_columns(ds, *REQUIRED[kind], source=f"{kind} tokenization")
    encode = partial(ENCODERS[kind], tokenizer=tokenizer, cfg=cfg)
    report = LengthReport(policy=cfg.length_policy, max_length=cfg.max_length)
    if isinstance(ds, datasets.IterableDataset):
        return _tokenize_streaming(ds, encode, report, batch_size), report
    mapped = ds.map(
        encode,
        batched=True,
        batch_size=batch_size,
        with_indices=True,
        num_proc=cfg.num_proc,
        load_from_cache_file=cfg.load_from_cache_file,
        desc=f"tokenize ({kind})",
    )
    counts = Counter(mapped[STATUS])
    report.kept, report.truncated, report.dropped = counts[KEPT], counts[TRUNCATED], counts[DROPPED]
    _log_report(report, f"{split} {kind}".strip())
    if report.dropped:
        mapped = mapped.filter(lambda s: s != DROPPED, input_columns=STATUS, num_proc=cfg.num_proc)
        ensure_not_empty(mapped, step=f"the length filter ({report})", source=f"{kind} tokenization")
    return mapped.remove_columns(STATUS), report


def _log_report(report: LengthReport, kind: str) -> None:
    """At WARNING when rows were cut or dropped (a prompt cut to its last tokens changes the task; the user must
    see it, once, not at a level that is hidden), else at INFO."""
    if report.truncated or report.dropped:
        log.warning(
            "%s data: %d of %d rows were longer than the limit: %s. Raise tokenize.max_length (or "
            "max_prompt_length), or set tokenize.length_policy",
            kind, report.truncated + report.dropped, report.total, report,
        )  # fmt: skip
    else:
        log.info("%s", report)


def _tokenize_streaming(
    ds: datasets.IterableDataset, encode: Callable[..., Batch], report: LengthReport, batch_size: int
) -> datasets.IterableDataset:
    def counted(batch: Batch, indices: Sequence[int]) -> Batch:
        out = encode(batch, indices)
        first = not (report.truncated or report.dropped)
        for status in out[STATUS]:
            report.add(status)
        if first and (report.truncated or report.dropped):  # streaming: said once, at the first cut row
            log.warning("streamed data: rows longer than the limit are cut or dropped (%s so far)", report)
        return out

    mapped = ds.map(counted, batched=True, batch_size=batch_size, with_indices=True)
    return mapped.filter(lambda s: s != DROPPED, input_columns=STATUS).remove_columns(STATUS)
