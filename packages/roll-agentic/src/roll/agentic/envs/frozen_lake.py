"""FrozenLake as a text env, implemented here (no gymnasium): walk from the start to the goal without falling
into a hole.

Maps are ``size`` x ``size``, start top-left, goal bottom-right; each other cell is frozen with probability
``frozen_prob`` and a hole otherwise, redrawn until a path from start to goal exists (breadth-first search, the
same rule as gymnasium's ``generate_random_map``). The map and the slips are seeded, so an episode is a function
of its seed and the actions.

Dynamics: a move into the border leaves the player in place. With ``slippery`` the player moves in the
intended direction with probability ``1 - slip_prob`` and otherwise to one of the two perpendicular directions
(gymnasium's slippery lake is ``slip_prob = 2/3``).

Rewards: 1 on reaching the goal, 0 otherwise; falling in a hole terminates the episode with 0; ``max_steps``
truncates it.

Text symbols: ``_`` frozen, ``O`` hole, ``G`` goal, ``P`` player, ``X`` player in a hole, ``√`` player on the
goal.

``observation: image`` shows the same state as a picture (for vision-language policies): an
:class:`~roll.agentic.types.ImageObservation` whose image is the grid drawn with PIL (``cell_px`` pixels a cell:
ice light grey, hole dark blue, goal green, the player a red square inside its cell) and whose text is a short
line with the ``<image>`` marker. The drawing is a pure function of the state, so it is deterministic per seed;
maps, moves, rewards and expert actions are the text env's.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Literal

from pydantic import Field

from roll.agentic.envs.grid_image import RGB, Cell, draw_grid
from roll.agentic.types import (
    EXPERT_ACTION,
    IMAGE_MARKER,
    EnvConfig,
    EnvError,
    Frame,
    ImageObservation,
    Observation,
    RenderMode,
    StepResult,
)

__all__ = ["FrozenLakeConfig", "FrozenLakeEnv", "draw_lake", "generate_map", "has_path"]

DIRECTIONS: dict[str, Cell] = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
_PERPENDICULAR: dict[str, tuple[str, str]] = {
    "Left": ("Up", "Down"),
    "Right": ("Up", "Down"),
    "Up": ("Left", "Right"),
    "Down": ("Left", "Right"),
}
FROZEN, HOLE, GOAL, START = "_", "O", "G", "S"
_COLOURS: dict[str, RGB] = {
    FROZEN: (220, 220, 220),
    START: (220, 220, 220),
    HOLE: (20, 40, 140),
    GOAL: (30, 170, 60),
}
PLAYER_COLOUR: RGB = (220, 30, 30)
IMAGE_TEXT = f"{IMAGE_MARKER}\nThe lake: grey ice, blue holes, green goal, red square you. Your move?"


class FrozenLakeConfig(EnvConfig):
    type: Literal["frozen_lake"] = Field(
        "frozen_lake", description="selects this env (its roll.env entry point)"
    )
    size: int = Field(default=4, ge=2, le=32, description="side of the square grid")
    frozen_prob: float = Field(default=0.8, gt=0.0, le=1.0, description="chance a cell is frozen, not a hole")
    slippery: bool = Field(False, description="moves may slip sideways (with slip_prob)")
    slip_prob: float = Field(default=2 / 3, ge=0.0, le=1.0, description="chance of a perpendicular move")
    max_steps: int = Field(default=20, ge=1, description="steps after which the episode is truncated")
    seed: int | None = Field(default=None, description="seeds the env's RNG for reset(seed=None)")
    observation: Literal["text", "image"] = Field(
        default="text", description="text grid, or a picture of it (ImageObservation) for a VLM policy"
    )
    cell_px: int = Field(default=16, ge=3, le=64, description="image observation: pixels per cell")


def generate_map(size: int, frozen_prob: float, rng: random.Random, max_tries: int = 10_000) -> list[str]:
    """Rows of ``S _ O G``; start top-left, goal bottom-right, and a path between them."""
    for _ in range(max_tries):
        grid = [[FROZEN if rng.random() < frozen_prob else HOLE for _ in range(size)] for _ in range(size)]
        grid[0][0], grid[-1][-1] = START, GOAL
        rows = ["".join(row) for row in grid]
        if has_path(rows):
            return rows
    raise EnvError(
        f"no {size}x{size} map with a path in {max_tries} tries; raise frozen_prob ({frozen_prob})"
    )


def has_path(rows: list[str]) -> bool:
    """Whether the goal is reachable from the start through non-hole cells (4-connected BFS)."""
    size = len(rows)
    seen, queue = {(0, 0)}, deque([(0, 0)])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == GOAL:
            return True
        for dr, dc in DIRECTIONS.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < len(rows[0]) and (nr, nc) not in seen and rows[nr][nc] != HOLE:
                seen.add((nr, nc))
                queue.append((nr, nc))
    return False


def expert_move(rows: list[str], start: Cell) -> str | None:
    """The first move of a shortest hole-free path from ``start`` to a goal (None when there is none)."""
    size_r, size_c = len(rows), len(rows[0])
    first: dict[Cell, str | None] = {start: None}
    queue = deque([start])
    while queue:
        r, c = queue.popleft()
        if rows[r][c] == GOAL:
            return first[(r, c)]
        for name, (dr, dc) in DIRECTIONS.items():
            nxt = (r + dr, c + dc)
            if (
                0 <= nxt[0] < size_r
                and 0 <= nxt[1] < size_c
                and nxt not in first
                and rows[nxt[0]][nxt[1]] != HOLE
            ):
                first[nxt] = first[(r, c)] or name
                queue.append(nxt)
    return None


def _checked_rows(rows: list[str]) -> list[str]:
    text = "".join(rows)
    if not rows or len({len(row) for row in rows}) != 1 or set(text) - {FROZEN, HOLE, GOAL, START}:
        raise EnvError(
            f"a FrozenLake map is equal-length rows of {START} {FROZEN} {HOLE} {GOAL}; got {rows!r}"
        )
    if text.count(START) != 1 or GOAL not in text:
        raise EnvError(f"a FrozenLake map needs exactly one {START} and at least one {GOAL}; got {rows!r}")
    return list(rows)


class FrozenLakeEnv:
    """The FrozenLake :class:`~roll.agentic.types.Env`."""

    def __init__(self, config: FrozenLakeConfig | None = None, rows: list[str] | None = None) -> None:
        """``rows`` fixes the map (``S _ O G``); otherwise each reset generates one."""
        self.config = config or FrozenLakeConfig()
        self.max_steps = self.config.max_steps
        self._rng = random.Random(self.config.seed)
        self._fixed = _checked_rows(rows) if rows is not None else None
        self.rows: list[str] = []
        self.player: Cell = (0, 0)
        self._slip_rng = random.Random(0)
        self._steps = 0
        self._done = True

    @property
    def system_prompt(self) -> str:
        slip = (
            " The ice is slippery: you may slide sideways instead of where you meant."
            if self.config.slippery
            else ""
        )
        legend = (
            "Colours: grey ice, blue hole, green goal, red square you."
            if self.config.observation == "image"
            else "Symbols: _ frozen, O hole, G goal, P you."
        )
        return (
            "You are walking on a frozen lake. Reach the goal G without falling into a hole O. "
            f"{legend}{slip}\n{self.action_space_text}. Answer with one action, e.g. <answer>Down</answer>."
        )

    @property
    def action_space_text(self) -> str:
        return "Valid actions: " + ", ".join(DIRECTIONS)

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        seed = self._rng.getrandbits(63) if seed is None else seed
        rng = random.Random(seed)
        self.rows = (
            list(self._fixed) if self._fixed else generate_map(self.config.size, self.config.frozen_prob, rng)
        )
        self.player = next(
            (r, c) for r, row in enumerate(self.rows) for c, ch in enumerate(row) if ch == START
        )
        self._slip_rng = rng
        self._steps, self._done = 0, False
        return self._observe(), {"seed": seed, EXPERT_ACTION: expert_move(self.rows, self.player)}

    def step(self, action: str) -> StepResult:
        if self._done:
            raise EnvError("step() called on a finished episode (or before reset()); call reset() first")
        self._steps += 1
        name = action.strip().capitalize()
        valid = name in DIRECTIONS
        if valid:
            self.player = self._move(self.player, self._slip(name))
        cell = self.rows[self.player[0]][self.player[1]]
        won, fell = cell == GOAL, cell == HOLE
        truncated = not (won or fell) and self._steps >= self.max_steps
        self._done = won or fell or truncated
        info: dict[str, Any] = {"action_is_valid": valid, "success": won, "fell": fell}
        if not self._done:
            info[EXPERT_ACTION] = expert_move(self.rows, self.player)
        return StepResult(self._observe(), 1.0 if won else 0.0, won or fell, truncated, info)

    def _slip(self, name: str) -> str:
        if self.config.slippery and self._slip_rng.random() < self.config.slip_prob:
            return self._slip_rng.choice(_PERPENDICULAR[name])
        return name

    def _move(self, cell: Cell, name: str) -> Cell:
        dr, dc = DIRECTIONS[name]
        r, c = cell[0] + dr, cell[1] + dc
        if 0 <= r < len(self.rows) and 0 <= c < len(self.rows[0]):
            return (r, c)
        return cell

    def _observe(self) -> Observation:
        if self.config.observation == "image":
            return ImageObservation(IMAGE_TEXT, (draw_lake(self.rows, self.player, self.config.cell_px),))
        return self._text()

    def render(self, mode: RenderMode = "text") -> Frame:
        if not self.rows:
            raise EnvError("render() called before reset()")
        if mode == "rgb_array":
            import numpy as np

            return np.asarray(draw_lake(self.rows, self.player, self.config.cell_px))
        if mode != "text":
            raise EnvError(f"FrozenLake renders as 'text' or 'rgb_array', not {mode!r}")
        return self._text()

    def _text(self) -> str:
        lines = []
        for r, row in enumerate(self.rows):
            cells = [self._symbol(ch, (r, c)) for c, ch in enumerate(row)]
            lines.append("".join(cells))
        return "\n".join(lines)

    def _symbol(self, ch: str, cell: Cell) -> str:
        if cell == self.player:
            return {HOLE: "X", GOAL: "√"}.get(ch, "P")
        return FROZEN if ch == START else ch

    def close(self) -> None:
        return None


def draw_lake(rows: list[str], player: Cell, cell_px: int) -> Any:
    """The map as an RGB PIL image, ``cell_px`` pixels a cell, the player a red square inset in its cell."""
    tiles_RC = [[_COLOURS[ch] for ch in row] for row in rows]
    return draw_grid(tiles_RC, cell_px, {player: PLAYER_COLOUR}, inset_px=max(1, cell_px // 4))
