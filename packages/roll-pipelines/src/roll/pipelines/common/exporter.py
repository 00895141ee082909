"""The ``export`` hooks of the LLM modes (:attr:`roll.core.types.PipelineSpec.export`), behind ``roll export``.

Each mode names its exportable roles once: the config section the role was built from, the sub-dir of a
checkpoint that holds its files, and its head. The hook then rebuilds that model in this process, without Ray,
and writes it with :func:`roll.workers.export.export_role`. Light module (no torch): the spec modules import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from roll.core.errors import ConfigError
from roll.core.types import ExportHook

Head = Literal["causal_lm", "value", "score"]


@dataclass(frozen=True)
class ExportRole:
    """A trained role as a checkpoint holds it. ``section(config)`` is the role's config section (a
    ``TrainRoleConfig``: ``model`` and ``strategy``), or None when this run did not train it."""

    files: str
    head: Head
    section: Callable[[Any], Any]
    key: str


def checkpoint_exporter(roles: Mapping[str, ExportRole], default: str) -> ExportHook:
    """The export hook of a mode whose trained models are ``roles`` (``default`` when ``--role`` is not given)."""

    def export(config: Any, checkpoint: Path, out: Path, role: str | None) -> str:
        name = role or default
        if name not in roles:
            known = ", ".join(sorted(roles))
            raise ConfigError(f"--role {name!r}: pipeline {config.pipeline!r} exports {known}")
        spec = roles[name]
        section = spec.section(config)
        if section is None:
            raise ConfigError(
                f"--role {name!r}: this {config.pipeline!r} run trained no {name} ({spec.key} is off)"
            )
        from roll.workers.export import export_role

        loader = export_role(
            section.model, section.strategy, checkpoint / spec.files, out, role=spec.key, head=spec.head
        )
        return f"{name} ({spec.key}): load with transformers.{loader}.from_pretrained({{out}})"

    return export


def _actor(config: Any) -> Any:
    return config.actor_train


def _critic(config: Any) -> Any:
    return config.critic.resolved(config.actor_train) if config.needs_critic else None


def _student(config: Any) -> Any:
    return config.student


ACTOR_TRAIN = ExportRole("actor_train", "causal_lm", _actor, "actor_train")
"""sft and dpo: the trained model, under ``actor_train/``."""
REWARD_MODEL = ExportRole("reward_model", "score", _actor, "actor_train")
"""reward_model: a one-label sequence-classification model, under ``reward_model/``."""
POLICY_ROLES = {
    "actor": ExportRole("actor", "causal_lm", _actor, "actor_train"),
    "critic": ExportRole("critic", "value", _critic, "critic"),
}
"""The policy group's (rlvr, rlvr_vlm, distill_onpolicy, agentic): the actor and, under PPO, the critic (a
one-label token-classification model: the value per token)."""
STUDENT = ExportRole("student", "causal_lm", _student, "student")
"""distill: the student, under ``student/``."""

OFFLINE_EXPORT = checkpoint_exporter({"actor": ACTOR_TRAIN}, "actor")
REWARD_MODEL_EXPORT = checkpoint_exporter({"reward_model": REWARD_MODEL}, "reward_model")
POLICY_EXPORT = checkpoint_exporter(POLICY_ROLES, "actor")
DISTILL_EXPORT = checkpoint_exporter({"student": STUDENT}, "student")
