"""Partial rollout in the GenerateScheduler against real Ray actors (a small Worker, no model).

``Segmenter`` stands in for an inference worker in partial mode: sample ``g`` of prompt ``x`` is
``length(x, g) = 1 + (3x + g) % 10`` tokens long, and each call adds at most ``segment_tokens_B`` of them; every
token it adds is the worker's current policy version (so a token's value says which weights sampled it, and the
recorded ``response_policy_version`` must agree). A sample not finished within its segment comes back with
``finish_reason`` ``"abort"``. ``update_weights`` bumps the version; Ray runs it between two calls of the actor,
which is where a weight update lands on a real inference worker too.
"""

from __future__ import annotations

import math
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from roll.core import columns as C
from roll.core.batch import Batch
from roll.core.cluster import Cluster, Dispatch, Worker, WorkerContext, register
from roll.core.scheduler import GenerateOptions, GenerateScheduler, RankRequest, RewardScheduler
from roll.core.testing import tiny_role

G = 4


def length(x: int, g: int) -> int:
    return 1 + (3 * x + g) % 10


class Segmenter(Worker):
    def __init__(self, ctx: WorkerContext, delay_s: float = 0.0) -> None:
        super().__init__(ctx)
        self.version, self.delay_s = 0, delay_s

    @register(Dispatch.DP_SPLIT)
    def generate(self, prompts: Batch, n: int) -> Batch:
        time.sleep(self.delay_s)
        seg_B = prompts[C.SEGMENT_TOKENS]
        if C.RESPONSE_PREFIX_IDS in prompts.non_tensors:  # rows to continue, one sample each
            x_B, g_B = prompts["x_B"], prompts["g_B"]
            prefix = prompts.non_tensors[C.RESPONSE_PREFIX_IDS]
            versions = prompts.non_tensors[C.RESPONSE_POLICY_VERSION]
        else:
            x_B, g_B = prompts["x_P"].repeat_interleave(n), torch.arange(n).repeat(len(prompts))
            seg_B = seg_B.repeat_interleave(n)
            prefix = versions = [[] for _ in range(len(x_B))]
        ids, new_versions, reasons = [], [], []
        for x, g, seg, have, v in zip(x_B.tolist(), g_B.tolist(), seg_B.tolist(), prefix, versions):
            add = min(seg, length(x, g) - len(have))
            ids.append([*have, *[self.version] * add])
            new_versions.append([*v, *[self.version] * add])
            reasons.append("stop" if len(ids[-1]) == length(x, g) else "abort")
        oldest_B = torch.tensor([min(v) for v in new_versions])
        return Batch(
            {"x_B": x_B, "g_B": g_B, C.POLICY_VERSION: oldest_B},
            {C.RESPONSE_IDS: ids, C.RESPONSE_POLICY_VERSION: new_versions, C.FINISH_REASON: reasons},
        )

    @register(Dispatch.ONE_TO_ALL)
    def update_weights(self, version: int) -> None:
        self.version = version

    @register(Dispatch.DP_SPLIT)
    def score(self, batch: Batch) -> Batch:
        time.sleep(self.delay_s)
        return Batch({"reward_B": torch.tensor([float(len(r)) for r in batch[C.RESPONSE_IDS]])})


@pytest.fixture(scope="module")
def segmenter(ray_local: Any) -> Iterator[Cluster]:
    with Cluster("segmenter", Segmenter, tiny_role(num_workers=2), init_args=(0.05,)) as cluster:
        yield cluster


class Feed:
    """Prompts ``x = 0, 1, 2 ...``; ``position`` is what a checkpoint records of it."""

    def __init__(self, start: int = 0) -> None:
        self.position = start

    def __call__(self, n: int) -> Batch:
        xs = list(range(self.position, self.position + n))
        self.position += n
        return Batch({"x_P": torch.tensor(xs)}, {"tag": ["t"] * n})


def make(cluster: Cluster, feed: Feed, *, scored: bool = False, **options: Any) -> GenerateScheduler:
    opts = GenerateOptions(
        **{"group_size": G, "request_prompts": 2, "partial_segment": 3, "carry_columns": ("tag",), **options}
    )
    score = RankRequest.bind(cluster.method(Segmenter.score))
    scorer = RewardScheduler({"r": score}, {"t": "r"}) if scored else None
    return GenerateScheduler(
        RankRequest.bind(cluster.method(Segmenter.generate), G), feed, opts, scorer=scorer
    )


