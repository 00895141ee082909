"""Fixtures of the roll-diffusion tests: the warmed tiny kit, built once per pytest run (cached on disk after),
and an in-process ``reward_fl`` run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

RunRewardFL = Callable[[Path, Path, Sequence[str]], Path]


@pytest.fixture(scope="session")
def tiny_sd() -> Path:
    from roll.diffusion.kit.tiny import tiny_sd_path

    return tiny_sd_path()


def _run(yaml: Path, out: Path, overrides: Sequence[str]) -> Path:
    from roll.core.config.loader import load_config
    from roll.diffusion.reward_fl import SPEC, RewardFLConfig

    cfg = load_config(yaml, [f"output_dir={out}", "ray.num_cpus=null", *overrides], model=RewardFLConfig)
    pipeline = SPEC.build(cfg)
    try:
        pipeline.run()
    finally:
        pipeline.shutdown()
    return out


@pytest.fixture(scope="session")
def run_reward_fl() -> RunRewardFL:
    """``run(yaml, output_dir, overrides) -> output_dir``: a whole ``reward_fl`` run in this process, on the
    session's Ray (request ``ray_local`` too)."""
    return _run
