"""Seeds derived from names, not from process history: what makes sampling reproducible across a resume.

A resumed run must sample what the uninterrupted run sampled. A generator that is seeded once and then consumed
cannot give that: its state depends on everything drawn before (how requests were batched, which worker got
which prompt, what was generated before the kill). So every random stream is seeded from a *path of integers*
that names it: ``derive_seed(run_seed, stream, prompt_counter)`` is the seed of one prompt's samples,
``derive_seed(prompt_seed, sample_index)`` that of one sample. Equal paths give equal seeds in any process, on
any machine; different paths give unrelated seeds (a cryptographic hash, not ``a * k + b``, so neighbouring
prompts do not get neighbouring, possibly correlated, streams).

Who derives what:

- the rollout scheduler (:class:`~roll.core.scheduler.generate.GenerateScheduler`, ``GenerateOptions.seed``)
  writes ``prompt_seed_B`` (:data:`~roll.core.columns.PROMPT_SEED`) on every prompt it sends:
  ``derive_seed(seed, TRAIN_STREAM, n)`` for the ``n``-th prompt it ever drew (a counter in its checkpointed
  state), ``derive_seed(seed, EVAL_STREAM, i)`` for row ``i`` of a :meth:`generate_all` batch;
- inference strategies seed sample ``s`` of a prompt with ``derive_seed(prompt_seed, s)``.
"""

from __future__ import annotations

import hashlib

from roll.core.errors import DataError

__all__ = ["EVAL_STREAM", "SEED_BITS", "TRAIN_STREAM", "derive_seed"]

SEED_BITS = 63
"""Derived seeds are in ``[0, 2**63)``: they fit int64 tensors, ``torch.Generator.manual_seed`` and vLLM."""

TRAIN_STREAM = 0
"""Stream id of the prompts a scheduler draws for training."""

EVAL_STREAM = 1
"""Stream id of fixed evaluation batches."""


def derive_seed(*path: int) -> int:
    """A seed in ``[0, 2**63)`` that depends only on ``path`` (BLAKE2b of its decimal form).

    ``derive_seed(7, 0, 3)`` is the same in every process and differs from ``derive_seed(7, 0, 4)``,
    ``derive_seed(7, 3)`` and ``derive_seed(7, 0, 3, 0)``.
    """
    if not path:
        raise DataError("derive_seed needs at least one integer")
    text = ",".join(str(int(p)) for p in path).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> (64 - SEED_BITS)
