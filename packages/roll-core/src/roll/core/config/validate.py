"""Validating a plain config tree against a pydantic model, with every problem reported at once.

Pydantic already collects every error of one validation; this module turns them into :class:`ConfigIssue`
objects a person can act on: the dotted key path (list items as ``.0``), the ``file.yaml:12`` it was written at,
the expected type and the value given, a did-you-mean for unknown keys, and the name of a missing key.

Cross-field checks that need several sections (batch sizes against a role's worker count) run in a
``model_validator(mode="after")`` and report through :func:`issues_error`, so their issues, with their own key
paths and hints, arrive in the same report as pydantic's. Pydantic runs an ``after`` validator only when the
fields it reads validated, so such a check reports once the field errors are fixed; that is on purpose, since
arithmetic on invalid numbers would only add noise.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from roll.core.config.schema import annotations_at, field_names, key_path, type_name
from roll.core.config.yaml_tree import nearest_source
from roll.core.errors import ConfigError, ConfigIssue

M = TypeVar("M", bound=BaseModel)

ISSUE_ERROR_TYPE = "roll_config_issue"

# Errors about a value's range or size, where the type was right: naming the expected type would mislead.
_CONSTRAINT_ERRORS = frozenset(
    {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "multiple_of",
        "finite_number",
        "too_short",
        "too_long",
        "string_too_short",
        "string_too_long",
        "string_pattern_mismatch",
    }
)


def issues_error(issues: Sequence[ConfigIssue], title: str = "config") -> ValidationError:
    """A pydantic ``ValidationError`` that carries ``issues``; raise it from a model validator.

    Each issue's ``path`` is relative to the model whose validator raises (pydantic prefixes the location of
    that model), and its message and hint survive into the final :class:`ConfigError` unchanged.
    """
    details = [
        InitErrorDetails(
            type=PydanticCustomError(
                ISSUE_ERROR_TYPE, "{message}", {"message": issue.message, "hint": issue.hint}
            ),
            loc=tuple(issue.path.split(".")) if issue.path else (),
            input=None,
        )
        for issue in issues
    ]
    return ValidationError.from_exception_data(title, details)


def validate_data(data: Any, model: type[M], sources: dict[str, str] | None = None) -> M:
    """Validate ``data`` as ``model``; raise :class:`ConfigError` with every issue found, located by ``sources``."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(issues=issues_from(exc, data, model, sources or {})) from None


def issues_from(
    exc: ValidationError, data: Any, model: type[BaseModel], sources: dict[str, str]
) -> list[ConfigIssue]:
    """One issue per key path. A union's members each fail on their own; their messages join into one issue."""
    grouped: dict[tuple[Any, ...], list[Any]] = {}
    for index, error in enumerate(exc.errors(include_url=False)):
        if error["type"] == "default_factory_not_called":  # a consequence of another error, reported there
            continue
        keys = tuple(key_path(model, error["loc"], data))
        # Issues raised through issues_error are already one per problem: never merge them.
        group = (*keys, index) if error["type"] == ISSUE_ERROR_TYPE else keys
        grouped.setdefault(group, []).append((keys, error))
    return [
        _issue(list(pairs[0][0]), [e for _, e in pairs], data, model, sources) for pairs in grouped.values()
    ]


def _issue(
    keys: list[str], errors: list[Any], data: Any, model: type[BaseModel], sources: dict[str, str]
) -> ConfigIssue:
    path = ".".join(keys)
    first = errors[0]
    where = nearest_source(sources, path)
    kind = first["type"]
    if kind == ISSUE_ERROR_TYPE:
        return ConfigIssue(path, first["ctx"]["message"], first["ctx"].get("hint"), where)
    if kind == "missing":
        return ConfigIssue(path, f"required key {keys[-1]!r} is missing", None, where)
    if kind == "extra_forbidden":
        return unknown_key(model, keys, data, where)
    return ConfigIssue(path, _value_message(keys, errors, data, model), None, where)


def unknown_key(model: type[BaseModel], keys: list[str], data: Any, where: str | None = None) -> ConfigIssue:
    """The issue for key path ``keys`` that ``model`` does not have, with the close keys it has as the hint (a
    validator that refuses some keys itself reports the unknown ones beside them with this)."""
    return ConfigIssue(".".join(keys), f"unknown key {keys[-1]!r}", _did_you_mean(model, keys, data), where)


def _did_you_mean(model: type[BaseModel], keys: list[str], data: Any) -> str | None:
    allowed = field_names(model, keys[:-1], data)
    if not allowed:
        return None
    close = difflib.get_close_matches(keys[-1], allowed, n=3, cutoff=0.6)
    if close:
        return f"did you mean {' or '.join(repr(name) for name in close)}?"
    return f"allowed keys here: {', '.join(allowed)}"


def _value_message(keys: list[str], errors: list[Any], data: Any, model: type[BaseModel]) -> str:
    """'expected int, got 'abc' (str): input should be a valid integer' or, for a range, the rule and value."""
    given = errors[0]["input"]
    shown = _short_repr(given)
    reasons = "; ".join(dict.fromkeys(_reason(error) for error in errors))
    if all(error["type"] in ("value_error", "assertion_error") for error in errors):
        return reasons  # a validator's own sentence; it names the values it needs
    if all(error["type"] in _CONSTRAINT_ERRORS for error in errors):
        return f"{reasons}, got {shown}"
    expected = " | ".join(dict.fromkeys(type_name(ann) for ann in annotations_at(model, keys, data)))
    if not expected:
        return f"{reasons}, got {shown}"
    return f"expected {expected}, got {shown} ({type(given).__name__}): {reasons}"


def _reason(error: Any) -> str:
    message = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return message[:1].lower() + message[1:]


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def moved_keys_error(data: Any, moved: dict[str, str]) -> ValidationError | None:
    """An error naming every key of ``data`` that ``moved`` maps to its new place (``old -> new path``), or None.

    Old paths may be dotted (``env_manager.temperature``): one is found when every section on its way is a
    mapping that holds the next key. Call it from a ``model_validator(mode="before")`` so a config written for an
    older layout gets the new path as its hint rather than a bare 'unknown key'.
    """
    if not isinstance(data, dict):
        return None
    issues = [_moved_issue(old, new) for old, new in moved.items() if _holds(data, old.split("."))]
    return issues_error(issues) if issues else None


def _holds(data: Any, keys: list[str]) -> bool:
    for key in keys:
        if not isinstance(data, dict) or key not in data:
            return False
        data = data[key]
    return True


def _moved_issue(old: str, new: str) -> ConfigIssue:
    parent, _, _ = old.rpartition(".")
    where = f"a key of {parent}" if parent else "a top-level key"
    return ConfigIssue(old, f"{old!r} is no longer {where}", f"move it to {new}")
