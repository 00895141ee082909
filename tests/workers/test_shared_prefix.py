"""The shared-prefix training forward (:mod:`roll.workers.shared_prefix`) equals the plain one, and does less.

Rows are GRPO-shaped: groups of samples that repeat one prompt, right-padded prompt + response, the loss on the
response tokens only. Prompts and responses have different lengths, so the prompts' left padding, the cache
expansion and the scatter back to row columns are all exercised.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_fsdp2 import ScoredNLL, _free_port, assert_params_close, config, params_of, tiny_model
from torch.multiprocessing.spawn import start_processes

from roll.core import columns as C
from roll.core.batch import Batch
from roll.data.sequences import to_sequences
from roll.workers import shared_prefix
from roll.workers.fsdp2 import FSDP2TrainStrategy
from roll.workers.logprobs import forward_scores, with_cache
from roll.workers.shared_prefix import prefix_lengths, shared_prefix_scores


def grouped_batch(groups: int = 4, samples: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    """``groups`` prompts of 6..12 tokens, each followed by ``samples`` responses of 1..6 tokens, laid out by the
    pipelines' own :func:`~roll.data.sequences.to_sequences` (right-padded prompt + response)."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(groups):
        prompt = torch.randint(1, 128, (int(torch.randint(6, 13, (), generator=g)),), generator=g).tolist()
        for _ in range(samples):
            n = int(torch.randint(1, 7, (), generator=g))
            prompts.append(prompt)
            responses.append(torch.randint(1, 128, (n,), generator=g).tolist())
    return as_training_rows(prompts, responses)


def as_training_rows(prompts: list[list[int]], responses: list[list[int]]) -> dict[str, torch.Tensor]:
    """``input_ids_BT``/``attention_mask_BT`` from ``to_sequences``, the loss on the response tokens
    (``response_mask_BT``)."""
    logps = [[0.0] * len(r) for r in responses]
    columns = {C.PROMPT_IDS: prompts, C.RESPONSE_IDS: responses, C.RESPONSE_LOGP: logps}
    rows = to_sequences(Batch(non_tensors=columns), pad_token_id=0)
    return {
        C.INPUT_IDS: rows[C.INPUT_IDS],
        C.ATTENTION_MASK: rows[C.ATTENTION_MASK],
        C.RESPONSE_MASK: rows[C.RESPONSE_MASK],
    }


def test_prefix_lengths_golden() -> None:
    """Row 0 is scored from column 2, row 1 from column 1; row 2 has no scored column: its length (3)."""
    scored = torch.tensor([[0, 0, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]])
    lengths = torch.tensor([4, 4, 3])
    assert prefix_lengths(scored, lengths).tolist() == [2, 1, 3]


def test_scores_entropy_and_gradients_equal_the_plain_forward() -> None:
    model = tiny_model()
    batch = grouped_batch()
    ids, mask, scored = batch[C.INPUT_IDS], batch[C.ATTENTION_MASK], batch[C.RESPONSE_MASK].bool()
    weights_BT = torch.randn(ids.shape, generator=torch.Generator().manual_seed(1))
    outs = []
    for shared in (False, True):
        model.zero_grad()
        if shared:
            result = shared_prefix_scores(model, ids, mask, scored, temperature=0.7, with_entropy=True)
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
    torch.testing.assert_close(logp_b, logp_a, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=0)
    assert len(grads_a) == len(grads_b) == len(list(model.parameters()))
    for ga, gb in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(gb, ga, atol=1e-5, rtol=1e-4)


def test_falls_back_without_sharing_or_right_padding() -> None:
    model = tiny_model()
    distinct = grouped_batch(groups=8, samples=1)
    ids, mask, scored = distinct[C.INPUT_IDS], distinct[C.ATTENTION_MASK], distinct[C.RESPONSE_MASK]
    assert shared_prefix_scores(model, ids, mask, scored) is None  # one row per prompt: nothing to share
    grouped = grouped_batch()
    left = grouped[C.ATTENTION_MASK].flip(-1)  # valid tokens at the right end: not the layout it reads
    assert shared_prefix_scores(model, grouped[C.INPUT_IDS], left, grouped[C.RESPONSE_MASK].flip(-1)) is None


