"""The megatron strategy itself on CPU over gloo (``roll.workers.megatron_device``): built, stepped, scored and
checkpointed like on GPUs, at TP=1 and TP=2 (two processes), against the fsdp2 strategy on the same model and batch.

Each run takes two optimizer steps of a token-mean NLL on right- and left-padded rows of a tiny Qwen2 (fp32, the
CPU's ``precision: auto``), then saves its optimizer, loads it back into a fresh strategy and takes a third step
there. Golden values are fsdp2's (one rank, fp32; itself checked against plain PyTorch in test_fsdp2.py): the same
Adam (``eps=1e-3``, see ``OPTIM`` in test_fsdp2.py) with the same clipping and LR schedule. Measured (TP 1 and 2,
max abs difference to fsdp2): log-probs 5e-7, losses 2e-7 relative, grad norms 3e-7 relative, weights after three
steps 4e-7; the tolerances are 1e-5 (log-probs, weights) and 1e-5 relative (loss, grad norm): summation order
differs (TP splits the matmuls, Megatron's fused QKV), nothing else may.

Marked ``megatron``: skipped without Megatron-Core (the default environment); ``bash .ci/megatron`` runs them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.workers.types import LossDefaults

pytestmark = pytest.mark.megatron

ROWS, T, VOCAB = 6, 10, 128


def _model() -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def _batch(seed: int) -> dict[str, torch.Tensor]:
    """Rows 0-2 right-padded, rows 3-5 left-padded (a prompt's padding), loss on every predicted token."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, T + 1, (ROWS,), generator=g)
    cols = torch.arange(T)[None, :]
    right = cols < lengths[:, None]
    left = cols >= (T - lengths[:, None])
    mask = torch.where(torch.arange(ROWS)[:, None] < 3, right, left).long()
    ids = torch.randint(1, VOCAB, (ROWS, T), generator=g) * mask
    loss_mask = mask.clone()
    loss_mask[:, 1:] *= mask[:, :-1]  # a row's first token is not predicted
    loss_mask[:, 0] = 0
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask, C.RESPONSE_MASK: loss_mask}


class TokenNLL(LossDefaults):
    def __call__(self, output: Any, micro_batch: Any) -> tuple[torch.Tensor, dict[str, float]]:
        return -(output.logp_BT * micro_batch[C.RESPONSE_MASK]).sum(), {}

    def count_units(self, micro_batch: Any) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


def _train(strategy: Any, tmp: Path, rebuild: Any) -> dict[str, Any]:
    """Two steps, a save, a rebuild that loads it, a third step; what each side reports."""
    b0 = _batch(0)
    logp = strategy.compute_logprobs(b0[C.INPUT_IDS], b0[C.ATTENTION_MASK]).logp_BT
    results = [strategy.train_step(_batch(s), TokenNLL()) for s in (1, 2)]
    weights = strategy.state_dict(all_ranks=True)
    strategy.save_optimizer(tmp / "optimizer.pt")
    fresh = rebuild()
    fresh.load_model_state_dict(weights)
    fresh.load_optimizer(tmp / "optimizer.pt")
    results.append(fresh.train_step(_batch(3), TokenNLL()))
    return {
        "logp": (logp * b0[C.RESPONSE_MASK]).tolist(),
        "loss": [r.loss for r in results],
        "grad_norm": [r.grad_norm for r in results],
        "lr": [r.lr for r in results],
        "weights": {k: v.tolist() for k, v in fresh.state_dict().items()},
    }


def megatron_run(tp: int) -> dict[str, Any]:
    """In each of ``tp`` processes (tests/gpu/tp_launch.py): the megatron strategy on CPU over gloo."""
    import torch.distributed as dist

    from roll.workers.gpu_specs import MEGATRON
    from roll.workers.megatron_config import MegatronConfig

    sys.path.insert(0, str(Path(__file__).parent))
    from test_fsdp2 import OPTIM

    dist.init_process_group("gloo")
    cfg = MegatronConfig(
        tensor_parallel_size=tp,
        micro_batch_size=2,  # three micro-batches: accumulation across them is exact too
        optimizer=OPTIM,
        scheduler={"kind": "linear", "min_lr_ratio": 0.5},
    )
    strategy = MEGATRON.build(cfg, _model(), total_steps=4)
    assert strategy.device.type == "cpu" and strategy.config.precision == "fp32"
    tmp = Path(os.environ["ROLL_TP_TMP"])
    out = _train(strategy, tmp, lambda: MEGATRON.build(cfg, _model(), total_steps=4))
    return out if dist.get_rank() == 0 else {}


def _fsdp2_run(tmp: Path) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_fsdp2 import OPTIM

    from roll.workers.config import FSDP2Config
    from roll.workers.specs import FSDP2

    cfg = FSDP2Config(device="cpu", optimizer=OPTIM, scheduler={"kind": "linear", "min_lr_ratio": 0.5})  # type: ignore[arg-type]
    strategy = FSDP2.build(cfg, _model(), total_steps=4)
    return _train(strategy, tmp, lambda: FSDP2.build(cfg, _model(), total_steps=4))


@pytest.fixture(scope="module")
def fsdp2(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _fsdp2_run(tmp_path_factory.mktemp("fsdp2"))


@pytest.mark.parametrize("tp", [1, 2])
def test_megatron_on_cpu_trains_resumes_and_equals_fsdp2(
    tp: int, tmp_path: Path, fsdp2: dict[str, Any]
) -> None:
    sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))  # tests/gpu/tp_launch.py (found by path)
    import tp_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["ROLL_TP_TMP"] = str(tmp_path)
    got = tp_launch.launch(tp, tmp_path, Path(__file__), "megatron_run")
    torch.testing.assert_close(torch.tensor(got["logp"]), torch.tensor(fsdp2["logp"]), atol=1e-5, rtol=0)
    assert got["lr"] == pytest.approx(fsdp2["lr"], rel=1e-12)
    assert got["loss"] == pytest.approx(fsdp2["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(fsdp2["grad_norm"], rel=1e-5)
    assert set(got["weights"]) == set(fsdp2["weights"])
    for name, value in fsdp2["weights"].items():
        torch.testing.assert_close(torch.tensor(got["weights"][name]), torch.tensor(value), atol=1e-5, rtol=0)
