"""Signature compatibility for the structural tests (strategy protocols, the hybrid worker's API)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


RAY_TRACE = "_ray_trace_ctx"


def incompatibility(proto_fn: Callable[..., Any], impl_fn: Callable[..., Any]) -> str | None:
    """Why method ``impl_fn`` cannot take every call method ``proto_fn`` allows (None when it can): each of the
    protocol's parameters must exist, positional ones at the same index, keyword-only ones passable by keyword,
    with a default where the protocol has one; parameters the protocol lacks need defaults."""
    # [1:]: self. Ray adds ``_ray_trace_ctx`` to actor classes' methods once any test turned tracing on.
    want = [p for p in list(inspect.signature(proto_fn).parameters.values())[1:] if p.name != RAY_TRACE]
    have = {k: v for k, v in list(inspect.signature(impl_fn).parameters.items())[1:] if k != RAY_TRACE}
    positional = [p.name for p in have.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for i, p in enumerate(want):
        got = have.get(p.name)
        if got is None:
            return f"lacks parameter {p.name!r}"
        if p.kind == p.POSITIONAL_OR_KEYWORD and (i >= len(positional) or positional[i] != p.name):
            return f"parameter {p.name!r} is not positional at index {i}"
        if p.kind == p.KEYWORD_ONLY and got.kind not in (got.KEYWORD_ONLY, got.POSITIONAL_OR_KEYWORD):
            return f"parameter {p.name!r} cannot be passed by keyword"
        if p.default is not p.empty and got.default is p.empty:
            return f"parameter {p.name!r} has no default"
    names = {p.name for p in want}
    required = [
        n for n, q in have.items() if n not in names and q.default is q.empty and q.kind not in _VARIADIC
    ]
    return f"extra required parameters {required}" if required else None
