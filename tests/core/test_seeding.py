"""derive_seed: a pure function of its integer path, in range, and unrelated across neighbouring paths."""

from __future__ import annotations

import subprocess
import sys

import pytest

from roll.core.errors import DataError
from roll.core.seeding import SEED_BITS, derive_seed


def test_equal_paths_give_equal_seeds_in_another_process() -> None:
    code = "from roll.core.seeding import derive_seed; print(derive_seed(7, 0, 3))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(other.stdout) == derive_seed(7, 0, 3)


def test_different_paths_give_different_seeds_in_range() -> None:
    """Prefixes, extensions and neighbours of a path are different paths: 4 * 1000 seeds, all distinct (a
    collision among them has probability about 8e6 / 2**64)."""
    seeds = {derive_seed(7, s, n) for s in range(2) for n in range(1000)}
    seeds |= {derive_seed(7, n) for n in range(1000)} | {derive_seed(7, 0, n, 0) for n in range(1000)}
    assert len(seeds) == 4000
    assert all(0 <= s < 2**SEED_BITS for s in seeds)


def test_an_empty_path_is_an_error() -> None:
    with pytest.raises(DataError, match="at least one integer"):
        derive_seed()
