"""Teacher top-k logits to the student workers that hold the same samples.

Rows are matched by ``sample_id_B`` (a unique id per sample), never by position, because the teacher and the
student clusters may have different world sizes and the student's data-parallel layout need not be the teacher's.

- **Object store** (default): the teacher cluster's ``topk_logits`` returns one Batch; :func:`align_to` reorders
  it to the student batch's sample order, and the driver joins it onto the student batch, which the student's
  DP_SPLIT then cuts like any other column.
- **torch.distributed** (:func:`send_topk` / :func:`receive_topk`): teachers and students join one standalone
  group (:class:`~roll.workers.model_update.CollectiveGroup`; teachers are ranks ``0..S-1``, students follow).
  Each student publishes the ids it needs in the group's store; each teacher sends each student, point to point,
  exactly the rows it holds that the student needs (values ``float32`` and indices ``int64``, ``[n, T, K]``).
  Nothing passes through the driver.

  Rounds: a ``TCPStore`` keeps every key, and ``get`` of an existing key returns at once, so a reused key would
  let a fast teacher read the previous round's request (or a student the previous round's reply). Every call
  therefore takes the next sequence number of its channel (``key``) on this group, and all store keys of the
  round carry it. Senders and receivers agree on it without talking, because every rank of the group takes part in
  every round (a rank with no rows still publishes an empty list). A student deletes its previous round's
  request when it starts the next one, so the store stays small.
"""

from __future__ import annotations

import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.errors import DataError
from roll.workers.model_update import CollectiveGroup

__all__ = ["align_to", "receive_topk", "send_topk"]


def align_to(teacher_out: Batch, sample_ids_B: torch.Tensor) -> Batch:
    """Rows of ``teacher_out`` reordered to follow ``sample_ids_B``; a missing id raises :class:`DataError`."""
    row_of = {int(s): i for i, s in enumerate(teacher_out.tensors[C.SAMPLE_ID].tolist())}
    missing = [int(s) for s in sample_ids_B.tolist() if int(s) not in row_of]
    if missing:
        raise DataError(f"teacher output lacks sample ids {missing[:5]} ({len(missing)} in all)")
    return teacher_out.select([row_of[int(s)] for s in sample_ids_B.tolist()])


def send_topk(group: CollectiveGroup, topk: Batch, *, src: int, num_sources: int, key: str = "topk") -> None:
    """Teacher ``src``: send each student the rows of ``topk`` it asked for (see :func:`receive_topk`).

    One round of channel ``key`` (see the module docstring); every teacher must call it once per round."""
    seq = group.next_round(key)
    held = {int(s): i for i, s in enumerate(topk.tensors[C.SAMPLE_ID].tolist())}
    for student in range(num_sources, group.world_size):
        wanted: list[int] = group.get(f"{key}/{seq}/want/{student}")
        rows = [held[s] for s in wanted if s in held]
        group.put(f"{key}/{seq}/{src}->{student}", [int(topk.tensors[C.SAMPLE_ID][r]) for r in rows])
        if rows:
            part = topk.select(rows)
            group.pg.send([part.tensors[C.TOPK_VALUES].float().contiguous()], student, 0).wait()
            group.pg.send([part.tensors[C.TOPK_INDICES].long().contiguous()], student, 1).wait()


def receive_topk(
    group: CollectiveGroup, sample_ids_B: torch.Tensor, *, num_sources: int, T: int, k: int, key: str = "topk"
) -> Batch:
    """Student: publish ``sample_ids_B``, receive its rows from every teacher, return them in that order.

    One round of channel ``key`` (see the module docstring); every student must call it once per round."""
    seq = group.next_round(key)
    if seq > 0:
        # Every teacher replied to the previous round, so each has read that request: nobody needs it now.
        group.delete(f"{key}/{seq - 1}/want/{group.rank}")
        for teacher in range(num_sources):
            group.delete(f"{key}/{seq - 1}/{teacher}->{group.rank}")
    group.put(f"{key}/{seq}/want/{group.rank}", [int(s) for s in sample_ids_B.tolist()])
    parts: list[Batch] = []
    for teacher in range(num_sources):
        ids: list[int] = group.get(f"{key}/{seq}/{teacher}->{group.rank}")
        if not ids:
            continue
        values_BTK = torch.empty(len(ids), T, k, dtype=torch.float32)
        indices_BTK = torch.empty(len(ids), T, k, dtype=torch.long)
        group.pg.recv([values_BTK], teacher, 0).wait()
        group.pg.recv([indices_BTK], teacher, 1).wait()
        ids_B = torch.tensor(ids, dtype=torch.long)
        parts.append(Batch({C.TOPK_VALUES: values_BTK, C.TOPK_INDICES: indices_BTK, C.SAMPLE_ID: ids_B}))
    if not parts:
        raise DataError(f"no teacher sent rows for sample ids {sample_ids_B.tolist()[:5]}")
    return align_to(Batch.concat(parts), sample_ids_B)
