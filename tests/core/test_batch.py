"""Tests for roll.core.batch: every operation with exact expected rows, every error message, and pickling."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from roll.core.batch import PAD_COLUMN, Batch, MissingColumnError
from roll.core.errors import DataError, RollError


def make_batch(size: int = 4) -> Batch:
    """Rows i = 0..size-1: ids_BT row i is [10i, 10i+1]; prompt is "p{i}"; tags are dicts {"i": i}."""
    ids_BT = torch.stack([torch.arange(size) * 10, torch.arange(size) * 10 + 1], dim=1)
    return Batch(
        tensors={"ids_BT": ids_BT, "reward_B": torch.arange(size, dtype=torch.float32) / 2},
        non_tensors={"prompt": [f"p{i}" for i in range(size)], "tag": [{"i": i} for i in range(size)]},
        meta={"step": 3},
    )


def rows(batch: Batch) -> list[int]:
    """The original row numbers of a batch built by make_batch, read back from ids_BT."""
    ids_BT = batch["ids_BT"]
    assert isinstance(ids_BT, torch.Tensor)
    return [int(x) // 10 for x in ids_BT[:, 0]]


def assert_batches_equal(a: Batch, b: Batch) -> None:
    assert a.keys() == b.keys()
    assert len(a) == len(b)
    assert a.meta == b.meta
    for name, tensor in a.tensors.items():
        assert b.tensors[name].dtype == tensor.dtype, name
        torch.testing.assert_close(b.tensors[name], tensor, rtol=0, atol=0)
    for name, column in a.non_tensors.items():
        assert b.non_tensors[name].tolist() == column.tolist(), name


# ---------------------------------------------------------------------------------------------- construction


def test_construction_and_mapping() -> None:
    batch = make_batch()
    assert len(batch) == 4
    assert batch.keys() == ["ids_BT", "reward_B", "prompt", "tag"]
    assert list(batch) == batch.keys()
    assert "prompt" in batch and "nope" not in batch
    assert batch["ids_BT"].tolist() == [[0, 1], [10, 11], [20, 21], [30, 31]]
    prompt = batch["prompt"]
    assert isinstance(prompt, np.ndarray) and prompt.dtype == object
    assert prompt.tolist() == ["p0", "p1", "p2", "p3"]
    assert repr(batch) == (
        "Batch(B=4, tensors={ids_BT: int64[4, 2], reward_B: float32[4]}, "
        "non_tensors={prompt: object[4], tag: object[4]}, meta={'step': 3})"
    )
    assert len(Batch()) == 0


def test_list_of_lists_stays_one_column_per_row() -> None:
    batch = Batch(non_tensors={"msgs": [[1, 2], [3, 4], [5, 6]]})
    assert batch["msgs"].shape == (3,)
    assert batch.select([2])["msgs"].tolist() == [[5, 6]]


def test_construction_rejects_mismatched_lengths() -> None:
    with pytest.raises(DataError) as info:
        Batch({"a_B": torch.zeros(4)}, {"prompt": ["x", "y", "z"]})
    assert str(info.value) == (
        "column 'prompt' has 3 rows, but column 'a_B' has 4; every column must share the leading batch dimension"
    )
    assert info.value.column == "prompt"  # type: ignore[attr-defined]


def test_construction_rejects_bad_columns() -> None:
    with pytest.raises(
        DataError, match=r"^column 'x' is 0-dimensional; a column needs a leading batch dimension$"
    ):
        Batch({"x": torch.tensor(1.0)})
    with pytest.raises(DataError, match=r"^column 's' must be a tensor, numpy array or list, got str$"):
        Batch(non_tensors={"s": "abc"})
    with pytest.raises(DataError, match=r"^columns \['a'\] are given both as tensors and as non-tensors$"):
        Batch({"a": torch.zeros(2)}, {"a": [1, 2]})


def test_missing_column_error() -> None:
    with pytest.raises(MissingColumnError) as info:
        make_batch()["nope"]
    assert str(info.value) == "batch has no column 'nope'; columns: ids_BT, reward_B, prompt, tag"
    assert isinstance(info.value, KeyError) and isinstance(info.value, RollError)


def test_setitem_validates_length() -> None:
    batch = make_batch()
    batch["adv_B"] = torch.ones(4)
    batch["answer"] = ["a", "b", "c", "d"]
    assert batch.keys() == ["ids_BT", "reward_B", "adv_B", "prompt", "tag", "answer"]
    with pytest.raises(DataError, match=r"^column 'bad_B' has 3 rows, but the batch has 4$"):
        batch["bad_B"] = torch.ones(3)
    empty = Batch()
    empty["x_B"] = torch.ones(5)
    assert len(empty) == 5


# --------------------------------------------------------------------------------------------- row selection


def test_select_reorders_and_repeats() -> None:
    batch = make_batch()
    picked = batch.select(torch.tensor([3, 1, 1, -4]))
    assert rows(picked) == [3, 1, 1, 0]
    assert picked["prompt"].tolist() == ["p3", "p1", "p1", "p0"]
    assert picked["tag"].tolist() == [{"i": 3}, {"i": 1}, {"i": 1}, {"i": 0}]
    assert picked["reward_B"].tolist() == [1.5, 0.5, 0.5, 0.0]
    assert picked.meta == {"step": 3} and picked.meta is not batch.meta
    assert rows(batch.select([2])) == [2]
    assert len(batch.select([])) == 0


def test_select_errors() -> None:
    batch = make_batch()
    with pytest.raises(DataError, match=r"^index 4 is out of range for a batch of 4 rows$"):
        batch.select([0, 4])
    with pytest.raises(DataError, match=r"^index -5 is out of range for a batch of 4 rows$"):
        batch.select([-5])
    with pytest.raises(DataError, match=r"^select needs integer indices, got dtype bool$"):
        batch.select(torch.tensor([True, False, True, False]))


def test_slice_is_a_view() -> None:
    batch = make_batch()
    part = batch.slice(1, 3)
    assert rows(part) == [1, 2]
    assert part["prompt"].tolist() == ["p1", "p2"]
    assert rows(batch.slice(2)) == [2, 3]
    part["reward_B"][0] = 9.0
    assert batch["reward_B"].tolist() == [0.0, 9.0, 1.0, 1.5]


def test_chunk_and_split() -> None:
    batch = make_batch(6)
    assert [rows(c) for c in batch.chunk(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [c["prompt"].tolist() for c in batch.chunk(2)] == [["p0", "p1", "p2"], ["p3", "p4", "p5"]]
    assert [rows(p) for p in batch.split([1, 0, 5])] == [[0], [], [1, 2, 3, 4, 5]]


def test_chunk_and_split_errors() -> None:
    batch = make_batch(10)
    with pytest.raises(DataError) as info:
        batch.chunk(3)
    assert str(info.value) == (
        "cannot chunk a batch of 10 rows into 3 equal parts: 10 % 3 = 1; call pad_to_multiple(3) first (adds 2 rows)"
    )
    with pytest.raises(DataError, match=r"^chunk count must be >= 1, got 0$"):
        batch.chunk(0)
    with pytest.raises(DataError, match=r"^split sizes \[4, 4\] must be >= 0 and sum to the batch size 10$"):
        batch.split([4, 4])
    with pytest.raises(
        DataError, match=r"^split sizes \[11, -1\] must be >= 0 and sum to the batch size 10$"
    ):
        batch.split([11, -1])


@pytest.mark.parametrize(
    ("interleave", "expected"), [(True, [0, 0, 0, 1, 1, 1]), (False, [0, 1, 0, 1, 0, 1])]
)
def test_repeat(interleave: bool, expected: list[int]) -> None:
    batch = make_batch(2).repeat(3, interleave=interleave)
    assert rows(batch) == expected
    assert batch["prompt"].tolist() == [f"p{i}" for i in expected]
    with pytest.raises(DataError, match=r"^repeat count must be >= 1, got 0$"):
        make_batch().repeat(0)


def test_pad_to_multiple_and_unpad() -> None:
    batch = make_batch(5)
    padded, pad = batch.pad_to_multiple(4)
    assert pad == 3
    assert rows(padded) == [0, 1, 2, 3, 4, 2, 3, 4]
    assert padded[PAD_COLUMN].tolist() == [False] * 5 + [True] * 3
    assert [rows(c) for c in padded.chunk(4)] == [[0, 1], [2, 3], [4, 2], [3, 4]]
    restored = padded.unpad(pad)
    assert_batches_equal(batch, restored)
    assert PAD_COLUMN not in restored


def test_pad_cycles_when_pad_exceeds_batch_and_composes() -> None:
    padded, pad = make_batch(2).pad_to_multiple(5)
    assert (pad, rows(padded)) == (3, [0, 1, 1, 0, 1])
    twice, pad2 = padded.pad_to_multiple(6)
    assert (pad2, rows(twice)) == (1, [0, 1, 1, 0, 1, 1])
    assert twice[PAD_COLUMN].tolist() == [False, False, True, True, True, True]
    once = twice.unpad(1)
    assert once[PAD_COLUMN].tolist() == [False, False, True, True, True]


def test_pad_noop_and_errors() -> None:
    batch = make_batch(4)
    same, pad = batch.pad_to_multiple(2)
    assert pad == 0 and rows(same) == [0, 1, 2, 3]
    assert same[PAD_COLUMN].tolist() == [False] * 4
    assert same.unpad(0).keys() == batch.keys()
    with pytest.raises(DataError, match=r"^pad multiple must be >= 1, got 0$"):
        batch.pad_to_multiple(0)
    empty, empty_pad = Batch().pad_to_multiple(3)
    assert (len(empty), empty_pad) == (0, 0)
    with pytest.raises(DataError, match=r"^unpad\(2\) would drop 2 rows not marked in 'is_pad_B'$"):
        same.unpad(2)
    with pytest.raises(DataError, match=r"^cannot unpad 5 rows from a batch of 4$"):
        batch.unpad(5)
    assert rows(batch.unpad(1)) == [0, 1, 2]  # no pad column: a plain slice


# ------------------------------------------------------------------------------------------------- combining


def test_concat() -> None:
    batch = make_batch(5)
    a, b = batch.split([2, 3])
    b.meta["policy_version"] = 7
    joined = Batch.concat([a, b])
    assert rows(joined) == [0, 1, 2, 3, 4]
    assert joined["tag"].tolist() == [{"i": i} for i in range(5)]
    assert joined.meta == {"step": 3, "policy_version": 7}
    assert_batches_equal(Batch.concat(batch.chunk(5)), batch)


def test_concat_errors() -> None:
    a, b = make_batch(4).split([2, 2])
    with pytest.raises(DataError, match=r"^concat needs at least one batch$"):
        Batch.concat([])
    b.meta["step"] = 4
    with pytest.raises(DataError, match=r"^conflicting meta 'step': 3 vs 4$"):
        Batch.concat([a, b])
    b.meta["step"] = 3
    b.pop("tag")
    with pytest.raises(DataError) as info:
        Batch.concat([a, b])
    assert str(info.value) == (
        "cannot concat: batch 1 has columns ['ids_BT', 'prompt', 'reward_B'], "
        "batch 0 has ['ids_BT', 'prompt', 'reward_B', 'tag']"
    )
    c = make_batch(2)
    c["ids_BT"] = torch.zeros(2, 3, dtype=torch.int32)
    with pytest.raises(DataError) as info:
        Batch.concat([make_batch(2), c])
    assert (
        str(info.value) == "cannot concat column 'ids_BT': batch 0 has int64[B, 2], batch 1 has int32[B, 3]"
    )


def test_union() -> None:
    batch = make_batch(3)
    extra = Batch({"adv_B": torch.tensor([1.0, 2.0, 3.0])}, {"prompt": ["p0", "p1", "p2"]}, {"version": 2})
    merged = batch.union(extra)
    assert merged.keys() == ["ids_BT", "reward_B", "adv_B", "prompt", "tag"]
    assert merged["adv_B"].tolist() == [1.0, 2.0, 3.0]
    assert merged.meta == {"step": 3, "version": 2}
    with pytest.raises(DataError, match=r"^cannot union batches of 3 and 2 rows$"):
        batch.union(make_batch(2))
    clash = Batch(non_tensors={"prompt": ["x", "p1", "p2"]})
    with pytest.raises(
        DataError, match=r"^cannot union: column 'prompt' is in both batches with different values$"
    ):
        batch.union(clash)


# --------------------------------------------------------------------------------------------------- columns


def test_to_and_clone() -> None:
    batch = make_batch()
    moved = batch.to("cpu")
    assert moved["ids_BT"].device.type == "cpu" and moved.meta == batch.meta
    copy = batch.clone()
    copy["reward_B"][0] = 5.0
    copy["tag"][0]["i"] = 99
    assert batch["reward_B"][0].item() == 0.0
    assert batch["tag"][0] == {"i": 0}


def test_rename() -> None:
    batch = make_batch()
    renamed = batch.rename({"reward_B": "score_B", "prompt": "question"})
    assert renamed.keys() == ["ids_BT", "score_B", "question", "tag"]
    assert renamed["score_B"].tolist() == [0.0, 0.5, 1.0, 1.5]
    with pytest.raises(MissingColumnError) as info:
        batch.rename({"nope": "x"})
    assert str(info.value) == "cannot rename missing columns ['nope']; columns: ids_BT, reward_B, prompt, tag"
    with pytest.raises(DataError) as info2:
        batch.rename({"reward_B": "tag"})
    assert str(info2.value) == "rename {'reward_B': 'tag'} would give duplicate columns ['tag']"


def test_pop() -> None:
    batch = make_batch()
    popped = batch.pop("reward_B", "tag")
    assert popped.keys() == ["reward_B", "tag"] and len(popped) == 4 and popped.meta == {"step": 3}
    assert batch.keys() == ["ids_BT", "prompt"] and len(batch) == 4
    with pytest.raises(MissingColumnError) as info:
        batch.pop("tag")
    assert str(info.value) == "cannot pop missing columns ['tag']; columns: ids_BT, prompt"


# -------------------------------------------------------------------------------------------------- pickling


def wire_batch() -> Batch:
    """Every dtype family, including bf16 (no numpy dtype) and a non-contiguous (transposed) tensor."""
    base_TB = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return Batch(
        tensors={
            "logp_BT": torch.tensor([[0.5, -1.25, 3.0], [2.0, 0.125, -7.5]], dtype=torch.bfloat16),
            "half_B": torch.tensor([1.5, -2.0], dtype=torch.float16),
            "mask_BT": torch.tensor([[True, False, True], [False, True, True]]),
            "ids_BT": torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32),
            "transposed_BT": base_TB.t()[:2],
        },
        non_tensors={"prompt": ["a", "b"], "info": [{"k": [1]}, None]},
        meta={"step": 5, "policy_version": 2},
    )


def test_pickle_round_trip_preserves_everything() -> None:
    batch = wire_batch()
    assert not batch["transposed_BT"].is_contiguous()
    restored = pickle.loads(pickle.dumps(batch, protocol=5))
    assert_batches_equal(batch, restored)
    assert restored["logp_BT"].dtype == torch.bfloat16
    assert restored["transposed_BT"].tolist() == [[0.0, 4.0, 8.0], [1.0, 5.0, 9.0]]
    state = batch.__getstate__()
    array, dtype_name, shape = state["tensors"]["logp_BT"]
    assert (array.dtype, dtype_name, shape) == (np.dtype(np.int16), "bfloat16", (2, 3))


@pytest.fixture(scope="module")
def local_ray() -> Iterator[object]:
    """A one-CPU local Ray for this module (token auth off: Ray 2.60 turns it on by default), or the Ray that
    is already running."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()


@pytest.mark.slow
def test_ray_round_trip_preserves_everything(local_ray: object) -> None:
    import ray

    batch = wire_batch()
    restored = ray.get(ray.put(batch))
    assert_batches_equal(batch, restored)
    assert restored["logp_BT"].dtype == torch.bfloat16
    # Zero copy: two fetches of one object map the same object-store memory.
    ref = ray.put(batch)
    first, second = ray.get(ref), ray.get(ref)
    assert first["ids_BT"].data_ptr() == second["ids_BT"].data_ptr()
    writable = restored.clone()
    writable["ids_BT"][0, 0] = 9
    assert writable["ids_BT"][0].tolist() == [9, 2, 3]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batch_pads_and_pickles_to_cpu() -> None:
    batch = wire_batch().to("cuda")
    padded, pad = batch.pad_to_multiple(4)
    assert pad == 2 and padded[PAD_COLUMN].device.type == "cuda"
    assert padded.select([3, 0])["logp_BT"].device.type == "cuda"
    restored = pickle.loads(pickle.dumps(batch))
    assert restored["logp_BT"].device.type == "cpu"  # tensors travel on the CPU
    assert_batches_equal(wire_batch(), restored)
