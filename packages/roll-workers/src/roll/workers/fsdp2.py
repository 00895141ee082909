"""The ``fsdp2`` training strategy: torch FSDP2 (``fully_shard``) data parallelism, or a plain module alone.

- World size > 1 (``torch.distributed`` initialized: gloo on CPU, NCCL on GPU): each decoder layer and then the
  root are ``fully_shard``-ed over a 1-D device mesh; bf16 params with fp32 gradient reduction on CUDA
  (``MixedPrecisionPolicy``), fp32 on CPU. World size 1: the module runs as is (no process group needed), under
  bf16 autocast on CUDA.
- Gradient accumulation is exact: the loss function returns a *sum* over units and the strategy divides by the
  global unit count of the whole step (all micro-batches, all ranks), so 4 micro-batches of 2 equal one of 8 and 2
  ranks with half the batch each equal 1 rank with all of it. FSDP averages gradients over ranks, hence the
  ``world_size`` factor in the scale. Every rank runs the same number of forwards (FSDP's collectives pair up
  across ranks): ranks with fewer micro-batches run zero-weighted repeats.
- Preference pairs (a loss with ``paired_rows``) as one row each, their common prefix once (``pair_prefix``,
  :mod:`roll.workers.pair_prefix`); padding-free ``packed`` forwards, activation checkpointing, ``compile`` (each
  decoder layer ``torch.compile``-d), peft LoRA (adapter-only training and export), full
  state dict gathering (``get_model_state_dict``) for export and model updates, optimizer and scheduler state
  save/load, offload/reload between phases.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import DTensor

from roll.core import columns as C
from roll.core.errors import CheckpointError, WorkerError
from roll.workers.config import FSDP2Config, LoraConfig, OptimizerConfig, SchedulerConfig
from roll.workers.hf_infer import resolve_device
from roll.workers.logprobs import forward_scores, split_micro_batches
from roll.workers.lora import merge_weight, wire_name
from roll.workers.metrics import UnitWeightedMeans
from roll.workers.offload import StateOffloader, train_state_tensors
from roll.workers.pair_prefix import pair_prefix_scores
from roll.workers.shared_prefix import shared_prefix_scores
from roll.workers.types import (
    ForwardOutput,
    LossFn,
    MicroBatch,
    TokenScores,
    TrainStepResult,
    check_declared,
)
from roll.workers.vision import Vision, vision_of


def lr_multiplier(step: int, config: SchedulerConfig, total_steps: int) -> float:
    """LR factor for optimizer step ``step`` (0-based): linear warmup, then constant, linear or cosine decay.

    Warmup gives ``(step + 1) / warmup_steps``, so the first step already trains and step ``warmup_steps - 1``
    reaches the full rate. Decay runs over ``progress = (step - warmup) / (total_steps - warmup)`` in [0, 1]:
    linear ``1 - (1 - m) * progress``, cosine ``m + (1 - m) * (1 + cos(pi * progress)) / 2`` with
    ``m = min_lr_ratio``.
    """
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.kind == "constant":
        return 1.0
    progress = min(1.0, (step - config.warmup_steps) / max(1, total_steps - config.warmup_steps))
    m = config.min_lr_ratio
    if config.kind == "linear":
        return 1.0 - (1.0 - m) * progress
    return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


class FSDP2TrainStrategy:
    """Trains one data-parallel rank of a transformers causal LM.

    ``total_steps`` (optimizer steps of the run) sizes the LR decay. Batches use the padded layout of
    :data:`roll.workers.types.MicroBatch`.
    """

    model: torch.nn.Module
    device: torch.device

    def __init__(
        self,
        model: torch.nn.Module,
        config: FSDP2Config | None = None,
        *,
        total_steps: int = 1,
        forward: ForwardFn | None = None,
    ) -> None:
        self.config = config or FSDP2Config()
        self._forward_fn = forward
        self.world_size, self.rank = _world()
        self.device = resolve_device(self.config.device)
        self.bf16 = self.config.mixed_precision == "bf16" or (
            self.config.mixed_precision == "auto" and self.device.type == "cuda"
        )
        if self.config.lora is not None:
            model = apply_lora(model, self.config.lora)
        if self.config.gradient_checkpointing:
            _enable_checkpointing(model)
        if self.config.compile:
            _compile_layers(model)
        model.to(self.device)
        self.model = self._shard(model) if self.world_size > 1 else model
        self.model.train()
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = _adamw(trainable, self.config.optimizer)
        schedule = self.config.scheduler
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: lr_multiplier(step, schedule, total_steps)
        )
        self._offloader = StateOffloader()

    def _shard(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.device.type, (self.world_size,))
        mp = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if self.bf16
            else None
        )
        kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": self.config.reshard_after_forward}
        if mp is not None:
            kwargs["mp_policy"] = mp
        for layer in _decoder_layers(model):
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        return model

    # ---- training --------------------------------------------------------------------------------------------

    def train_step(self, batch: MicroBatch, loss_fn: LossFn, *, temperature: float = 1.0) -> TrainStepResult:
        """Split ``batch`` into micro-batches (per config), accumulate gradients, take one optimizer step."""
        check_declared(loss_fn)
        micro_batches = self.split(batch)
        loss, units, metrics = self.forward_backward(micro_batches, loss_fn, temperature=temperature)
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = self.optimizer_step()
        return TrainStepResult(
            loss=loss, grad_norm=grad_norm, lr=lr, num_units=units, num_micro_batches=len(micro_batches),
            metrics=metrics,
        )  # fmt: skip

    def split(self, batch: MicroBatch) -> list[dict[str, torch.Tensor]]:
        """Micro-batches of ``batch`` by ``micro_batch_size`` rows or ``max_tokens_per_micro_batch`` tokens."""
        return split_micro_batches(
            batch,
            micro_batch_size=self.config.micro_batch_size,
            max_tokens=self.config.max_tokens_per_micro_batch,
        )

    def forward_backward(
        self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn, *, temperature: float = 1.0
    ) -> tuple[float, float, dict[str, float]]:
        """Accumulate gradients of ``sum(loss_sum) / global_units``; returns ``(global mean loss, global units,
        the loss's metrics)``, the metrics unit-weighted over this rank's micro-batches.

        Gradients are synchronized across ranks only on the last micro-batch.
        """
        local_units = [float(loss_fn.count_units(mb)) for mb in micro_batches]
        units = self._all_reduce(sum(local_units))
        if units <= 0:
            raise WorkerError(f"forward_backward: the step has {units} loss units (empty loss masks?)")
        scale = self.world_size / units
        loss_total = torch.zeros((), device=self.device)
        metrics = UnitWeightedMeans()
        schedule = list(self._equalized(micro_batches))
        for i, (mb, weight) in enumerate(schedule):
            _set_grad_sync(self.model, i == len(schedule) - 1)
            with self._autocast():
                score_mask = loss_fn.score_mask(mb)
                out = self._forward(mb, loss_fn.needs_entropy, temperature, score_mask, loss_fn.paired_rows)
                loss_sum, mb_metrics = loss_fn(out, mb)
                loss_sum = loss_sum * weight
            torch.autograd.backward(loss_sum * scale)
            loss_total += loss_sum.detach().float()
            metrics.add(mb_metrics, local_units[min(i, len(local_units) - 1)] * weight)
        return self._all_reduce(float(loss_total)) / units, units, metrics.means()

    def _equalized(self, micro_batches: Sequence[MicroBatch]) -> Iterator[tuple[MicroBatch, float]]:
        if not micro_batches:
            raise WorkerError("forward_backward needs at least one micro-batch on every rank")
        count = int(self._all_reduce(float(len(micro_batches)), op="max"))
        for i in range(count):
            yield (micro_batches[i], 1.0) if i < len(micro_batches) else (micro_batches[-1], 0.0)

    def _forward(
        self,
        mb: MicroBatch,
        with_entropy: bool,
        temperature: float,
        score_mask: torch.Tensor | None = None,
        paired: bool = False,
    ) -> ForwardOutput:
        ids = mb[C.INPUT_IDS].to(self.device)
        mask = mb[C.ATTENTION_MASK].to(self.device)
        if self._forward_fn is not None:
            images = vision_of(
                mb
            )  # passed only with images, so custom forwards without image support still work
            extra: dict[str, Any] = {"vision": images} if images else {}
            return self._forward_fn(self.model, ids, mask, with_entropy, temperature, **extra)
        vision = vision_of(mb)
        score_mask = None if score_mask is None else score_mask.to(self.device)
        if paired and score_mask is not None and self._pairs_prefixes() and not vision:
            pair = pair_prefix_scores(
                self.model, ids, mask, score_mask, temperature=temperature, with_entropy=with_entropy
            )
            if pair is not None:
                return ForwardOutput(logp_BT=pair[0], entropy_BT=pair[1])
        if score_mask is not None and self._shares_prefixes() and not vision:
            shared = shared_prefix_scores(
                self.model, ids, mask, score_mask, temperature=temperature, with_entropy=with_entropy
            )
            if shared is not None:
                return ForwardOutput(logp_BT=shared[0], entropy_BT=shared[1])
        logp_BT, ent_BT = forward_scores(
            self.model,
            ids,
            mask,
            temperature=temperature,
            with_entropy=with_entropy,
            packed=self.config.packed,
            score_mask=score_mask,
            vision=vision,
            without_vision_tokens=self.config.score_without_vision_tokens,
        )
        return ForwardOutput(logp_BT=logp_BT, entropy_BT=ent_BT)

    def _shares_prefixes(self) -> bool:
        # gradient checkpointing turns transformers' KV cache off, which the shared-prefix forward runs on
        c = self.config
        # and the shared path scores over the full vocabulary (no vision-token ban)
        return (
            c.shared_prefix
            and not c.packed
            and not c.gradient_checkpointing
            and not c.score_without_vision_tokens
        )

    def _pairs_prefixes(self) -> bool:
        # the pair path scores over the full vocabulary (no vision-token ban) and needs the padded layout
        c = self.config
        return c.pair_prefix and not c.packed and not c.score_without_vision_tokens

    def optimizer_step(self) -> float:
        """Clip (when configured), step AdamW and the LR schedule, zero grads; returns the pre-clip grad norm.

        A non-finite norm skips the update (the gradients are dropped) so one bad batch cannot poison weights.
        """
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        norm_value = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if math.isfinite(norm_value):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm_value

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        """Use ``lr`` as the base rate from now on: the next step uses ``lr`` itself, later ones ``lr`` times the
        schedule's multiplier."""
        for group in self.optimizer.param_groups:
            group["lr"] = group["initial_lr"] = lr
        self.scheduler.base_lrs = [lr for _ in self.optimizer.param_groups]

    @torch.no_grad()
    def compute_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        vision: Vision | None = None,
    ) -> TokenScores:
        """Forward-only scores of this rank's rows, micro-batched like training (e.g. old or reference log-probs);
        ``vision``: the rows' images (:mod:`roll.workers.vision`)."""
        out = self.forward_only(
            input_ids, attention_mask, temperature=temperature, with_entropy=with_entropy, vision=vision
        )
        return TokenScores(logp_BT=out.logp_BT, entropy_BT=out.entropy_BT)

    @torch.no_grad()
    def forward_only(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
        vision: Vision | None = None,
    ) -> ForwardOutput:
        """The forward's outputs (log-probs, or values/scores with a custom ``forward``) for all rows, float32.

        Collective when sharded: every rank runs the same number of micro-batch forwards.
        """
        batch: dict[str, Any] = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask}
        batch.update({k: list(v) for k, v in (vision or {}).items()})
        parts: list[ForwardOutput] = []
        for mb, weight in self._equalized(self.split(batch)):
            with self._autocast():
                out = self._forward(mb, with_entropy, temperature)
            if weight > 0:
                parts.append(out)
        return _concat_outputs(parts)

    # ---- state -----------------------------------------------------------------------------------------------

    def state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Full weights with the base model's names: on CPU on rank 0, ``{}`` on other ranks; with
        ``all_ranks``, on every rank, on the training device. Collective.

        With LoRA the adapters are merged (``W + B @ A * alpha / r``), which is what an inference worker serves.
        """
        options = StateDictOptions(full_state_dict=True, cpu_offload=not all_ranks)
        sd = cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=options))
        if self.config.lora is None or not sd:
            return sd
        return merge_lora_state_dict(sd, self.config.lora)

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The module's full, *unmerged* state (peft names under LoRA) on CPU on rank 0, ``{}`` elsewhere; what a
        checkpoint stores, so training resumes with the adapter. Collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=options))
        return sd if self.rank == 0 else {}

    def load_model_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load a full :meth:`model_state_dict` (every rank passes it and keeps its shard)."""
        set_model_state_dict(self.model, dict(state), options=StateDictOptions(full_state_dict=True))

    @property
    def lora_config(self) -> LoraConfig | None:
        """The LoRA adapter this strategy trains (None: full fine-tuning)."""
        return self.config.lora

    def lora_state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """The LoRA adapter alone, on CPU under wire names (:mod:`roll.workers.lora`): on rank 0 (others get
        ``{}``) or, with ``all_ranks``, on every rank. Collective: gathers the adapter's shards, never the base."""
        out: dict[str, torch.Tensor] = {}
        for name, param in self.model.named_parameters():
            wire = wire_name(name)
            if wire is None:
                continue
            full = param.full_tensor() if isinstance(param, DTensor) else param
            if self.rank == 0 or all_ranks:
                out[wire] = full.detach().to("cpu", copy=True)
        return out

    def export_hf(self, path: str | Path) -> None:
        """Write a transformers ``save_pretrained`` folder (safetensors); LoRA writes the adapter only. Collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        sd = get_model_state_dict(self.model, options=options)
        if self.rank == 0:
            target: Any = self.model
            target.save_pretrained(str(path), state_dict=sd)
        self._barrier()

    def save_optimizer(self, path: str | Path) -> None:
        """Save the full optimizer and scheduler state to ``path`` (rank 0 writes). Collective.

        Before the first step there is no optimizer state, and it is saved as ``None``: torch's
        ``get_optimizer_state_dict`` would first fill it by a zero-gradient step (``step=1``, zero moments), which
        changes the live optimizer's next update (Adam's bias correction) and the restored one's alike."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        fresh = not self.optimizer.state  # the same on every rank: they step together
        osd = None if fresh else get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if self.rank == 0:
            torch.save({"optimizer": osd, "scheduler": self.scheduler.state_dict()}, str(path))
        self._barrier()

    def load_optimizer(self, path: str | Path) -> None:
        """Restore what :meth:`save_optimizer` wrote; every rank reads the file and keeps its own shard."""
        try:
            saved = torch.load(str(path), map_location="cpu", weights_only=True)
        except (OSError, RuntimeError) as err:
            raise CheckpointError(f"cannot read optimizer state from {path}: {err}") from err
        if saved["optimizer"] is None:  # saved before the first step (see save_optimizer)
            self.optimizer.state.clear()
        else:
            options = StateDictOptions(full_state_dict=True)
            set_optimizer_state_dict(self.model, self.optimizer, saved["optimizer"], options=options)
        self.scheduler.load_state_dict(saved["scheduler"])

    def offload(self) -> None:
        """Free the device between phases: params, grads and optimizer state go to host memory (storages
        released in place, :mod:`roll.workers.offload`). A no-op when training on CPU: the state is there already."""
        if self.device.type == "cpu":
            return
        self._offloader.offload(train_state_tensors(self.model, self.optimizer))
        torch.cuda.empty_cache()

    def reload(self) -> None:
        """Bring params, grads and optimizer state back into the same device storages."""
        self._offloader.reload()

    # ---- helpers ---------------------------------------------------------------------------------------------

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        # Sharded models cast via MixedPrecisionPolicy; a lone module (CUDA, or a CPU with mixed_precision: bf16)
        # uses autocast for the same effect: bf16 matmuls, fp32 weights, gradients and optimizer state.
        if self.bf16 and self.world_size == 1:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _all_reduce(self, value: float, op: str = "sum") -> float:
        if self.world_size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return float(t.item())

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def _barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


