"""The ``megatron`` training strategy: Megatron-Core ``GPTModel`` with tensor and pipeline parallelism.

Importing this module needs neither Megatron nor CUDA; constructing :class:`MegatronTrainStrategy` needs Megatron-Core
(``pip install 'roll-workers[megatron]'``), and raises :class:`~roll.core.errors.PluginError` saying so otherwise. It
runs on the process's GPU over NCCL or, without CUDA, on the CPU over gloo (:mod:`roll.workers.megatron_device`).

How a step runs:

1. **Build** (once): ``torch.distributed`` (NCCL, or gloo on CPU) and ``parallel_state.initialize_model_parallel(tp, pp)``; a
   ``TransformerConfig`` read from the HF config (RMSNorm, SwiGLU as ``gated_linear_unit``, grouped-query
   attention as ``num_query_groups``, Qwen2's qkv bias, RoPE base, tied embeddings); this stage's ``GPTModel``
   with the local or TE layer spec; the HF weights converted by :mod:`roll.workers.megatron_convert`; then
   Megatron's ``DistributedDataParallel`` and ``get_megatron_optimizer`` (distributed optimizer by default).
2. **forward_backward**: ``get_forward_backward_func()`` picks the schedule (no pipelining, or 1F1B across
   stages). Rows are re-aligned so each sequence starts at column 0, which makes Megatron's built-in causal mask
   exact for left- and right-padded batches (padding then only ever follows a row's tokens). Log-probs are taken
   from the vocabulary-parallel logits without gathering them: max, sum-exp and the target logit are all-reduced
   over the TP group (padded vocabulary columns are masked out, so the distribution equals the HF model's).
3. **Exact accumulation**: the loss function returns sums; we divide by the global unit count (all micro-batches,
   all DP ranks) ourselves, run Megatron with ``calculate_per_token_loss`` (so DDP sums rather than averages over
   DP) and hand ``finalize_model_grads`` no token count (so it does not rescale).
4. **optimizer_step**: LR from our schedule (:func:`roll.workers.fsdp2.lr_multiplier`), Megatron's clip and step.

Heads: a causal LM by default; a value or score head (critic, reward model) or a reader of full logits (a distilled
student) when built with a :class:`~roll.workers.megatron_heads.ForwardPair` as ``forward=``
(:mod:`roll.workers.megatron_heads`).

Checkpoint files: the HF-named ``model.safetensors`` (rank 0), one optimizer file per
TP/PP rank, ``optimizer.pt.tp{t}.pp{p}.pt`` (plus ``.params``, the distributed optimizer's gathered state), written
by DP rank 0, and ``rng_rank{r}.pt`` per rank. Resuming needs the same TP/PP layout; another one is refused with
the layout found.

Simplifications: no sequence or context parallelism, no virtual pipeline stages, no packed sequences; rows must
hold one contiguous span of valid tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from roll.core import columns as C
from roll.core.errors import CheckpointError, ConfigError, PluginError, WorkerError
from roll.workers.config import LoraConfig
from roll.workers.fsdp2 import lr_multiplier
from roll.workers.logprobs import split_micro_batches
from roll.workers.megatron_config import MegatronConfig
from roll.workers.megatron_convert import GPTLayout, hf_to_megatron, megatron_to_hf
from roll.workers.megatron_device import (
    device_scope,
    init_parallel,
    megatron_device,
    on_device,
    resolve_precision,
)
from roll.workers.megatron_heads import (
    Aligned,
    MegatronHead,
    ScalarHead,
    StageOutput,
    align_left,
    head_of,
    vocab_parallel_scores,
)
from roll.workers.metrics import UnitWeightedMeans
from roll.workers.types import ForwardOutput, LossFn, MicroBatch, TokenScores, TrainStepResult

INSTALL_HINT = "pip install 'roll-workers[megatron]'  (or: uv sync --extra megatron)"
_METRIC = "metric/"  # prefix of the loss metrics among the values Megatron stores per micro-batch


def require_megatron() -> Any:
    """Import ``megatron.core`` or raise :class:`PluginError` naming the extra to install."""
    try:
        import megatron.core as mcore
    except ImportError as err:
        raise PluginError(
            f"the 'megatron' strategy needs Megatron-Core, which is not installed ({err}); {INSTALL_HINT}"
        ) from err
    return mcore


def rope_base(hf_config: Any) -> float:
    """RoPE base of an HF config; only plain RoPE is supported (no llama3/yarn scaling)."""
    params = getattr(hf_config, "rope_parameters", None) or {}
    scaling = getattr(hf_config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise ConfigError(f"the megatron strategy supports plain RoPE only; this model uses {kind!r} scaling")
    theta = getattr(hf_config, "rope_theta", None) or params.get("rope_theta") or 10000.0
    return float(theta)


def transformer_config(hf_config: Any, layout: GPTLayout, config: MegatronConfig) -> Any:
    """Megatron ``TransformerConfig`` equivalent to an HF Qwen2/Llama config. Fusions that need Apex/TE are off."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    return TransformerConfig(
        num_layers=layout.num_layers,
        hidden_size=layout.hidden_size,
        num_attention_heads=layout.num_heads,
        num_query_groups=layout.num_kv_heads,
        kv_channels=layout.head_dim,
        ffn_hidden_size=layout.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=layout.qkv_bias,
        qk_layernorm=layout.qk_layernorm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=config.tensor_parallel_size,
        pipeline_model_parallel_size=config.pipeline_parallel_size,
        bf16=config.precision == "bf16",
        params_dtype=dtype,
        pipeline_dtype=dtype,
        calculate_per_token_loss=True,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        attention_softmax_in_fp32=True,
    )


