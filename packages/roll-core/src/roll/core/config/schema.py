"""Walking a pydantic config model by key path, for error messages and overrides.

Pydantic reports *that* ``trainer.lerning_rate`` is not allowed; to say *what* is allowed there (the
did-you-mean) and which type a key expects, we walk the model class along the same path: through nested
models, ``X | None``, other unions (discriminated ones narrowed by the data's tag when it is known), lists,
tuples and dicts. Nothing here validates; it only reads type annotations.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel

_SEQUENCE_ORIGINS: tuple[Any, ...] = (list, tuple, set, frozenset, Sequence, typing.Sequence)
_MAPPING_ORIGINS: tuple[Any, ...] = (dict, Mapping, typing.Mapping)

S = TypeVar("S", bound=BaseModel)


def sections_of(config: Any, kind: type[S], where: str = "") -> Iterator[tuple[str, S]]:
    """Every instance of ``kind`` inside a loaded config, with its key path (``actor_train.model``,
    ``teachers.math``, ``data.sources.0``): through nested models, dicts and lists; a match is searched too."""
    if isinstance(config, kind):
        yield where, config
    if isinstance(config, BaseModel):
        for name in type(config).model_fields:
            yield from sections_of(getattr(config, name), kind, f"{where}.{name}".lstrip("."))
    elif isinstance(config, dict):
        for key, value in config.items():
            yield from sections_of(value, kind, f"{where}.{key}")
    elif isinstance(config, list | tuple):
        for i, value in enumerate(config):
            yield from sections_of(value, kind, f"{where}.{i}")


def alternatives(annotation: Any) -> list[Any]:
    """The members of a union (``X | None`` included), with ``Annotated`` metadata stripped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return alternatives(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [alt for arg in typing.get_args(annotation) for alt in alternatives(arg)]
    return [annotation]


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _child(annotation: Any, key: str, value: Any) -> list[Any]:
    """The annotations one key below ``annotation``; ``value`` is the data there (used to pick a variant)."""
    found: list[Any] = []
    for alt in _narrow(alternatives(annotation), value):
        origin, args = typing.get_origin(alt), typing.get_args(alt)
        if _is_model(alt):
            field = alt.model_fields.get(key) or _by_alias(alt, key)
            found += [field.annotation] if field is not None else []
        elif origin in _SEQUENCE_ORIGINS and key.isdigit() and args:
            found.append(_item_type(origin, args, int(key)))
        elif origin in _MAPPING_ORIGINS and len(args) == 2:
            found.append(args[1])
    return found


def _item_type(origin: Any, args: tuple[Any, ...], index: int) -> Any:
    """The type of item ``index``: the one item type, or the positional one of a fixed-length tuple."""
    if origin is not tuple or (len(args) == 2 and args[1] is Ellipsis):
        return args[0]
    return args[index] if index < len(args) else Any


def _by_alias(model: type[BaseModel], key: str) -> Any:
    return next((f for f in model.model_fields.values() if f.alias == key), None)


def _narrow(candidates: list[Any], value: Any) -> list[Any]:
    """Drop model variants whose ``Literal`` tag fields disagree with ``value`` (the discriminator)."""
    if not isinstance(value, dict) or sum(map(_is_model, candidates)) < 2:
        return candidates
    kept = [alt for alt in candidates if not _is_model(alt) or _tags_match(alt, value)]
    return kept or candidates


def _tags_match(model: type[BaseModel], value: dict[str, Any]) -> bool:
    for name, field in model.model_fields.items():
        is_tag = typing.get_origin(field.annotation) is typing.Literal and name in value
        if is_tag and value[name] not in typing.get_args(field.annotation):
            return False
    return True


def annotations_at(model: type[BaseModel], keys: Sequence[str], data: Any = None) -> list[Any]:
    """Every annotation the key path ``keys`` may have in ``model`` (empty: the model has no such key)."""
    current: list[Any] = [model]
    node = data
    for key in keys:
        current = [child for ann in current for child in _child(ann, key, node)]
        node = _step(node, key)
    return current


def _step(node: Any, key: str) -> Any:
    if isinstance(node, dict):
        return node.get(key)
    if isinstance(node, list) and key.isdigit() and int(key) < len(node):
        return node[int(key)]
    return None


def field_names(model: type[BaseModel], keys: Sequence[str], data: Any = None) -> list[str]:
    """The keys the model declares directly under ``keys`` (its field names, in declaration order)."""
    names: dict[str, None] = {}
    for ann in annotations_at(model, keys, data):
        for alt in _narrow(alternatives(ann), _step_all(data, keys)):
            if _is_model(alt):
                names.update((field.alias or name, None) for name, field in alt.model_fields.items())
    return list(names)


def _step_all(data: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        data = _step(data, key)
    return data


def key_path(model: type[BaseModel], loc: Sequence[int | str], data: Any) -> list[str]:
    """The config key path of a pydantic error location, without its union-member tags.

    Pydantic puts the member it tried into ``loc`` (``resume.literal['auto','never']``, ``strategy.fsdp2``).
    A segment is a key when the model declares it there or the data has it (an unknown key); list indices
    always are; anything else is a tag and is dropped.
    """
    keys: list[str] = []
    current: list[Any] = [model]
    node = data
    for segment in loc:
        key = str(segment)
        children = [child for ann in current for child in _child(ann, key, node)]
        if children or isinstance(segment, int) or (isinstance(node, dict) and key in node):
            keys.append(key)
            current = children
            node = _step(node, key)
    return keys


def type_name(annotation: Any) -> str:
    """A short, readable spelling of a type: ``int``, ``float | None``, ``'auto' | 'never' | Path``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if annotation is type(None) or annotation is None:
        return "None"
    if origin is not None and args:
        return f"{type_name(origin)}[{', '.join(type_name(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")
