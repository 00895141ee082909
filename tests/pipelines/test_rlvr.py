"""The rlvr pipeline: config checks, loss objects, and an end-to-end run where the reward must rise.

The end-to-end test is the quickstart made smaller (fewer RL steps) on its earlier task, one-digit sums a+b
(``ONE_DIGIT_SUMS``): a 1M-parameter Qwen2 learns them on CPU. It asserts what a user would look at: accuracy after training beats accuracy of the
first step, the run wrote TensorBoard events, metrics.jsonl and the PNG plot, and the rollout's policy version
equals the trainer's after every sync (sync mode: lag 0 every step).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from roll.core import columns as C
from roll.core.config.loader import load_tree, validate
from roll.core.errors import ConfigError
from roll.pipelines.algorithms.aggregate import aggregate_loss
from roll.pipelines.algorithms.losses import MaskedNLLLoss, PolicyLoss
from roll.pipelines.algorithms.presets import preset_config
from roll.pipelines.rlvr import SPEC, RLVRConfig
from roll.workers.types import ForwardOutput

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"


ONE_DIGIT_SUMS = [
    "data.sources.0.builtin_options={level: 0}",
    "data.sources.0.max_samples=80",
    "data.eval_sources.0.builtin_options={level: 0}",
    "data.eval_sources.0.max_samples=12",
    "validation.num_prompts=12",
    "warmup.data.sources.0.builtin_options={level: 0}",
    "warmup.data.sources.0.max_samples=80",
    "warmup.steps=90",
]
"""The quickstart's task and warm-up before it moved to three-term sums (2026-12-03): 80 of the 100 one-digit sums
a+b. The learning test below was measured on it; the quickstart itself has its own test (test_quickstart.py)."""


def load(overrides: list[str]) -> RLVRConfig:
    return validate(load_tree(QUICKSTART, overrides, model=RLVRConfig), RLVRConfig)


def test_quickstart_config_validates() -> None:
    cfg = load([])
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.batch.samples_per_step == 32 * 8
    assert not cfg.needs_reference and cfg.warmup is not None


def test_hybrid_rejects_the_generator_keys_it_would_ignore() -> None:
    """Under placement hybrid the generator lives in actor_train's actors: an ``actor_infer`` size, node or model
    other than actor_train's would be silently unused, so each is an error with its key path; values equal to
    actor_train's, and ``cpus_per_worker`` (actor_train's apply), are accepted; placement separate takes them."""
    with pytest.raises(ConfigError) as err:
        load(["actor_infer.num_workers=2", "actor_infer.node=rollout", "actor_infer.model.path=tiny-10m"])
    text = str(err.value)
    assert (
        "actor_infer.num_workers is 2, but placement hybrid" in text and "actor_train.num_workers (1)" in text
    )
    assert "actor_infer.node is 'rollout'" in text and "actor_infer.model is 'tiny-10m'" in text
    assert "use placement: separate" in text and "3 problems" in text
    load(["actor_infer.num_workers=1", "actor_infer.cpus_per_worker=0.5"])
    cfg = load(["placement=separate", "actor_infer.num_workers=2"])
    assert cfg.policy_roles()["actor_infer"].num_workers == 2
    assert (
        "actor_infer" not in load([]).policy_roles()
    )  # the quickstart's hybrid places no generator of its own


def test_group_estimator_needs_groups() -> None:
    with pytest.raises(ConfigError, match="samples_per_prompt"):
        load(["batch.samples_per_prompt=1", "batch.micro_batch_samples=16"])


def test_a_tag_routes_to_one_domain() -> None:
    cfg = load([]).model_dump()
    cfg["rewards"]["other"] = {"type": "arithmetic", "tags": ["arithmetic"]}
    with pytest.raises(
        ValueError, match="routed to both"
    ):  # pydantic's ValidationError, raised by the validator
        RLVRConfig.model_validate(cfg)


def _micro_batch(B: int = 4, T: int = 6) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    mask = (torch.rand(B, T, generator=g) > 0.3).long()
    mask[:, 0] = 1
    return {C.RESPONSE_MASK: mask, C.ADVANTAGES: torch.randn(B, T, generator=g) * mask}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_loss_sum_over_units_is_the_modes_mean(mode: str) -> None:
    """Loss sum / count_units over two micro-batches equals the aggregation mode's mean over their union."""
    algo = preset_config("grpo", kl_mode="none", kl_coef=0.0, loss_agg_mode=mode)
    loss_fn = PolicyLoss(algo, norm_len=6, use_old_logp=False, kl_coef=0.0)
    mbs = [_micro_batch(), _micro_batch(B=3)]
    logps = [torch.randn(mb[C.RESPONSE_MASK].shape, requires_grad=True) for mb in mbs]
    outs = [loss_fn(ForwardOutput(lp, torch.ones_like(lp)), mb) for lp, mb in zip(logps, mbs)]
    total = sum(loss for loss, _ in outs)
    units = sum(loss_fn.count_units(mb) for mb in mbs)
    # At ratio 1 the PPO surrogate is -A per token; its global aggregate is the expected value.
    width = 6
    adv = torch.cat([mb[C.ADVANTAGES] for mb in mbs])
    mask = torch.cat([mb[C.RESPONSE_MASK] for mb in mbs])
    expected = aggregate_loss(-adv[:, :width], mask[:, :width], mode=mode, norm_len=6)  # type: ignore[arg-type]
    torch.testing.assert_close(total / units, expected)
    assert all("clip_frac" in metrics for _, metrics in outs)


