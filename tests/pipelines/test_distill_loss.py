"""Distillation pieces without Ray: the LossFn wrapper equals ``distill_loss``, the student forward's alignment,
the tokenizer check, the config's validation."""

from __future__ import annotations

import pytest
import torch

from roll.core import columns as C
from roll.core.columns import LABELS
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.choices import DIVERGENCES, DivergenceName
from roll.pipelines.algorithms.divergence import distill_loss
from roll.pipelines.algorithms.preference import sft_cross_entropy
from roll.pipelines.distill import DistillConfig
from roll.pipelines.distill.checks import check_same_tokenizer
from roll.pipelines.distill.losses import DistillLoss, StudentOutput

B, T, V, K = 4, 9, 13, 5


def fixed_batch() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Right-padded rows: 3 prompt tokens (label -100), then answer tokens; row lengths 9, 8, 6, 7."""
    g = torch.Generator().manual_seed(0)
    lengths = [9, 8, 6, 7]
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.long)
    labels = torch.full((B, T), -100)
    for b, n in enumerate(lengths):
        mask[b, :n] = 1
        labels[b, 3:n] = ids[b, 3:n]
    teacher = torch.randn(B, T, V, generator=g) * 2
    top = teacher.topk(K, dim=-1)
    logits = torch.randn(B, T, V, generator=g)
    mb = {
        C.INPUT_IDS: ids,
        C.ATTENTION_MASK: mask,
        LABELS: labels,
        C.TOPK_VALUES: top.values,
        C.TOPK_INDICES: top.indices,
    }
    return mb, logits


def run_loss(
    loss: DistillLoss, mb: dict[str, torch.Tensor], logits: torch.Tensor, splits: list[int]
) -> torch.Tensor:
    """Sum of the bound loss over micro-batches of ``splits`` rows: what the strategy backpropagates."""
    bound = loss.bind(mb)
    total, units, lo = torch.zeros(()), 0.0, 0
    for n in splits:
        part = {k: v[lo : lo + n] for k, v in mb.items()}
        out = StudentOutput(logp_BT=torch.zeros(n, T), logits_BTV=logits[lo : lo + n])
        total = total + bound(out, part)[0]
        units += bound.count_units(part)
        lo += n
    assert units == pytest.approx(1.0)  # the strategy divides by the global units: a no-op
    return total


@pytest.mark.parametrize("divergence", DIVERGENCES)
@pytest.mark.parametrize("kd_weight", [1.0, 0.7])
def test_wrapper_equals_distill_loss(divergence: DivergenceName, kd_weight: float) -> None:
    mb, logits = fixed_batch()
    loss = DistillLoss(
        divergence=divergence, kd_weight=kd_weight, student_temperature=1.5, teacher_temperature=0.8
    )
    got = run_loss(loss, mb, logits, [1, 3])
    mask = mb[LABELS] != -100
    want, _ = distill_loss(
        logits,
        mb[C.TOPK_VALUES],
        mb[C.TOPK_INDICES],
        mask,
        divergence=divergence,
        student_temperature=1.5,
        teacher_temperature=0.8,
        kd_weight=kd_weight,
        labels_BT=mb[LABELS],
    )
    torch.testing.assert_close(got, want)


def test_wrapper_gradient_equals_distill_loss() -> None:
    mb, logits = fixed_batch()
    a = logits.clone().requires_grad_(True)
    b = logits.clone().requires_grad_(True)
    run_loss(DistillLoss(divergence="js", kd_weight=0.5), mb, a, [2, 2]).backward()  # type: ignore[no-untyped-call]
    mask = mb[LABELS] != -100
    want, _ = distill_loss(
        b, mb[C.TOPK_VALUES], mb[C.TOPK_INDICES], mask, divergence="js", kd_weight=0.5, labels_BT=mb[LABELS]
    )
    want.backward()  # type: ignore[no-untyped-call]
    torch.testing.assert_close(a.grad, b.grad)


def test_prompt_distillation_normalizes_each_term_by_its_own_tokens() -> None:
    """With ``distill_prompt`` the divergence covers every predicted token and the CE only the answer:
    ``w * mean_{has_prev}(div) + (1 - w) * mean_{labels}(nll)``."""
    mb, logits = fixed_batch()
    got = run_loss(DistillLoss(kd_weight=0.6, distill_prompt=True), mb, logits, [3, 1])
    has_prev = torch.zeros(B, T, dtype=torch.bool)
    has_prev[:, 1:] = mb[C.ATTENTION_MASK][:, :-1].bool()
    has_prev &= mb[C.ATTENTION_MASK].bool()
    kd, _ = distill_loss(logits, mb[C.TOPK_VALUES], mb[C.TOPK_INDICES], has_prev)
    ce = sft_cross_entropy(logits, mb[LABELS])
    torch.testing.assert_close(got, 0.6 * kd + 0.4 * ce)


def test_loss_without_bind_or_logits_says_what_to_do() -> None:
    mb, logits = fixed_batch()
    with pytest.raises(Exception, match="bind"):
        DistillLoss()(StudentOutput(logp_BT=torch.zeros(B, T), logits_BTV=logits), mb)
    with pytest.raises(Exception, match="DistillStudentWorker"):
        DistillLoss().bind(mb)(StudentOutput(logp_BT=torch.zeros(B, T)), mb)


def test_student_forward_aligns_logits_with_logprobs() -> None:
    """``logits_BTV[b, t]`` scores token ``t``: its log-softmax at the token equals the strategies' ``logp_BT``."""
    from roll.data.tiny import build_tiny_model
    from roll.pipelines.distill.losses import student_forward
    from roll.workers.logprobs import forward_scores

    model = build_tiny_model("tiny-1m")
    ids = torch.randint(3, 100, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        out = student_forward(model, ids, mask, False, 1.0)
        want, _ = forward_scores(model, ids, mask)
    torch.testing.assert_close(out.logp_BT, want, rtol=1e-5, atol=1e-5)
    assert out.logits_BTV is not None
    torch.testing.assert_close(out.logits_BTV[:, 0], torch.zeros_like(out.logits_BTV[:, 0]))


def test_tokenizer_mismatch_names_both_models_and_keys() -> None:
    from roll.data.tokenizer import build_tokenizer

    student, teacher = build_tokenizer(), build_tokenizer()
    check_same_tokenizer(student, teacher, student_ref="a", teacher_ref="b", student_key="s", teacher_key="t")
    teacher.add_tokens(["<extra_tool_token>"])
    with pytest.raises(ConfigError) as err:
        check_same_tokenizer(
            student,
            teacher,
            student_ref="tiny-1m",
            teacher_ref="/models/other-teacher",
            student_key="student.model.path",
            teacher_key="teacher.model.path",
        )
    text = str(err.value)
    for part in (
        "student.model.path='tiny-1m'",
        "teacher.model.path='/models/other-teacher'",
        "<extra_tool_token>",
    ):
        assert part in text
    assert "vocabulary sizes differ" in text


def test_config_defaults_validate_and_batch_errors_name_the_key() -> None:
    cfg = DistillConfig.model_validate({})
    assert cfg.teacher.model.path == "tiny-10m" and cfg.student.model.path == "tiny-1m"
    with pytest.raises(ValueError, match=r"student\.num_workers"):
        DistillConfig.model_validate(
            {"student": {"num_workers": 3}, "batch": {"prompts_per_step": 32, "micro_batch_samples": 16}}
        )
    with pytest.raises(ValueError, match="divergence"):
        DistillConfig.model_validate({"distill": {"divergence": "kl"}})


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_token_logprobs_equal_the_full_log_softmax_with_gradients(temperature: float) -> None:
    """Chunks of 5 positions over B*T = 36 (the last chunk is short) give the one-shot values and gradients."""
    from roll.pipelines.distill.losses import token_logprobs

    mb, logits = fixed_batch()
    ids = mb[C.INPUT_IDS]
    weights = torch.randn(B, T, generator=torch.Generator().manual_seed(1))
    full_logits = logits.clone().requires_grad_(True)
    full = torch.log_softmax(full_logits / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)
    (full * weights).sum().backward()
    chunk_logits = logits.clone().requires_grad_(True)
    chunked = token_logprobs(chunk_logits, ids, temperature=temperature, chunk=5)
    (chunked * weights).sum().backward()
    torch.testing.assert_close(chunked, full)
    torch.testing.assert_close(chunk_logits.grad, full_logits.grad)
    with torch.no_grad():
        torch.testing.assert_close(
            token_logprobs(logits, ids, temperature=temperature, chunk=7), full.detach()
        )


def test_chunked_cross_entropy_equals_sft_cross_entropy() -> None:
    from roll.pipelines.algorithms.aggregate import Aggregation
    from roll.pipelines.distill.losses import chunked_cross_entropy

    mb, logits = fixed_batch()
    agg = Aggregation(num_global_tokens=50.0)
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    expected = sft_cross_entropy(a, mb[LABELS], agg=agg)
    got = chunked_cross_entropy(b, mb[LABELS], agg=agg, chunk=4)
    expected.backward()
    got.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(b.grad, a.grad)


def test_the_student_role_reaches_each_of_its_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """DistillStudentWorker built in this process (no Ray; ``roll_call`` is what its actor runs): ``setup`` is its
    PolicyTrainer's, built with STUDENT_FORWARD (``eval_distill`` needs logits), ``eval_step`` its
    SFTEvaluation's. Counts by hand from :func:`fixed_batch` (lengths 9, 8, 6, 7; labels from token 3): 6+5+3+4 = 18
    trained tokens, 8+7+5+6 = 26 predicted positions with ``distill_prompt``."""
    from roll.core.batch import Batch
    from roll.core.cluster import WorkerContext
    from roll.pipelines.distill.worker import DistillStudentWorker
    from roll.workers.config import FSDP2Config
    from roll.workers.roles.config import ModelConfig
    from roll.workers.roles.spec import TrainerSpec

    monkeypatch.setenv("RANK", "0")  # Worker.__init__ exports both; restored after the test
    monkeypatch.setenv("WORLD_SIZE", "1")
    spec = TrainerSpec(model=ModelConfig(path="tiny-1m"), strategy=FSDP2Config(device="cpu"))
    student = DistillStudentWorker(WorkerContext("student", 0, 1), spec)
    student.roll_call("setup")
    batch = Batch(fixed_batch()[0])
    (kd,) = student.roll_call("eval_distill", batch, DistillLoss())
    (kd_prompt,) = student.roll_call("eval_distill", batch, DistillLoss(distill_prompt=True))
    assert (kd["kd_tokens_sum"], kd_prompt["kd_tokens_sum"]) == (18.0, 26.0)
    assert kd["kd_sum"] > 0.0
    assert student.roll_call("eval_step", batch)["tokens_sum"] == 18.0
