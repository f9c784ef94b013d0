"""What runs inside a rank: bootstrap (detach, capture output, exit), the runner, and in-rank APIs."""
