"""Tools for agentic envs: calculator, python, MCP servers, and the wrapper that gives an env tools.

See :mod:`roll.agentic.types` for the :class:`~roll.agentic.types.Tool` protocol.
"""