def build_gpt_model(
    hf_config: Any,
    layout: GPTLayout,
    config: MegatronConfig,
    tconfig: Any,
    device: torch.device | None = None,
) -> Any:
    """This pipeline stage's ``GPTModel`` on ``device`` (default :func:`megatron_device`; random init, weights are
    loaded next); a value or score head replaces the LM output layer with a
    :class:`~roll.workers.megatron_heads.ScalarHead`."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    if config.layer_spec == "local":
        spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=layout.qk_layernorm)
    else:
        spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=layout.qk_layernorm)
    model = GPTModel(
        config=tconfig,
        transformer_layer_spec=spec,
        vocab_size=layout.padded_vocab_size,
        max_sequence_length=int(getattr(hf_config, "max_position_embeddings", 4096)),
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        parallel_output=True,
        share_embeddings_and_output_weights=layout.tied_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=int(rope_base(hf_config)),
    )
    if layout.head != "lm" and parallel_state.is_pipeline_last_stage():
        model.output_layer = ScalarHead(
            layout.hidden_size,
            bias=layout.head == "value",
            dtype=tconfig.params_dtype,
            device=device or megatron_device(),
        )
    return model


def load_stage_weights(module: torch.nn.Module, hf_state: dict[str, torch.Tensor], layout: GPTLayout) -> None:
    """Copy this rank's shard of the HF weights into ``module``; any parameter left unset raises."""
    from megatron.core import parallel_state

    shards = hf_to_megatron(
        hf_state,
        layout,
        tp_size=parallel_state.get_tensor_model_parallel_world_size(),
        pp_size=parallel_state.get_pipeline_model_parallel_world_size(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
    )
    mine = shards[parallel_state.get_tensor_model_parallel_rank()]
    result = module.load_state_dict(mine, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith("_extra_state")]
    if missing or result.unexpected_keys:
        raise WorkerError(
            f"HF -> Megatron weights do not match the model: missing {missing[:5]}, "
            f"unexpected {list(result.unexpected_keys)[:5]}"
        )


# ---- the strategy --------------------------------------------------------------------------------------------


class MegatronTrainStrategy:
    """Trains one rank of a TP x PP x DP Megatron-Core model built from a transformers Qwen2/Llama-family model.

    ``model`` is the HF model whose config and weights seed training (CPU is fine; it is kept on global rank 0
    only, as the template of :meth:`export_hf`): a causal LM, or with ``forward`` a
    :class:`~roll.workers.megatron_heads.ForwardPair` the head model its Megatron side names (a token- or
    sequence-classification model for a value or score head). ``total_steps`` sizes the LR decay. Batches follow
    :data:`roll.workers.types.MicroBatch`; every rank of one pipeline must receive the same batch.
    """

    model: Any  # Megatron's DistributedDataParallel around this stage's GPTModel
    device: torch.device

    def __init__(
        self,
        model: Any,
        config: MegatronConfig | None = None,
        *,
        total_steps: int = 1,
        forward: Callable[..., ForwardOutput] | None = None,
    ) -> None:
        self.head: MegatronHead = head_of(forward)  # before the stack check: a bad forward is a config error
        require_megatron()
        self.device = megatron_device()
        self.config = resolve_precision(config or MegatronConfig(), self.device)
        self.total_steps = total_steps
        self._base_lr = self.config.optimizer.lr
        self.hf_config = model.config
        init_parallel(self.config, self.device)
        with device_scope(self.device):
            self._build(model)

    def _build(self, model: Any) -> None:
        self.layout = GPTLayout.from_hf_config(
            self.hf_config,
            tp_size=self.config.tensor_parallel_size,
            vocab_multiple=self.config.vocab_multiple,
            fused_norms=self.config.layer_spec == "transformer_engine",
            head=self.head.kind,
        )
        self.layout.check_parallel(self.config.tensor_parallel_size, self.config.pipeline_parallel_size)
        self.tconfig = transformer_config(self.hf_config, self.layout, self.config)
        self.tconfig.use_cpu_initialization = self.device.type == "cpu"
        module = build_gpt_model(self.hf_config, self.layout, self.config, self.tconfig, self.device)
        load_stage_weights(module, {k: v.detach() for k, v in model.state_dict().items()}, self.layout)
        self.model, self.optimizer = self._wrap(module)
        self._hf_template = model if dist.get_rank() == 0 else None
        self._step = 0
        self._offloaded: list[torch.Tensor] = []

    def _wrap(self, module: torch.nn.Module) -> tuple[Any, Any]:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, use_distributed_optimizer=self.config.use_distributed_optimizer
        )
        ddp = DistributedDataParallel(config=self.tconfig, ddp_config=ddp_config, module=module)
        opt = self.config.optimizer
        optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=opt.lr,
                weight_decay=opt.weight_decay,
                adam_beta1=opt.betas[0],
                adam_beta2=opt.betas[1],
                adam_eps=opt.eps,
                bf16=self.config.precision == "bf16",
                params_dtype=self.tconfig.params_dtype,
                use_distributed_optimizer=self.config.use_distributed_optimizer,
                clip_grad=self.config.max_grad_norm or 0.0,
            ),
            [ddp],
        )

        def finalize(chunks: list[Any], _num_tokens: Any = None, **kwargs: Any) -> None:
            # We divide by the global unit count ourselves: sync the grads, never rescale them.
            finalize_model_grads(chunks, None, **kwargs)

        self.tconfig.finalize_model_grads_func = finalize
        self.tconfig.no_sync_func = ddp.no_sync
        return ddp, optimizer

    # ---- training ------------------------------------------------------------------------------------------

    @on_device
    def train_step(self, batch: MicroBatch, loss_fn: LossFn, *, temperature: float = 1.0) -> TrainStepResult:
        """Split ``batch`` into micro-batches, accumulate gradients through the schedule, take one step."""
        micro_batches = split_micro_batches(batch, micro_batch_size=self.config.micro_batch_size)
        loss, units, metrics = self.forward_backward(micro_batches, loss_fn, temperature=temperature)
        lr = self._current_lr()
        grad_norm = self.optimizer_step()
        return TrainStepResult(
            loss=loss, grad_norm=grad_norm, lr=lr, num_units=units, num_micro_batches=len(micro_batches),
            metrics=metrics,
        )  # fmt: skip

    @on_device
    def forward_backward(
        self, micro_batches: Sequence[MicroBatch], loss_fn: LossFn, *, temperature: float = 1.0
    ) -> tuple[float, float, dict[str, float]]:
        """Accumulate gradients of ``sum(loss_sum) / global_units``; returns ``(global mean loss, global units,
        the loss's metrics)``; the metrics (unit-weighted over this rank's micro-batches) exist on the last
        pipeline stage only, other stages report ``{}``."""
        from megatron.core import parallel_state

        if not micro_batches:
            raise WorkerError("forward_backward needs at least one micro-batch on every rank")
        local_units = [float(loss_fn.count_units(mb)) for mb in micro_batches]
        units = self._dp_sum(sum(local_units))
        if units <= 0:
            raise WorkerError(f"forward_backward: the step has {units} loss units (empty loss masks?)")
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        step = partial(self._loss_of, loss_fn=loss_fn, scale=1.0 / units, temperature=temperature)
        stored = self._run_schedule(micro_batches, step, forward_only=False)
        loss_sum = torch.zeros((), device=self.device)
        metrics = UnitWeightedMeans()
        if parallel_state.is_pipeline_last_stage():
            loss_sum = torch.stack([d["loss_sum"] for d in stored]).sum()
            for d, mb_units in zip(stored, local_units, strict=True):
                named = {k.removeprefix(_METRIC): v for k, v in d.items() if k.startswith(_METRIC)}
                metrics.add(named, mb_units)
        loss_sum = self._from_last_stage(loss_sum)
        return self._dp_sum(float(loss_sum)) / units, units, metrics.means()

    def _loss_of(
        self,
        output: torch.Tensor,
        aligned: Aligned,
        mb: MicroBatch,
        *,
        loss_fn: LossFn,
        scale: float,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        out = self.head.read(
            StageOutput(output, aligned, self.layout.vocab_size), temperature, loss_fn.needs_entropy
        )
        on_device = {k: v.to(self.device) for k, v in mb.items()}
        loss_sum, metrics = loss_fn(out, on_device)
        stored = {
            f"{_METRIC}{k}": torch.as_tensor(v, device=self.device).detach() for k, v in metrics.items()
        }
        # The count is ignored by our finalize hook; Megatron only needs an int tensor here.
        return (
            loss_sum * scale,
            torch.ones((), dtype=torch.int, device=self.device),
            {"loss_sum": loss_sum.detach(), **stored},
        )

    def _run_schedule(
        self, micro_batches: Sequence[MicroBatch], loss_of: Callable[..., Any], *, forward_only: bool
    ) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        padded = self._equal_shapes(micro_batches)
        rows, tokens = padded[0][C.INPUT_IDS].shape
        return list(
            get_forward_backward_func()(
                forward_step_func=partial(self._forward_step, loss_of=loss_of),
                data_iterator=iter(padded),
                model=[self.model],
                num_microbatches=len(padded),
                seq_length=tokens,
                micro_batch_size=rows,
                forward_only=forward_only,
            )
        )

    def _forward_step(self, data: Iterator[MicroBatch], model: Any, *, loss_of: Callable[..., Any]) -> Any:
        mb = next(data)
        ids = mb[C.INPUT_IDS].to(self.device)
        aligned = align_left(ids, mb[C.ATTENTION_MASK].to(self.device))
        pos_BT = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
        output = model(aligned.ids_BT, pos_BT, None)
        return output, partial(loss_of, aligned=aligned, mb=mb)

    def _equal_shapes(self, micro_batches: Sequence[MicroBatch]) -> list[MicroBatch]:
        """Pipeline stages exchange fixed-shape activations, so pad every micro-batch to the largest one.

        Padded rows and columns are zeros everywhere (attention mask included), so they score 0 and carry no loss
        under any loss function that weights tokens by a mask. Without pipelining shapes may differ.
        """
        if self.config.pipeline_parallel_size == 1:
            return list(micro_batches)
        rows = max(mb[C.INPUT_IDS].shape[0] for mb in micro_batches)
        cols = max(mb[C.INPUT_IDS].shape[1] for mb in micro_batches)
        return [_pad_micro_batch(mb, rows, cols) for mb in micro_batches]

    @on_device
    def optimizer_step(self) -> float:
        """Set the scheduled LR, clip and step (Megatron skips a step on non-finite grads); returns the grad norm."""
        lr = self._current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        _ok, grad_norm, _zeros = self.optimizer.step()
        self._step += 1
        return float(grad_norm) if grad_norm is not None else float("nan")

    def _current_lr(self) -> float:
        return self._base_lr * lr_multiplier(self._step, self.config.scheduler, self.total_steps)

    @property
    def lr(self) -> float:
        """The learning rate the next optimizer step uses."""
        return self._current_lr()

    def set_lr(self, lr: float) -> None:
        """Use ``lr`` as the base rate from now on (the schedule's multiplier still applies)."""
        self._base_lr = lr

    def split(self, batch: MicroBatch) -> list[dict[str, torch.Tensor]]:
        """Micro-batches of ``micro_batch_size`` rows (one micro-batch when it is ``None``)."""
        return split_micro_batches(batch, micro_batch_size=self.config.micro_batch_size)

    # ---- scoring ------------------------------------------------------------------------------------------

    @torch.no_grad()
    @on_device
    def compute_logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> TokenScores:
        """Forward-only ``logp_BT`` (and ``entropy_BT``) of this pipeline's rows, on every stage (broadcast)."""
        from megatron.core import parallel_state

        batch = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask}
        micro_batches = split_micro_batches(batch, micro_batch_size=self.config.micro_batch_size)

        def scores(output: torch.Tensor, aligned: Aligned, mb: MicroBatch) -> Any:
            logp, ent = vocab_parallel_scores(
                output, aligned, self.layout.vocab_size, temperature=temperature, with_entropy=with_entropy
            )
            return (
                torch.zeros((), device=self.device),
                torch.ones((), dtype=torch.int, device=self.device),
                {
                    "logp": logp,
                    "ent": ent,
                },
            )

        stored = self._run_schedule(micro_batches, scores, forward_only=True)
        B, T = input_ids.shape
        logp = torch.zeros(B, T, device=self.device)
        ent = torch.zeros(B, T, device=self.device) if with_entropy else None
        if parallel_state.is_pipeline_last_stage():
            self._fill(logp, ent, stored, [mb[C.INPUT_IDS].shape for mb in micro_batches])
        logp = self._from_last_stage(logp)
        ent = self._from_last_stage(ent) if ent is not None else None
        return TokenScores(logp_BT=logp, entropy_BT=ent)

    @torch.no_grad()
    @on_device
    def forward_only(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        with_entropy: bool = False,
    ) -> ForwardOutput:
        """The head's outputs (log-probs, values, scores, or what a ``ForwardPair``'s reader returns) for all rows,
        on the last pipeline stage; with pipeline parallelism the other stages receive them from it."""
        from megatron.core import parallel_state

        batch = {C.INPUT_IDS: input_ids, C.ATTENTION_MASK: attention_mask}
        micro_batches = split_micro_batches(batch, micro_batch_size=self.config.micro_batch_size)

        def read(output: torch.Tensor, aligned: Aligned, mb: MicroBatch) -> Any:
            out = self.head.read(
                StageOutput(output, aligned, self.layout.vocab_size), temperature, with_entropy
            )
            return (
                torch.zeros((), device=self.device),
                torch.ones((), dtype=torch.int, device=self.device),
                {"out": out},
            )

        stored = self._run_schedule(micro_batches, read, forward_only=True)
        result: ForwardOutput | None = None
        if parallel_state.is_pipeline_last_stage():
            shapes = [mb[C.INPUT_IDS].shape for mb in micro_batches]
            result = concat_outputs([trim_output(d["out"], b, t) for d, (b, t) in zip(stored, shapes)])
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            box = [result]
            dist.broadcast_object_list(
                box,
                src=parallel_state.get_pipeline_model_parallel_last_rank(),
                group=parallel_state.get_pipeline_model_parallel_group(),
            )
            result = box[0]
        assert result is not None  # the last stage computed it, the others received it
        return result

    @staticmethod
    def _fill(
        logp: torch.Tensor, ent: torch.Tensor | None, stored: list[Any], shapes: list[torch.Size]
    ) -> None:
        row = 0
        for out, (b, t) in zip(stored, shapes):
            logp[row : row + b, :t] = out["logp"][:b, :t]
            if ent is not None:
                ent[row : row + b, :t] = out["ent"][:b, :t]
            row += b

    # ---- state --------------------------------------------------------------------------------------------

    @on_device
    def state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        """Full HF-named weights on CPU on global rank 0 (``{}`` elsewhere) or, with ``all_ranks``, on every rank
        (each rank gathers over its own TP and PP groups, so every DP replica has them). Collective over TP and PP."""
        from megatron.core import parallel_state

        local = {k: v for k, v in self.model.module.state_dict().items() if not k.endswith("_extra_state")}
        tp_group = parallel_state.get_tensor_model_parallel_group()
        tp_states: list[dict[str, torch.Tensor]] = [{} for _ in range(dist.get_world_size(tp_group))]
        for name, tensor in local.items():
            parts = [torch.empty_like(tensor) for _ in tp_states]
            dist.all_gather(parts, tensor.contiguous(), group=tp_group)
            for state, part in zip(tp_states, parts):
                state[name] = part.cpu()
        stage = megatron_to_hf(
            tp_states,
            self.layout,
            pp_size=parallel_state.get_pipeline_model_parallel_world_size(),
            pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        )
        stages: list[Any] = [None] * parallel_state.get_pipeline_model_parallel_world_size()
        dist.all_gather_object(stages, stage, group=parallel_state.get_pipeline_model_parallel_group())
        if dist.get_rank() != 0 and not all_ranks:
            return {}
        return {k: v for s in stages for k, v in s.items()}

    @property
    def lora_config(self) -> LoraConfig | None:
        """Always None: the megatron strategy trains all weights (no LoRA)."""
        return None

    def lora_state_dict(self, all_ranks: bool = False) -> dict[str, torch.Tensor]:
        raise WorkerError("the megatron strategy trains no LoRA adapter; send state_dict() instead")

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """What a checkpoint stores: the HF-named :meth:`state_dict` (rank 0; ``{}`` elsewhere). Collective."""
        return self.state_dict()

    @on_device
    def load_model_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Load full HF-named weights (every rank passes them and keeps its shard), then refresh the optimizer's
        fp32 main copies from them (Megatron's ``reload_model_params``)."""
        load_stage_weights(self.model.module, dict(state), self.layout)
        self.optimizer.reload_model_params()

    @on_device
    def export_hf(self, path: str | Path) -> None:
        """Write a transformers ``save_pretrained`` folder (safetensors) from rank 0. Collective."""
        sd = self.state_dict()
        if self._hf_template is not None:
            template = self._hf_template
            dtype = next(template.parameters()).dtype
            template.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False)
            template.save_pretrained(str(path))
        dist.barrier()

    @on_device
    def save_optimizer(self, path: str | Path) -> None:
        """Save this rank's optimizer state next to ``path`` (one file per TP/PP rank). Collective over DP."""
        target = self._rank_path(path)
        if hasattr(self.optimizer, "save_parameter_state"):
            self.optimizer.save_parameter_state(f"{target}.params")
        from megatron.core import parallel_state

        if parallel_state.get_data_parallel_rank() == 0:
            state = {"optimizer": self.optimizer.state_dict(), "step": self._step, "base_lr": self._base_lr}
            torch.save(state, target)
        dist.barrier()

    @on_device
    def load_optimizer(self, path: str | Path) -> None:
        """Restore what :meth:`save_optimizer` wrote with the same TP/PP/DP layout."""
        target = self._rank_path(path)
        check_optimizer_shard(Path(target), self.config)
        try:
            saved = torch.load(target, map_location="cpu", weights_only=False)
        except (OSError, RuntimeError) as err:
            raise CheckpointError(f"cannot read optimizer state from {target}: {err}") from err
        with torch.no_grad():  # fp32 main params are views of the trained params, which require grad
            self.optimizer.load_state_dict(saved["optimizer"])
            if hasattr(self.optimizer, "load_parameter_state"):
                with _adam_steps_set_aside(self.optimizer):
                    self.optimizer.load_parameter_state(f"{target}.params")
        self._step = int(saved["step"])
        self._base_lr = float(saved.get("base_lr", self.config.optimizer.lr))

    @staticmethod
    def _rank_path(path: str | Path) -> str:
        from megatron.core import parallel_state

        return optimizer_shard_path(
            path,
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_pipeline_model_parallel_rank(),
        )

    def offload(self) -> None:
        """Free GPU memory between phases: weights, gradient buffers and optimizer state go to CPU (on a CPU run
        there is nothing to free: a no-op)."""
        if self._offloaded or self.device.type == "cpu":
            return
        self.model.offload_grad_buffers()
        for buffer in _param_buffers(self.model):
            self._offloaded.append(buffer.param_data.detach().to("cpu", non_blocking=True))
            buffer.param_data.untyped_storage().resize_(0)
        _move_optimizer_state(self.optimizer, "cpu", move_params=self._separate_main_params)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()

    def reload(self) -> None:
        """Undo :meth:`offload` (parameter views stay valid: the same storages are regrown and refilled)."""
        if not self._offloaded:  # also on a CPU run, whose offload keeps nothing
            return
        for buffer, saved in zip(_param_buffers(self.model), self._offloaded):
            storage = buffer.param_data.untyped_storage()
            storage.resize_(saved.numel() * saved.element_size())
            buffer.param_data.copy_(saved, non_blocking=True)
        self._offloaded = []
        self.model.restore_grad_buffers()
        _move_optimizer_state(self.optimizer, "cuda", move_params=self._separate_main_params)
        torch.cuda.synchronize()

    @property
    def _separate_main_params(self) -> bool:
        # With bf16 weights the optimizer keeps its own fp32 copies; in fp32 they are views of the param buffers,
        # which offload frees and reload refills already.
        return self.config.precision == "bf16"

    # ---- collectives ----------------------------------------------------------------------------------------

    def _dp_sum(self, value: float) -> float:
        from megatron.core import parallel_state

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, group=parallel_state.get_data_parallel_group())
        return float(t.item())

    @staticmethod
    def _from_last_stage(t: torch.Tensor) -> torch.Tensor:
        from megatron.core import parallel_state

        if parallel_state.get_pipeline_model_parallel_world_size() == 1:
            return t
        src = parallel_state.get_pipeline_model_parallel_last_rank()
        t = t.contiguous()
        dist.broadcast(t, src=src, group=parallel_state.get_pipeline_model_parallel_group())
        return t


