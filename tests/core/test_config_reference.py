"""The configuration reference's walk over config models (roll.core.config.reference): every key with its type,
default and description, nested sections, lists and mappings of sections, type-discriminated variants, and the
keys a loaded config leaves at their defaults (what `roll validate --explain` prints)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from roll.core.config.base import RollModel
from roll.core.config.reference import defaults_left, iter_keys, key_table, undescribed_keys


class Inner(RollModel):
    depth: int = Field(2, ge=1, description="how deep")


class Draw(RollModel):
    type: Literal["draw"] = "draw"
    k: int = 1


class Pull(RollModel):
    type: Literal["pull"] = "pull"
    rate: float = 0.5


class Outer(RollModel):
    name: str
    inner: Inner = Field(default_factory=Inner)
    items: list[Inner] = Field(default_factory=list)
    by_name: dict[str, Inner] = Field(default_factory=dict)
    algo: Draw | Pull = Field(default_factory=Draw)
    mode: Literal["a", "b"] | None = None


def test_every_key_with_type_default_and_description() -> None:
    docs = {d.path: d for d in iter_keys(Outer)}
    paths = [d.path for d in iter_keys(Outer)]
    assert paths == [
        "name",
        "inner",
        "inner.depth",
        "items",
        "items[].depth",
        "by_name",
        "by_name.<name>.depth",
        "algo",
        "algo.type",
        "algo.k",
        "algo.type",
        "algo.rate",
        "mode",
    ]
    assert (docs["name"].type, docs["name"].default) == ("str", "required")
    assert (docs["inner"].default, docs["inner.depth"].type) == ("(section)", "int (>= 1)")
    assert (docs["inner.depth"].default, docs["inner.depth"].description) == ("2", "how deep")
    assert docs["algo"].default == "type 'draw', its defaults" and docs["algo"].type == "Draw | Pull"
    assert docs["algo.rate"].description == "(type pull)" and docs["mode"].type == "'a' | 'b' | None"


def test_key_table_escapes_unions_and_skips_what_it_is_told() -> None:
    table = key_table(Outer, skip=frozenset({"items", "by_name"}))
    assert "| `mode` | 'a' or 'b' or None | `null` |  |" in table
    assert "items" not in table and "by_name" not in table


def test_defaults_left_lists_only_unset_leaves() -> None:
    config = Outer.model_validate({"name": "x", "inner": {"depth": 3}, "algo": {"type": "pull"}})
    left = dict(defaults_left(config))
    # inner was given with its only key; algo was given with its tag, so only its rate is a default
    assert left == {"items": "[]", "by_name": "{}", "algo.rate": "0.5", "mode": "null"}


def test_undescribed_keys_names_every_row_without_a_description() -> None:
    """In Outer only ``inner.depth`` and its copies under ``items[]`` and ``by_name.<name>`` have a description;
    Inner has no docstring, so its sections have none; a variant's ``(type x)`` tag alone is not a description.
    A description with an escaped pipe still counts as one."""
    table = key_table(Outer)
    assert undescribed_keys(table) == [
        "name", "inner", "items", "by_name", "algo", "algo.type", "algo.k", "algo.type", "algo.rate", "mode"
    ]  # fmt: skip
    described = '| `x` | int | `1` | (type a) one \\| two |\n| `y` | str | `""` | why y |'
    assert undescribed_keys(described) == []
    assert undescribed_keys("| key | type | default | description |\n|---|---|---|---|") == []
