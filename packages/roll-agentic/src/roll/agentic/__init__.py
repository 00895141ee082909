"""roll.agentic."""
