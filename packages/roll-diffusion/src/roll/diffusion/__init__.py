"""roll.diffusion."""
