"""Resolve a callable a config names: ``package.module:name`` or ``path/to/file.py:name``.

Used where a user's plain function plugs in without an entry point (``type: python`` rewards, a gymnasium env's
``render``/``parse`` pair). Errors are ``ValueError`` with a sentence a config error can carry unchanged. A file is
loaded once per process under a module name derived from its path, so two files called ``rewards.py`` never
collide. ``name`` may be dotted (``Class.method``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def is_file_target(target: str) -> bool:
    """Whether the part before ``:`` names a file (``x.py`` or a path) rather than a module."""
    return target.endswith(".py") or "/" in target or "\\" in target


def resolve_callable(spec: str) -> Callable[..., Any]:
    """The callable ``spec`` names (``module:name`` or ``file.py:name``); ValueError says what is wrong."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"{spec!r} is not of the form 'module:name' or 'path/to/file.py:name'")
    module = _load_file(target) if is_file_target(target) else _import(target)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in vars(module) if callable(getattr(module, n)) and not n.startswith("_"))
            raise ValueError(f"{target} has no attribute {name!r}; its public callables: {public}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return]


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"cannot import module {module!r}: {exc}. Install the package that provides it (on every node), "
            "or name a file instead: path/to/file.py:name"
        ) from exc


def _load_file(path: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"file {path} does not exist")
    name = "roll_user_" + hashlib.sha1(str(file).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise ValueError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        raise ValueError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    sys.modules[name] = module
    return module
