"""IFEval-style verifiable instructions (Zhou et al., 2023, "Instruction-Following Evaluation for LLMs").

A well-known subset of IFEval's checkers under their original ids, strict mode only (the response as given, no
"loose" variants with the first/last line removed). Requests carry their instructions in ``metadata`` either as
``"instructions": [{"id": ..., "kwargs": {...}}, ...]`` or in IFEval's own columns, ``"instruction_id_list"``
plus a parallel ``"kwargs"`` list. Score: the fraction of instructions followed (or 0/1, ``all_or_nothing``);
``info`` lists each instruction's verdict. An unknown id or bad kwargs scores 0 with ``info["error"]``.

Relations are IFEval's ``"at least"`` and ``"less than"``, plus ``"at most"`` and ``"exactly"``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from roll.pipelines.rewards.config import IFEvalRewardConfig
from roll.pipelines.rewards.types import RewardRequest, RewardResult

Checker = Callable[..., bool]

_RELATIONS: dict[str, Callable[[int, int], bool]] = {
    "at least": lambda value, n: value >= n,
    "less than": lambda value, n: value < n,
    "at most": lambda value, n: value <= n,
    "exactly": lambda value, n: value == n,
}


def _compare(value: int, relation: str, n: int) -> bool:
    if relation not in _RELATIONS:
        raise ValueError(f"unknown relation {relation!r}; use one of {sorted(_RELATIONS)}")
    return _RELATIONS[relation](value, int(n))


def number_words(response: str, *, relation: str, num_words: int) -> bool:
    return _compare(len(re.findall(r"\b\w+\b", response)), relation, num_words)


def number_paragraphs(response: str, *, num_paragraphs: int) -> bool:
    """IFEval's paragraphs are separated by a markdown divider ``***``; empty paragraphs fail."""
    parts = re.split(r"\s?\*\*\*\s?", response.strip())
    return all(p.strip() for p in parts) and len(parts) == int(num_paragraphs)


def keyword_existence(response: str, *, keywords: list[str]) -> bool:
    return all(re.search(re.escape(k), response, re.IGNORECASE) for k in keywords)


def forbidden_words(response: str, *, forbidden_words: list[str]) -> bool:
    return not any(re.search(r"\b" + re.escape(w) + r"\b", response, re.IGNORECASE) for w in forbidden_words)


def keyword_frequency(response: str, *, keyword: str, frequency: int, relation: str) -> bool:
    return _compare(len(re.findall(re.escape(keyword), response, re.IGNORECASE)), relation, frequency)


def english_lowercase(response: str) -> bool:
    return response == response.lower() and any(c.isalpha() for c in response)


def english_capital(response: str) -> bool:
    return response == response.upper() and any(c.isalpha() for c in response)


def end_checker(response: str, *, end_phrase: str) -> bool:
    return response.strip().lower().endswith(end_phrase.strip().lower())


def start_checker(response: str, *, start_phrase: str) -> bool:
    return response.strip().lower().startswith(start_phrase.strip().lower())


def quotation(response: str) -> bool:
    text = response.strip()
    return len(text) > 1 and text[0] == '"' and text[-1] == '"'


def json_format(response: str) -> bool:
    """The whole response parses as JSON; a surrounding markdown fence is tolerated (as in IFEval)."""
    text = re.sub(r"^```(?:json)?\s*|\s*```$", "", response.strip(), flags=re.IGNORECASE)
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def number_bullet_lists(response: str, *, num_bullets: int) -> bool:
    """Exactly ``num_bullets`` markdown bullets (lines starting with ``*`` or ``-``)."""
    bullets = re.findall(r"^\s*[*-]\s+\S", response, re.MULTILINE)
    return len(bullets) == int(num_bullets)


def no_comma(response: str) -> bool:
    return "," not in response


def number_placeholders(response: str, *, num_placeholders: int) -> bool:
    """At least ``num_placeholders`` square-bracket placeholders such as ``[address]``."""
    return len(re.findall(r"\[[^\[\]]+\]", response)) >= int(num_placeholders)


def title(response: str) -> bool:
    """A title wrapped in double angular brackets, e.g. ``<<poem of joy>>``."""
    return any(t.strip() for t in re.findall(r"<<([^\n]+?)>>", response))


