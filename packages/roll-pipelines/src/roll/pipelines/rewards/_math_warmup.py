"""Imported only by the math reward's forkserver (as a preload), so forked workers start warm.

Never import this from the parent: importing it runs :func:`roll.pipelines.rewards._math_worker.warm`.
"""

from roll.pipelines.rewards._math_worker import warm

warm()
