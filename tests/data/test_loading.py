"""Loading: every format and path kind, field mapping, mixing, held-out splits, streaming, and error messages."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import datasets
import pytest
from pydantic import ValidationError

from roll.core.errors import DataError
from roll.data.config import DataConfig, DatasetSourceConfig
from roll.data.loading import ensure_not_empty, load_data, load_source, split_eval

ROWS = [{"question": f"q{i}", "answer": str(i)} for i in range(20)]
MAP = {"prompt": "question", "ground_truth": "answer"}


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def src(path: Path | str, **kw: Any) -> DatasetSourceConfig:
    return DatasetSourceConfig(path=str(path), fields=kw.pop("fields", MAP), **kw)


def rows_of(ds: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in ds]


EXPECTED = [{"prompt": r["question"], "ground_truth": r["answer"]} for r in ROWS]


@pytest.mark.parametrize("fmt", ["jsonl", "json", "parquet", "csv"])
def test_each_file_format_loads_with_field_mapping(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"data.{fmt}"
    table = datasets.Dataset.from_list(ROWS)
    if fmt == "jsonl":
        write_jsonl(path, ROWS)
    elif fmt == "json":
        path.write_text(json.dumps(ROWS))
    elif fmt == "parquet":
        table.to_parquet(str(path))
    else:
        table.to_csv(str(path), index=False)
    ds = load_source(src(path))
    rows = rows_of(ds)
    if fmt == "csv":  # csv infers integers
        rows = [{**r, "ground_truth": str(r["ground_truth"])} for r in rows]
    assert rows == EXPECTED


def test_glob_and_directory_concatenate_files_in_name_order(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", ROWS[:10])
    write_jsonl(tmp_path / "b.jsonl", ROWS[10:])
    (tmp_path / "notes.txt").write_text("ignored")
    assert rows_of(load_source(src(tmp_path / "*.jsonl"))) == EXPECTED
    assert rows_of(load_source(src(tmp_path))) == EXPECTED


def test_save_to_disk_folder_and_split(tmp_path: Path) -> None:
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "one"))
    assert rows_of(load_source(src(tmp_path / "one"))) == EXPECTED
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:5]), "test": datasets.Dataset.from_list(ROWS[5:])}
    )
    dd.save_to_disk(str(tmp_path / "dict"))
    assert len(load_source(src(tmp_path / "dict", split="test"))) == 15
    with pytest.raises(DataError, match=r"no split 'dev'; splits found: \['test', 'train'\]"):
        load_source(src(tmp_path / "dict", split="dev"))


def test_hub_code_path_on_a_local_folder(tmp_path: Path) -> None:
    # datasets.load_dataset(path) is what a hub name goes through; a local folder takes the same call offline.
    repo = tmp_path / "my_org__my_set"
    repo.mkdir()
    write_jsonl(repo / "train.jsonl", ROWS)
    ds = load_source(src(repo, format="hub"))
    assert rows_of(ds) == EXPECTED


def test_unreachable_hub_name_is_a_data_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # fail fast instead of retrying the network
    with pytest.raises(DataError, match="no-such-org/no-such-dataset-xyz: could not load dataset"):
        load_source(src("no-such-org/no-such-dataset-xyz"))


def test_builtin_task_source() -> None:
    pytest.importorskip("roll.data.tasks")
    ds = load_source(DatasetSourceConfig(path="builtin:arithmetic", max_samples=6, builtin_kind="rl"))
    assert len(ds) == 6
    assert {"prompt", "messages", "ground_truth", "tag"} <= set(ds.column_names)
    with pytest.raises(ValidationError, match="set max_samples"):
        DatasetSourceConfig(path="builtin:arithmetic")


def test_max_samples_keeps_the_first_rows(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    assert rows_of(load_source(src(path, max_samples=3))) == EXPECTED[:3]
    assert rows_of(load_source(src(path, max_samples=3), streaming=True)) == EXPECTED[:3]


def test_malformed_jsonl_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "a", "answer": "1"}\n\n{"question": "b", "answer": \n{"question": "c"}\n')
    for streaming in (False, True):
        with pytest.raises(DataError, match=rf"malformed JSONL line: {path}:3: invalid JSON"):
            load_source(src(path), streaming=streaming)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (
            {"question": "q7", "note": "no answer"},
            "'answer' is missing or null \\(it feeds `ground_truth`\\)",
        ),
        ({"question": "q7", "answer": None}, "'answer' is missing or null"),
        ({"question": ["q", "7"], "answer": "7"}, "'question' is a list here but a str in the first row"),
    ],
)
def test_a_malformed_row_fails_at_load_naming_file_and_line(
    tmp_path: Path, line: dict[str, Any], reason: str
) -> None:
    """Line 9 (after a blank line 5) lacks or mistypes a field the other 19 rows have: the JSON builder would
    load it (null, or a ``Json`` column) and the run would fail at the step that first draws it."""
    path = tmp_path / "d.jsonl"
    lines = [json.dumps(r) for r in ROWS]
    lines[7] = json.dumps(line)
    path.write_text("\n".join([*lines[:4], "", *lines[4:]]) + "\n")
    for streaming in (False, True):
        with pytest.raises(DataError, match=rf"malformed JSONL line: {path}:9: {reason}"):
            load_source(src(path), streaming=streaming)
    if "missing" in reason:  # rows past max_samples are never used (a mixed-type file fails in the builder)
        assert len(load_source(src(path, max_samples=7))) == 7


def test_missing_mapped_column_lists_found_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(DataError) as err:
        load_source(src(path, fields={"prompt": "query_text"}))
    assert "fields.prompt: 'query_text' names a column that does not exist" in str(err.value)
    assert "columns found: ['question', 'answer']" in str(err.value)
    with pytest.raises(
        DataError,
        match=r"columns found: \['question', 'answer'\]\. Map your columns, e\.g\. `fields\.prompt: question`",
    ):
        load_source(src(path, fields={}))


def test_weighted_mixing_is_proportional_and_deterministic(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"a{i}", "tag": "a"} for i in range(3000)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"b{i}", "tag": "b"} for i in range(3000)])
    cfg = DataConfig(sources=[src(a, fields={}, weight=3.0), src(b, fields={}, weight=1.0)], seed=7)
    mixed = load_data(cfg).train
    head = Counter(mixed.select(range(2000))["tag"])  # before "first_exhausted" stops the mix
    assert head["a"] / 2000 == pytest.approx(0.75, abs=0.03)
    assert load_data(cfg).train["prompt"] == mixed["prompt"]
    other = load_data(cfg.model_copy(update={"seed": 8})).train
    assert other["prompt"] != mixed["prompt"]


def test_held_out_split_is_disjoint_and_deterministic(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(400)])
    cfg = DataConfig(sources=[src(path, fields={})], eval_fraction=0.25, seed=3)
    splits, again = load_data(cfg), load_data(cfg)
    assert isinstance(splits.eval, datasets.Dataset) and isinstance(again.eval, datasets.Dataset)
    train, held = set(splits.train["prompt"]), set(splits.eval["prompt"])
    assert not train & held
    assert len(train) + len(held) == 400
    assert 70 < len(held) < 130
    assert again.eval["prompt"] == splits.eval["prompt"]
    assert again.train["prompt"] == splits.train["prompt"]  # the shuffle is seeded too
    unshuffled = load_data(cfg.model_copy(update={"shuffle": False})).eval
    assert (
        unshuffled is not None and set(unshuffled["prompt"]) == held
    )  # membership does not depend on shuffling


def test_eval_sources(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "t.jsonl", ROWS)
    dev = write_jsonl(tmp_path / "v.jsonl", ROWS[:4])
    splits = load_data(DataConfig(sources=[src(train)], eval_sources=[src(dev)], shuffle=False))
    assert rows_of(splits.eval) == EXPECTED[:4]
    with pytest.raises(ValidationError, match="either eval_fraction or eval_sources"):
        DataConfig(sources=[src(train)], eval_sources=[src(dev)], eval_fraction=0.1)


def test_streaming_yields_the_same_rows(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}"} for i in range(200)])
    cfg = DataConfig(sources=[src(path, fields={})], eval_fraction=0.2, shuffle=False)
    eager = load_data(cfg)
    lazy = load_data(cfg.model_copy(update={"streaming": True}))
    assert isinstance(lazy.train, datasets.IterableDataset) and lazy.eval is not None
    assert isinstance(eager.eval, datasets.Dataset)
    assert [r["prompt"] for r in lazy.train] == eager.train["prompt"]
    assert [r["prompt"] for r in lazy.eval] == eager.eval["prompt"]
    shuffled = load_data(cfg.model_copy(update={"streaming": True, "shuffle": True, "shuffle_buffer": 50}))
    assert sorted(r["prompt"] for r in shuffled.train) == sorted(eager.train["prompt"])


def test_split_that_empties_the_data_names_the_step() -> None:
    one = datasets.Dataset.from_list([{"prompt": "x"}])
    with pytest.raises(DataError, match=r"tiny: no rows left after holding out eval_fraction=0\.999"):
        split_eval(one, 0.999, seed=0, source="tiny")
    with pytest.raises(DataError, match="no rows left after length filter"):
        ensure_not_empty(one.select([]), step="length filter", source="x")
