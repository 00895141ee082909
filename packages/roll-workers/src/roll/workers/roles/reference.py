"""``ReferenceWorker``: frozen forward-only log-probs (the KL anchor of RL). Any ``roll.strategy`` plugin works:
an infer strategy (``hf``, default) or a train strategy (``fsdp2``, to shard a large reference); neither trains."""

from __future__ import annotations

import torch

from roll.core import plugins
from roll.core.batch import Batch
from roll.core.cluster import Dispatch, Worker, WorkerContext, register
from roll.core.errors import WorkerError
from roll.core.types import StrategySpec
from roll.workers.roles import _common
from roll.workers.roles.model import check_vocab, load_causal_lm, load_tokenizer
from roll.workers.roles.spec import ScorerSpec
from roll.workers.types import ScoringStrategy


class FrozenScorer:
    """A causal LM behind a strategy, used forward-only (shared by the reference and teacher roles)."""

    def __init__(self, worker: Worker, spec: ScorerSpec) -> None:
        self.worker, self.spec = worker, spec
        self.strategy: ScoringStrategy  # built by setup()

    def setup(self) -> None:
        model_cfg, config, role = self.spec.model, self.spec.strategy, self.worker.role
        plugin: StrategySpec = plugins.load("roll.strategy", config.type)
        if plugin.kind == "train":
            _common.join_default_group(self.worker)
        model = load_causal_lm(model_cfg, role)
        tokenizer = load_tokenizer(model_cfg, role)
        check_vocab(tokenizer, model, model_cfg, role)
        model.requires_grad_(False)
        if plugin.kind == "infer":
            self.strategy = _common.build_infer(plugin, config, model, role, tokenizer=tokenizer)
        else:
            self.strategy = _common.build_train(plugin, config, model, role)

    def module(self) -> torch.nn.Module:
        """The scorer's torch module, for forwards of its own (top-k logits); hf and fsdp2 keep one."""
        model = getattr(self.strategy, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise WorkerError(
                f"{self.worker.role}: strategy {self.spec.strategy.type!r} keeps no torch module in this process; "
                "use strategy type hf or fsdp2 for this role"
            )
        return model

    @torch.no_grad()
    def logprobs(self, batch: Batch, temperature: float, with_entropy: bool) -> Batch:
        return _common.logprobs_of(self.strategy, batch, temperature, with_entropy)


class ReferenceWorker(Worker):
    """One replica of the frozen reference policy (``spec``: the model and its strategy, ``hf`` by default)."""

    def __init__(self, ctx: WorkerContext, spec: ScorerSpec) -> None:
        super().__init__(ctx)
        self.scorer = FrozenScorer(self, spec)

    @register(Dispatch.ONE_TO_ALL)
    def setup(self) -> None:
        self.scorer.setup()

    @register(Dispatch.DP_SPLIT)
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0, with_entropy: bool = False) -> Batch:
        """``logp_BT`` (and ``entropy_BT``) of ``input_ids_BT`` under the reference weights."""
        return self.scorer.logprobs(batch, temperature, with_entropy)

    @register(Dispatch.ONE_TO_ALL)
    def offload(self) -> None:
        self.scorer.strategy.offload()

    @register(Dispatch.ONE_TO_ALL)
    def reload(self) -> None:
        self.scorer.strategy.reload()
