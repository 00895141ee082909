"""What a built-in task is, and how any task becomes SFT, preference and RL datasets.

A task is a generator of :class:`Problem` objects with verifiable answers plus the rules to check a model's reply.
It knows nothing about tokenizers or models; :func:`sft_dataset`, :func:`preference_dataset` and :func:`rl_dataset`
turn its problems into ``datasets.Dataset`` objects with fixed column layouts (documented on each function), so
every task yields the same schemas and the loaders only need to know these three.

Splits: a problem belongs to ``"eval"`` or ``"train"`` by a hash of its *key* (its canonical text), never by the
seed. So an eval set drawn with any seed shares no problem with a train set drawn with any other seed.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from roll.core.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset

Split = Literal["train", "eval"]
SPLITS: tuple[Split, ...] = ("train", "eval")

#: One problem in this many is held out for evaluation (decided by the hash of its key).
EVAL_EVERY = 8


@dataclass(frozen=True)
class Problem:
    """One problem: ``prompt`` is what the user asks, ``answer`` the bare correct answer.

    ``ground_truth`` is what a verifier receives (for arithmetic the same as ``answer``); ``key`` identifies the
    problem for de-duplication and splitting; ``tag`` routes it to a reward worker by domain. ``images`` (PIL
    images) go with the prompt, each where its ``<image>`` marker is (visual tasks); ``videos`` (each a tuple of
    PIL frames) where their ``<video>`` markers are.
    """

    prompt: str
    answer: str
    ground_truth: str
    tag: str
    key: str
    images: tuple[Any, ...] = ()
    videos: tuple[tuple[Any, ...], ...] = ()


@runtime_checkable
class Task(Protocol):
    """A source of verifiable problems. Implementations must be deterministic given an ``random.Random``."""

    @property
    def name(self) -> str:
        """The registry name (also seeds the problem stream, so tasks sharing a name share problems)."""
        ...

    @property
    def tag(self) -> str:
        """The domain tag a reward worker is chosen by."""
        ...

    def sample(self, rng: random.Random) -> Problem:
        """Draw one problem (may repeat earlier draws; callers de-duplicate by ``key``)."""
        ...

    def format_answer(self, answer: str) -> str:
        """The assistant's reply for a correct ``answer``, in the one format the task teaches."""
        ...

    def extract_answer(self, response: str) -> str | None:
        """The answer a model's ``response`` gives, or ``None`` when it gives none."""
        ...

    def verify(self, response: str, ground_truth: str) -> bool:
        """Whether ``response`` answers correctly. Reward workers call this."""
        ...

    def wrong_answer(self, problem: Problem, rng: random.Random) -> str:
        """A plausible but wrong bare answer (never equal to ``problem.answer``)."""
        ...


def split_of(key: str) -> Split:
    """The split a problem belongs to, from a stable hash of its key (not Python's salted ``hash``)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return "eval" if int.from_bytes(digest[:4], "big") % EVAL_EVERY == 0 else "train"


def problems(task: Task, n: int, *, seed: int = 0, split: Split = "train") -> list[Problem]:
    """``n`` distinct problems of ``split``, deterministic in ``(task, n, seed, split)``.

    Raises :class:`DataError` when the task's problem space cannot supply ``n`` distinct problems of that split
    (for example asking for 1000 one-digit sums), instead of looping forever or silently returning fewer.
    """
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; use one of {list(SPLITS)}")
    if n < 0:
        raise DataError(f"number of problems must be >= 0, got {n}")
    rng = random.Random(f"{task.name}:{split}:{seed}")
    found: dict[str, Problem] = {}
    # Give up once many draws in a row find nothing new: the space is (nearly) exhausted. A fixed budget
    # proportional to n made an impossible request of 100k problems spin for minutes before failing.
    attempts, misses, patience = 0, 0, 20_000
    while len(found) < n and misses < patience:
        attempts += 1
        problem = task.sample(rng)
        if problem.key not in found and split_of(problem.key) == split:
            found[problem.key] = problem
            misses = 0
        else:
            misses += 1
    if len(found) < n:
        raise DataError(
            f"task {task.name!r} found only {len(found)} distinct {split} problems of the {n} asked for "
            f"after {attempts} draws; ask for fewer or raise the difficulty"
        )
    return list(found.values())


def _base_row(problem: Problem) -> dict[str, Any]:
    row: dict[str, Any] = {"ground_truth": problem.ground_truth, "tag": problem.tag}
    if problem.images:
        row["images"] = list(problem.images)
    if problem.videos:
        row["videos"] = [list(frames) for frames in problem.videos]
    return row


def sft_dataset(task: Task, n: int, *, seed: int = 0, split: Split = "train") -> Dataset:
    """SFT rows: ``messages`` = ``[{role: user, content}, {role: assistant, content}]``, ``ground_truth``, ``tag``.

    The assistant turn is ``task.format_answer(answer)``, so a model trained on it answers in the format
    ``task.verify`` parses.
    """
    from datasets import Dataset

    rows = [
        {
            "messages": [
                {"role": "user", "content": p.prompt},
                {"role": "assistant", "content": task.format_answer(p.answer)},
            ],
            **_base_row(p),
        }
        for p in problems(task, n, seed=seed, split=split)
    ]
    return Dataset.from_list(rows)


def preference_dataset(task: Task, n: int, *, seed: int = 0, split: Split = "train") -> Dataset:
    """Preference rows in the conversational layout TRL also uses.

    ``prompt`` = ``[{role: user, content}]``; ``chosen`` / ``rejected`` = ``[{role: assistant, content}]`` with
    the correct and a plausible wrong answer in the same format (so only correctness differs); ``ground_truth``,
    ``tag``. ``chosen != rejected`` always.
    """
    from datasets import Dataset

    rng = random.Random(f"{task.name}:rejected:{split}:{seed}")
    rows = []
    for p in problems(task, n, seed=seed, split=split):
        wrong = task.wrong_answer(p, rng)
        if wrong == p.answer:  # a task bug; never hand out a pair that teaches nothing
            raise DataError(
                f"task {task.name!r} produced a 'wrong' answer equal to the right one: {p.prompt!r}"
            )
        rows.append(
            {
                "prompt": [{"role": "user", "content": p.prompt}],
                "chosen": [{"role": "assistant", "content": task.format_answer(p.answer)}],
                "rejected": [{"role": "assistant", "content": task.format_answer(wrong)}],
                **_base_row(p),
            }
        )
    return Dataset.from_list(rows)


def rl_dataset(task: Task, n: int, *, seed: int = 0, split: Split = "train") -> Dataset:
    """RL prompt rows: ``messages`` = ``[{role: user, content}]``, ``prompt`` (the bare text), ``ground_truth``, ``tag``."""
    from datasets import Dataset

    rows = [
        {"messages": [{"role": "user", "content": p.prompt}], "prompt": p.prompt, **_base_row(p)}
        for p in problems(task, n, seed=seed, split=split)
    ]
    return Dataset.from_list(rows)
