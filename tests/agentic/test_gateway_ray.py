"""The gateway's ``ClusterSampler`` on a real Ray ``actor_infer`` cluster (the session's shared Ray): the agent's
calls reach the generator actor, each recorded choice carries the version of the weights the actor serves, and
a hung generator gives the agent a clear error within the per-call deadline, not a hang.

One rank of :class:`GatedInfer`: the real ``ActorInferWorker`` on tiny-1m, which also counts its ``generate``
calls and, while a gate file exists, holds them (a hung generator, made on demand; the hold is bounded so a
leaked actor cannot hang for ever).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray import cloudpickle

from roll.core.batch import Batch
from roll.core.cluster import Cluster, Dispatch, WorkerContext, register
from roll.core.testing import tiny_role
from roll.workers.config import HFInferConfig, SamplingParams
from roll.workers.roles import ActorInferWorker, ModelConfig
from roll.workers.roles.spec import GeneratorSpec

# the roll-agentic[openai] extra (in the dev group): the per-package check installs roll-agentic without it
openai = pytest.importorskip("openai", reason="the OpenAI client is the roll-agentic[openai] extra")

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

HOLD_AT_MOST_S = 120.0
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


class GatedInfer(ActorInferWorker):
    """``ActorInferWorker`` whose ``generate`` counts its calls and waits while ``gate`` exists."""

    def __init__(self, ctx: WorkerContext, spec: GeneratorSpec, gate: str) -> None:
        super().__init__(ctx, spec)
        self.gate, self.calls = gate, 0

    @register(Dispatch.DP_SPLIT)
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        self.calls += 1
        until = time.monotonic() + HOLD_AT_MOST_S
        while os.path.exists(self.gate) and time.monotonic() < until:
            time.sleep(0.05)
        return super().generate(prompts, params)

    @register(Dispatch.ONE_TO_ALL)
    def generate_calls(self) -> int:
        return self.calls


@pytest.fixture(scope="module")
def infer(ray_local: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, Path]]:
    gate = tmp_path_factory.mktemp("gate") / "hold"
    spec = GeneratorSpec(model=ModelConfig(path="tiny-1m"), strategy=HFInferConfig(device="cpu"))
    kwargs = {"gate": str(gate), "spec": spec}
    with Cluster("actor_infer", GatedInfer, tiny_role(), init_kwargs=kwargs, call_timeout_s=120) as cluster:
        cluster.setup()
        yield cluster, gate


@pytest.fixture(scope="module")
def encoder() -> Any:
    from transformers import AutoTokenizer

    from roll.agentic.env_manager.chat import ChatEncoder
    from roll.data.tiny import tiny_model_path

    return ChatEncoder(AutoTokenizer.from_pretrained(tiny_model_path("tiny-1m")))


def _chat_agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    first = client.chat.completions.create(model="policy", messages=MESSAGES, n=2, max_tokens=5)  # type: ignore[arg-type]
    again = [*MESSAGES, {"role": "assistant", "content": first.choices[0].message.content or ""},
             {"role": "user", "content": "And 3 + 4?"}]  # fmt: skip
    client.chat.completions.create(model="policy", messages=again, max_tokens=5)  # type: ignore[arg-type]
    return 0.5


def _same_weights_as(version: int) -> tuple[dict[str, Any], int]:
    """tiny-1m's own weights, to load into the actor as a new ``version`` (what a sync of unchanged weights is)."""
    from safetensors.torch import load_file

    from roll.data.tiny import tiny_model_path

    return load_file(str(Path(tiny_model_path("tiny-1m")) / "model.safetensors")), version


