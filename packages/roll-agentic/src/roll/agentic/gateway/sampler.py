"""The policy behind the gateway: a :class:`Sampler`, and the :class:`Batcher` that lets concurrent calls share
one batched generate.

A :class:`Sampler` takes prompts (token ids), one seed per prompt and sampling params, and returns ``params.n``
:class:`~roll.agentic.env_manager.manager.Generation` per prompt. :class:`ClusterSampler` runs on the policy's
inference workers (``actor_infer``: hf or vLLM, whatever the run configured); :class:`LocalSampler` on an
in-process :class:`~roll.workers.hf_infer.HFInferStrategy` (tests, notebooks).

Seeds are per call (``derive_seed(rollout seed, episode, call)``), so what an episode samples does not depend on
which other calls happened to share its batch.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll.agentic.env_manager.manager import Generation
from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.errors import WorkerTimeoutError
from roll.workers.config import SamplingParams

__all__ = ["Batcher", "ClusterSampler", "LocalSampler", "Sampler"]


class Sampler(Protocol):
    def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[list[Generation]]:
        """``params.n`` generations per prompt, in prompt order."""
        ...


class LocalSampler:
    """A :class:`Sampler` on an in-process ``HFInferStrategy`` (or anything with its ``generate``)."""

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy

    def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[list[Generation]]:
        out: list[list[Generation]] = [[] for _ in prompts]
        for s in self.strategy.generate([list(p) for p in prompts], params, seeds=list(seeds)):
            out[s.prompt_index].append(Generation(list(s.token_ids), list(s.logprobs), s.policy_version))
        return out


class ClusterSampler:
    """A :class:`Sampler` on an ``ActorInferWorker`` cluster (its registered ``generate``).

    ``timeout_s`` is the deadline of each remote ``generate`` (pass ``gateway.generate_timeout_s``); ``None``
    keeps the cluster's own (the role's ``call_timeout_s``). Past it the call fails with the cluster's
    :class:`WorkerTimeoutError` naming role, rank and method, which every call of the batch gets (HTTP 500), and
    the gateway's batcher is free for the next batch instead of waiting on a hung worker."""

    def __init__(self, infer: Any, timeout_s: float | None = None) -> None:
        self.infer, self.timeout_s = infer, timeout_s

    def __call__(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams
    ) -> list[list[Generation]]:
        import torch

        seed_B = torch.tensor([int(s) for s in seeds], dtype=torch.long)  # the workers read seeds as a tensor
        batch = Batch({C.PROMPT_SEED: seed_B}, {C.PROMPT_IDS: [list(p) for p in prompts]})
        generate = self.infer.generate
        out = (generate if self.timeout_s is None else generate.with_timeout(self.timeout_s))(batch, params)
        ids, logps = out.non_tensors[C.RESPONSE_IDS], out.non_tensors[C.RESPONSE_LOGP]
        index = out.tensors[C.PROMPT_INDEX].tolist()
        versions = out.tensors[C.POLICY_VERSION].tolist()
        result: list[list[Generation]] = [[] for _ in prompts]
        for p, i, lp, v in zip(index, ids, logps, versions):
            result[int(p)].append(Generation([int(t) for t in i], [float(x) for x in lp], int(v)))
        return result


@dataclass
class _Request:
    prompt: list[int]
    seed: int
    params: SamplingParams
    future: Future[list[Generation]] = field(default_factory=Future)


class Batcher:
    """Collects calls for ``wait_s`` and runs those with equal sampling params as one :class:`Sampler` call.

    One thread drives the sampler, so the inference workers see one batch at a time. A sampler error fails every
    call of its batch (the server answers them with HTTP 500 and the message)."""

    def __init__(self, sampler: Sampler, wait_s: float, timeout_s: float) -> None:
        self.sampler, self.wait_s, self.timeout_s = sampler, wait_s, timeout_s
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="gateway-batcher", daemon=True)
        self._thread.start()

    def generate(
        self, prompt: list[int], seed: int, params: SamplingParams, timeout_s: float
    ) -> list[Generation]:
        """``params.n`` generations of ``prompt``; raises :class:`WorkerTimeoutError` after ``timeout_s``."""
        request = _Request(prompt, seed, params)
        self._queue.put(request)
        # wait, then read: a sampler's own timeout error is a TimeoutError too, and must reach the caller as is
        # (it names role, rank and method), not be mistaken for this wait running out
        if not futures.wait([request.future], timeout=max(timeout_s, 0.0)).done:
            raise WorkerTimeoutError(f"the policy did not answer within {timeout_s:.1f} s")
        return request.future.result()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=self.timeout_s)

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            pending, stop = [first], self._drain(first)
            pending += stop[0]
            self._run(pending)
            if stop[1]:
                return

    def _drain(self, first: _Request) -> tuple[list[_Request], bool]:
        """Calls that arrive within ``wait_s`` after ``first`` (and whether close was asked meanwhile)."""
        more: list[_Request] = []
        until = time.monotonic() + self.wait_s
        try:
            while True:
                left = until - time.monotonic()
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
                if item is None:
                    return more, True
                more.append(item)
        except queue.Empty:
            return more, False

    def _run(self, pending: list[_Request]) -> None:
        by_params: dict[str, list[_Request]] = {}
        for r in pending:
            by_params.setdefault(r.params.model_dump_json(), []).append(r)
        for group in by_params.values():
            try:
                out = self.sampler([r.prompt for r in group], [r.seed for r in group], group[0].params)
            except Exception as exc:  # every waiting call learns why; the server shows it
                for r in group:
                    r.future.set_exception(exc)
                continue
            for r, gens in zip(group, out, strict=True):
                r.future.set_result(gens)
