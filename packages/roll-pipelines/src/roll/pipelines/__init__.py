"""roll.pipelines."""
