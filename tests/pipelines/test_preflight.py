"""Errors before start-up: ``roll validate`` (and ``roll train`` before Ray) peeks at the first rows of every data
source and checks the fields the config maps; ``roll validate --explain`` says what a preset sets.

In-process through :func:`roll.core.cli.load_run_config` on the quickstart with its data swapped for small
jsonl files this test writes; no Ray. About a second in all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from roll.core.cli import load_run_config, main
from roll.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, rows: list[dict[str, Any]], **changes: Any) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data["data"] = {"sources": [{"path": str(tmp_path / "rows.jsonl"), "fields": changes.pop("fields", {})}]}
    data.update(changes)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    return cfg


def issues_of(cfg: Path) -> dict[str, str]:
    load_run_config(cfg, [])  # the config model alone accepts every case here
    with pytest.raises(ConfigError) as err:
        load_run_config(cfg, [], preflight=True)
    return {issue.path: issue.message for issue in err.value.issues}


ROWS = [{"question": "1+1", "answer": "2"}, {"question": "2+2", "answer": "4"}]


def test_one_domain_accepts_untagged_rows(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, ROWS, fields={"prompt": "question", "ground_truth": "answer"})
    spec, config = load_run_config(cfg, [], preflight=True)
    assert spec.name == "rlvr" and len(config.rewards) == 1


def test_missing_mapped_column_and_missing_prompt(tmp_path: Path) -> None:
    issues = issues_of(write_config(tmp_path, ROWS, fields={"prompt": "q", "ground_truth": "answer"}))
    assert "fields.prompt: 'q' names a column that does not exist" in issues["data.sources.0.path"]
    assert "['question', 'answer']" in issues["data.sources.0.path"]
    issues = issues_of(write_config(tmp_path, ROWS, fields={"ground_truth": "answer"}))
    assert issues["data.sources.0.fields"].startswith("prompt rows need fields prompt or messages")


def test_two_domains_need_a_tag_column(tmp_path: Path) -> None:
    rewards = {
        "arith": {"type": "arithmetic", "tags": ["arithmetic"]},
        "exact": {"type": "exact_match", "tags": ["qa"]},
    }
    fields = {"prompt": "question", "ground_truth": "answer"}
    issues = issues_of(write_config(tmp_path, ROWS, fields=fields, rewards=rewards))
    assert "no `tag` column, and 2 reward domains (arith, exact)" in issues["data.sources.0.fields"]
    tagged = [{**r, "kind": k} for r, k in zip(ROWS, ["qa", "poetry"])]
    issues = issues_of(write_config(tmp_path, tagged, fields={**fields, "tag": "kind"}, rewards=rewards))
    assert (
        issues["data.sources.0"]
        == "rows tagged 'poetry' match no reward domain; routed tags: ['arithmetic', 'qa']"
    )


def test_validate_explain_prints_what_grpo_sets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The quickstart keeps grpo's estimator but overrides its KL (kl_mode none, coef 0) and aggregation."""
    assert main(["validate", "--explain", str(ROOT / "examples" / "quickstart.yaml")]) == 0
    out = capsys.readouterr().out
    assert "algorithm.preset: grpo sets" in out
    assert "algorithm.kl_coef: 0.04   # overridden by the config: kl_coef: 0.0" in out
    assert (
        "algorithm.loss_agg_mode: seq-mean-token-mean   # overridden by the config: loss_agg_mode: token-mean"
        in out
    )
    assert "TRL's loss_type='dapo' is only a loss aggregation" in out
    assert (
        main(
            [
                "validate",
                "--explain",
                str(ROOT / "examples" / "quickstart.yaml"),
                "~algorithm.kl_mode",
                "~algorithm.kl_coef",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "algorithm.kl_mode: loss   # loss: the KL to the reference is a loss term" in out
    assert "algorithm.kl_coef: 0.04\n" in out
