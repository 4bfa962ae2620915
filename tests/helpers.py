"""Small run configs for fast end-to-end tests."""

from configs import default, splm
from rank4jax.training.run_config import model_section


def tiny_config(**overrides):
    """A few-second run on the built-in corpus; ``overrides`` use dotted keys ("model.dx": 4)."""
    c = default.get_config()
    c.data.builtin_stories = 200
    c.model.n_tokens = 8
    c.model.dx = 4
    c.model.dt = 2
    c.model.n_heads = 2
    c.model.n_layers = 1
    c.batch_size = 8
    c.eval_batch_size = 16
    c.num_steps = 6
    c.log_every = 2
    c.eval_every = 2
    c.checkpoint_every = 2
    c.keep_checkpoints = 2
    c.optim.warmup_steps = 0
    c.progress_bar = False
    c.compact_buckets = 8  # the loop tests run the rank-4 fast path (test_compact checks it against 0)
    family = overrides.pop("model_family", "rank4")
    if family != "rank4":  # the family's own model section
        c.model_family = family
        c.model = model_section(family, c.model)
        if family == "splm":
            c.model.splm = splm.get_config().model.splm
    for key, value in overrides.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c