def multiple_sections(response: str, *, section_spliter: str, num_sections: int) -> bool:
    """At least ``num_sections`` sections, each opened by ``"<spliter> <n>"`` (e.g. ``SECTION 1``)."""
    pattern = r"\s?" + re.escape(section_spliter) + r"\s?\d+\s?"
    return len(re.split(pattern, response)) - 1 >= int(num_sections)


def postscript(response: str, *, postscript_marker: str) -> bool:
    return (
        re.search(r"\s*" + re.escape(postscript_marker) + r".*$", response, re.MULTILINE | re.IGNORECASE)
        is not None
    )


def response_language(response: str, *, language: str = "en") -> bool:
    """A heuristic, ASCII-letter share >= 90%, and only for English (IFEval uses a language detector)."""
    if language.lower() not in {"en", "english"}:
        raise ValueError(f"only English is checked (got language={language!r})")
    letters = [c for c in response if c.isalpha()]
    return bool(letters) and sum(c.isascii() for c in letters) / len(letters) >= 0.9


CHECKERS: dict[str, Checker] = {
    "length_constraints:number_words": number_words,
    "length_constraints:number_paragraphs": number_paragraphs,
    "keywords:existence": keyword_existence,
    "keywords:forbidden_words": forbidden_words,
    "keywords:frequency": keyword_frequency,
    "change_case:english_lowercase": english_lowercase,
    "change_case:english_capital": english_capital,
    "startend:end_checker": end_checker,
    "startend:start_checker": start_checker,
    "startend:quotation": quotation,
    "detectable_format:json_format": json_format,
    "detectable_format:number_bullet_lists": number_bullet_lists,
    "detectable_format:title": title,
    "detectable_format:multiple_sections": multiple_sections,
    "detectable_content:number_placeholders": number_placeholders,
    "detectable_content:postscript": postscript,
    "punctuation:no_comma": no_comma,
    "language:response_language": response_language,
}
"""Instruction id -> checker ``(response, **kwargs) -> bool``."""


def instructions_of(metadata: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``[(id, kwargs), ...]`` from either metadata layout (see the module docstring)."""
    if "instructions" in metadata:
        return [(str(item["id"]), dict(item.get("kwargs") or {})) for item in metadata["instructions"]]
    ids = list(metadata.get("instruction_id_list", []))
    kwargs = list(metadata.get("kwargs", [{}] * len(ids)))
    if len(kwargs) != len(ids):
        raise ValueError(f"{len(ids)} instruction ids but {len(kwargs)} kwargs entries")
    # IFEval rows carry null-valued keys for unused arguments; drop them.
    return [(str(i), {k: v for k, v in (kw or {}).items() if v is not None}) for i, kw in zip(ids, kwargs)]


def check(instruction_id: str, response: str, kwargs: Mapping[str, Any]) -> bool:
    """Whether ``response`` follows one instruction; ``ValueError`` for an unknown id or bad kwargs."""
    if instruction_id not in CHECKERS:
        raise ValueError(f"unknown instruction id {instruction_id!r}; known: {', '.join(sorted(CHECKERS))}")
    try:
        return CHECKERS[instruction_id](response, **kwargs)
    except TypeError as exc:
        raise ValueError(f"bad kwargs {dict(kwargs)!r} for {instruction_id!r}: {exc}") from exc


class IFEvalReward:
    """Scores how many of a request's verifiable instructions the response follows."""

    def __init__(self, config: IFEvalRewardConfig | None = None) -> None:
        self.config = config or IFEvalRewardConfig()

    def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._score_one(r) for r in requests]

    def _score_one(self, request: RewardRequest) -> RewardResult:
        try:
            instructions = instructions_of(request.metadata)
            followed = [check(i, request.response, kw) for i, kw in instructions]
        except (ValueError, KeyError, TypeError) as exc:  # the row's data, not the response: unscored
            return RewardResult.unscored(str(exc), kind="bad instructions")
        if not followed:
            return RewardResult.unscored("no instructions in request metadata", kind="bad instructions")
        fraction = sum(followed) / len(followed)
        score = float(all(followed)) if self.config.all_or_nothing else fraction
        verdicts = {i: ok for (i, _), ok in zip(instructions, followed)}
        return RewardResult(
            score=score, info={"followed": verdicts, "correct": all(followed), "fraction": fraction}
        )
