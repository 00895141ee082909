"""Built-in text environments: sokoban, frozen_lake, countdown and guess_direction (a learnable toy).

Each module holds its config (a :class:`~roll.agentic.types.EnvConfig`) and its env class; the
:class:`~roll.core.types.EnvSpec` constants are in :mod:`roll.agentic.envs.specs`.
"""
