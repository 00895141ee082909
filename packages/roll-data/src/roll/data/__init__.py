"""roll.data."""