def test_sft_loss_is_token_nll_over_labels() -> None:
    logp = torch.log(torch.full((2, 3), 0.5))
    labels = torch.tensor([[-100, 5, 6], [-100, -100, 7]])
    loss_fn = MaskedNLLLoss("labels")
    total, metrics = loss_fn(ForwardOutput(logp), {"labels_BT": labels})
    assert float(metrics["nll"]) == pytest.approx(0.6931, abs=1e-4)
    torch.testing.assert_close(
        total / loss_fn.count_units({"labels_BT": labels}), torch.tensor(0.6931), atol=1e-4, rtol=0
    )


@pytest.mark.slow
def test_reward_rises_on_arithmetic(ray_local: Any, tmp_path: Path, export_matches_trainer: Any) -> None:
    cfg = load(
        [
            *ONE_DIGIT_SUMS,
            f"output_dir={tmp_path}",
            "checkpoint.export_hf=true",
            "max_steps=40",
            "eval_every=0",
            "tracking.progress=false",
            "ray.address=auto",
            "ray.num_cpus=null",
        ]
    )
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r["metrics"] for r in rows if r["step"] > 0]
    acc = [s["reward/accuracy"] for s in steps]
    first, last = sum(acc[:8]) / 8, sum(acc[-8:]) / 8  # means over 8 steps of 256 samples each
    assert last > first + 0.05, f"accuracy did not rise: first 8 steps {first:.3f}, last 8 {last:.3f}"
    assert all(s["rollout/version_lag_max"] == 0 for s in steps), (
        "sync mode trains on the current policy only"
    )
    assert (tmp_path / "plot.png").stat().st_size > 1000
    export_matches_trainer(tmp_path)
    assert list(tmp_path.glob("tensorboard/**/events.*")) or list(tmp_path.glob("**/events.out.tfevents*"))


@pytest.mark.slow
def test_hybrid_placement_trains_and_generates_in_one_process(ray_local: Any, tmp_path: Path) -> None:
    """``placement=hybrid`` (the quickstart's): one actor holds the fsdp2 trainer and the hf generator, weights
    sync in process; with KL in the loss, a separate reference gets the warmed-up weights from the hybrid.
    Three GRPO steps after a short warm-up: no ``actor_infer`` role is placed, every step trains on samples of
    the current policy version (lag 0), the version advances once per step, held-out evaluation runs, and the
    KL to the reference is ~0 at step 1 (the policy is still the warmed-up model the reference was sent) and grows
    once the policy trains; a reference left at the untrained preset would start far from it."""
    cfg = load(
        [
            f"output_dir={tmp_path}",
            "max_steps=3",
            "warmup.steps=10",
            "eval_every=3",
            "plot=false",
            "tracking.backends=[jsonl]",
            "tracking.progress=false",
            "ray.address=auto",
            "ray.num_cpus=null",
            "algorithm.kl_mode=loss",
            "algorithm.kl_coef=0.05",
        ]
    )
    assert cfg.placement == "hybrid"
    pipeline = SPEC.build(cfg)
    assert "actor_infer" not in pipeline.recipe.roles() and "reference" in pipeline.recipe.roles()
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = {r["step"]: r["metrics"] for r in rows if r["step"] > 0}
    assert sorted(steps) == [1, 2, 3]
    assert [steps[k]["policy_version"] for k in (1, 2, 3)] == [2.0, 3.0, 4.0]  # warm-up sync is version 1
    assert all(steps[k]["rollout/version_lag_max"] == 0 for k in steps)
    assert 0.0 <= steps[3]["eval/accuracy"] <= 1.0 and "actor/loss" in steps[3]
    kl = [steps[k]["actor/kl"] for k in (1, 2, 3)]
    assert abs(kl[0]) < 1e-5 < kl[2], f"KL to the reference per step: {kl}"


