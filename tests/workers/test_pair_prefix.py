"""Preference pairs as one row each (:mod:`roll.workers.pair_prefix`) score and train like the plain forward.

Rows are DPO-shaped: pairs interleaved (row ``2i`` chosen, ``2i + 1`` rejected) that share a prompt and differ in
their responses, right-padded, the loss on the response tokens only.
"""

from __future__ import annotations

import pytest
import torch
from test_fsdp2 import ScoredNLL, assert_params_close, config, params_of, tiny_model

from roll.core import columns as C
from roll.workers import pair_prefix
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.logprobs import forward_scores
from roll.workers.pair_prefix import pair_layout, pair_prefix_scores


class PairedNLL(ScoredNLL):
    """The scored token-mean NLL, declaring its rows interleaved pairs."""

    paired_rows = True


def pair_rows(pairs: int = 4, seed: int = 0) -> dict[str, torch.Tensor]:
    """``pairs`` prompts of 6..12 tokens, each followed by two responses of 1..6 tokens, right-padded."""
    g = torch.Generator().manual_seed(seed)
    seqs, n_prompt = [], []
    for _ in range(pairs):
        prompt = torch.randint(1, 128, (int(torch.randint(6, 13, (), generator=g)),), generator=g).tolist()
        for _ in range(2):
            response = torch.randint(1, 128, (int(torch.randint(1, 7, (), generator=g)),), generator=g)
            seqs.append(prompt + response.tolist())
            n_prompt.append(len(prompt))
    T = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    mask, loss_mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for r, (s, n) in enumerate(zip(seqs, n_prompt, strict=True)):
        ids[r, : len(s)], mask[r, : len(s)], loss_mask[r, n : len(s)] = torch.tensor(s), 1, 1
    return {C.INPUT_IDS: ids, C.ATTENTION_MASK: mask, C.RESPONSE_MASK: loss_mask}


def test_layout_golden() -> None:
    """Chosen ``5 6 7 8`` and rejected ``5 6 9`` (pad 0) share ``5 6``: merged row ``5 6 7 8 9``, positions
    ``0 1 2 3 2``; token 9 (merged 4) sees the prefix (0, 1) and itself, not ``7 8``. Scored: chosen's 7 and 8
    (predicted by merged 1 and 2), rejected's 9 (predicted by merged 1, the prefix's last token)."""
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 9, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    scored = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 0]])
    layout = pair_layout(ids, mask, scored)
    assert layout is not None
    assert layout.ids_PL.tolist() == [[5, 6, 7, 8, 9]] and layout.pos_PL.tolist() == [[0, 1, 2, 3, 2]]
    assert layout.mask_P1LL[0, 0, 4].tolist() == [True, True, False, False, True]
    assert layout.mask_P1LL[0, 0, 3].tolist() == [True, True, True, True, False]
    assert list(zip(layout.rows_M.tolist(), layout.cols_M.tolist(), strict=True)) == [(0, 2), (0, 3), (1, 2)]
    assert layout.src_col_M.tolist() == [1, 2, 1] and layout.labels_M.tolist() == [7, 8, 9]


def test_scores_entropy_and_gradients_equal_the_plain_forward() -> None:
    model = tiny_model()
    batch = pair_rows()
    ids, mask, scored = batch[C.INPUT_IDS], batch[C.ATTENTION_MASK], batch[C.RESPONSE_MASK].bool()
    weights_BT = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    outs = []
    for paired in (False, True):
        model.zero_grad()
        if paired:
            result = pair_prefix_scores(model, ids, mask, scored, temperature=0.7, with_entropy=True)
            assert result is not None
        else:
            result = forward_scores(model, ids, mask, temperature=0.7, with_entropy=True, score_mask=scored)
        logp_BT, ent_BT = result
        assert ent_BT is not None
        ((logp_BT + 0.1 * ent_BT) * weights_BT * scored).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        outs.append((logp_BT.detach(), ent_BT.detach(), grads))
    (logp_a, ent_a, grads_a), (logp_b, ent_b, grads_b) = outs
    assert bool((logp_b[~scored] == 0).all()) and bool((ent_b[~scored] == 0).all())
    torch.testing.assert_close(logp_b, logp_a, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-6, rtol=1e-6)  # entropies ~4.8: a few ulps
    assert len(grads_a) == len(grads_b) == len(list(model.parameters()))
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(gb, ga, atol=1e-6, rtol=1e-5)


def test_falls_back_where_it_does_not_apply() -> None:
    """An odd row count, or pairs without a common prefix (merged rows as long as both: work fraction 1 > 0.85),
    take the plain path."""
    model = tiny_model()
    batch = pair_rows()
    ids, mask, scored = batch[C.INPUT_IDS], batch[C.ATTENTION_MASK], batch[C.RESPONSE_MASK]
    assert pair_prefix_scores(model, ids[:7], mask[:7], scored[:7]) is None
    unrelated = ids.clone()
    unrelated[1::2, 0] = (
        unrelated[0::2, 0] + 1
    )  # the rejected rows' first token differs from the chosen ones'
    assert pair_prefix.MAX_WORK_FRACTION == 0.85
    assert pair_layout(unrelated, mask, scored) is None
    assert pair_layout(ids, mask, scored) is not None


def test_strategy_steps_equal_with_less_work() -> None:
    """Two steps with and without ``pair_prefix`` give the same losses (1e-6) and weights; the pair path embeds
    fewer token positions (each prompt once per pair instead of twice)."""
    runs = {}
    for paired in (False, True):
        strategy = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=4, pair_prefix=paired))
        seen: list[int] = []
        embed = strategy.model.get_input_embeddings()
        embed.register_forward_hook(lambda m, args, out, seen=seen: seen.append(args[0].numel()))
        losses = [strategy.train_step(pair_rows(seed=s), PairedNLL()).loss for s in range(2)]
        runs[paired] = (losses, params_of(strategy), sum(seen))
    assert runs[True][0] == pytest.approx(runs[False][0], abs=1e-6)
    assert_params_close(runs[True][1], runs[False][1], atol=1e-6)
    assert runs[True][2] < 0.85 * runs[False][2]