def check_samples(batch: Batch) -> None:
    """Every sample is whole (its full length, no token lost or repeated across segments), each token's recorded
    version is the version that made it, and versions never go back within a sample."""
    for x, g, ids, versions in zip(
        batch["x_B"].tolist(), batch["g_B"].tolist(), batch[C.RESPONSE_IDS], batch[C.RESPONSE_POLICY_VERSION]
    ):
        assert len(ids) == length(x, g), (x, g, ids)
        assert list(ids) == list(versions), (x, g, ids, versions)
        assert list(versions) == sorted(versions), (x, g, versions)


def test_prefetched_first_segments_continue_under_the_new_weights(segmenter: Cluster) -> None:
    """The deterministic (step_ahead) use: the first 3 tokens of every sample of 4 prompts are made on version 0;
    after the update to version 1 :meth:`get_batch` continues them, so a sample of length ``L`` has
    ``min(L, 3)`` tokens of version 0 and the rest of version 1, cut ``ceil(L / 3) - 1`` times; its version (that of
    its oldest token) is 0, one behind the trainer (``max_staleness`` 1 keeps them), and the groups are in feed
    order."""
    segmenter.update_weights(0)
    with make(segmenter, Feed(), max_staleness=1) as scheduler:
        scheduler.prefetch(4)
        segmenter.update_weights(1)
        out = scheduler.get_batch(4, trainer_version=1)
    segmenter.update_weights(0)
    batch = out.batch
    check_samples(batch)
    assert batch["x_B"].tolist() == [x for x in range(4) for _ in range(G)]
    for x, g, versions in zip(batch["x_B"].tolist(), batch["g_B"].tolist(), batch[C.RESPONSE_POLICY_VERSION]):
        n = length(x, g)
        assert versions == [0] * min(n, 3) + [1] * max(n - 3, 0), (x, g, versions)
    assert batch[C.POLICY_VERSION].tolist() == [0] * (4 * G)
    cuts = sum(math.ceil(length(x, g) / 3) - 1 for x in range(4) for g in range(G))
    assert out.metrics["rollout/aborts"] == cuts


def test_async_partial_samples_span_versions_within_the_bound(segmenter: Cluster) -> None:
    """Stream mode, ratio 1, segments of 2 tokens: weight updates land between segments while samples are in
    flight, so samples span versions; the oldest token of every trained sample is at most 1 version behind."""
    segmenter.update_weights(0)
    spans, aborts = [], 0.0
    with make(segmenter, Feed(), async_ratio=1.0, partial_segment=2) as scheduler:
        for version in range(5):
            out = scheduler.get_batch(4, trainer_version=version)
            check_samples(out.batch)
            lag_B = version - out.batch[C.POLICY_VERSION]
            assert int(lag_B.max()) <= 1 and int(lag_B.min()) >= 0, (version, lag_B.tolist())
            spans += [max(v) - min(v) for v in out.batch[C.RESPONSE_POLICY_VERSION]]
            aborts += out.metrics["rollout/aborts"]
            time.sleep(0.3)  # "training"
            segmenter.update_weights(version + 1)
    segmenter.update_weights(0)
    assert aborts > 0, "no sample was cut at a segment boundary"
    assert max(spans) <= 1, spans


