"""The strategy protocols of roll-workers and the plain values they exchange.

Map of the abstractions:

- A *strategy* owns one model replica (or one shard of it) on one worker and knows one backend. Worker roles
  (actor, infer, reference, critic ...) hold a strategy and add dispatch, data movement and versioning around it.
- :class:`InferStrategy` (``kind="infer"``; hf, vllm): ``generate`` samples continuations of token-id prompts,
  ``compute_logprobs`` scores given sequences forward-only, ``load_weights`` receives named tensors from the
  trainer and records the ``policy_version`` they belong to, so a rollout can say which weights produced it.
- :class:`TrainStrategy` (``kind="train"``; fsdp2, megatron): ``train_step`` cuts a batch into micro-batches,
  accumulates gradients over them with exact token-level accumulation and takes one optimizer step: the one path
  every training role and every test goes through; ``lr``/``set_lr`` read and rebase the LR schedule;
  ``state_dict`` gathers full (LoRA-merged) weights for export and for the model update, ``lora_state_dict`` the
  adapter alone; ``model_state_dict``/``load_model_state_dict`` and ``save_optimizer``/``load_optimizer`` are the
  checkpoint; ``forward_only`` gives a custom head's outputs (values, scores).
- Both ``offload``/``reload`` so colocated roles can time-share a device between phases, and both score
  (:class:`ScoringStrategy`), so a frozen reference or teacher takes either kind.
- :class:`LossFn`: the trainer's contract with algorithms. It returns a *sum* over its units (tokens, sequences)
  and the strategy divides by the global unit count across all micro-batches and ranks, so gradient accumulation
  and data parallelism equal one big batch exactly. With the sum it returns its metrics (means over the
  micro-batch's units), which the strategy weights by units (:class:`roll.workers.metrics.UnitWeightedMeans`).
  What a loss may ask beyond ``logp_BT`` (entropy, scored positions, paired rows, inert rows) it declares as
  members of the protocol; :class:`LossDefaults` gives the "not asked" value of each, so nothing is probed.
- :data:`MicroBatch`: one key vocabulary from the driver to the loss, the :mod:`roll.core.columns` names.
- Strategy specs (:data:`roll.workers.specs.HF`, :data:`roll.workers.specs.FSDP2`) are the ``roll.strategy``
  entry points; they build these objects.

Log-prob convention, shared by every strategy: ``logp_BT[b, t] = log p(ids[b, t] | ids[b, :t])`` under
``log_softmax(logits / temperature)`` (the temperature-scaled distribution, *before* top-k/top-p truncation);
positions with no prediction (padding, the first token of a sequence) hold 0. Entropy is aligned the same way.
With ``score_without_vision_tokens`` (off by default) a vision-language model's softmax leaves out its vision
markers, which no sampler emits (:func:`roll.workers.vision.vision_token_ids`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from roll.core.errors import WorkerError

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from roll.workers.config import LoraConfig, SamplingParams
    from roll.workers.metrics import LossMetrics

FinishReason = Literal["stop", "length", "abort"]
"""``abort``: a partial-rollout sample cut at its segment budget, to be continued (never trained on)."""

MicroBatch = Mapping[str, "torch.Tensor"]
"""Tensors of one micro-batch under their :mod:`roll.core.columns` names, the same keys the driver's
:class:`~roll.core.batch.Batch` uses (:func:`roll.workers.roles._common.micro_batch` only drops the DP pad column).
Padded layout: :data:`~roll.core.columns.INPUT_IDS` and :data:`~roll.core.columns.ATTENTION_MASK` (``input_ids_BT``,
``attention_mask_BT``) ``[B, T]``, left- or right-padded, or both; every further column (``labels_BT``,
``response_mask_BT``, ``advantages_BT`` ...) is passed through to the loss function unchanged. In a training call
the rows' vision lists (:data:`~roll.core.columns.VISION_COLUMNS`, one entry per row) ride along."""


@dataclass(frozen=True)
class GeneratedSample:
    """One sampled continuation.

    ``token_ids`` include the stop token that ended the sample (its log-prob is in ``logprobs``), so training sees
    how to stop. ``text`` (when the strategy has a tokenizer) excludes special tokens and is cut before a matched
    stop string. ``logprobs[i]`` is the log-prob of ``token_ids[i]`` under the temperature-scaled distribution
    (temperature 1 for greedy), the same quantity ``compute_logprobs(..., temperature=T)`` returns.
    """

    prompt_index: int
    sample_index: int
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    text: str | None = None
    policy_version: int = 0


