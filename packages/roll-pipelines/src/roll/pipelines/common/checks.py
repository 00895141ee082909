"""Pre-flight checks the training modes share; each pipeline spec's ``preflight`` is a list of them.

``roll validate`` and ``roll train`` (before Ray starts) run them through :func:`roll.core.startup.startup_issues`.
They read config and small files only: model folders' ``config.json`` and tokenizer files
(:mod:`roll.data.model_check`), the first rows of every data source (:func:`roll.data.peek.peek_data`), and the
images those rows name. No weights are loaded and no preset model is built. Every issue names its key path.

- :func:`model_issues`: every role's ``model.path`` (and ``model.tokenizer``) exists when it is a local path;
- :func:`data_issues`: every source (training and eval) readable, with the fields its layout needs, the columns
  its ``fields:`` map names, its images and videos readable and a vision-language model to take them;
- :func:`chat_template_issues`: chat data needs a chat template: the tokenizer's own, or ``tokenize.template``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from roll.core.config.schema import sections_of
from roll.core.errors import ConfigIssue, DataError
from roll.data.model_check import has_chat_template, is_vision_language_files, model_path_issues
from roll.data.peek import Peek, peek_data
from roll.data.templates import TEMPLATES
from roll.data.tokenize import Kind
from roll.workers.roles.config import ModelConfig

Check = Callable[[Any], list[ConfigIssue]]


def model_issues(config: Any) -> list[ConfigIssue]:
    """A local model or tokenizer path that does not exist, or is no ``save_pretrained`` folder, in any role."""
    issues = []
    for where, model in sections_of(config, ModelConfig):
        issues += model_path_issues(model.path, where=f"{where}.path")
        if model.tokenizer is not None:
            issues += model_path_issues(model.tokenizer, where=f"{where}.tokenizer", tokenizer_only=True)
    return issues


def chat_template_issues(config: Any, role: str) -> list[ConfigIssue]:
    """``tokenize.template`` unset while the tokenizer of ``role`` has no chat template: every row (messages,
    prompt/response, pairs) is rendered through one. Unknown for a hub id that is not cached: not reported."""
    if config.tokenize.template is not None:
        return []
    model = getattr(config, role).model
    ref = model.tokenizer or model.path
    if has_chat_template(ref) is not False:
        return []
    key = f"{role}.model.tokenizer" if model.tokenizer else f"{role}.model.path"
    message = f"the tokenizer of {key} ({ref!r}) has no chat template, and every row is rendered with one"
    return [
        ConfigIssue("tokenize.template", message, f"name a fallback template: {', '.join(sorted(TEMPLATES))}")
    ]


def data_issues(config: Any, *, kind: Kind, role: str, where: str = "data") -> list[ConfigIssue]:
    """The sources of ``config.<where>`` peeked for layout ``kind``; rows with images or videos need a
    vision-language model in ``role``, and their first rows' files must open."""
    data = config
    for part in where.split("."):
        data = getattr(data, part)
    peeks, issues = peek_data(data, kind=kind, where=where)
    return issues + vision_issues(peeks, getattr(config, role).model.path, role=role)


def vision_issues(peeks: list[Peek], model_path: str, *, role: str) -> list[ConfigIssue]:
    """Peeked rows whose images or videos do not open, or that carry them for a model that is not a VLM."""
    from roll.data.video import load_video, row_videos
    from roll.data.vision import load_image, row_images

    issues = []
    for peek in peeks:
        visual = [(i, row) for i, row in enumerate(peek.rows) if row_images(row) or row_videos(row)]
        if not visual:
            continue
        if is_vision_language_files(model_path) is False:
            message = f"rows carry images or videos, but {role}.model.path {model_path!r} is not a vision-language model"
            hint = "use a VLM (a tiny-vl-* preset, a Qwen2-VL / Qwen2.5-VL folder or hub id)"
            issues.append(ConfigIssue(f"{peek.where}.path", message, hint))
        try:
            for i, row in visual:
                for k, image in enumerate(row_images(row)):
                    load_image(image, row=i, index=k)
                for k, video in enumerate(row_videos(row)):
                    load_video(video, row=i, index=k)
        except DataError as exc:
            issues.append(ConfigIssue(f"{peek.where}.path", str(exc), "fix the file paths the rows name"))
    return issues


def offline_preflight(kind: Kind, role: str = "actor_train") -> Check:
    """The ``preflight`` of an offline mode (sft, dpo, reward_model, distill) training ``role`` on ``kind`` rows."""

    def preflight(config: Any) -> list[ConfigIssue]:
        issues = model_issues(config)
        issues += data_issues(config, kind=kind, role=role)
        return issues + chat_template_issues(config, role)

    return preflight
