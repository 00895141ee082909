"""Worker roles: Ray actors (``roll.core.cluster.Worker`` subclasses) that hold one strategy each.

Each role takes one argument, a frozen spec of what it builds (:mod:`roll.workers.roles.spec`: ``TrainerSpec``,
``GeneratorSpec``, ``HybridSpec``, ``ScorerSpec``); the spec's strategy config names, by its ``type``, the
``roll.strategy`` plugin that builds it, so vllm/megatron plug in without changes here. Build a role with
``Cluster(role, WorkerCls, role_cfg, init_args=(spec,))`` and call ``cluster.setup()`` first (it joins the role's
process group when it has several ranks and loads the model).
Every role subclasses ``Worker`` directly; shared behaviour comes from parts it holds (see
:mod:`roll.core.cluster.dispatch`): :class:`~roll.workers.roles.actor.PolicyTrainer` (a trained policy's methods),
:class:`~roll.workers.roles.sender.WeightSender` (the model update's sending end) and
:class:`~roll.workers.roles.topk_receiver.TopkReceiver` (a distillation student's top-k receiving end).
Column names are in :mod:`roll.core.columns`.

Registered methods (dispatch mode) by role:

- :class:`ActorTrainWorker` ``(TrainerSpec)``, parts ``trainer`` (``PolicyTrainer``), ``sender``
  (``WeightSender``) and ``transfer`` (``TopkReceiver``):
  ``setup()`` ALL; ``train_step(batch, loss_fn, temperature=1.0) -> list[dict]`` MP (per-DP-rank metrics: loss,
  grad_norm, lr, tokens, units, and the loss's own as ``actor/<name>``; critic: ``critic/<name>``, reward model:
  ``reward/<name>``); ``compute_logprobs(batch, temperature=1.0, with_entropy=False) -> Batch``
  MP (``logp_BT``, ``entropy_BT``); ``save_checkpoint(path)`` / ``load_checkpoint(path)`` / ``export_hf(path)`` /
  ``offload()`` / ``reload()`` ALL (each returns ``seconds`` and ``freed_bytes``); ``weights_checksum(dtype=None) -> list[str]`` ALL (rank 0's is the one);
  model update: ``stage_weights`` / ``weight_bucket`` / ``share_weight_bucket`` (CUDA IPC) / ``release_weights`` /
  ``update_endpoint`` /
  ``join_update_group`` / ``broadcast_weights`` (driven by :class:`~roll.workers.model_update.ModelUpdateGroup`;
  a LoRA trainer sends its adapter only); distillation: ``join_transfer_group`` ALL,
  ``receive_topk(batch, name, num_sources, k, key="topk") -> Batch`` DP.
- :class:`ActorInferWorker` ``(GeneratorSpec)``: ``setup()`` ALL;
  ``generate(prompts, params: SamplingParams) -> Batch`` DP (n rows per prompt, seeded by each row's
  ``prompt_seed_B`` when given; see :func:`~roll.data.sequences.to_sequences`); ``compute_logprobs(batch, temperature=1.0,
  with_entropy=False) -> Batch`` DP; ``update_weights(bucket_refs, policy_version)`` / ``update_weights_ipc`` / ``join_update_group`` /
  ``receive_weights(name, policy_version)`` ALL; ``policy_version() -> list[int]`` ALL;
  ``weights_checksum(dtype=None) -> list[str]`` ALL; ``offload()`` / ``reload()`` ALL.
- :class:`HybridActorWorker` ``(HybridSpec)``: both in one process, and one cluster of it can be a pipeline's
  train and infer cluster at once. Parts ``trainer`` (``PolicyTrainer``: every method of ``ActorTrainWorker``'s
  above, ``weights_checksum`` the trainer's) and ``sender`` (``WeightSender``, so
  ``ModelUpdateGroup(hybrid, reference)`` sends its trainer's weights to another process); its own (the
  ``ActorInferWorker`` ones with the same signatures and dispatch): ``generate`` DP, ``policy_version()`` ALL,
  ``served_checksum(dtype=None) -> list[str]`` ALL (the served weights'); overrides of the trainer's (same
  signatures): ``setup()`` (both strategies), ``offload()`` / ``reload()`` ALL (both sides), and for one side
  ``offload_side(side)`` / ``reload_side(side)`` ALL (``"train"`` or ``"infer"``); the model update is
  ``sync_weights(policy_version) -> list[int]`` ALL (in process), which ``ModelUpdateGroup(hybrid, hybrid)``
  uses (mode ``in_process``).
- :class:`ReferenceWorker` ``(ScorerSpec)``: ``setup()``,
  ``compute_logprobs(batch, temperature=1.0, with_entropy=False) -> Batch`` DP, ``offload``/``reload``.
- :class:`CriticWorker` ``(TrainerSpec)``: ``setup()``,
  ``compute_values(batch) -> Batch`` MP (``values_BT``), ``train_step(batch, loss_fn)`` MP (the loss reads
  ``ForwardOutput.values_BT``), ``save_checkpoint``/``load_checkpoint``/``export_hf``/``offload``/``reload``.
- :class:`RewardModelWorker` ``(TrainerSpec)``: ``setup()``, ``score(batch) -> Batch`` MP (``scores_B``),
  ``train_step(batch, loss_fn)`` MP (the loss reads ``ForwardOutput.scores_B``), ``export_hf`` and checkpoints.
- :class:`TeacherWorker` ``(ScorerSpec)``: ``setup()``,
  ``compute_logprobs`` DP, ``topk_logits(batch, k) -> Batch`` DP (``topk_values_BTK``, ``topk_indices_BTK``),
  ``transfer_endpoint()`` RANK_ZERO, ``join_transfer_group`` ALL, ``send_topk(batch, k, name, num_sources,
  key="topk")`` DP (one round of channel ``key`` per call; see :mod:`roll.workers.logits_transfer`).

DP = ``Dispatch.DP_SPLIT`` (rows split evenly, padding removed from the result), MP = ``Dispatch.MP_SPLIT`` (rows
split by data-parallel rank, every TP/PP rank called, one result per DP group; the cluster's mesh comes from the
strategy config, so with fsdp2 it is DP), ALL = ``Dispatch.ONE_TO_ALL``
(result: list by rank). Importing this package is light: each name below is imported on first use (PEP 562),
so config modules that import :mod:`roll.workers.roles.config` don't pull in torch and Ray. A driver that must not
import torch at all builds its clusters from :func:`role_ref` (``Cluster(role, role_ref("ActorTrainWorker"), ...)``):
the class is imported in the actors only.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from roll.core.cluster.worker import WorkerRef

if TYPE_CHECKING:
    from roll.workers.roles.actor import ActorTrainWorker
    from roll.workers.roles.config import ModelConfig
    from roll.workers.roles.critic import CriticWorker
    from roll.workers.roles.hybrid import HybridActorWorker
    from roll.workers.roles.infer import ActorInferWorker
    from roll.workers.roles.model import load_causal_lm, load_model, load_tokenizer
    from roll.workers.roles.reference import ReferenceWorker
    from roll.workers.roles.reward_model import RewardModelWorker
    from roll.workers.roles.teacher import TeacherWorker

_WHERE = {
    "ActorTrainWorker": "actor",
    "ModelConfig": "config",
    "CriticWorker": "critic",
    "HybridActorWorker": "hybrid",
    "ActorInferWorker": "infer",
    "load_causal_lm": "model",
    "load_model": "model",
    "load_tokenizer": "model",
    "ReferenceWorker": "reference",
    "RewardModelWorker": "reward_model",
    "TeacherWorker": "teacher",
}


def role_ref(name: str) -> WorkerRef:
    """The role class ``name`` (``"ActorTrainWorker"``) as a :class:`~roll.core.cluster.WorkerRef`: a Cluster of
    it imports the class's module (and torch) in its actors only, never in the driver."""
    module = _WHERE.get(name)
    if module is None or not name.endswith("Worker"):
        known = sorted(n for n in _WHERE if n.endswith("Worker"))
        raise AttributeError(f"no worker role {name!r} in {__name__}; known: {known}")
    return WorkerRef(f"{__name__}.{module}", name)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "ActorInferWorker",
    "ActorTrainWorker",
    "CriticWorker",
    "HybridActorWorker",
    "ModelConfig",
    "ReferenceWorker",
    "RewardModelWorker",
    "TeacherWorker",
    "load_causal_lm",
    "load_model",
    "load_tokenizer",
    "role_ref",
]
