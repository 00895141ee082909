"""Procedural task suites as data sources: ``path: "reasoning_gym:<task>"`` (extra ``roll-data[reasoning-gym]``).

A source ``{path: "reasoning_gym:chain_sum", max_samples: 200, builtin_options: {min_terms: 2, max_terms: 3},
difficulty: 1}`` generates ``max_samples`` rows of reasoning-gym's ``chain_sum`` with the run's seed. Options are
the task's config fields; ``difficulty`` sets every attribute of the task's reasoning-gym curriculum to that level
(explicit options win over it). Held-out splits (``split: eval``/``validation``/``test``) draw from a disjoint
seed range: reasoning-gym makes row ``i`` from ``Random(seed + i)``, so the eval seed is offset by
:data:`EVAL_SEED_OFFSET`.

Row layouts, as for the built-in tasks (``builtin_kind``): ``rl`` rows carry ``prompt`` (the question) and
``messages``; ``sft`` rows a user/assistant conversation whose answer is ``"The answer is {answer}."`` (the format
the ``reasoning_gym`` reward extracts by default). Every row's ``ground_truth`` is a JSON object ``{"task",
"answer", "metadata"}``: the reasoning-gym entry the suite's own checker needs, so the reward scores with
``score_answer`` exactly as reasoning-gym does. ``tag`` is ``reasoning_gym``.

:class:`AccuracyCurriculum` is the rule that raises the difficulty when accuracy passes a threshold.
"""

from __future__ import annotations

import json
from collections import deque
from typing import TYPE_CHECKING, Any, Literal

from roll.core.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset

TAG = "reasoning_gym"
EVAL_SEED_OFFSET = 10_000_019
ANSWER_FORMAT = "The answer is {answer}."


def import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise DataError(
            f"reasoning_gym sources need the reasoning-gym package ({exc}): pip install 'roll-data[reasoning-gym]'"
        ) from exc
    return reasoning_gym


def task_config(task: str, n: int, *, seed: int, options: dict[str, Any], difficulty: int | None) -> Any:
    """The reasoning-gym config object of ``task``: curriculum level ``difficulty`` under explicit ``options``."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS, create_curriculum, has_curriculum

    if task not in DATASETS:
        raise DataError(f"reasoning_gym has no task {task!r}; tasks: {', '.join(sorted(DATASETS))}")
    fields = {**options, "size": n, "seed": seed}
    try:
        if difficulty is None:
            config = DATASETS[task][1](**fields)
        elif not has_curriculum(task):
            raise DataError(f"reasoning_gym task {task!r} has no curriculum; drop `difficulty`")
        else:
            curriculum = create_curriculum(task)
            curriculum.set_global_level(difficulty)
            config = curriculum.generate_configuration()
            config = type(config)(**{**vars(config), **fields})
        if hasattr(config, "validate"):
            config.validate()
    except (TypeError, ValueError, AssertionError) as exc:
        raise DataError(f"reasoning_gym:{task}: bad options {options}: {exc}") from exc
    return config


def reasoning_gym_dataset(
    task: str,
    kind: Literal["sft", "rl"],
    n: int,
    *,
    seed: int,
    split: str = "train",
    options: dict[str, Any] | None = None,
    difficulty: int | None = None,
) -> Dataset:
    """``n`` rows of reasoning-gym's ``task`` in the ``kind`` layout (module docstring)."""
    from datasets import Dataset
    from reasoning_gym.factory import DATASETS

    if split in ("eval", "validation", "test"):
        seed += EVAL_SEED_OFFSET
    config = task_config(task, n, seed=seed, options=dict(options or {}), difficulty=difficulty)
    entries = list(DATASETS[task][0](config=config))
    return Dataset.from_list([_row(task, entry, kind) for entry in entries])


def _row(task: str, entry: dict[str, Any], kind: str) -> dict[str, Any]:
    question, answer = str(entry["question"]), str(entry["answer"])
    truth = json.dumps({"task": task, "answer": entry["answer"], "metadata": entry["metadata"]}, default=str)
    user = {"role": "user", "content": question}
    if kind == "sft":
        reply = {"role": "assistant", "content": ANSWER_FORMAT.format(answer=answer)}
        return {"messages": [user, reply], "ground_truth": truth, "tag": TAG}
    return {"messages": [user], "prompt": question, "ground_truth": truth, "tag": TAG}


class AccuracyCurriculum:
    """Raise the difficulty level when the mean accuracy of the last ``window`` observations reaches
    ``threshold``; the window restarts at each raise, so every level is judged on its own samples.

    ``observe(accuracy)`` returns the level to train at next. Its state (``level`` and the window) is plain data
    for checkpoints (:meth:`state`, :meth:`load_state`).
    """

    def __init__(self, *, start: int = 0, max_level: int, threshold: float = 0.8, window: int = 4) -> None:
        if not 0 <= start <= max_level:
            raise DataError(f"curriculum start level {start} is outside 0..{max_level}")
        self.level, self.max_level, self.threshold = start, max_level, threshold
        self.recent: deque[float] = deque(maxlen=window)

    def observe(self, accuracy: float) -> int:
        self.recent.append(accuracy)
        full = len(self.recent) == self.recent.maxlen
        if full and self.level < self.max_level and sum(self.recent) / len(self.recent) >= self.threshold:
            self.level += 1
            self.recent.clear()
        return self.level

    def state(self) -> dict[str, Any]:
        return {"level": self.level, "recent": list(self.recent)}

    def load_state(self, state: dict[str, Any]) -> None:
        self.level = int(state["level"])
        self.recent.clear()
        self.recent.extend(float(v) for v in state["recent"])
