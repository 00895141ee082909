"""Data in the forms people have it: ``save_to_disk`` folders, parquet and arrow files, hub ids (and the error
an offline machine gives), and chat columns (``messages``, ShareGPT's ``from``/``value``). Small files written
here; each test runs in well under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pytest
from transformers import PreTrainedTokenizerFast

from roll.core.errors import DataError
from roll.data.config import DatasetSourceConfig, TokenizeConfig
from roll.data.loading import load_source
from roll.data.tokenize import tokenize_dataset

ROWS = [{"question": f"what is {i}", "answer": str(i), "domain": "math"} for i in range(6)]
MAP = {"prompt": "question", "ground_truth": "answer", "tag": "domain"}
EXPECTED = [{"prompt": r["question"], "ground_truth": r["answer"], "tag": "math"} for r in ROWS]


def rows_of(ds: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in ds]


def write_arrow(path: Path, rows: list[dict[str, Any]]) -> Path:
    """An Arrow IPC stream file, the layout ``datasets``' arrow builder reads (and ``save_to_disk`` writes)."""
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return path


def test_disk_folder_parquet_and_arrow_give_the_same_rows(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_list(ROWS)
    ds.save_to_disk(str(tmp_path / "saved"))
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    write_arrow(tmp_path / "rows.arrow", ROWS)
    for path in ("saved", "rows.parquet", "rows.arrow"):
        loaded = load_source(DatasetSourceConfig(path=str(tmp_path / path), fields=MAP))
        assert rows_of(loaded) == EXPECTED, path
    streamed = load_source(DatasetSourceConfig(path=str(tmp_path / "rows.arrow"), fields=MAP), streaming=True)
    assert rows_of(streamed) == EXPECTED


def test_directory_of_arrow_files(tmp_path: Path) -> None:
    """Two files in name order: rows 0-2 from a.arrow, then 3-5 from b.arrow."""
    write_arrow(tmp_path / "a.arrow", ROWS[:3])
    write_arrow(tmp_path / "b.arrow", ROWS[3:])
    assert rows_of(load_source(DatasetSourceConfig(path=str(tmp_path), fields=MAP))) == EXPECTED


def test_offline_hub_error_explains_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # what this machine is; fail without retries
    with pytest.raises(DataError) as err:
        load_source(DatasetSourceConfig(path="openai/gsm8k", subset="main"))
    text = str(err.value)
    assert text.startswith("openai/gsm8k: could not load dataset")
    assert "cannot be reached" in text and "save_to_disk" in text and "path: DIR" in text
    assert "huggingface-cli download --repo-type dataset openai/gsm8k" in text


CHAT = [
    [{"role": "user", "content": "what is the answer ?"}, {"role": "assistant", "content": "yes"}],
    [{"role": "system", "content": "you are good"}, {"role": "user", "content": "hi"}],
]
SHAREGPT = [
    [
        {"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]), "value": m["content"]}
        for m in c
    ]
    for c in CHAT
]


def test_chat_columns_tokenize_alike(tmp_path: Path, tok: PreTrainedTokenizerFast) -> None:
    """A ``messages`` column and a ShareGPT ``conversations`` column (mapped by ``fields.messages``) give the
    same prompt ids; the prompt of row 0 ends with the generation prompt, not with the assistant's answer."""
    datasets.Dataset.from_list([{"messages": c} for c in CHAT]).to_parquet(str(tmp_path / "chat.parquet"))
    datasets.Dataset.from_list([{"conversations": c} for c in SHAREGPT]).to_json(str(tmp_path / "sg.jsonl"))
    cfg = TokenizeConfig(max_length=64)
    plain = load_source(DatasetSourceConfig(path=str(tmp_path / "chat.parquet")))
    sharegpt = load_source(
        DatasetSourceConfig(path=str(tmp_path / "sg.jsonl"), fields={"messages": "conversations"})
    )
    ids = [
        [r["prompt_ids"] for r in tokenize_dataset(d, kind="prompt", tokenizer=tok, cfg=cfg)[0]]
        for d in (plain, sharegpt)
    ]
    assert ids[0] == ids[1]
    tokens = tok.convert_ids_to_tokens(ids[0][0])
    assert tokens[-3:] == ["<|im_start|>", "assistant", "\n"] and "yes" not in tokens
    sft = tokenize_dataset(sharegpt.select([0]), kind="sft", tokenizer=tok, cfg=cfg)[0][0]
    assert tok.convert_ids_to_tokens(sft["input_ids"])[-3:] == ["yes", "<|im_end|>", "\n"]