@dataclass(frozen=True)
class TokenScores:
    """Forward-only scores of given sequences: ``logp_BT`` and (when asked) ``entropy_BT``, both ``[B, T]``."""

    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None = None


@dataclass(frozen=True)
class ForwardOutput:
    """What a :class:`LossFn` receives for one micro-batch, in the micro-batch's padded ``[B, T]`` layout.

    A causal LM fills ``logp_BT`` (and ``entropy_BT`` when asked). A value head (critic) fills ``values_BT`` and a
    sequence-score head (reward model) ``scores_B``; those leave ``logp_BT`` as an empty ``[B, 0]`` tensor, so a
    log-prob loss given to them fails on the shape instead of training on zeros.
    """

    logp_BT: torch.Tensor
    entropy_BT: torch.Tensor | None = None
    values_BT: torch.Tensor | None = None
    scores_B: torch.Tensor | None = None


@dataclass(frozen=True)
class TrainStepResult:
    """Metrics of one optimizer step. ``loss`` is the global mean (sum of loss over global units)."""

    loss: float
    grad_norm: float
    lr: float
    num_units: float
    num_micro_batches: int
    metrics: dict[str, float] = field(default_factory=dict)
    """The loss's own metrics, unit-weighted means over this rank's micro-batches."""


@runtime_checkable
class LossFn(Protocol):
    """The loss of one micro-batch as a *sum* over its units, its metrics, and the unit count of any micro-batch.

    ``count_units`` is called on every micro-batch before any backward, so the strategy can all-reduce the global
    count first; ``__call__`` then returns ``(loss_sum, metrics)``: ``loss_sum`` a scalar tensor with grad (the
    strategy backpropagates ``loss_sum / global_units``), ``metrics`` detached scalars (tensors or floats), each a
    *mean over this micro-batch's units*, which the strategy averages over the step weighted by ``count_units``.
    A loss keeps no state between calls.

    What a loss asks of the strategy beyond ``logp_BT`` it declares; a loss that asks for none of it takes the
    defaults of :class:`LossDefaults`:

    - ``needs_entropy``: the strategy computes ``entropy_BT`` too.
    - ``score_mask(micro_batch) -> bool [B, T] | None``: the only positions the loss reads ``logp_BT`` /
      ``entropy_BT`` at (e.g. the label tokens of SFT or DPO); the fsdp2 strategy then projects only the hidden
      states that predict them (no logits for prompt tokens), and the scores elsewhere are 0. ``None``: every
      position.
    - ``paired_rows``: the rows are interleaved preference pairs (row ``2i`` chosen, ``2i + 1`` rejected); with a
      score mask the fsdp2 strategy then runs each pair as one row, their common prefix once
      (:mod:`roll.workers.pair_prefix`), with the same scores.
    - ``inert_rows(micro_batch) -> bool [B] | None``: the rows whose gradient under this loss is exactly zero
      (e.g. a GRPO group whose samples all scored the same), which the driver may leave out of the step, carrying
      their units (:func:`roll.pipelines.policy.views.without_inert_rows`). ``None``: no row can be told inert.
    """

    @property
    def needs_entropy(self) -> bool: ...

    @property
    def paired_rows(self) -> bool: ...

    def __call__(
        self, output: ForwardOutput, micro_batch: MicroBatch
    ) -> tuple[torch.Tensor, LossMetrics]: ...

    def count_units(self, micro_batch: MicroBatch) -> float: ...

    def score_mask(self, micro_batch: MicroBatch) -> torch.Tensor | None: ...

    def inert_rows(self, micro_batch: MicroBatch) -> torch.Tensor | None: ...


class LossDefaults:
    """The declarations of a :class:`LossFn` at their "not asked" values: no entropy, every position scored, rows
    not paired, no row inert. A loss class derives from it and overrides what it asks for (an attribute, or a
    method returning a mask), so strategies and the driver read every declaration, typed, instead of probing."""

    needs_entropy: bool = False
    paired_rows: bool = False

    def score_mask(self, micro_batch: MicroBatch) -> torch.Tensor | None:
        return None

    def inert_rows(self, micro_batch: MicroBatch) -> torch.Tensor | None:
        return None


