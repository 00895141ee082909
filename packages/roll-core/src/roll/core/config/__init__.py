"""Typed, strict, immutable configs (see :mod:`roll.core.config.base`)."""
