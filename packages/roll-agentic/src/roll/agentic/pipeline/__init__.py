"""The agentic pipelines: ``agentic`` (multi-turn RL on envs) and ``agentic_rollout`` (evaluation only).

Each pipeline's package holds only its config and ``SPEC`` (no torch, no Ray); the implementation is imported by
``SPEC.build``. :mod:`.config` holds the sections both share, :mod:`.runtime` the clusters and the generate call
both drive.
"""
