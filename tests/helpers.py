"""Small run configs for fast end-to-end tests; small model configs, ragged windows and random
parameters without compiling an init; JAX's compile log."""

import contextlib
import math
import socket

import jax
import jax.numpy as jnp
import numpy as np

import rank4jax
from configs import default, splm
from rank4jax.engine.run_config import model_section

# rank4jax.forward jitted once for every test module: one program per config and input shape (run
# eagerly, every primitive compiles as its own program)
jitted_forward = jax.jit(rank4jax.forward, static_argnums=2)

TINY = {  # the tiny run, as dotted config keys: tiny_config() applies them, tiny_flags() passes them to a command
    "data.builtin_stories": 200,
    "model.n_tokens": 8,
    "model.dx": 4,
    "model.dt": 2,
    "model.n_heads": 2,
    "model.n_layers": 1,
    "batch_size": 8,
    "eval_batch_size": 16,
    "num_steps": 6,
    "log_every": 2,
    "eval_every": 2,
    "checkpoint_every": 2,
    "keep_checkpoints": 2,
    "optim.warmup_steps": 0,
    "progress_bar": False,
    "plots": False,  # about 0.3 s a run; the tests of the curves turn it on
    "compact_buckets": 8,  # the loop tests run the rank-4 fast path (test_compact checks it against 0)
    "batch_layout": "rule",  # unmeasured: the first enabled layout (test_layout_choice measures)
}


def tiny_flags(**overrides) -> list[str]:
    """The tiny run as ``--config.KEY=VALUE`` flags of a command line (``overrides``: dotted keys with
    "." written "__", e.g. ``model__dx=8``)."""
    values = TINY | {key.replace("__", "."): value for key, value in overrides.items()}
    return [f"--config.{key}={value}" for key, value in values.items()]


def tiny_config(**overrides):
    """A few-second run on the built-in corpus; ``overrides`` use dotted keys ("model.dx": 4)."""
    c = default.get_config()
    _apply(c, TINY)
    family = overrides.pop("model_family", "rank4")
    if family != "rank4":  # the family's own model section
        c.model_family = family
        c.model = model_section(family, c.model)
        if family == "splm":
            c.model.splm = splm.get_config().model.splm
    _apply(c, overrides)
    return c


def _apply(config, values: dict) -> None:
    for key, value in values.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value


def hand_position_tables():
    """The fixed tables of a model with N = 2, T = 2, dx = 2, dt = 3, by hand (SPEC §2): P[x][n] and
    R[x + t][q], with the tokens tok[b, t, x] of a (B=1, T=2, N=2) window the exact tests embed."""
    p_tab = [[0.0, 1.0], [math.sin(1.0), math.cos(1.0)]]  # P[x, n]
    r_tab = [[math.sin(p), math.cos(p), math.sin(p / 10000 ** (2 / 3))] for p in range(4)]  # R[x+t, q]
    return p_tab, r_tab, np.array([[[5, 2], [0, 3]]])


@contextlib.contextmanager
def compile_log():
    """The names of the programs JAX lowers to XLA inside the block (its own compile log: every lowering
    is then compiled, or loaded from the persistent compilation cache), e.g. ``jit(train_step)``."""
    names = []

    def listener(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_to_mlir_module_duration":
            names.append(kwargs.get("fun_name", "?"))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield names
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def numpy_params(init_fn, cfg, dtype=np.float32, seed=0):
    """Random parameters in the tree ``init_fn(key, cfg, dtype)`` returns, drawn with numpy: nothing to
    compile (a jax.random init compiles one XLA program per shape, seconds each on CPU, and most of a
    gradient test's time went there). At the init's scale with every path non-trivial: LayerNorm scales
    1 + 0.1·N(0, 1), biases 0.1·N(0, 1), embeddings N(0, 1), other weights N(0, 1)/sqrt(fan_in) with the
    fan-in the second-to-last axis."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: init_fn(jax.random.key(0), cfg, dtype))

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        noise = rng.standard_normal(leaf.shape)
        if name.endswith("['scale']"):
            value = 1.0 + 0.1 * noise
        elif "bias" in name or name.endswith(("['b1']", "['b2']")):
            value = 0.1 * noise
        elif "embed" in name or len(leaf.shape) < 2:
            value = noise
        else:
            value = noise / np.sqrt(leaf.shape[-2])
        return jnp.asarray(value.astype(leaf.dtype))

    return jax.tree_util.tree_map_with_path(draw, shapes)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a two-process run's coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank4_cfg(**sizes):
    """A small rank-4 model config of ``sizes`` (V, N, T, dx, dt and any other field; H = 2, L = 2 and
    no dropout unless given)."""
    import rank4jax

    return rank4jax.Rank4Config(**({"n_heads": 2, "n_layers": 2, "dropout": 0.0} | sizes))


def ragged_windows(cfg, batch: int, seed: int = 0, lengths: tuple[int, int] | None = None) -> np.ndarray:
    """Random windows (B, T+1, N) of ``cfg``'s sizes, each sentence PAD after a random length drawn
    from [low, high) (``lengths``; default [0, N]), ids from 4 up."""
    rng = np.random.default_rng(seed)
    w = rng.integers(4, cfg.vocab_size, size=(batch, cfg.n_slices + 1, cfg.n_tokens)).astype(np.int32)
    low, high = lengths or (0, cfg.n_tokens + 1)
    w[np.arange(cfg.n_tokens)[None, None, :] >= rng.integers(low, high, size=(batch, cfg.n_slices + 1))[..., None]] = 0
    return w


def max_leaf_diff(a, b) -> float:
    """The largest absolute difference between two trees' leaves (in numpy: no program per leaf shape)."""
    pairs = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)
