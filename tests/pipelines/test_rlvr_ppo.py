"""PPO inside rlvr: the critic's loss and metrics (golden), the config's critic checks, and a short end-to-end run.

The end-to-end run is ``examples/ppo.yaml`` made small: a short SFT warm-up, one critic-only step, then PPO steps
with GAE on the critic's values. It asserts the critic learns (value loss of the last steps below the first
step's), the actor's weights change, the critic's metrics are logged each step, and the critic is checkpointed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from roll.core import columns as C
from roll.core.config.loader import load_tree, validate
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.losses import ValueLoss
from roll.pipelines.algorithms.value_loss import action_values
from roll.pipelines.policy.critic import explained_variance
from roll.pipelines.rlvr import SPEC, RLVRConfig
from roll.workers.types import ForwardOutput

PPO = Path(__file__).parents[2] / "examples" / "ppo.yaml"


def load(overrides: list[str]) -> RLVRConfig:
    return validate(load_tree(PPO, overrides, model=RLVRConfig), RLVRConfig)


def test_action_values_shift_right_by_one() -> None:
    """The value of the state before token t is the head's output at t - 1; position 0 gets 0."""
    assert_close(action_values(torch.tensor([[1.0, 2.0, 3.0]])), torch.tensor([[0.0, 1.0, 2.0]]))


def test_value_loss_reads_the_shifted_head_golden() -> None:
    """Head [7, 1.5, 0.5, 7], response on tokens 2 and 3 -> values there [1.5, 0.5] (the head at 1 and 2).
    Old values [1, 1], returns [2, 2], clip 0.2: clipped values [1.2, 0.8]; squared errors unclipped
    [0.25, 2.25], clipped [0.64, 1.44]; half the max: [0.32, 1.125], sum 1.445 over 2 token units (mean
    0.7225). Gradient of the sum: token 2 is clipped (0), token 3 is V - R = -1.5, landing on head position 2."""
    head_BT = torch.tensor([[7.0, 1.5, 0.5, 7.0]], requires_grad=True)
    mb = {
        C.RESPONSE_MASK: torch.tensor([[0, 0, 1, 1]]),
        C.OLD_VALUES: torch.tensor([[0.0, 0.0, 1.0, 1.0]]),
        C.RETURNS: torch.tensor([[0.0, 0.0, 2.0, 2.0]]),
    }
    loss_fn = ValueLoss(clip_range=0.2, agg_mode="token-mean", norm_len=4)
    loss, metrics = loss_fn(ForwardOutput(torch.zeros(1, 0), values_BT=head_BT), mb)
    loss.backward()
    assert_close(loss, torch.tensor(1.445))
    assert loss_fn.count_units(mb) == 2.0
    assert head_BT.grad is not None
    assert_close(head_BT.grad, torch.tensor([[0.0, 0.0, -1.5, 0.0]]))
    assert metrics["vf_clip_frac"] == pytest.approx(0.5)
    assert metrics["value_mean"] == pytest.approx(1.0)
    assert metrics["value_error"] == pytest.approx(1.0)  # |1.5 - 2| and |0.5 - 2| -> mean 1.0


def test_value_loss_rejects_a_model_without_value_head() -> None:
    loss_fn = ValueLoss(clip_range=0.2, agg_mode="token-mean", norm_len=4)
    mb = {C.RESPONSE_MASK: torch.ones(1, 2), C.OLD_VALUES: torch.zeros(1, 2), C.RETURNS: torch.zeros(1, 2)}
    with pytest.raises(ValueError, match="value head"):
        loss_fn(ForwardOutput(torch.zeros(1, 2)), mb)


