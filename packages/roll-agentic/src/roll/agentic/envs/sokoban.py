"""Sokoban as a text env (or an image one): push every box onto a target.

Rules: the player moves Up/Down/Left/Right into free floor; moving into a box pushes it one cell if the cell
beyond is free (no wall, no other box: boxes never push boxes); a blocked move leaves the state unchanged but
still costs a step. The episode terminates when every box is on a target and is truncated after ``max_steps``.

Rewards (the gym-sokoban scheme, all configurable):

- ``step_reward`` = -0.1 on every step, valid or not, so shorter solutions score higher;
- ``box_on_reward`` = +1 when a push puts a box on a target, ``box_off_reward`` = -1 when one leaves it (pushing
  from target to target nets 0, so the shaping cannot be farmed);
- ``win_reward`` = +10 on the step that solves the level.

A one-box level solved in n pushes-and-moves returns ``-0.1 n + 1 + 10``.

Text symbols: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box, ``√`` box on target, ``P`` player, ``S`` player on
target. Levels come from :func:`~roll.agentic.envs.sokoban_gen.generate_level` (solvable by construction) or from
``SokobanConfig.level`` (a fixed level in the text form).

``observation: image`` shows the same state as a picture (for vision-language policies): an
:class:`~roll.agentic.types.ImageObservation` whose image is the room drawn with PIL by :func:`draw_room`
(``tile_size`` pixels a cell: brown wall, dark floor, red target tiles; inset squares for a box (yellow), a box
on a target (green), the player (blue) and the player on a target (violet)) and whose text is a short line with
the ``<image>`` marker. Levels, moves, rewards and expert actions are the text env's.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from roll.agentic.envs.grid_image import RGB, draw_grid
from roll.agentic.envs.sokoban_gen import (
    DIRECTIONS,
    SokobanLevel,
    apply_move,
    expert_move,
    generate_level,
)
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

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray
    from PIL.Image import Image

__all__ = ["SokobanConfig", "SokobanEnv", "draw_room", "render_rgb"]

ACTIONS = tuple(DIRECTIONS)
IMAGE_TEXT = (
    f"{IMAGE_MARKER}\nThe room: brown walls, red targets, yellow boxes (green on a target), blue square you. "
    "Your move?"
)
IMAGE_LEGEND = (
    "The room is a picture: brown walls, dark floor, red targets; a yellow square is a box, a green one a box "
    "on a target, a blue one you, a violet one you on a target."
)


class SokobanConfig(EnvConfig):
    type: Literal["sokoban"] = Field("sokoban", description="selects this env (its roll.env entry point)")
    width: int = Field(default=6, ge=4, le=30, description="room width in cells, walls included")
    height: int = Field(default=6, ge=4, le=30, description="room height in cells, walls included")
    num_boxes: int = Field(default=1, ge=1, le=8, description="boxes (and targets) per generated level")
    max_steps: int = Field(default=30, ge=1, description="moves after which the episode is truncated")
    search_depth: int = Field(default=300, ge=1, description="reverse-play steps when generating a level")
    seed: int | None = Field(default=None, description="seeds the env's RNG for reset(seed=None)")
    level: str | None = Field(
        default=None, description="a fixed level in the text form; overrides generation"
    )
    step_reward: float = Field(-0.1, description="reward of every move")
    box_on_reward: float = Field(1.0, description="added when a box is pushed onto a target")
    box_off_reward: float = Field(-1.0, description="added when a box is pushed off a target")
    win_reward: float = Field(10.0, description="added when every box is on a target (ends the episode)")
    observation: Literal["text", "image"] = Field(
        default="text", description="text grid, or a picture of it (ImageObservation) for a VLM policy"
    )
    tile_size: int = Field(
        default=16, ge=3, le=64, description="pixels per cell of the picture (observation: image, rgb_array)"
    )
    expert: bool = Field(
        default=False,
        description="report info['expert_action'] after reset and each step: the first move of a shortest "
        "solution from the current state (breadth-first; for warmup.expert_fraction)",
    )

    @model_validator(mode="after")
    def _room_fits_boxes(self) -> SokobanConfig:
        interior = (self.width - 2) * (self.height - 2)
        if self.level is None and interior < 2 * self.num_boxes + 2:
            raise ValueError(
                f"a {self.height}x{self.width} room has {interior} interior cells, too few for "
                f"{self.num_boxes} boxes (needs {2 * self.num_boxes + 2}); enlarge the room or use fewer boxes"
            )
        return self


class SokobanEnv:
    """The Sokoban :class:`~roll.agentic.types.Env`."""

    def __init__(self, config: SokobanConfig | None = None) -> None:
        self.config = config or SokobanConfig()
        self.max_steps = self.config.max_steps
        self._rng = random.Random(self.config.seed)
        self._fixed = SokobanLevel.from_text(self.config.level) if self.config.level else None
        self.level: SokobanLevel | None = None
        self._steps = 0
        self._done = False

    @property
    def system_prompt(self) -> str:
        legend = (
            IMAGE_LEGEND
            if self.config.observation == "image"
            else "Symbols: # wall, _ floor, O target, X box, √ box on target, P you, S you on a target."
        )
        return (
            f"You are solving Sokoban. Push every box onto a target. {legend} "
            "You move one cell per turn; walking into a box "
            "pushes it if the cell behind it is free. Boxes cannot be pulled and cannot push other boxes.\n"
            f"{self.action_space_text}. Answer with one action, e.g. <answer>Left</answer>."
        )

    @property
    def action_space_text(self) -> str:
        return "Valid actions: " + ", ".join(ACTIONS)

    def reset(self, seed: int | None = None) -> tuple[Observation, dict[str, Any]]:
        seed = self._rng.getrandbits(63) if seed is None else seed
        if self._fixed is not None:
            self.level = self._fixed
        else:
            cfg = self.config
            rng = random.Random(seed)
            self.level = generate_level(cfg.height, cfg.width, cfg.num_boxes, rng, depth=cfg.search_depth)
        self._steps, self._done = 0, False
        return self._observe(), self._with_expert({"seed": seed, "boxes_on_target": self._on_target()})

    def step(self, action: str) -> StepResult:
        level = self._require_running()
        self._steps += 1
        move = DIRECTIONS.get(action.strip().capitalize())
        after = apply_move(level, move) if move else level
        self.level = after
        delta = len(after.boxes & after.targets) - len(level.boxes & level.targets)
        reward = self.config.step_reward + self._box_reward(delta)
        won = after.solved
        reward += self.config.win_reward if won else 0.0
        truncated = not won and self._steps >= self.max_steps
        self._done = won or truncated
        info = {
            "action_is_valid": move is not None,
            "action_is_effective": after != level,
            "success": won,
            "boxes_on_target": self._on_target(),
        }
        return StepResult(self._observe(), reward, won, truncated, self._with_expert(info))

    def _with_expert(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.config.expert and self.level is not None and not self._done:
            info[EXPERT_ACTION] = expert_move(self.level)
        return info

    def _box_reward(self, delta: int) -> float:
        if delta > 0:
            return delta * self.config.box_on_reward
        return -delta * self.config.box_off_reward

    def _require_running(self) -> SokobanLevel:
        if self.level is None:
            raise EnvError("step() called before reset()")
        if self._done:
            raise EnvError("step() called on a finished episode; call reset() first")
        return self.level

    def _observe(self) -> Observation:
        level = self._require_level()
        if self.config.observation == "image":
            return ImageObservation(IMAGE_TEXT, (draw_room(level, self.config.tile_size),))
        return level.to_text()

    def _require_level(self) -> SokobanLevel:
        if self.level is None:
            raise EnvError("call reset() first")
        return self.level

    def _on_target(self) -> int:
        return len(self.level.boxes & self.level.targets) if self.level else 0

    def render(self, mode: RenderMode = "text") -> Frame:
        if self.level is None:
            raise EnvError("render() called before reset()")
        if mode == "text":
            return self.level.to_text()
        if mode == "rgb_array":
            return render_rgb(self.level, self.config.tile_size)
        raise EnvError(f"unknown render mode {mode!r}; use 'text' or 'rgb_array'")

    def close(self) -> None:
        return None


# Colours of the picture (render_rgb, observation: image): tiles, then the pieces inset on them.
_COLORS: dict[str, RGB] = {
    "wall": (110, 70, 50),
    "floor": (30, 30, 30),
    "target": (200, 50, 50),
    "box": (220, 180, 60),
    "box_on_target": (60, 200, 80),
    "player": (70, 130, 230),
    "player_on_target": (170, 90, 220),
}


def draw_room(level: SokobanLevel, tile: int = 16) -> Image:
    """The level as an RGB PIL image, ``tile`` pixels a cell: wall, floor or target tiles, and the boxes and
    the player as squares inset by ``max(1, tile // 5)`` (their own colour on a target)."""
    tiles_RC = [
        [
            _COLORS["wall" if (r, c) in level.walls else "target" if (r, c) in level.targets else "floor"]
            for c in range(level.width)
        ]
        for r in range(level.height)
    ]
    pieces = {box: _COLORS["box_on_target" if box in level.targets else "box"] for box in level.boxes}
    pieces[level.player] = _COLORS["player_on_target" if level.player in level.targets else "player"]
    return draw_grid(tiles_RC, tile, pieces, inset_px=max(1, tile // 5))


def render_rgb(level: SokobanLevel, tile: int = 16) -> NDArray[np.uint8]:
    """:func:`draw_room` as an ``[H*tile, W*tile, 3]`` uint8 array."""
    import numpy as np

    return np.array(draw_room(level, tile), dtype=np.uint8)
