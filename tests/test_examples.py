"""Every YAML in ``examples/`` names an installed pipeline and validates against its config model.

Runs in the full suite only (it needs every training-mode package installed), so a config key renamed in a
package cannot silently break an example that no end-to-end test runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.core.cli import load_run_config

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert len(EXAMPLES) >= 10


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_validates(path: Path) -> None:
    spec, config = load_run_config(path, [])
    assert spec.name == config.pipeline
    assert config.max_steps > 0
