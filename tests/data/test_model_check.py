"""Start-up checks of model references (roll.data.model_check): they read small files only and build no preset."""

from __future__ import annotations

import json
from pathlib import Path

from roll.data.model_check import has_chat_template, is_vision_language_files, model_path_issues
from roll.data.models import missing_model_path


def test_missing_local_paths_are_named_and_hub_ids_and_presets_pass(tmp_path: Path) -> None:
    assert "'/nope/model' does not exist" in (missing_model_path("/nope/model") or "")
    assert "does not exist" in (missing_model_path("./nope") or "")
    assert "does not exist" in (missing_model_path("outputs/sft/hf") or "")  # two slashes: not a hub id
    assert missing_model_path("Qwen/Qwen2.5-0.5B-Instruct") is None  # never fetched to check
    assert missing_model_path("tiny-1m") is None and missing_model_path("tiny-vl-1m") is None
    assert missing_model_path(str(tmp_path)) is None
    (issue,) = model_path_issues("/nope/model", where="actor_train.model.path")
    assert issue.path == "actor_train.model.path"


def test_a_folder_must_be_a_save_pretrained_folder(tmp_path: Path) -> None:
    (issue,) = model_path_issues(str(tmp_path), where="critic.model.path")
    assert issue.path == "critic.model.path" and "without config.json" in issue.message
    (issue,) = model_path_issues(str(tmp_path), where="actor_train.model.tokenizer", tokenizer_only=True)
    assert "holds no tokenizer files" in issue.message
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_path_issues(str(tmp_path), where="x") == []
    assert model_path_issues(str(tmp_path), where="x", tokenizer_only=True) == []


def test_chat_template_and_vision_are_read_from_the_files(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert has_chat_template(str(tmp_path)) is False
    assert is_vision_language_files(str(tmp_path)) is False
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2_vl", "vision_config": {}}))
    assert has_chat_template(str(tmp_path)) is True and is_vision_language_files(str(tmp_path)) is True
    assert has_chat_template("tiny-1m") is True and is_vision_language_files("tiny-1m") is False
    assert is_vision_language_files("tiny-vl-1m") is True
    assert has_chat_template("no-such-org/no-such-model") is None  # a hub id not in the cache: unknown
