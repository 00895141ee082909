"""On-policy distillation, run through the RLVR machinery as a mode (not a copy of it).

The student samples (RLVR's generate and score steps, rewards included), one or more frozen teachers score the
student's own tokens, and the advantage is built from the per-token negative log-ratio (Agarwal et al. 2024,
"On-Policy Distillation of Language Models"; Lu & Thinking Machines 2025, "On-Policy Distillation")::

    r_t = -(log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t))
    D_t = sum_{k >= t} gamma^(k - t) r_k          (onpolicy.gamma; 0: D_t = r_t)
    A_t = distill_coef * baseline(D)_t + rl_coef * A_t^RL

With the policy-gradient loss and ``rl_coef = 0``, ``gamma = 1`` gives the REINFORCE gradient of the reverse KL
of whole sequences ``KL(pi_student(y) || pi_teacher(y))`` on the student's own samples (mode seeking: the student
learns from the teacher where the student actually goes); ``gamma = 0`` drops the future log-ratios (the per-token
reverse KL). ``onpolicy.advantage_baseline`` subtracts the batch mean of ``D`` over response tokens (a constant:
the expected gradient is unchanged, the variance lower; the raw log-ratio averages about -0.7 a token on the
built-in task, so without it nearly every sampled token is pushed down) and ``whiten`` also divides by its std.
``rl_coef > 0`` adds the RL advantage of the configured preset.

Pieces:

- :func:`~roll.pipelines.algorithms.distill.distill_advantages` (in ``algorithms``) and :func:`route_by_tag` are
  pure (tensors and lists in, tensors and indices out); any pipeline can call them.
- :class:`TeacherPanel` holds the teacher clusters and returns ``teacher_logp_BT`` for a batch, each row scored by
  the teacher its ``tag`` routes to.
- :class:`OnPolicyDistill` is the :class:`~roll.pipelines.rlvr.transform.AdvantageTransform` that RLVR's pipeline
  composes (teacher roles, their warm-up, the advantage mix); generation, rewards, the loss, weight sync,
  evaluation and checkpoints are RLVR's, and the mode is a plugin of its own (``distill_onpolicy``), not a subclass.

The student's log-probs are the sampler's (``infer_logp_BT``): on-policy, the inference workers serve the
trainer's weights, so they are the student's (up to kernel differences); with several optimizer steps per step
RLVR's ``old_logp_BT`` (a trainer forward) is used instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.config.sections import RoleConfig
from roll.core.errors import DataError
from roll.data.tasks import get_task, is_builtin
from roll.pipelines.algorithms.distill import distill_advantages
from roll.pipelines.common.data import prepare_data
from roll.pipelines.distill.checks import check_same_tokenizer
from roll.pipelines.distill.onpolicy_config import OnPolicyDistillConfig
from roll.pipelines.distill.warmup import greedy_accuracy, warm_up_teacher
from roll.pipelines.policy.group import SetUp
from roll.pipelines.policy.views import training_view
from roll.pipelines.rlvr.transform import TransformContext
from roll.workers.roles.spec import ScorerSpec
from roll.workers.roles.teacher import TeacherWorker

if TYPE_CHECKING:
    from roll.pipelines.sft.clusters import SFTCluster
    from roll.workers.roles.clusters import TeacherCluster

logger = logging.getLogger(__name__)


def route_by_tag(tags: Sequence[Any], routes: Mapping[str, Sequence[str] | None]) -> dict[str, list[int]]:
    """Row indices per teacher: a row goes to the teacher listing its tag, else to the one with ``None`` tags.

    A tag no teacher takes raises :class:`DataError` naming it and the routes.
    """
    by_tag = {tag: name for name, tags_ in routes.items() for tag in tags_ or []}
    default = next((name for name, tags_ in routes.items() if tags_ is None), None)
    rows: dict[str, list[int]] = {name: [] for name in routes}
    for i, tag in enumerate(tags):
        name = by_tag.get(str(tag), default)
        if name is None:
            known = {n: list(t) if t is not None else "*" for n, t in routes.items()}
            raise DataError(f"sample tag {tag!r} has no teacher; teachers and their tags: {known}")
        rows[name].append(i)
    return rows


class TeacherPanel:
    """Teacher clusters by name, each scoring the rows whose tag routes to it."""

    def __init__(
        self, clusters: Mapping[str, TeacherCluster], routes: Mapping[str, Sequence[str] | None]
    ) -> None:
        self.clusters, self.routes = dict(clusters), dict(routes)

    def logprobs(self, batch: Batch, tags: Sequence[Any], temperature: float = 1.0) -> torch.Tensor:
        """``teacher_logp_BT`` of ``batch`` (``input_ids_BT``/``attention_mask_BT``), teachers called in parallel."""
        rows = route_by_tag(tags, self.routes)
        pending = {
            name: self.clusters[name].compute_logprobs.submit(batch.select(idx), temperature)
            for name, idx in rows.items()
            if idx
        }
        out_BT = torch.zeros(batch.tensors[C.INPUT_IDS].shape, dtype=torch.float32)
        for name, call in pending.items():
            out_BT[torch.tensor(rows[name])] = call.result().tensors[C.LOGP].float()
        return out_BT


class OnPolicyDistill:
    """The :class:`~roll.pipelines.rlvr.transform.AdvantageTransform` of on-policy distillation: teacher roles,
    their optional warm-up, and the distillation advantage mixed into RLVR's (see the module docstring)."""

    def __init__(self, config: OnPolicyDistillConfig) -> None:
        self.config = config
        self.teachers: TeacherPanel | None = None
        self._reverse_kl = 0.0

    def roles(self) -> Mapping[str, RoleConfig]:
        return {f"teacher_{n}": t for n, t in self.config.teachers.items()}

    def prepare(self, context: TransformContext) -> list[SetUp]:
        """Warm up the teachers that ask for it, then start one frozen cluster per teacher."""
        models = {name: self._teacher_model(context, name) for name in self.config.teachers}
        clusters = {
            name: cast(
                "TeacherCluster",
                context.host.make_cluster(
                    f"teacher_{name}", TeacherWorker, init_args=(ScorerSpec(model=model),)
                ),
            )
            for name, model in models.items()
        }
        self.teachers = TeacherPanel(clusters, {n: t.tags for n, t in self.config.teachers.items()})
        return list(clusters.values())

    def _teacher_model(self, context: TransformContext, name: str) -> Any:
        """The teacher's model after its optional warm-up; its tokenizer is checked against the student's."""
        teacher = self.config.teachers[name]
        self._check_tokenizer(context.tokenizer, name, teacher.model.tokenizer or teacher.model.path)
        if teacher.warmup is None:
            return teacher.model
        data = teacher.warmup.data or (self.config.warmup.data if self.config.warmup else None)
        if data is None:
            raise DataError(f"teachers.{name}.warmup needs data: set teachers.{name}.warmup.data (SFT rows)")
        rows = prepare_data(data, self.config.tokenize, kind="sft", tokenizer=context.tokenizer).train
        return warm_up_teacher(
            context.host, f"teacher_{name}", teacher, teacher.warmup, rows=rows,
            pad_id=context.tokenizer.pad_token_id, summary=partial(self._accuracy, context),
        )  # fmt: skip

    def _accuracy(self, context: TransformContext, cluster: SFTCluster) -> dict[str, float]:
        """Greedy accuracy of a warmed-up teacher on the held-out prompts (``accuracy``, the prompts and token
        budget of the student's ``eval/accuracy``) and on up to 64 training prompts (``train_accuracy``: what it
        can teach), when a ``builtin:`` task verifies them."""
        sources = self.config.data.eval_sources or self.config.data.sources
        if not is_builtin(sources[0].path):
            return {}
        v = self.config.validation
        score = partial(
            greedy_accuracy, cluster, verify=get_task(sources[0].path, **sources[0].builtin_options).verify,
            tokenizer=context.tokenizer, batch_size=v.num_prompts,
            max_new_tokens=v.max_new_tokens or self.config.rollout.max_new_tokens,
        )  # fmt: skip
        train = context.train_rows[: max(v.num_prompts, 64)]
        out = {
            "train_accuracy": score([r[C.PROMPT_IDS] for r in train], [str(r[C.GROUND_TRUTH]) for r in train])
        }
        if context.eval_prompts is not None:
            ids, truths = context.eval_prompts[C.PROMPT_IDS], context.eval_prompts[C.GROUND_TRUTH]
            out["accuracy"] = score(list(ids), [str(t) for t in truths])
        return out

    def _check_tokenizer(self, student: Any, name: str, reference: str) -> None:
        from roll.pipelines.common.data import load_tokenizer

        model = self.config.policy_model
        key = "actor_train.model.tokenizer" if model.tokenizer else "actor_train.model.path"
        t_key = (
            f"teachers.{name}.model.{'tokenizer' if self.config.teachers[name].model.tokenizer else 'path'}"
        )
        check_same_tokenizer(
            student, load_tokenizer(reference), student_ref=model.tokenizer or model.path,
            teacher_ref=reference, student_key=key, teacher_key=t_key,
        )  # fmt: skip

    def advantages(self, batch: Batch) -> Batch:
        """The teachers' log-ratio mixed into RLVR's advantages (rewards, KL, old log-probs already there)."""
        assert self.teachers is not None  # prepare() ran
        s = self.config.onpolicy
        mask_BT = batch.tensors[C.RESPONSE_MASK].float()
        seqs = training_view(batch, (C.INPUT_IDS, C.ATTENTION_MASK, C.RESPONSE_MASK))
        teacher_BT = (
            self.teachers.logprobs(seqs, list(batch[C.TAG]), self.config.rollout.temperature) * mask_BT
        )
        student_BT = batch.tensors[C.OLD_LOGP] if C.OLD_LOGP in batch else batch.tensors[C.INFER_LOGP]
        batch[C.TEACHER_LOGP] = teacher_BT
        batch[C.ADVANTAGES] = distill_advantages(
            student_BT * mask_BT, teacher_BT, mask_BT, distill_coef=s.distill_coef,
            rl_advantages_BT=batch.tensors[C.ADVANTAGES], rl_coef=s.rl_coef, clip=s.clip,
            gamma=s.gamma, baseline=s.advantage_baseline,
        )  # fmt: skip
        self._reverse_kl = float((student_BT * mask_BT - teacher_BT).sum() / mask_BT.sum().clamp(min=1))
        return batch

    def metrics(self) -> dict[str, float]:
        return {"distill/reverse_kl": self._reverse_kl}