def check_declared(loss_fn: object) -> None:
    """Raise naming the :class:`LossFn` members ``loss_fn`` lacks (a loss written before the declarations)."""
    if isinstance(loss_fn, LossFn):
        return
    members = ("needs_entropy", "paired_rows", "score_mask", "inert_rows", "count_units", "__call__")
    missing = [m for m in members if not hasattr(loss_fn, m)]
    raise WorkerError(
        f"{type(loss_fn).__name__} is not a LossFn: it lacks {missing}; derive it from "
        "roll.workers.types.LossDefaults, which declares the optional members at their 'not asked' values"
    )


@runtime_checkable
class ScoringStrategy(Protocol):
    """What a frozen scorer (reference, teacher) calls: forward-only log-probs and offload/reload. Every train
    and every infer strategy has these, so a frozen role takes either kind."""

    def compute_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenScores: ...

    def offload(self) -> None: ...

    def reload(self) -> None: ...


@runtime_checkable
class InferStrategy(Protocol):
    """Generation and forward-only scoring on one inference worker.

    ``generate`` seeds per prompt: ``seeds[p]`` fixes the samples of prompt ``p`` (sample ``s`` draws from
    ``derive_seed(seeds[p], s)``, :mod:`roll.core.seeding`) whatever else is in the call and whatever the strategy
    generated before. Without ``seeds`` prompt ``p`` gets ``derive_seed(params.seed, p)`` when ``params.seed`` is
    set; with neither, the backend's own RNG decides.
    """

    @property
    def policy_version(self) -> int: ...

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
    ) -> list[GeneratedSample]: ...

    def compute_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        response_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenScores: ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], policy_version: int) -> None: ...

    def load_adapter(
        self, named_tensors: Mapping[str, torch.Tensor], lora: LoraConfig, policy_version: int
    ) -> None: ...

    def offload(self) -> None: ...

    def reload(self) -> None: ...


@runtime_checkable
class ContinuesSamples(Protocol):
    """An inference strategy that can continue samples from a generated prefix (partial rollout, hf and vllm):
    one sample per row, at most ``budget`` new tokens, seeded so a sample cut into segments draws from its own
    stream (see each strategy's ``continue_samples``)."""

    def continue_samples(
        self,
        prompts: Sequence[Sequence[int]],
        prefixes: Sequence[Sequence[int]],
        params: SamplingParams,
        *,
        sample_indices: Sequence[int],
        seeds: Sequence[int],
        budget: int,
    ) -> list[GeneratedSample]: ...


@runtime_checkable
class TrainStrategy(Protocol):
    """Training of one data-parallel rank (the model may be sharded across ranks).

    A role's step is one ``train_step`` (inside it: split into micro-batches, accumulate, one optimizer step; its
    ``lr`` is the rate that step used). The optimizer and LR scheduler stay inside the strategy: roles reach them only through
    ``lr``, ``set_lr`` and ``save_optimizer``/``load_optimizer``. ``model`` is the backend's module (for fsdp2 the
    transformers model, possibly FSDP-sharded or peft-wrapped; for megatron the DDP-wrapped ``GPTModel``) and
    ``device`` where it computes, for roles that run their own forwards (evaluation).
    """

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def lr(self) -> float: ...

    @property
    def lora_config(self) -> LoraConfig | None: ...

    def train_step(
        self, batch: MicroBatch, loss_fn: LossFn, *, temperature: float = 1.0
    ) -> TrainStepResult: ...

    def set_lr(self, lr: float) -> None: ...

    def compute_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenScores: ...

    def forward_only(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> ForwardOutput: ...

    def state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]: ...

    def lora_state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]: ...

    def model_state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_model_state_dict(self, state: Mapping[str, torch.Tensor]) -> None: ...

    def export_hf(self, path: str | Path) -> None: ...

    def save_optimizer(self, path: str | Path) -> None: ...

    def load_optimizer(self, path: str | Path) -> None: ...

    def offload(self) -> None: ...

    def reload(self) -> None: ...
