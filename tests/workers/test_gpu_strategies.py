"""The GPU strategies: vLLM inference and Megatron-Core training.

CPU part (always runs): the modules import without their backends, ``build`` fails naming the extra to install,
configs validate, and the pure-torch helpers of both strategies behave.

GPU part (``@pytest.mark.gpu``, skipped without CUDA, and each test skips when its backend is not installed):

- vLLM generates ``n`` samples per prompt with the sampled token's log-prob, matching an fp32 HF forward of the
  same weights to bf16 tolerance; a seed reproduces a call;
- sleep frees GPU memory and wake-up restores the same greedy outputs;
- a weight update gives exactly the outputs of an engine started from those weights, and the samples report the
  new policy version;
- Megatron (TP=1) lowers the loss of a fixed batch in one step, and its HF export loads with transformers and
  scores the batch like the strategy does.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.core.errors import PluginError
from roll.workers.config import OptimizerConfig, SamplingParams
from roll.workers.megatron_config import MegatronConfig
from roll.workers.megatron_heads import align_left, restore_layout
from roll.workers.megatron_train import _pad_micro_batch
from roll.workers.types import ForwardOutput, GeneratedSample, LossDefaults
from roll.workers.vllm_config import VLLMConfig
from roll.workers.vllm_infer import sampled_logprobs

HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_MEGATRON = importlib.util.find_spec("megatron") is not None and (
    importlib.util.find_spec("megatron.core") is not None
)

# ---- CPU ---------------------------------------------------------------------------------------------------------


def test_modules_import_without_backends() -> None:
    """A fresh interpreter imports the strategy modules and the specs without importing vLLM or Megatron."""
    code = (
        "import sys\n"
        "import roll.workers.gpu_specs, roll.workers.vllm_infer, roll.workers.megatron_train\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'megatron'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.skipif(HAS_VLLM, reason="vllm is installed: build would start an engine")
def test_vllm_build_without_vllm_names_the_extra() -> None:
    from roll.workers.gpu_specs import VLLM

    assert VLLM.extra == "vllm" and VLLM.kind == "infer"
    with pytest.raises(PluginError, match=r"pip install 'roll-workers\[vllm\]'"):
        VLLM.build(VLLMConfig(), "some/model")


@pytest.mark.skipif(HAS_MEGATRON, reason="Megatron-Core is installed: the strategy builds (on CPU too)")
def test_megatron_build_without_backend_says_why() -> None:
    from roll.workers.gpu_specs import MEGATRON

    assert MEGATRON.extra == "megatron" and MEGATRON.kind == "train"
    expected = r"pip install 'roll-workers\[megatron\]'"
    with pytest.raises(PluginError, match=expected):
        MEGATRON.build(MegatronConfig(), SimpleNamespace(config=None))


def test_configs_are_strict() -> None:
    with pytest.raises(ValueError, match="micro_batch_size"):
        MegatronConfig(pipeline_parallel_size=2)
    with pytest.raises(ValueError, match=r"(?i)extra"):
        VLLMConfig(gpu_memory_util=0.5)  # type: ignore[call-arg]
    assert MegatronConfig(pipeline_parallel_size=2, micro_batch_size=1).tensor_parallel_size == 1


def test_align_left_and_restore_round_trip() -> None:
    """Left-, right- and un-padded rows: valid tokens move to column 0 and come back to their places."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 0, 0], [4, 5, 6, 7, 8]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    aligned = align_left(ids, mask)
    assert aligned.ids_BT[0, :3].tolist() == [5, 6, 7]
    assert aligned.ids_BT[1, :3].tolist() == [1, 2, 3]
    assert aligned.ids_BT[2].tolist() == [4, 5, 6, 7, 8]
    back = restore_layout(aligned.ids_BT.float(), aligned)
    assert torch.equal(back, (ids * mask).float())


def test_pad_micro_batch_pads_rows_and_token_columns() -> None:
    mb = {C.INPUT_IDS: torch.ones(2, 3, dtype=torch.long), "adv": torch.ones(2), "mask": torch.ones(2, 3)}
    out = _pad_micro_batch(mb, rows=3, cols=5)
    assert out[C.INPUT_IDS].shape == (3, 5) and out["mask"].shape == (3, 5) and out["adv"].shape == (3,)
    assert out["mask"].sum() == 6 and out["adv"].sum() == 2


def test_sampled_logprobs_reads_the_sampled_token() -> None:
    entries = [
        {7: SimpleNamespace(logprob=-0.5)},
        {3: SimpleNamespace(logprob=-1.25), 9: SimpleNamespace(logprob=-2)},
    ]
    assert sampled_logprobs([7, 3], entries) == [-0.5, -1.25]