def test_cluster_sampler_calls_the_actor_and_records_its_weight_version(
    infer: tuple[Cluster, Path], encoder: Any
) -> None:
    """Two rollouts through the real ``openai`` client (4 episodes x 2 chat calls, the first with ``n=2``): each
    recorded choice's ids are what the actor samples for that prompt and seed when asked directly, the actor's
    ``generate`` ran at least once and at most once per call, and every recorded version is the one the actor
    reports: its initial version, then 5 after a weight update to version 5."""
    import ray

    from roll.agentic.gateway.agents import AgentGateway
    from roll.agentic.gateway.config import GatewayConfig, GatewaySamplingConfig
    from roll.agentic.gateway.sampler import ClusterSampler
    from roll.core.seeding import derive_seed
    from roll.workers.model_update import pack_bucket

    cluster, _ = infer
    config, sampling = GatewayConfig(generate_timeout_s=120), GatewaySamplingConfig(max_new_tokens=5)
    before_calls = cluster.generate_calls()[0]
    versions = []
    for step in range(2):
        with AgentGateway(
            config,
            encoder,
            ClusterSampler(cluster, config.generate_timeout_s),
            _chat_agent,
            sampling=sampling,
        ) as gw:
            rollout = gw.rollout([{}, {}], 2, seed=step)
        assert not rollout.errors, rollout.errors[0].traceback
        served = cluster.policy_version()[0]
        recorded = {g.policy_version for e in rollout.episodes for c in e.calls for g in c.choices}
        assert recorded == {served}, f"recorded versions {recorded}, the actor serves {served}"
        versions.append(served)
        if step == 0:
            state, version = _same_weights_as(5)
            assert cluster.update_weights([ray.put(pack_bucket(state))], version) == [5]
    assert versions[1] == 5 and versions[0] != 5
    calls = cluster.generate_calls()[0] - before_calls
    assert 1 <= calls <= 2 * 8, f"{calls} generate calls on the actor for 16 gateway calls (2 rollouts x 8)"

    episode = rollout.episodes[3]
    assert [len(c.choices) for c in episode.calls] == [2, 1]
    params = SamplingParams(n=2, temperature=sampling.temperature, top_p=sampling.top_p, max_new_tokens=5)
    first = episode.calls[0]
    direct = ClusterSampler(cluster)([first.prompt_ids], [derive_seed(1, episode.index, 0)], params)[0]
    assert [g.ids for g in direct] == [g.ids for g in first.choices]
    for again, recorded in zip(direct, first.choices):
        assert again.logp == pytest.approx(recorded.logp, abs=1e-5)  # batched with other calls, or alone
    assert encoder.decode(first.prompt_ids).count("What is 2 + 3?") == 1


def test_hung_generator_gives_a_clear_error_not_a_hang(infer: tuple[Cluster, Path], encoder: Any) -> None:
    """While the actor's ``generate`` hangs, the agent's call fails with HTTP 500 naming why, well before the
    hang ends: with the sampler's deadline (2 s), the cluster's error naming role, rank and method; with only the
    gateway's ``generate_timeout_s`` (2 s), the gateway's. Once the generator answers again, so does the gateway."""
    from roll.agentic.gateway.agents import AgentGateway
    from roll.agentic.gateway.config import GatewayConfig, GatewaySamplingConfig
    from roll.agentic.gateway.sampler import ClusterSampler

    cluster, gate = infer
    seen: list[tuple[int, str, float]] = []

    def agent(base_url: str, api_key: str, task: dict[str, Any]) -> float:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
        start = time.monotonic()
        try:
            client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=3)  # type: ignore[arg-type]
        except openai.APIStatusError as exc:
            seen.append((exc.status_code, str(exc), time.monotonic() - start))
            return 0.0
        return 1.0

    gate.touch()
    try:
        sampler_deadline = GatewayConfig(generate_timeout_s=60)
        with AgentGateway(sampler_deadline, encoder, ClusterSampler(cluster, 2.0), agent) as gw:
            gw.rollout([{}], 1, seed=0)
        gateway_deadline = GatewayConfig(generate_timeout_s=2)
        with AgentGateway(gateway_deadline, encoder, ClusterSampler(cluster), agent) as gw:
            gw.rollout([{}], 1, seed=0)
    finally:
        gate.unlink()
    (status1, message1, waited1), (status2, message2, waited2) = seen
    assert status1 == 500 and "actor_infer rank 0: generate did not answer within 2s" in message1
    assert status2 == 500 and "the policy did not answer within 2.0 s" in message2
    assert waited1 < 60 and waited2 < 60, f"the calls waited {waited1:.0f} s and {waited2:.0f} s"

    with AgentGateway(
        GatewayConfig(),
        encoder,
        ClusterSampler(cluster, 120),
        agent,
        sampling=GatewaySamplingConfig(max_new_tokens=3),
    ) as gw:
        after = gw.rollout([{}], 1, seed=0)
    assert not after.errors and after.episodes[0].reward == 1.0 and len(after.episodes[0].calls) == 1


def test_batcher_passes_the_samplers_timeout_error_through() -> None:
    """A sampler's own deadline error (a ``TimeoutError``, as the cluster's ``WorkerTimeoutError`` is) reaches the
    caller as raised, naming role, rank and method, and at once: it is not taken for the batcher's own wait
    running out (which would claim the full wait, 60 s here, had passed)."""
    from roll.agentic.gateway.sampler import Batcher
    from roll.core.errors import WorkerTimeoutError

    def timed_out(prompts: Any, seeds: Any, params: SamplingParams) -> Any:
        raise WorkerTimeoutError("actor_infer rank 0: generate did not answer within 2s")

    batcher = Batcher(timed_out, wait_s=0.0, timeout_s=60.0)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerTimeoutError, match="actor_infer rank 0: generate did not answer within 2s"):
            batcher.generate([1, 2], 0, SamplingParams(), timeout_s=60.0)
        assert time.monotonic() - start < 30
    finally:
        batcher.close()
