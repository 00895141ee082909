"""Shared forward helpers: chunked log-softmax gather, packed vs padded scoring, micro-batching."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from roll.core import columns as C
from roll.core.errors import DataError
from roll.workers import logprobs as lp


def tiny_model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
    )
    model = Qwen2ForCausalLM(cfg)
    torch.nn.Module.eval(model)
    return model


def test_logprobs_from_logits_matches_log_softmax_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lp, "LOGIT_CHUNK_ROWS", 3)  # force several chunks over 10 rows
    torch.manual_seed(0)
    logits_NV, labels_N = torch.randn(10, 17), torch.randint(0, 17, (10,))
    logp_N, ent_N = lp.logprobs_from_logits(logits_NV, labels_N, temperature=0.7, with_entropy=True)
    ref_NV = (logits_NV / 0.7).log_softmax(-1)
    torch.testing.assert_close(logp_N, ref_NV.gather(-1, labels_N[:, None]).squeeze(-1))
    assert ent_N is not None
    torch.testing.assert_close(ent_N, -(ref_NV.exp() * ref_NV).sum(-1))


def test_shifted_scores_align_token_with_previous_logits() -> None:
    torch.manual_seed(0)
    logits_BTV, ids_BT = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    mask_BT = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    logp_BT, _ = lp.shifted_scores(logits_BTV, ids_BT, lp.has_prev_from_mask(mask_BT))
    ref = logits_BTV.log_softmax(-1)
    assert logp_BT[0, 2] == pytest.approx(float(ref[0, 1, ids_BT[0, 2]]), abs=1e-6)
    assert logp_BT[1, 1] == pytest.approx(float(ref[1, 0, ids_BT[1, 1]]), abs=1e-6)
    # no prediction for padding or for a sequence's first token
    assert logp_BT[0, :2].abs().sum() == 0 and logp_BT[1, 0] == 0 and logp_BT[1, 3:].abs().sum() == 0


def test_packed_forward_equals_padded_forward() -> None:
    model = tiny_model()
    torch.manual_seed(1)
    ids_BT = torch.randint(1, 128, (3, 9))
    mask_BT = torch.tensor(
        [[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1, 0, 0]]
    )
    with torch.no_grad():
        padded = lp.forward_scores(model, ids_BT, mask_BT, temperature=0.9, with_entropy=True)
        packed = lp.forward_scores(model, ids_BT, mask_BT, temperature=0.9, with_entropy=True, packed=True)
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=1e-5)
    assert padded[0][mask_BT.bool() & lp.has_prev_from_mask(mask_BT)].abs().min() > 0


def test_all_padding_columns_are_left_out_and_change_nothing() -> None:
    model = tiny_model()
    torch.manual_seed(2)
    ids_BT = torch.randint(1, 128, (2, 6))
    mask_BT = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 0]])
    wide_ids = torch.nn.functional.pad(ids_BT, (2, 3))  # two columns of left and three of right padding
    wide_mask = torch.nn.functional.pad(mask_BT, (2, 3))
    calls: list[int] = []
    model.model.embed_tokens.register_forward_hook(lambda m, args, out: calls.append(args[0].shape[1]))
    with torch.no_grad():
        logp, ent = lp.forward_scores(model, ids_BT, mask_BT, with_entropy=True)
        wide_logp, wide_ent = lp.forward_scores(model, wide_ids, wide_mask, with_entropy=True)
    assert calls == [6, 6]  # the wide batch ran on its 6 valid columns
    assert ent is not None and wide_ent is not None
    torch.testing.assert_close(wide_logp, torch.nn.functional.pad(logp, (2, 3)), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(wide_ent, torch.nn.functional.pad(ent, (2, 3)), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("packed", [False, True])
def test_score_mask_scores_only_the_asked_positions(packed: bool) -> None:
    model = tiny_model()
    torch.manual_seed(1)
    ids_BT = torch.randint(1, 128, (3, 9))
    mask_BT = torch.tensor(
        [[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1, 0, 0]]
    )
    ask_BT = torch.zeros_like(mask_BT, dtype=torch.bool)
    ask_BT[:, 4:] = True  # includes padding: only valid positions with a previous token get a score
    full = lp.forward_scores(model, ids_BT, mask_BT, temperature=0.9, with_entropy=True, packed=packed)
    part = lp.forward_scores(
        model, ids_BT, mask_BT, temperature=0.9, with_entropy=True, packed=packed, score_mask=ask_BT
    )
    keep_BT = ask_BT & lp.has_prev_from_mask(mask_BT)
    for got, want in zip(part, full, strict=True):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want * keep_BT, atol=1e-6, rtol=1e-6)
    assert part[0][keep_BT].abs().min() > 0 and part[0][~keep_BT].abs().sum() == 0


def test_split_micro_batches_by_rows_and_tokens() -> None:
    mask_BT = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1]])
    batch = {C.INPUT_IDS: torch.arange(20).view(5, 4), C.ATTENTION_MASK: mask_BT, "scale": torch.tensor(2.0)}
    by_rows = lp.split_micro_batches(batch, micro_batch_size=2)
    assert [mb[C.INPUT_IDS].shape[0] for mb in by_rows] == [2, 2, 1]
    assert all(mb["scale"] is batch["scale"] for mb in by_rows)
    # valid tokens 3, 2, 4, 1, 4 with budget 5: [3] [2] -> 5 | [4, 1] -> 5 | [4]
    by_tokens = lp.split_micro_batches(batch, max_tokens=5)
    assert [mb[C.ATTENTION_MASK].sum().item() for mb in by_tokens] == [5, 5, 4]
    assert torch.equal(torch.cat([mb[C.INPUT_IDS] for mb in by_tokens]), batch[C.INPUT_IDS])


def test_trim_padding_and_positions() -> None:
    mask_BT = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 1, 0, 0]])
    trimmed = lp.trim_padding({C.ATTENTION_MASK: mask_BT, C.INPUT_IDS: torch.ones(2, 5)})
    assert trimmed[C.ATTENTION_MASK].tolist() == [[0, 1, 1], [1, 1, 0]]
    assert lp.position_ids_from_mask(mask_BT).tolist() == [[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]


def test_left_pad_rejects_empty_prompt() -> None:
    ids_BT, mask_BT = lp.left_pad([[5, 6], [7]], pad_id=0, device=torch.device("cpu"))
    assert ids_BT.tolist() == [[5, 6], [0, 7]] and mask_BT.tolist() == [[1, 1], [0, 1]]
    with pytest.raises(DataError):
        lp.left_pad([[1], []], pad_id=0, device=torch.device("cpu"))
