"""Built-in environments: sokoban, frozen_lake, countdown and guess_direction (a learnable toy).

Each module holds its config (a :class:`~roll.agentic.types.EnvConfig`) and its env class; the
:class:`~roll.core.types.EnvSpec` constants are in :mod:`roll.agentic.envs.specs`. Sokoban and FrozenLake also
show their state as a picture (``observation: image``), both drawn by :mod:`roll.agentic.envs.grid_image`.
"""