def test_a_single_reward_without_tags_takes_every_row_and_names_stay_whole() -> None:
    """One domain with no ``tags``: every row goes to it, whatever its tag (``""`` or one no domain lists), and
    its metrics are ``reward/<domain>/...``, never ``reward//...``; two tagless domains are an error."""
    import numpy as np

    from roll.core.batch import Batch
    from roll.pipelines.rlvr import metrics as M
    from roll.pipelines.rlvr.config import reward_routes

    cfg = load(["rewards.arithmetic.tags=null"])
    routes, default = reward_routes(dict(cfg.rewards))
    assert routes == {} and default == "arithmetic"
    batch = Batch(
        {C.SCORES: torch.tensor([1.0, 0.0, 1.0]), C.CORRECT: torch.tensor([1.0, 0.0, 1.0])},
        {C.TAG: np.array(["", "gsm8k", ""], dtype=object)},
    )
    named = M.domain_metrics(batch, routes, default=default)
    assert named["reward/arithmetic/count"] == 3.0 and named["reward/arithmetic/mean"] == pytest.approx(2 / 3)
    untagged = M.domain_metrics(batch, {"gsm8k": "math"})
    assert sorted(untagged) == sorted(
        f"reward/{d}/{k}" for d in ("math", "untagged") for k in ("mean", "std", "accuracy", "count")
    )
    assert not any("//" in k for k in [*named, *untagged])
    data = cfg.model_dump()
    data["rewards"]["other"] = {"type": "arithmetic"}
    with pytest.raises(ValueError, match=r"reward domains \['arithmetic', 'other'\] all leave `tags` unset"):
        RLVRConfig.model_validate(data)


def test_reward_scheduler_routes_every_tag_to_the_tagless_domain(ray_local: Any) -> None:
    """The real scheduler and a real reward worker (Ray): rows tagged ``""`` and ``gsm8k`` are both scored by
    the one tagless ``arithmetic`` domain ("The answer is 7." against 7 is 1.0, against 8 is 0.0)."""
    import numpy as np

    from roll.core.batch import Batch
    from roll.core.cluster import Cluster
    from roll.core.scheduler import RankRequest, RewardScheduler
    from roll.core.testing import tiny_role
    from roll.pipelines.rlvr.clusters import RewardCluster
    from roll.pipelines.rlvr.reward_worker import REWARD_COLUMNS, RewardWorker

    with Cluster("reward_arithmetic", RewardWorker, tiny_role(), init_args=("arithmetic", {})) as cluster:
        score = RankRequest.bind(cast(RewardCluster, cluster).score)
        scheduler = RewardScheduler(
            {"arithmetic": score}, {}, columns=REWARD_COLUMNS, default_domain="arithmetic"
        )
        rows = {
            C.TEXT: ["The answer is 7.", "The answer is 7."],
            C.GROUND_TRUTH: ["7", "8"],
            C.PROMPT: ["a", "b"],
        }
        scored = scheduler.score(Batch({}, {**rows, C.TAG: np.array(["", "gsm8k"], dtype=object)}))
    assert scored[C.SCORES].tolist() == [1.0, 0.0] and scored[C.REWARD_ERROR].tolist() == [0.0, 0.0]
    assert list(scored[C.REWARD_ERROR_REPORT]) == [None, None]