def _prompts_in(buffers: dict[str, Any]) -> list[int]:
    """The prompts a checkpoint's buffers hold: buffered groups, groups being scored, and open groups, each of
    whose ``G`` samples must be somewhere (finished, queued to continue, or its prompt queued to be sent again),
    else the group could never complete and its prompt would be lost."""
    partial = buffers["partial"]
    xs = [int(b["x_B"][0]) for b, _, _ in buffers["kept"] + buffers["rejected"]]
    xs += [int(group["x_B"][0]) for _, group in buffers["scoring"]]
    held: dict[tuple[int, int], set[int]] = {key: set() for key in partial["open"]}
    prompt: dict[tuple[int, int], int] = {}
    for key, slots in partial["open"].items():
        for g, row in enumerate(slots):
            if row is not None:
                held[key].add(g)
                prompt[key] = int(row["x_B"][0])
    for key, g, row in partial["queue"]:
        if key in held:
            held[key].add(g)
            prompt[key] = int(row["x_B"][0])
    for origin, prompts in partial["resend"]:
        for i, x in enumerate(prompts["x_P"].tolist()):
            held[(origin, i)] = set(range(G))
            prompt[(origin, i)] = int(x)
    lost = {key: sorted(set(range(G)) - samples) for key, samples in held.items() if len(samples) != G}
    assert not lost, f"open groups whose samples are nowhere: {lost}"
    assert set(held) == set(partial["open"]), "a resend belongs to no open group"
    return xs + [prompt[key] for key in held]


def test_a_checkpoint_taken_mid_flight_loses_no_prompt(segmenter: Cluster) -> None:
    """Stream mode: a checkpoint is taken while requests are on the workers (and groups are being scored or are
    half finished), then the run "dies" (the batch it was collecting is never trained). A new scheduler restored
    from the checkpoint, the feed resumed at the recorded position, trains three batches (a staleness bound of 10
    so that nothing is evicted, which would drop a prompt on purpose). Every prompt ever drawn is trained exactly
    once or still held by the final buffers, and every trained sample is whole."""
    segmenter.update_weights(0)
    feed = Feed()
    with make(segmenter, feed, scored=True, async_ratio=1.0, max_staleness=10) as first:
        dying = threading.Thread(target=lambda: first.get_batch(4, trainer_version=0), daemon=True)
        dying.start()
        deadline = time.monotonic() + 60
        while True:  # snapshot while a request is on a worker
            position, buffers = first.buffer_state(lambda: feed.position)
            if buffers["partial"]["inflight_requests"] or time.monotonic() > deadline:
                break
            time.sleep(0.005)
        dying.join(timeout=120)
    buffers = pickle.loads(pickle.dumps(buffers))  # what the checkpoint file holds
    assert buffers["partial"]["inflight_requests"] > 0, "no request was in flight: the test proves nothing"
    trained: list[int] = []
    resumed_feed = Feed(position)
    with make(segmenter, resumed_feed, scored=True, async_ratio=1.0, max_staleness=10) as second:
        second.load_buffer_state(buffers)
        for version in range(1, 4):
            segmenter.update_weights(version)
            out = second.get_batch(4, trainer_version=version)
            check_samples(out.batch)
            trained += out.batch["x_B"][::G].tolist()
        _, final = second.buffer_state()
        stale = second.state()["rollout/groups_stale"]
    segmenter.update_weights(0)
    assert stale == 0  # a bound of 10 versions evicts nothing: every prompt must be accounted for
    left = _prompts_in(final)
    assert len(trained) == len(set(trained)), f"a prompt was trained twice: {sorted(trained)}"
    assert sorted(trained + left) == list(range(resumed_feed.position)), (sorted(trained), sorted(left))


def test_load_buffer_state_keeps_request_ids_unique(segmenter: Cluster) -> None:
    """Group keys are (request id, place): a restored scheduler continues the id sequence, so a new request's
    groups never collide with restored ones."""
    feed = Feed()
    with make(segmenter, feed) as first:
        first.prefetch(4)
        _, buffers = first.buffer_state()
    restored_ids = {key[0] for key in buffers["partial"]["open"]}
    with make(segmenter, Feed(4)) as second:
        second.load_buffer_state(buffers)
        out = second.get_batch(6, trainer_version=0)
        _, after = second.buffer_state()
    check_samples(out.batch)
    assert sorted(set(out.batch["x_B"].tolist())) == list(range(6))
    assert buffers["next_id"] > max(restored_ids, default=-1)
    assert not after["partial"]["open"], "sync get_batch leaves no open group behind"


def test_partial_needs_a_positive_segment() -> None:
    from roll.core.errors import DataError
    from roll.core.scheduler.partial import PartialRollouts

    with pytest.raises(DataError, match="segment_tokens"):
        PartialRollouts(G, 0)