def test_runs_only_where_it_saves_enough_work() -> None:
    """Two 4-token prompts. With 2 responses of 4 tokens each (DPO-shaped), the shared path embeds
    ``U * Lp + B * Ls = 2 * 4 + 4 * 4 = 24`` positions against the plain ``B * T = 4 * 8 = 32``: 0.75 of the work,
    above ``MAX_WORK_FRACTION`` (0.6), so the plain forward runs. With 4 one-token responses each it is
    ``2 * 4 + 8 * 1 = 16`` against ``8 * 5 = 40`` (0.4): shared."""
    model = tiny_model()
    p, q = [5, 6, 7, 8], [9, 10, 11, 12]
    pairs = as_training_rows([p, p, q, q], [[1, 2, 3, 4], [4, 3, 2, 1], [1, 1, 2, 2], [2, 2, 1, 1]])
    groups = as_training_rows([p] * 4 + [q] * 4, [[t] for t in range(1, 9)])
    assert shared_prefix.MAX_WORK_FRACTION == 0.6
    for rows, shared in ((pairs, False), (groups, True)):
        length_B = rows[C.ATTENTION_MASK].sum(-1)
        prefix_B = prefix_lengths(rows[C.RESPONSE_MASK], length_B)
        assert shared_prefix._work([p, q], prefix_B, length_B) == (16 if shared else 24)
        out = shared_prefix_scores(model, rows[C.INPUT_IDS], rows[C.ATTENTION_MASK], rows[C.RESPONSE_MASK])
        assert (out is not None) == shared


def test_strategy_steps_equal_with_less_work() -> None:
    """Two steps with and without ``shared_prefix`` give the same losses and weights; the shared one embeds
    fewer token positions (each prompt once per micro-batch instead of once per sample)."""
    runs = {}
    for shared in (False, True):
        strategy = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=8, shared_prefix=shared))
        seen: list[int] = []
        embed = strategy.model.get_input_embeddings()
        embed.register_forward_hook(lambda m, args, out, seen=seen: seen.append(args[0].numel()))
        losses = [strategy.train_step(grouped_batch(seed=s), ScoredNLL()).loss for s in range(2)]
        runs[shared] = (losses, params_of(strategy), sum(seen))
    assert runs[True][0] == pytest.approx(runs[False][0], abs=1e-6)
    assert_params_close(runs[True][1], runs[False][1], atol=1e-6)
    assert runs[True][2] < 0.8 * runs[False][2]


def _two_rank_worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        strategy = FSDP2TrainStrategy(tiny_model(), config(micro_batch_size=8), total_steps=2)
        seen: list[int] = []
        strategy.model.get_input_embeddings().register_forward_hook(
            lambda m, args, out: seen.append(args[0].numel())
        )
        plain = 0
        for step in range(2):
            batch = {k: v[rank * 8 : (rank + 1) * 8] for k, v in grouped_batch(groups=2, seed=step).items()}
            strategy.train_step(batch, ScoredNLL())
            plain += batch[C.INPUT_IDS].numel()
        assert sum(seen) < 0.8 * plain  # each rank's group ran its prompt once
        state = strategy.state_dict()
        if rank == 0:
            torch.save(state, Path(out_dir) / "two_ranks.pt")
    finally:
        dist.destroy_process_group()


def test_two_ranks_with_shared_prefixes_equal_one_plain_rank(tmp_path: Path) -> None:
    """Two forwards per micro-batch under FSDP2 (prompts, then responses on the cache) still reduce the right
    gradients across ranks: 2 ranks x 8 rows with shared prefixes equal 1 rank x 16 rows without."""
    start_processes(_two_rank_worker, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="fork")  # type: ignore[no-untyped-call]
    single = FSDP2TrainStrategy(tiny_model(), config(shared_prefix=False), total_steps=2)
    for step in range(2):
        single.train_step(grouped_batch(groups=2, seed=step), ScoredNLL())
    assert_params_close(torch.load(tmp_path / "two_ranks.pt"), params_of(single), atol=1e-5)


def test_the_cache_goes_by_the_name_the_forward_takes() -> None:
    """transformers renamed the forward's ``past_key_values`` to ``cache``; a wrong name lands in ``**kwargs`` and
    is ignored, which left the responses without their prompt. The name is read off the signature."""

    class Old(torch.nn.Module):
        def forward(
            self, input_ids: torch.Tensor, past_key_values: object = None, **kwargs: object
        ) -> None: ...

    class New(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, cache: object = None, **kwargs: object) -> None: ...

    marker = object()
    assert with_cache(Old(), marker) == {"past_key_values": marker}
    assert with_cache(New(), marker) == {"cache": marker}
    assert with_cache(tiny_model(), marker).keys() <= {"cache", "past_key_values"}
