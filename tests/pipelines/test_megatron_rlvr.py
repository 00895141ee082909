"""The rlvr pipeline with ``actor_train.strategy: {type: megatron, tensor_parallel_size: 2}`` on CPU: two ranks over
gloo (``roll.workers.megatron_device``), against the fsdp2 run of the same config, and resumed from a checkpoint.

The quickstart made small: 10 SFT warm-up steps, then 4 GRPO steps of 8 prompts x 8 samples, ``placement: hybrid``
(each of the two train workers also generates, with the weights it gathers from its TP shards). The megatron run
checkpoints every 2 steps; a second run resumes from step 2 (:func:`roll.core.testing.resume_matches`) and must log
steps 3 and 4 exactly as the uninterrupted run did (bitwise, timing aside).

Against fsdp2 (one worker, the same fp32 AdamW, clipping and schedule), every metric of every step must agree:
discrete ones exactly (rewards, response lengths, token and unit counts: the same weights sample the same tokens,
since sampling is seeded per request), continuous ones within ``REL`` = 1e-4 relative (``ABS`` = 1e-5 absolute for
values near 0, such as the trainer-vs-generator log-prob gaps, themselves ~1e-6). The two strategies sum in
different orders (TP splits each matmul and all-reduces; Megatron fuses QKV), which one step leaves at ~1e-7
relative (tests/workers/test_megatron_cpu_train.py). Both runs use Adam ``eps = 1e-3`` (as test_fsdp2.py's
``OPTIM``): with the default 1e-8, Adam divides a parameter's near-zero gradient by its own noise-sized scale, so
1e-7 differences became 4e-5 in the weights after the warm-up and 4.5% in step 2's grad norm (measured), while with
1e-3 the update is Lipschitz in the gradient. Measured (2026-12-03, eps 1e-3): largest relative difference 8.9e-6
(step 2's grad norm), warm-up losses and grad norms 2e-6 or less, discrete metrics equal. A real fault (a wrong
shard, a dropped bias, a lost optimizer state, a misscaled loss) moves these metrics by percents.

Marked ``megatron``: skipped without Megatron-Core; ``bash .ci/megatron`` runs it and fails if it skips.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from roll.core.config.loader import load_tree, validate
from roll.core.testing import TIMING_PREFIXES, Metrics, read_metrics

pytestmark = pytest.mark.megatron

QUICKSTART = Path(__file__).parents[2] / "examples" / "quickstart.yaml"
SMALL = [
    "warmup.steps=10",
    "eval_every=0",
    "batch.prompts_per_step=8",
    "rollout.request_prompts=8",
    "batch.micro_batch_samples=32",
    "validation.num_prompts=8",
    "actor_train.cpus_per_worker=0.5",
    "plot=false",
    "tracking.backends=[jsonl]",
    "tracking.progress=false",
    "ray.address=auto",
    "ray.num_cpus=null",
]
MEGATRON_TP2 = [
    "actor_train.num_workers=2",
    "actor_train.strategy={type: megatron, tensor_parallel_size: 2, optimizer: {lr: 5.0e-4}, max_grad_norm: 1.0}",
]
# Applied after the strategy is chosen, for both runs (see the module docstring).
ADAM_EPS = "actor_train.strategy.optimizer.eps=1.0e-3"
REL, ABS = 1e-4, 1e-5
DISCRETE = (
    "reward/",
    "response/",
    "rollout/",
    "actor/tokens",
    "actor/units",
    "actor/rows_skipped",
    "policy_version",
)


def _train(overrides: list[str]) -> None:
    from roll.pipelines.rlvr import SPEC, RLVRConfig

    cfg = validate(load_tree(QUICKSTART, [*SMALL, *overrides, ADAM_EPS], model=RLVRConfig), RLVRConfig)
    assert cfg.actor_train.strategy.optimizer.eps == 1e-3
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()


def _differences(got: Metrics, expected: Metrics) -> tuple[list[Any], float]:
    """Metrics outside the tolerance (see the module docstring), and the largest relative difference seen."""
    bad, worst = [], 0.0
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    for step in sorted(expected):
        names = {n for n in expected[step] if not n.startswith(TIMING_PREFIXES)}
        assert names == {n for n in got[step] if not n.startswith(TIMING_PREFIXES)}, step
        for name in sorted(names):
            a, b = got[step][name], expected[step][name]
            if name.startswith(DISCRETE):
                ok = a == b
            else:
                ok = math.isclose(a, b, rel_tol=REL, abs_tol=ABS)
                worst = max(worst, abs(a - b) / max(abs(b), ABS))
            if not ok:
                bad.append((step, name, a, b))
    return bad, worst


@pytest.mark.timeout(1500)
def test_rlvr_with_megatron_tp2_on_cpu_matches_fsdp2_and_resumes(
    ray_local: Any, tmp_path: Path, resume_matches: Any
) -> None:
    megatron = resume_matches(lambda o: _train([*MEGATRON_TP2, *o]), tmp_path / "megatron", steps=4, at=2)
    _train([f"output_dir={tmp_path / 'fsdp2'}", "max_steps=4"])
    fsdp2 = read_metrics(tmp_path / "fsdp2")
    assert any(s < 0 for s in megatron) and sorted(s for s in megatron if s > 0) == [1, 2, 3, 4]
    assert any(megatron[s]["actor/updates"] > 0 for s in (1, 2, 3, 4)), "no RL step updated the policy"
    bad, worst = _differences(megatron, fsdp2)
    print(f"megatron TP=2 vs fsdp2: largest relative difference {worst:.2e}")
    assert not bad, f"{len(bad)} metrics differ beyond rel {REL} / abs {ABS}; the first: {bad[:5]}"
