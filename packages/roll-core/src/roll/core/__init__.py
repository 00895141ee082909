"""roll.core."""
