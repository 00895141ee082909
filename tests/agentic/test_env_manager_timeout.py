"""A hung env is cut off inside the EnvWorker Ray actor, its episode is dropped, and the rest of the batch trains.

The env workers are real Ray actors (no torch in them, so they start fast); the policy is scripted. The env whose
``step`` sleeps forever is cut off after ``step_timeout_s``; the rollout returns the other episodes and the
agentic loss trains a tiny Qwen2 on them (its parameters change).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
import torch
from ray import cloudpickle

from roll.agentic.env_manager.batching import to_batch
from roll.agentic.env_manager.chat import ChatEncoder
from roll.agentic.env_manager.config import EnvEntryConfig, EnvManagerConfig
from roll.agentic.env_manager.manager import Generation, RolloutManager
from roll.agentic.env_manager.worker import ClusterEnvPool, EnvWorker, worker_kwargs
from roll.agentic.types import StepResult
from roll.core import columns as C
from roll.core.cluster import Cluster
from roll.core.testing import tiny_role
from roll.pipelines.algorithms.estimators import AdvantageInputs, EstimatorParams, estimate_advantages
from roll.pipelines.algorithms.losses import PolicyLoss
from roll.pipelines.algorithms.presets import AlgorithmConfig
from roll.workers.types import ForwardOutput

# Ray workers cannot import this test module by name: ship its classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


class MaybeHungEnv:
    """One-step env: rewards "Left" on even seeds; with ``hang=True`` its step never returns."""

    max_steps = 1

    def __init__(self, hang: bool) -> None:
        self.hang, self.seed = hang, 0

    system_prompt = "Pick. Valid actions: Left, Right"
    action_space_text = "Valid actions: Left, Right"

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.seed = seed or 0
        return f"seed parity {self.seed % 2}", {}

    def step(self, action: str) -> StepResult:
        if self.hang:
            time.sleep(3600)
        win = (action == "Left") == (self.seed % 2 == 0)
        return StepResult("over", 1.0 if win else 0.0, True, False, {"success": win})

    def render(self, mode: str = "text") -> str:
        return ""

    def close(self) -> None:
        return None


class HangSecond:
    """Factory: the second env this worker builds hangs (exactly one hung env per batch)."""

    def __init__(self) -> None:
        self.built = 0

    def __call__(self, entry: int) -> MaybeHungEnv:
        self.built += 1
        return MaybeHungEnv(hang=self.built == 2)


class Alternating:
    """Scripted policy: even prompts answer Left, odd ones Right (so groups have reward spread)."""

    def __init__(self, encoder: ChatEncoder) -> None:
        self.encoder = encoder

    def __call__(self, prompts: list[list[int]], *, seed: int) -> list[Generation]:
        out = []
        for i, _ in enumerate(prompts):
            ids = self.encoder.encode(f"<answer>{'Left' if i % 2 == 0 else 'Right'}</answer>")
            ids.append(self.encoder.eos_token_id)
            out.append(Generation(ids, [-0.7] * len(ids)))
        return out


@pytest.mark.slow
def test_hung_env_is_cut_off_and_the_rest_trains(ray_local: Any) -> None:
    from roll.data.tokenizer import build_tokenizer

    encoder = ChatEncoder(build_tokenizer("roll-tiny"))
    config = EnvManagerConfig(envs=[EnvEntryConfig(type="maybe_hung")], step_timeout_s=2.0)
    kwargs = worker_kwargs(config.envs, total_envs=8, num_workers=1, timeout_s=config.step_timeout_s)
    with Cluster(
        "env_workers", EnvWorker, tiny_role(), init_kwargs={**kwargs, "factory": HangSecond()}
    ) as cluster:
        manager = RolloutManager(
            config, ClusterEnvPool(cluster, kwargs["slots"]), Alternating(encoder), encoder, max_new_tokens=32
        )
        start = time.monotonic()
        rollout = manager.rollout(num_groups=2, group_size=4, batch_seed=1)
        elapsed = time.monotonic() - start
    assert elapsed < 20, f"the hung env should cost one step timeout (2 s), took {elapsed:.1f}s"
    statuses = sorted(e.status for e in rollout.started)
    assert statuses == ["done"] * 7 + ["timeout"]
    assert len(rollout.episodes) == 7 and rollout.metrics()["env/timeouts"] == 1.0

    batch = to_batch(rollout.samples("trajectory"), encoder.pad_token_id)
    inputs = AdvantageInputs(
        batch.tensors[C.SCORES], batch.tensors[C.RESPONSE_MASK], group_ids_B=batch.tensors[C.GROUP_ID]
    )
    batch[C.ADVANTAGES] = estimate_advantages("grpo", inputs, EstimatorParams()).advantages_BT
    assert batch.tensors[C.ADVANTAGES].abs().sum() > 0
    _assert_one_step_trains(batch)


def _assert_one_step_trains(batch: Any) -> None:
    """One optimizer step of the agentic loss on a tiny random Qwen2 changes its parameters."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
    model = Qwen2ForCausalLM(cfg)
    before = [p.detach().clone() for p in model.parameters()]
    ids_BT, attn_BT = batch.tensors[C.INPUT_IDS], batch.tensors[C.ATTENTION_MASK]
    logits_BTV = model(input_ids=ids_BT, attention_mask=attn_BT).logits
    logp_BT = torch.zeros(ids_BT.shape)
    logp_BT[:, 1:] = torch.log_softmax(logits_BTV[:, :-1], -1).gather(-1, ids_BT[:, 1:, None]).squeeze(-1)
    loss_fn = PolicyLoss(AlgorithmConfig(preset="grpo", kl_mode="none"), norm_len=16, use_old_logp=False)
    micro = {k: batch.tensors[k] for k in (C.RESPONSE_MASK, C.ADVANTAGES)}
    loss = loss_fn(ForwardOutput(logp_BT=logp_BT), micro)[0] / loss_fn.count_units(micro)
    loss.backward()  # type: ignore[no-untyped-call]
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert torch.isfinite(loss)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