ForwardFn = Callable[..., ForwardOutput]
"""``fn(model, ids_BT, mask_BT, with_entropy, temperature[, vision=...]) -> ForwardOutput``; ``vision`` is passed
only for micro-batches with images."""
"""``(model, input_ids_BT, attention_mask_BT, with_entropy, temperature) -> ForwardOutput``: replaces the causal-LM
forward, e.g. for a value head (critic) or a sequence-score head (reward model)."""


def _concat_outputs(parts: Sequence[ForwardOutput]) -> ForwardOutput:
    """Parts joined field by field, float32; a ``ForwardOutput`` subclass (a student's logits) keeps its type."""

    def cat(name: str) -> torch.Tensor | None:
        tensors = [getattr(p, name) for p in parts]
        return torch.cat([t.float() for t in tensors]) if tensors and tensors[0] is not None else None

    kind = type(parts[0]) if parts else ForwardOutput
    joined: dict[str, Any] = {f.name: cat(f.name) for f in dataclasses.fields(kind)}
    assert joined["logp_BT"] is not None  # logp_BT is a required field of every part
    return kind(**joined)


def _adamw(params: list[torch.nn.Parameter], opt: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW with torch's fused kernel (one multi-tensor op per step, CPU included since torch 2.4), else foreach.

    Fused, foreach and the per-tensor loop apply the same update formula; they differ only in float rounding
    (~1 ulp), and each is deterministic, so a run and its resumed copy still match bitwise.
    """
    kwargs: dict[str, Any] = {
        "lr": opt.lr,
        "betas": opt.betas,
        "eps": opt.eps,
        "weight_decay": opt.weight_decay,
    }
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel
        return torch.optim.AdamW(params, **kwargs)


def _set_grad_sync(model: torch.nn.Module, sync: bool) -> None:
    setter: Callable[[bool], None] | None = getattr(model, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(sync)


def _enable_checkpointing(model: Any) -> None:
    # Non-reentrant checkpointing composes with FSDP2 and with inputs that do not require grad (LoRA).
    # transformers >= 5.x renamed the method (the old name warns); keep both for older releases.
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def _compile_layers(model: torch.nn.Module) -> None:
    """``torch.compile`` each decoder layer's ``forward`` (regional compilation), run only for calls without a KV
    cache.

    The layers hold nearly all the compute, and inductor fuses their elementwise ops (RMSNorm, RoPE, SiLU * up,
    residual adds, and their backward) around the matmuls; the identical layers share one compiled graph, so the
    compile costs about one layer's. Embedding, output projection and loss stay eager: the label-only projection
    (``score_mask``) selects a data-dependent number of rows, which would break or re-specialize a whole-model
    graph. Module hooks (FSDP2's gathers) stay outside the compiled ``forward``. ``dynamic=True``: batch and
    sequence sizes are symbolic from the start, so micro-batches of other shapes reuse the graph (the default
    would compile again for the second shape, then once more dynamic); a micro-batch without padding (transformers
    passes it no attention mask) and a forward without gradients (log-probs, evaluation) compile once more each.
    Calls with a KV cache (the shared-prefix forward, greedy evaluation) run eager: the cache's per-layer state
    would compile a graph per layer and per decoding step until dynamo's recompile limit. Inductor may round
    differently from eager (fused reductions): losses agree to ~1e-6 over 20 tiny-1m steps.
    """
    layers = _decoder_layers(model)
    if not layers:
        raise WorkerError(
            f"compile: found no decoder layers to compile in {type(model).__name__} (modules named in its "
            "_no_split_modules or ending in DecoderLayer); set compile: false for this model"
        )
    for layer in layers:
        layer.forward = _compiled_unless_cached(layer.forward)


def _compiled_unless_cached(forward: Callable[..., Any]) -> Callable[..., Any]:
    compiled = torch.compile(forward, dynamic=True)

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(name) is not None for name in CACHE_KWARGS):
            return forward(*args, **kwargs)
        return compiled(*args, **kwargs)

    return run


CACHE_KWARGS = ("cache", "past_key_values", "layer_past")
"""The names transformers' decoder layers take a KV cache under (renamed over releases)."""


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks to shard one by one: modules named in ``_no_split_modules``, else ``*DecoderLayer``."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    return [
        m for m in model.modules() if type(m).__name__ in names or type(m).__name__.endswith("DecoderLayer")
    ]


def apply_lora(model: torch.nn.Module, config: LoraConfig) -> torch.nn.Module:
    """Wrap ``model`` with a peft LoRA adapter; only adapter weights keep ``requires_grad``."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=list(config.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def merge_lora_state_dict(sd: dict[str, torch.Tensor], config: LoraConfig) -> dict[str, torch.Tensor]:
    """Fold peft LoRA weights into their base weights and restore the base model's parameter names."""
    scaling = config.alpha / config.r
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in sd.items():
        if ".lora_" in name:
            continue
        base = name.removeprefix("base_model.model.")
        if ".base_layer." in name:
            prefix = name.split(".base_layer.")[0]
            base = base.replace(".base_layer.", ".")
            a_key, b_key = f"{prefix}.lora_A.default.weight", f"{prefix}.lora_B.default.weight"
            if name.endswith("weight") and a_key in sd:
                tensor = merge_weight(tensor, sd[a_key], sd[b_key], scaling)
        merged[base] = tensor
    return merged
