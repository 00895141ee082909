"""Fixtures of the roll-diffusion tests: the warmed tiny kit, built once per pytest run (cached on disk after)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_sd() -> Path:
    from roll.diffusion.kit.tiny import tiny_sd_path

    return tiny_sd_path()
