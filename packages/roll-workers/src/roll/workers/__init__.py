"""roll.workers."""