# ---- shared GPU fixtures -----------------------------------------------------------------------------------------


def _tiny_qwen2(seed: int) -> Any:
    """A Qwen2 with head_dim 64 (every attention backend supports it) and peaked random logits."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    config.eos_token_id = None
    torch.manual_seed(seed)
    model: Any = Qwen2ForCausalLM(config)
    return model.eval()


def _save(model: Any, folder: Path) -> Path:
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("gpu_models")
    return _save(_tiny_qwen2(0), root / "m0"), _save(_tiny_qwen2(1), root / "m1")


PROMPTS = [[5, 17, 3, 99, 42], [11, 2], [64, 65, 66, 67, 68, 69]]


def _vllm(path: Path, **overrides: object) -> Any:
    from roll.workers.gpu_specs import VLLM

    fields: dict[str, object] = {
        "gpu_memory_utilization": 0.25,
        "enforce_eager": True,
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "max_model_len": 256,
    }
    fields.update(overrides)
    return VLLM.build(VLLMConfig(**fields), str(path))


def _greedy(strategy: Any) -> list[tuple[list[int], list[float]]]:
    params = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    return [(s.token_ids, s.logprobs) for s in strategy.generate(PROMPTS, params)]


# ---- vLLM on GPU -------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_vllm_generates_n_samples_with_logprobs(model_dirs: tuple[Path, Path]) -> None:
    pytest.importorskip("vllm")
    strategy = _vllm(model_dirs[0])
    try:
        params = SamplingParams(n=3, temperature=1.0, max_new_tokens=8, ignore_eos=True, seed=7)
        samples = strategy.generate(PROMPTS, params)
        assert [(s.prompt_index, s.sample_index) for s in samples] == [
            (p, i) for p in range(3) for i in range(3)
        ]
        assert all(len(s.token_ids) == 8 == len(s.logprobs) and s.finish_reason == "length" for s in samples)
        assert all(s.policy_version == 0 and max(s.logprobs) <= 0 for s in samples)
        again = strategy.generate(PROMPTS, params)
        assert [s.token_ids for s in again] == [s.token_ids for s in samples]  # same seed, same samples
        _check_against_hf(samples, model_dirs[0])
    finally:
        strategy.shutdown()


def _check_against_hf(samples: list[GeneratedSample], folder: Path) -> None:
    """vLLM's log-probs (bf16) equal an fp32 HF forward of prompt + sample within bf16 tolerance."""
    from transformers import AutoModelForCausalLM

    hf: Any = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    hf = hf.cuda().eval()
    for s in samples:
        ids = torch.tensor([PROMPTS[s.prompt_index] + s.token_ids], device="cuda")
        with torch.no_grad():
            logp = hf(ids).logits.float().log_softmax(-1)[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1)
        expected = logp[-len(s.token_ids) :].cpu()
        torch.testing.assert_close(torch.tensor(s.logprobs), expected, atol=0.15, rtol=0.05)


@pytest.mark.gpu
def test_vllm_sleep_frees_memory_and_wake_restores(model_dirs: tuple[Path, Path]) -> None:
    pytest.importorskip("vllm")
    strategy = _vllm(model_dirs[0])
    try:
        before = _greedy(strategy)
        free_awake, total = torch.cuda.mem_get_info()
        strategy.offload()
        assert strategy.is_sleeping()
        free_asleep, _ = torch.cuda.mem_get_info()
        # The KV cache is ~25% of the GPU; sleeping must hand most of it back.
        assert free_asleep - free_awake > 0.15 * total
        strategy.reload()
        assert _greedy(strategy) == before
    finally:
        strategy.shutdown()


@pytest.mark.gpu
def test_vllm_weight_update_equals_loading_those_weights(model_dirs: tuple[Path, Path]) -> None:
    pytest.importorskip("vllm")
    new_weights = {k: v.to(torch.bfloat16) for k, v in _tiny_qwen2(1).state_dict().items()}
    strategy = _vllm(model_dirs[0])
    try:
        old = _greedy(strategy)
        strategy.load_weights(new_weights, policy_version=1)
        assert strategy.policy_version == 1
        updated = _greedy(strategy)
        params = SamplingParams(temperature=0.0, max_new_tokens=2, ignore_eos=True)
        assert all(s.policy_version == 1 for s in strategy.generate(PROMPTS, params))
    finally:
        strategy.shutdown()
    reference = _vllm(model_dirs[1])
    try:
        assert updated == _greedy(reference)
        assert updated != old
    finally:
        reference.shutdown()