def test_explained_variance_golden() -> None:
    """Returns [1, 2, 3, 4], values [1, 2, 3, 3] (the masked 5th token is ignored): residuals [0, 0, 0, 1],
    unbiased var 0.75 / 3 = 0.25; var of returns 5 / 3; 1 - 0.25 / (5/3) = 0.85. Constant returns: nan."""
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0, 100.0]])
    values = torch.tensor([[1.0, 2.0, 3.0, 3.0, -100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(values, returns, mask) == pytest.approx(0.85)
    assert explained_variance(values, torch.ones(1, 5), mask) != explained_variance(
        values, torch.ones(1, 5), mask
    )


def test_ppo_config_has_a_critic_role() -> None:
    cfg = load([])
    assert cfg.needs_critic and cfg.algorithm.adv_estimator == "gae" and cfg.algorithm.whiten_advantages
    from roll.pipelines.rlvr import SPEC

    assert "critic" in SPEC.build(cfg).recipe.roles()  # type: ignore[attr-defined]


def test_critic_keys_without_a_critic_are_rejected_by_name() -> None:
    with pytest.raises(ConfigError) as err:
        load(["algorithm.preset=grpo", "algorithm.use_critic=false", "algorithm.adv_estimator=grpo"])
    message = str(err.value)
    assert (
        "critic.strategy" in message and "critic_warmup_steps" in message and "use_critic is false" in message
    )
    with pytest.raises(ConfigError, match="critic_warmup_steps = 2 >= max_steps = 2"):
        load(["max_steps=2"])
    with pytest.raises(ConfigError, match=r"critic\.num_workers"):
        load(["critic.num_workers=3"])


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> float:
    return max(float((after[k] - before[k]).abs().max()) for k in before)


def _run(overrides: list[str]) -> list[dict[str, float]]:
    cfg = load(overrides)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    lines = (cfg.output_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["metrics"] for line in lines]


@pytest.mark.slow
def test_ppo_trains_critic_and_actor_and_resumes_exactly(
    ray_local: Any, tmp_path: Path, resume_matches: Any
) -> None:
    """Warm-up 20 SFT steps, 1 critic-only step, 3 PPO steps, a checkpoint at step 2; a second run resumed from
    it logs steps 3-4 exactly as the uninterrupted one (critic, KL controller, sampling seeds and data position are
    all in the checkpoint). Slow (about 2 min on 2 idle cores): two pipeline starts of four actors each."""
    common = [
        "warmup.steps=20",
        "batch.prompts_per_step=16",
        "batch.samples_per_optimizer_step=64",
        "batch.micro_batch_samples=64",
        "cpu_threads=1",  # actor and critic train at the same time
        # A length penalty (DAPO's soft overlong punishment, from 2 tokens on) gives returns near -0.6 that a
        # critic can learn in a few steps; the outcome reward alone (right a few times in a hundred after this
        # short warm-up) is already matched by a random head near 0, leaving nothing to see fall.
        "algorithm.overlong_penalty=true",
        "algorithm.overlong_cache_len=10",
        "critic_warmup_steps=1",
        "eval_every=0",
        "plot=false",
        "tracking.backends=[jsonl]",
        "tracking.progress=false",
        "ray.address=auto",
        "ray.num_cpus=null",
    ]
    metrics = resume_matches(lambda extra: _run([*common, *extra]), tmp_path, steps=4, at=2)
    steps = [metrics[k] for k in sorted(metrics) if k > 0 and "critic/value_loss" in metrics[k]]
    assert len(steps) == 4
    losses = [s["critic/value_loss"] for s in steps]
    assert losses[-1] < losses[0] / 2, f"the critic's value loss did not fall: {losses}"
    for s in steps:
        for key in (
            "critic/vf_clip_frac",
            "critic/explained_variance",
            "critic/values_mean",
            "critic/grad_norm",
        ):
            assert key in s
    assert "actor/loss" not in steps[0] and all("actor/loss" in s for s in steps[1:]), "critic warm-up"
    root = tmp_path / "full" / "checkpoints"
    first, last = root / "step_000002", root / "step_000004"
    assert _changed(_weights(first / "actor"), _weights(last / "actor")) > 0, "PPO did not move the actor"
    assert _changed(_weights(first / "critic"), _weights(last / "critic")) > 0, "the critic did not train"
