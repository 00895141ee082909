"""A Batch in a process without torch: numpy tensor columns, the same row operations, torch only where it is.

The memory goal wants a driver that never imports torch (~550 MB resident): batches that come back from actors
must unpickle there as numpy, every row operation must work on them, and an actor must get torch tensors again.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from roll.core.batch import PAD_COLUMN, Batch
from roll.core.errors import DataError


def _torch_batch() -> Batch:
    return Batch(
        {
            "ids_BT": torch.arange(12, dtype=torch.long).reshape(4, 3),
            "rewards_B": torch.tensor([0.5, -1.0, 2.25, 0.0]),
            "mask_B": torch.tensor([True, False, True, True]),
        },
        {"text": ["a", "b", "c", "d"]},
        {"step": 3},
    )


def _same(numpy_batch: Batch, torch_batch: Batch) -> None:
    """Same columns, values, dtypes and meta; the numpy side holds numpy arrays."""
    assert numpy_batch.keys() == torch_batch.keys()
    for name, array in numpy_batch.tensors.items():
        assert isinstance(array, np.ndarray), name
        expected = torch_batch.tensors[name]
        assert str(array.dtype) == str(expected.dtype).removeprefix("torch."), name
        np.testing.assert_array_equal(array, expected.numpy())
    for name, column in numpy_batch.non_tensors.items():
        assert column.tolist() == torch_batch.non_tensors[name].tolist()
    assert numpy_batch.meta == torch_batch.meta


OPERATIONS = {
    "select": lambda b: b.select([3, 0, 0, -1]),
    "slice": lambda b: b.slice(1, 3),
    "chunk": lambda b: b.chunk(2)[1],
    "repeat": lambda b: b.repeat(2),
    "repeat_tiled": lambda b: b.repeat(2, interleave=False),
    "pad": lambda b: b.pad_to_multiple(3)[0],
    "pad_unpad": lambda b: b.pad_to_multiple(3)[0].unpad(2),
    "pad_twice": lambda b: b.pad_to_multiple(3)[0].pad_to_multiple(4)[0],
    "concat": lambda b: Batch.concat([b, b.slice(0, 1)]),
    "clone": lambda b: b.clone(),
    "rename": lambda b: b.rename({"rewards_B": "scores_B"}),
    "union": lambda b: b.union(b.slice(0, 4)),
}


@pytest.mark.parametrize("op", sorted(OPERATIONS))
def test_numpy_columns_give_the_same_rows_as_torch(op: str) -> None:
    torch_batch = _torch_batch()
    numpy_batch = torch_batch.to_numpy()
    assert all(isinstance(v, np.ndarray) for v in numpy_batch.tensors.values())
    _same(OPERATIONS[op](numpy_batch), OPERATIONS[op](torch_batch))


def test_pad_column_on_a_numpy_batch_is_numpy_bool() -> None:
    padded, pad = _torch_batch().to_numpy().pad_to_multiple(3)
    assert pad == 2
    assert padded.tensors[PAD_COLUMN].tolist() == [False, False, False, False, True, True]


def test_a_numpy_batch_reaches_a_torch_process_as_torch_tensors() -> None:
    """This process imported torch, as an actor has: what was numpy on the sender is torch here, same values."""
    torch_batch = _torch_batch()
    received = pickle.loads(pickle.dumps(torch_batch.to_numpy()))
    assert all(isinstance(v, torch.Tensor) for v in received.tensors.values())
    for name, tensor in torch_batch.tensors.items():
        assert received.tensors[name].dtype == tensor.dtype
        assert torch.equal(received.tensors[name], tensor)
    assert received.to_torch().tensors["ids_BT"] is received.tensors["ids_BT"]


def test_mixed_concat_comes_out_torch_and_mixed_union_compares_values() -> None:
    torch_batch = _torch_batch()
    joined = Batch.concat([torch_batch.to_numpy(), torch_batch])
    assert isinstance(joined.tensors["rewards_B"], torch.Tensor)
    assert joined.tensors["rewards_B"].tolist() == [0.5, -1.0, 2.25, 0.0] * 2
    torch_batch.union(torch_batch.to_numpy())  # equal values: no error
    other = torch_batch.to_numpy()
    other.tensors["rewards_B"] = np.zeros(4, dtype=np.float32)
    with pytest.raises(DataError, match="rewards_B"):
        torch_batch.union(other)


def test_object_arrays_are_not_tensor_columns() -> None:
    with pytest.raises(DataError, match="tensor column 'text'"):
        Batch({"text": np.array(["a", "b"], dtype=object)})


def test_bfloat16_cannot_become_numpy() -> None:
    batch = Batch({"logits_B": torch.ones(2, dtype=torch.bfloat16)})
    with pytest.raises(DataError, match="bfloat16"):
        batch.to_numpy()


TORCH_FREE_RECEIVER = """
import pickle, sys
import numpy as np
from roll.core.batch import Batch, PAD_COLUMN
received = pickle.loads(sys.stdin.buffer.read())
assert all(isinstance(v, np.ndarray) for v in received.tensors.values()), received
work = Batch.concat([received.select([2, 0]), received.repeat(2).slice(0, 3)])
padded, pad = work.pad_to_multiple(4)
answer = {"torch": "torch" in sys.modules, "pad": pad, "batch": padded.unpad(pad), "padded": padded}
sys.stdout.buffer.write(pickle.dumps(answer))
"""


def test_a_process_without_torch_unpickles_numpy_and_never_imports_torch() -> None:
    """The driver's side: a torch batch from an actor arrives as numpy, select/repeat/concat/pad/unpad work, and torch
    is never imported; the batch it sends back is torch again here, equal to the same work done in torch."""
    torch_batch = _torch_batch()
    out = subprocess.run(
        [sys.executable, "-c", TORCH_FREE_RECEIVER],
        input=pickle.dumps(torch_batch), capture_output=True, timeout=120, check=True,
    )  # fmt: skip
    answer = pickle.loads(out.stdout)
    assert answer["torch"] is False, out.stderr.decode()
    expected = Batch.concat([torch_batch.select([2, 0]), torch_batch.repeat(2).slice(0, 3)])
    expected_padded, expected_pad = expected.pad_to_multiple(4)
    assert answer["pad"] == expected_pad == 3
    for got, want in ((answer["batch"], expected), (answer["padded"], expected_padded)):
        assert got.keys() == want.keys()
        for name, tensor in want.tensors.items():
            assert isinstance(got.tensors[name], torch.Tensor)
            assert got.tensors[name].dtype == tensor.dtype and torch.equal(got.tensors[name], tensor), name
        assert got.non_tensors["text"].tolist() == want.non_tensors["text"].tolist()


def test_bfloat16_imports_torch_where_it_must_with_a_warning() -> None:
    code = (
        "import pickle, sys, logging; logging.basicConfig(); "
        "b = pickle.loads(sys.stdin.buffer.read()); "
        "print('torch' in sys.modules, b.tensors['logits_B'].dtype, type(b.tensors['ids_B']).__name__)"
    )
    batch = Batch(
        {"logits_B": torch.tensor([1.5, -2.0], dtype=torch.bfloat16), "ids_B": torch.tensor([1, 2])}
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(batch), capture_output=True, timeout=120, check=True
    )
    # the first column makes torch come in; from then on this process builds torch tensors, like an actor
    assert out.stdout.decode().split() == ["True", "torch.bfloat16", "Tensor"]
    assert "column 'logits_B' is bfloat16" in out.stderr.decode()
