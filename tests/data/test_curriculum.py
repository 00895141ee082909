"""The accuracy curriculum rule of :mod:`roll.data.procedural` (pure; no reasoning-gym needed)."""

from __future__ import annotations

import pytest

from roll.core.errors import DataError
from roll.data.procedural import AccuracyCurriculum


def test_level_rises_when_the_window_mean_passes_the_threshold() -> None:
    """window 2, threshold 0.5: (0.4 + 0.7) / 2 = 0.55 raises 0 -> 1 and empties the window; the next single
    observation cannot raise again; (0.9 + 0.2) / 2 = 0.55 raises to the cap 2; nothing passes the cap."""
    c = AccuracyCurriculum(max_level=2, threshold=0.5, window=2)
    assert [c.observe(a) for a in (0.1, 0.4, 0.7, 0.9, 0.2, 1.0, 1.0)] == [0, 0, 1, 1, 2, 2, 2]


def test_below_threshold_stays_and_state_round_trips() -> None:
    c = AccuracyCurriculum(start=1, max_level=3, threshold=0.8, window=3)
    for a in (0.9, 0.7, 0.75):  # mean 0.783 < 0.8
        assert c.observe(a) == 1
    copy = AccuracyCurriculum(max_level=3, threshold=0.8, window=3)
    copy.load_state(c.state())
    assert copy.state() == {"level": 1, "recent": [0.9, 0.7, 0.75]}
    assert copy.observe(0.96) == c.observe(0.96) == 2  # window now 0.7, 0.75, 0.96: mean 0.803
    with pytest.raises(DataError, match=r"outside 0\.\.3"):
        AccuracyCurriculum(start=4, max_level=3)
