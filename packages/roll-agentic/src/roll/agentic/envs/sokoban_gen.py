"""Sokoban levels: the data type, its text form, and a generator of solvable levels.

Generation follows the reverse-play idea of gym-sokoban (Schrader, 2018; used by RAGEN and ROLL): carve a room
by a random walk, put every box *on* a target (a solved state), then walk the player backwards, *pulling* boxes.
Every pull undone is a legal push, so the forward puzzle is solvable by construction, no solver needed. Among the
states visited, the one with the highest score ``box_swaps * box_displacement`` is kept (harder: several boxes
moved, moved far), and only states where every box is off its target qualify, so no box is solved for free.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, replace

from roll.agentic.types import EnvError

__all__ = ["DIRECTIONS", "Cell", "SokobanLevel", "apply_move", "expert_move", "generate_level"]

Cell = tuple[int, int]  # (row, col)

DIRECTIONS: dict[str, Cell] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}

# Symbols of the text form (also what the policy sees).
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"


@dataclass(frozen=True)
class SokobanLevel:
    """An immutable Sokoban state: the room (walls, targets) plus where the boxes and the player are."""

    height: int
    width: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    @property
    def solved(self) -> bool:
        return self.boxes == self.targets

    def is_free(self, cell: Cell) -> bool:
        """Neither wall nor box (nor outside the room)."""
        return self._inside(cell) and cell not in self.walls and cell not in self.boxes

    def _inside(self, cell: Cell) -> bool:
        return 0 <= cell[0] < self.height and 0 <= cell[1] < self.width

    def symbol(self, cell: Cell) -> str:
        on_target = cell in self.targets
        if cell == self.player:
            return PLAYER_ON_TARGET if on_target else PLAYER
        if cell in self.boxes:
            return BOX_ON_TARGET if on_target else BOX
        if cell in self.walls:
            return WALL
        return TARGET if on_target else FLOOR

    def to_text(self) -> str:
        rows = ("".join(self.symbol((r, c)) for c in range(self.width)) for r in range(self.height))
        return "\n".join(rows)

    @classmethod
    def from_text(cls, text: str) -> SokobanLevel:
        """Parse the text form (rows of ``# _ O X √ P S``). Raises :class:`EnvError` on a malformed level."""
        rows = [row for row in text.strip("\n").splitlines() if row.strip()]
        if not rows or len({len(row) for row in rows}) != 1:
            raise EnvError("a Sokoban level needs non-empty rows of equal length")
        cells: dict[str, set[Cell]] = {
            s: set() for s in (WALL, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET)
        }
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                if ch in cells:
                    cells[ch].add((r, c))
                elif ch != FLOOR:
                    raise EnvError(f"unknown Sokoban symbol {ch!r} at row {r}, column {c}; use # _ O X √ P S")
        players = cells[PLAYER] | cells[PLAYER_ON_TARGET]
        boxes = cells[BOX] | cells[BOX_ON_TARGET]
        targets = cells[TARGET] | cells[BOX_ON_TARGET] | cells[PLAYER_ON_TARGET]
        if len(players) != 1 or not boxes or len(boxes) != len(targets):
            raise EnvError(
                f"a Sokoban level needs one player and as many boxes as targets (at least one); "
                f"got {len(players)} players, {len(boxes)} boxes, {len(targets)} targets"
            )
        return cls(
            len(rows), len(rows[0]), frozenset(cells[WALL]), frozenset(targets), frozenset(boxes), *players
        )


def _add(a: Cell, b: Cell) -> Cell:
    return (a[0] + b[0], a[1] + b[1])


def _room_floor(height: int, width: int, rng: random.Random) -> set[Cell]:
    """Carve floor by a random walk of small brushes inside the border (gym-sokoban's ``room_topology``)."""
    brushes: list[list[Cell]] = [
        [(0, 0)],
        [(0, -1), (0, 0), (0, 1)],
        [(-1, 0), (0, 0), (1, 0)],
        [(0, 0), (0, 1), (1, 0), (1, 1)],
        [(-1, 0), (0, -1), (0, 0), (0, 1), (1, 0)],
    ]
    pos = (rng.randrange(1, height - 1), rng.randrange(1, width - 1))
    direction = rng.choice(list(DIRECTIONS.values()))
    floor: set[Cell] = set()
    for _ in range(int(1.7 * (height + width))):
        if rng.random() < 0.35:
            direction = rng.choice(list(DIRECTIONS.values()))
        for offset in rng.choice(brushes):
            cell = _add(pos, offset)
            if 1 <= cell[0] < height - 1 and 1 <= cell[1] < width - 1:
                floor.add(cell)
        nxt = _add(pos, direction)
        pos = (min(max(nxt[0], 1), height - 2), min(max(nxt[1], 1), width - 2))
    return floor


def _reverse_play(start: SokobanLevel, rng: random.Random, depth: int) -> SokobanLevel | None:
    """Random walk with pulls from a solved ``start``; the best-scoring unsolved state seen, or None."""
    origin = {box: box for box in start.boxes}  # current cell -> the target it started on
    level, last_pulled, swaps = start, None, 0
    best, best_score = None, 0
    for _ in range(depth):
        step = rng.choice(list(DIRECTIONS.values()))
        nxt = _add(level.player, step)
        if not level.is_free(nxt):
            continue
        behind = (level.player[0] - step[0], level.player[1] - step[1])
        if behind in level.boxes and rng.random() < 0.5:
            boxes = (level.boxes - {behind}) | {level.player}
            origin[level.player] = origin.pop(behind)
            swaps += origin[level.player] != last_pulled
            last_pulled = origin[level.player]
            level = replace(level, boxes=frozenset(boxes), player=nxt)
        else:
            level = replace(level, player=nxt)
        score = swaps * sum(abs(b[0] - t[0]) + abs(b[1] - t[1]) for b, t in origin.items())
        if score > best_score and not (level.boxes & level.targets):
            best, best_score = level, score
    return best


def generate_level(
    height: int, width: int, num_boxes: int, rng: random.Random, *, depth: int = 300, attempts: int = 50
) -> SokobanLevel:
    """A solvable level with ``num_boxes`` boxes, none on a target. Deterministic given ``rng``'s state."""
    for _ in range(attempts):
        floor = _room_floor(height, width, rng)
        if len(floor) < 2 * num_boxes + 2:
            continue
        cells = sorted(floor)
        targets = frozenset(rng.sample(cells, num_boxes))
        player = rng.choice([cell for cell in cells if cell not in targets])
        walls = frozenset((r, c) for r in range(height) for c in range(width) if (r, c) not in floor)
        solved = SokobanLevel(height, width, walls, targets, targets, player)
        level = _reverse_play(solved, rng, depth)
        if level is not None:
            return level
    raise EnvError(
        f"could not generate a {height}x{width} Sokoban level with {num_boxes} boxes in {attempts} attempts; "
        "use a larger room or fewer boxes"
    )


def apply_move(level: SokobanLevel, move: Cell) -> SokobanLevel:
    """The level after the player tries ``move``: walk, or push one box into a free cell; unchanged if blocked."""
    nxt = _add(level.player, move)
    if nxt in level.boxes:
        beyond = _add(nxt, move)
        if not level.is_free(beyond):
            return level
        return replace(level, boxes=(level.boxes - {nxt}) | {beyond}, player=nxt)
    return replace(level, player=nxt) if level.is_free(nxt) else level


def expert_move(level: SokobanLevel, *, max_states: int = 20_000) -> str | None:
    """The first move of a shortest solution of ``level`` (breadth-first over player and box positions), or None
    when it is solved, unsolvable (a box pushed into a corner), or not solved within ``max_states`` states.

    The generator's reverse pulls already prove a solution exists from the start; a search from the *current*
    state is what lets the expert answer after any detour a noisy policy takes. One or two boxes in the small
    rooms roll trains on stay far below the state budget (a 6x6 room with one box has under 600 states)."""
    if level.solved:
        return None
    queue: deque[tuple[SokobanLevel, str | None]] = deque([(level, None)])
    seen = {(level.player, level.boxes)}
    while queue and len(seen) < max_states:
        state, move_name = queue.popleft()
        for name, move in DIRECTIONS.items():
            nxt = apply_move(state, move)
            key = (nxt.player, nxt.boxes)
            if key in seen:
                continue
            if nxt.solved:
                return move_name or name
            seen.add(key)
            queue.append((nxt, move_name or name))
    return None
