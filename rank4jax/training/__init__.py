"""Training and evaluation library: run configs, train state, steps, loop, checkpoints, metrics."""
