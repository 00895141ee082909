"""A prompt feed that raises the difficulty when accuracy passes a threshold.

:class:`CurriculumFeeder` holds one pool of tokenized prompt rows per difficulty level (built once by
:func:`level_rows` from a generated source: ``difficulty`` of a ``reasoning_gym:<task>`` source, or
``builtin_options.level`` of a ``builtin:<task>`` one) and serves batches from the current level's pool, epoch-
shuffled like ``rlvr``'s :class:`~roll.pipelines.rlvr.data.PromptFeeder`. After each training step the loop
calls ``observe(accuracy)``; the rule is :class:`roll.data.procedural.AccuracyCurriculum`. Its state (level,
window, each pool's position) is checkpoint state.

``rlvr`` builds one with :func:`curriculum_feeder` when its config has a ``curriculum`` section
(:class:`~roll.pipelines.rlvr.config.CurriculumConfig`), observes the step's ``curriculum.metric`` after each
step and logs ``curriculum/level`` (the level of that step's prompts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from roll.core.batch import Batch
from roll.core.errors import DataError
from roll.data.config import DataConfig, DatasetSourceConfig, TokenizeConfig
from roll.data.procedural import AccuracyCurriculum
from roll.pipelines.common.data import prepare_data
from roll.pipelines.rlvr.config import CurriculumConfig
from roll.pipelines.rlvr.data import PromptFeeder, Row


def at_level(src: DatasetSourceConfig, level: int) -> DatasetSourceConfig:
    """``src`` generating at difficulty ``level``."""
    if src.path.startswith("reasoning_gym:"):
        return src.model_copy(update={"difficulty": level})
    if src.path.startswith("builtin:"):
        return src.model_copy(update={"builtin_options": {**src.builtin_options, "level": level}})
    raise DataError(
        f"{src.path}: a curriculum needs a generated source (reasoning_gym:<task> or builtin:<task>)"
    )


def level_rows(
    src: DatasetSourceConfig, levels: int, *, tokenize: TokenizeConfig, tokenizer: Any, seed: int
) -> list[list[Row]]:
    """Tokenized prompt rows of ``src`` at each level ``0 .. levels - 1``."""
    pools = []
    for level in range(levels):
        data = DataConfig(sources=[at_level(src, level)], seed=seed, shuffle=False)
        pools.append(prepare_data(data, tokenize, kind="prompt", tokenizer=tokenizer).train)
    return pools


class CurriculumFeeder:
    """``feeder(n)`` prompts from the current level; ``observe(accuracy)`` may move to the next one."""

    def __init__(self, pools: Sequence[Sequence[Row]], rule: AccuracyCurriculum, *, seed: int) -> None:
        if len(pools) != rule.max_level + 1:
            raise DataError(f"{len(pools)} row pools for levels 0..{rule.max_level}")
        self.rule = rule
        self.feeders = [PromptFeeder(rows, seed=seed + level) for level, rows in enumerate(pools)]

    @property
    def level(self) -> int:
        return self.rule.level

    @property
    def rows(self) -> list[Row]:
        """The current level's pool (what :class:`PromptFeeder` calls its rows)."""
        return self.feeders[self.rule.level].rows

    def __call__(self, n: int) -> Batch:
        return self.feeders[self.rule.level](n)

    def observe(self, accuracy: float) -> int:
        return self.rule.observe(accuracy)

    def state(self) -> dict[str, Any]:
        return {"rule": self.rule.state(), "feeders": [f.state() for f in self.feeders]}

    def load_state(self, state: Mapping[str, Any]) -> None:
        self.rule.load_state(dict(state["rule"]))
        for feeder, feeder_state in zip(self.feeders, state["feeders"], strict=True):
            feeder.load_state(feeder_state)


def curriculum_feeder(
    cfg: CurriculumConfig, data: DataConfig, tokenize: TokenizeConfig, *, tokenizer: Any, seed: int
) -> CurriculumFeeder:
    """The feed of ``data``'s one generated source (the config checked there is one) at levels
    ``0 .. cfg.levels - 1``."""
    src = data.sources[0]
    pools = level_rows(src, cfg.levels, tokenize=tokenize, tokenizer=tokenizer, seed=data.seed)
    rule = AccuracyCurriculum(
        start=cfg.start, max_level=cfg.levels - 1, threshold=cfg.threshold, window=cfg.window
    )
    return CurriculumFeeder(pools, rule, seed=seed)