@pytest.mark.gpu
def test_vllm_lora_adapter_serves_the_merged_model(model_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """Two LoRA updates through ``load_adapter`` (the wire format of a LoRA model update): the engine then serves
    base + the second adapter, the greedy tokens of a plain engine loading the merged weights."""
    pytest.importorskip("vllm")
    from roll.workers.config import LoraConfig
    from roll.workers.lora import LORA_A, LORA_B, merge_weight

    lora = LoraConfig(r=8, alpha=16, target_modules=["q_proj", "v_proj"])
    base = _tiny_qwen2(0)  # the weights of model_dirs[0]
    adapters = []
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        named: dict[str, torch.Tensor] = {}
        for name, module in base.named_modules():
            if name.endswith(("q_proj", "v_proj")):
                out_features, in_features = module.weight.shape
                named[name + LORA_A] = torch.randn(lora.r, in_features, generator=g) * 0.2
                named[name + LORA_B] = torch.randn(out_features, lora.r, generator=g) * 0.2
        adapters.append(named)
    state = base.state_dict()
    for key in list(state):
        module = key.removesuffix(".weight")
        if module + LORA_A in adapters[1]:
            state[key] = merge_weight(
                state[key], adapters[1][module + LORA_A], adapters[1][module + LORA_B], 2.0
            )
    base.load_state_dict(state)
    merged_dir = _save(base, tmp_path / "merged")
    strategy = _vllm(model_dirs[0], enable_lora=True, max_lora_rank=8)
    try:
        before = _greedy(strategy)
        strategy.load_adapter(adapters[0], lora, policy_version=1)
        strategy.load_adapter(adapters[1], lora, policy_version=2)
        assert strategy.policy_version == 2
        served = _greedy(strategy)
    finally:
        strategy.shutdown()
    reference = _vllm(merged_dir)
    try:
        expected = _greedy(reference)
    finally:
        reference.shutdown()
    assert [tokens for tokens, _ in served] == [tokens for tokens, _ in expected]
    assert served != before
    for (_, got), (_, want) in zip(served, expected):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=0.1, rtol=0)  # bf16 kernels


# ---- Megatron on GPU ---------------------------------------------------------------------------------------------


class _TokenNLL(LossDefaults):
    """Sum of ``-logp`` over ``response_mask_BT``; units are masked tokens."""

    def __call__(
        self, output: ForwardOutput, micro_batch: Mapping[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return -(output.logp_BT * micro_batch[C.RESPONSE_MASK].to(output.logp_BT.device)).sum(), {}

    def count_units(self, micro_batch: Mapping[str, torch.Tensor]) -> float:
        return float(micro_batch[C.RESPONSE_MASK].sum())


def _batch() -> dict[str, torch.Tensor]:
    """Two left-padded rows and one full row; the loss covers every predicted token."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 512, (3, 12), generator=g)
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0
    mask[1, :2] = 0
    ids = ids * mask
    loss_mask = mask.clone()
    loss_mask[torch.arange(3), mask.argmax(1)] = 0  # a row's first token has no prediction
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask, C.RESPONSE_MASK: loss_mask}


@pytest.mark.gpu
def test_megatron_step_lowers_loss_and_exports_to_hf(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core")
    from transformers import AutoModelForCausalLM

    from roll.workers.gpu_specs import MEGATRON
    from roll.workers.logprobs import forward_scores

    config = MegatronConfig(
        precision="fp32", optimizer=OptimizerConfig(lr=1e-2), use_distributed_optimizer=True
    )
    strategy = MEGATRON.build(config, _tiny_qwen2(0), total_steps=1)
    batch, loss_fn = _batch(), _TokenNLL()

    def loss_now() -> float:
        scores = strategy.compute_logprobs(batch[C.INPUT_IDS], batch[C.ATTENTION_MASK])
        return float(-(scores.logp_BT.cpu() * batch[C.RESPONSE_MASK]).sum() / batch[C.RESPONSE_MASK].sum())

    before = loss_now()
    result = strategy.train_step(batch, loss_fn)
    assert result.loss == pytest.approx(before, rel=1e-4)  # the step's loss is the pre-step loss
    assert result.num_units == float(batch[C.RESPONSE_MASK].sum()) and result.grad_norm > 0
    after = loss_now()
    assert after < before

    strategy.export_hf(tmp_path / "export")
    hf: Any = AutoModelForCausalLM.from_pretrained(str(tmp_path / "export"), dtype=torch.float32)
    hf = hf.cuda().eval()
    with torch.no_grad():
        hf_logp, _ = forward_scores(hf, batch[C.INPUT_IDS].cuda(), batch[C.ATTENTION_MASK].cuda())
    ours = strategy.compute_logprobs(batch[C.INPUT_IDS], batch[C.ATTENTION_MASK]).logp_BT
    torch.testing.assert_close(ours.cpu(), hf_logp.float().cpu(), atol=2e-3, rtol=1e-3)
