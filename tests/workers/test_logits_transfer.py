"""Teacher top-k logits reach the student ranks holding the same samples, exactly: by object store (rows matched by
sample id) and point to point over a standalone gloo group."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from _roles_helpers import MODEL, ClusterSet, Spec, sequences

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster
from roll.core.testing import tiny_role
from roll.workers.logits_transfer import align_to
from roll.workers.roles import TeacherWorker
from roll.workers.roles.spec import ScorerSpec

K = 4


@pytest.fixture(scope="module")
def roles(shared_roles: ClusterSet) -> Iterator[tuple[Cluster, Cluster]]:
    """Two teachers, and the shared two-rank trainer as the students (they only receive here)."""
    shared_roles.start()
    own = ClusterSet(
        {
            "teacher": Spec(
                "teacher", TeacherWorker, tiny_role(num_workers=2), {"spec": ScorerSpec(model=MODEL)}
            )
        }
    )
    try:
        yield own.start().get()["teacher"], shared_roles.get()["train2"]
    finally:
        own.shutdown()


def test_topk_matches_a_local_forward(roles: tuple[Cluster, Cluster]) -> None:
    from transformers import AutoModelForCausalLM

    from roll.data.models import resolve_model_path

    teacher, _ = roles
    batch = sequences(rows=3, seed=0)
    out = teacher.topk_logits(batch, K)
    assert out[C.TOPK_VALUES].shape == (3, 12, K) and out[C.TOPK_INDICES].dtype == torch.long
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-1m"))
    with torch.no_grad():
        logits = model(input_ids=batch[C.INPUT_IDS][:1, :5]).logits[0, :4]
    torch.testing.assert_close(out[C.TOPK_VALUES][0, 1:5], logits.topk(K).values, atol=1e-5, rtol=0)


def test_object_store_path_matches_rows_by_sample_id(roles: tuple[Cluster, Cluster]) -> None:
    """The distill driver's object-store path: the teacher's rows, in batch order, joined onto a student batch
    that holds the samples in another order (rows 5, 3, 1, 0, 2, 4) land on the rows with the same sample id."""
    teacher, _ = roles
    batch = sequences(rows=6, seed=1)
    out = teacher.topk_logits(batch, K)
    order = [5, 3, 1, 0, 2, 4]
    student_batch = batch.select(order)
    joined = student_batch.union(align_to(out, student_batch.tensors[C.SAMPLE_ID]))
    assert torch.equal(joined.tensors[C.SAMPLE_ID], batch.tensors[C.SAMPLE_ID][order])
    assert torch.equal(joined.tensors[C.TOPK_VALUES], out.tensors[C.TOPK_VALUES][order])
    assert torch.equal(joined.tensors[C.TOPK_INDICES], out.tensors[C.TOPK_INDICES][order])


@pytest.fixture(scope="module")
def joined(roles: tuple[Cluster, Cluster]) -> tuple[Cluster, Cluster]:
    """The roles, joined in one transfer group "distill": teachers are ranks 0-1, students 2-3."""
    teacher, student = roles
    addr, port = teacher.transfer_endpoint()
    joins = [
        teacher.join_transfer_group.submit("distill", addr, port, 4, 0),
        student.join_transfer_group.submit("distill", addr, port, 4, 2),
    ]
    for j in joins:
        j.result()
    return teacher, student


def _assert_received_exactly(teacher: Cluster, batch: Batch, student_batch: Batch, received: Batch) -> None:
    expected = align_to(teacher.topk_logits(batch, K), student_batch[C.SAMPLE_ID])
    assert torch.equal(received.tensors[C.SAMPLE_ID], student_batch.tensors[C.SAMPLE_ID])
    assert torch.equal(received.tensors[C.TOPK_VALUES], expected.tensors[C.TOPK_VALUES])
    assert torch.equal(received.tensors[C.TOPK_INDICES], expected.tensors[C.TOPK_INDICES])


def test_gloo_point_to_point_transfer_is_exact(joined: tuple[Cluster, Cluster]) -> None:
    """2 teachers (ranks 0-1) send 5 samples to 2 students (ranks 2-3) that hold them in a shuffled order."""
    teacher, student = joined
    batch = sequences(rows=5, seed=2)
    student_batch = batch.select([4, 2, 0, 1, 3])
    sending = teacher.send_topk.submit(batch, K, "distill", 2)
    received = student.receive_topk(student_batch, "distill", 2, K)
    assert sending.result() == [3, 2]  # 5 rows padded to 6: rank 1's pad row is not sent
    _assert_received_exactly(teacher, batch, student_batch, received)


def test_successive_rounds_never_read_a_previous_rounds_keys(joined: tuple[Cluster, Cluster]) -> None:
    """Two rounds on one channel with different samples and data. In round 2 the teachers start a second early:
    with a store key shared by the rounds they would read round 1's request at once (sending the wrong rows, or
    none, and the student would then wait for rows that never come); with per-round keys they wait for it."""
    teacher, student = joined
    first = sequences(rows=4, seed=3)
    second = sequences(rows=6, T=10, seed=4)
    second[C.SAMPLE_ID] = torch.arange(100, 106)  # disjoint from round 1's ids
    for batch, order, head_start_s in [(first, [3, 1, 0, 2], 0.0), (second, [5, 0, 4, 1, 3, 2], 1.0)]:
        student_batch = batch.select(order)
        sending = teacher.send_topk.submit(batch, K, "distill", 2, "rounds")
        time.sleep(head_start_s)
        received = student.receive_topk(student_batch, "distill", 2, K, "rounds")
        sending.result()
        _assert_received_exactly(teacher, batch, student_batch, received)