def concat_outputs(parts: Sequence[ForwardOutput]) -> ForwardOutput:
    """Micro-batch outputs joined along rows, field by field (a ``ForwardOutput`` subclass keeps its type)."""
    if not parts:
        raise WorkerError("forward_only needs at least one micro-batch")
    values: dict[str, Any] = {}
    for f in fields(parts[0]):
        got = [getattr(p, f.name) for p in parts]
        values[f.name] = torch.cat(got) if got[0] is not None else None
    return type(parts[0])(**values)


def trim_output(out: ForwardOutput, rows: int, cols: int) -> ForwardOutput:
    """A micro-batch's output without the rows and token columns pipeline padding added (dims 0 and 1)."""

    def trim(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        return t[:rows, :cols] if t.dim() >= 2 else t[:rows]

    trimmed: dict[str, Any] = {f.name: trim(getattr(out, f.name)) for f in fields(out)}
    return type(out)(**trimmed)


OPTIMIZER_SHARD = "{path}.tp{tp}.pp{pp}.pt"


def optimizer_shard_path(path: str | Path, tp_rank: int, pp_rank: int) -> str:
    """The optimizer file of TP rank ``tp_rank`` of stage ``pp_rank`` for a checkpoint's ``optimizer.pt``."""
    return OPTIMIZER_SHARD.format(path=path, tp=tp_rank, pp=pp_rank)


def check_optimizer_shard(target: Path, config: MegatronConfig) -> None:
    """Raise :class:`CheckpointError` when ``target`` is missing, naming the TP x PP layout the folder holds."""
    if target.is_file():
        return
    stem = target.name.split(".tp")[0]
    found = sorted(p.name for p in target.parent.glob(f"{stem}.tp*.pp*.pt"))
    layout = _shard_layout(found)
    raise CheckpointError(
        f"no optimizer shard {target.name} in {target.parent}: this run has tensor_parallel_size="
        f"{config.tensor_parallel_size}, pipeline_parallel_size={config.pipeline_parallel_size}"
        + (
            f", the checkpoint was written with {layout}"
            if layout
            else ", and the folder has no megatron shards"
        )
        + "; resume with the layout it was written with"
    )


def _shard_layout(names: Sequence[str]) -> str:
    pairs = [n.split(".tp")[1].removesuffix(".pt").split(".pp") for n in names]
    if not pairs:
        return ""
    tp = 1 + max(int(t) for t, _ in pairs)
    pp = 1 + max(int(p) for _, p in pairs)
    return f"tensor_parallel_size={tp}, pipeline_parallel_size={pp}"


def _pad_micro_batch(mb: MicroBatch, rows: int, cols: int) -> dict[str, torch.Tensor]:
    """Zero-pad every tensor to ``rows`` (dim 0) and, for ``[B, T]``-shaped ones, ``cols`` (dim 1)."""
    B, T = mb[C.INPUT_IDS].shape
    out = {}
    for key, t in mb.items():
        pad = [0, 0] * t.dim()
        if t.dim() >= 2 and t.shape[1] == T:
            pad[-3] = cols - T  # dim 1, right side (F.pad lists the last dim first)
        pad[-1] = rows - B  # dim 0, right side
        out[key] = torch.nn.functional.pad(t, pad) if any(pad) else t
    return out


def _param_buffers(ddp: Any) -> list[Any]:
    """Megatron DDP's contiguous parameter buffers (dense and expert), where each has parameter data."""
    buffers = list(getattr(ddp, "buffers", [])) + list(getattr(ddp, "expert_parallel_buffers", []))
    return [b for b in buffers if getattr(b, "param_data", None) is not None]


@contextlib.contextmanager
def _adam_steps_set_aside(optimizer: Any) -> Iterator[None]:
    """Without TE or Apex, Megatron's optimizer is torch's Adam, which keeps a per-parameter ``step``. The
    distributed optimizer's parameter-state file omits it (its loader then looks it up and fails), and its
    ``load_state_dict`` restores it as one tensor shared by every parameter, which Adam's in-place increment then
    advances once per parameter per step (wrong bias correction after a resume: measured, weights off by 2e-3 after
    one step). So it is set aside while the file loads and put back as one tensor per parameter."""
    inner_list = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    states = [s for w in inner_list for s in getattr(w, "optimizer", w).state.values() if "step" in s]
    steps = [s.pop("step") for s in states]
    try:
        yield
    finally:
        for state, step in zip(states, steps):
            state["step"] = step.clone()


def _move_optimizer_state(optimizer: Any, device: str, *, move_params: bool) -> None:
    """Move Adam moments (and, with ``move_params``, fp32 main parameters) of every Megatron optimizer."""
    inner_list = getattr(optimizer, "chained_optimizers", None) or [optimizer]
    for wrapper in inner_list:
        inner = getattr(wrapper, "optimizer", wrapper)
        for group in inner.param_groups if move_params else []:
            for param in group["params"]:
                param.data = param.data.to(device, non_blocking=True)
        for state in inner.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    state[key] = value.to(device, non_blocking=True)
