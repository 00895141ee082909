"""Pre-flight checks of the ``rlvr`` pipeline: what its config model cannot see alone, run before Ray starts.

``roll validate`` and ``roll train`` call :func:`rlvr_preflight` through the pipeline spec's ``preflight`` hook:

- every role's model path, and a chat template for the policy's tokenizer (:mod:`roll.pipelines.common.checks`);
- every reward domain's plugin and options (:func:`roll.pipelines.rewards.check.reward_issues`);
- the first rows of every data source (:func:`roll.data.peek.peek_data`): readable, a ``prompt`` or
  ``messages`` field (warm-up data: an SFT layout), and a ``tag`` that routes each row to a reward domain. With one
  domain, an untagged row goes to it (the reward scheduler does the same); with several, every row needs a tag;
  rows with images or videos need files that open and a vision-language policy.

:func:`rlvr_explain` says what the algorithm preset set, for ``roll validate --explain``.
"""

from __future__ import annotations

from typing import Any

from roll.core.errors import ConfigIssue
from roll.data.peek import Peek, peek_data
from roll.pipelines.algorithms.presets import PRESETS
from roll.pipelines.common.checks import chat_template_issues, model_issues, vision_issues
from roll.pipelines.rewards.check import reward_issues

PRESET_NOTES: dict[str, str] = {
    "kl_mode": "loss: the KL to the reference is a loss term, so a reference model runs",
    "loss_agg_mode": "how per-token losses become one number (see roll.pipelines.algorithms)",
}
DAPO_NOTE = (
    "note: roll's `dapo` preset is the DAPO algorithm (clip-higher 0.2/0.28, token-mean loss, dynamic sampling, "
    "soft overlong punishment). TRL's loss_type='dapo' is only a loss aggregation (per-token losses normalized "
    "by the active tokens of the batch), close to roll's loss_agg_mode: token-mean with none of the rest."
)


def rlvr_preflight(config: Any) -> list[ConfigIssue]:
    """Every problem found in the model paths, the reward domains and the first rows of the data sources."""
    role = "actor_train" if getattr(config, "actor_train", None) is not None else "actor_infer"
    issues = model_issues(config) + reward_issues(config.rewards)
    peeks, data_issues = peek_data(config.data, kind="prompt", where="data")
    issues += data_issues + tag_issues(peeks, config.rewards)
    issues += vision_issues(peeks, getattr(config, role).model.path, role=role)
    if getattr(config, "warmup", None) is not None:
        issues += peek_data(config.warmup.data, kind="sft", where="warmup.data")[1]
    return issues + chat_template_issues(config, role)


def tag_issues(peeks: list[Peek], rewards: dict[str, Any]) -> list[ConfigIssue]:
    """Rows whose tag no reward domain takes. With one domain an untagged row is fine: it goes there."""
    routes = {tag: name for name, domain in rewards.items() for tag in domain.tags or []}
    if any(domain.tags is None for domain in rewards.values()):
        return []  # the default domain (no `tags`) takes every row no other domain routes
    issues = []
    for peek in peeks:
        tags = [str(row.get("tag") or "") for row in peek.rows]
        if len(rewards) == 1:
            tags = [t for t in tags if t]  # untagged rows go to the only domain
        unrouted = sorted({t for t in tags if t not in routes})
        if not unrouted:
            continue
        if unrouted == [""] and "tag" not in peek.columns:
            message = f"rows have no `tag` column, and {len(rewards)} reward domains ({', '.join(rewards)}) need one to route each row"
            hint = "map the column that says the domain (fields.tag: <column>), or use one reward domain"
            issues.append(ConfigIssue(f"{peek.where}.fields", message, hint))
            continue
        shown = ", ".join(repr(t) for t in unrouted)
        message = f"rows tagged {shown} match no reward domain; routed tags: {sorted(routes)}"
        issues.append(
            ConfigIssue(f"{peek.where}", message, "add the tags to a domain's `rewards.<name>.tags`")
        )
    return issues


def rlvr_explain(config: Any) -> list[str]:
    """What ``algorithm.preset`` set, which of those the config overrides, and how roll's names differ."""
    algo = config.algorithm
    if algo.preset is None:
        return ["algorithm: no preset; every algorithm field is the config's or its default"]
    lines = [f"algorithm.preset: {algo.preset} sets"]
    for key, preset_value in PRESETS[algo.preset].items():
        value = getattr(algo, key)
        note = f"   # {PRESET_NOTES[key]}" if key in PRESET_NOTES and value == preset_value else ""
        if value != preset_value:
            note = f"   # overridden by the config: {key}: {value}"
        lines.append(f"  algorithm.{key}: {preset_value}{note}")
    if algo.preset == "dapo" or algo.loss_agg_mode == "token-mean":
        lines.append(DAPO_NOTE)
    return lines
