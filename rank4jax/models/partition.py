"""The parameters' logical axes, and the default rules that lay them on the trainer's (data, model) mesh.

Every parameter dimension has a logical name (``LOGICAL_AXES``, by the parameter's parent and leaf
key); rules map each name to a mesh axis or None (replicated), as flax's ``nnx.logical_axis_rules``
and MaxText's ``logical_axis_rules`` do. :data:`DEFAULT_RULES` put the attention heads (the H axis
of WQ/WK/WV; the baseline's head columns) and the MLP hidden width (4D) on ``model`` and replicate
everything else: the trainer's shardings (``rank4jax.engine.sharding``) resolve by them, and
``rank4jax.nn``'s parameters carry the names, resolved by a user's rules where given
(``nnx.logical_axis_rules``), by these elsewhere.
"""

from __future__ import annotations

from jax.sharding import PartitionSpec

MODEL_AXIS = "model"

# (parent key, leaf key) → the logical name of each dimension
LOGICAL_AXES = {
    ("attn", "wq"): ("heads", "embed", "kv"),  # (H, D, D): input fiber, then the head's own
    ("attn", "wk"): ("heads", "embed", "kv"),
    ("attn", "wv"): ("heads", "embed", "kv"),
    ("attn", "q"): ("embed", "heads"),  # baseline (D, D): output columns = heads
    ("attn", "k"): ("embed", "heads"),
    ("attn", "v"): ("embed", "heads"),
    ("attn", "o"): ("heads", "embed"),  # baseline (D, D): input rows = heads
    ("mlp", "w1"): ("embed", "mlp"),  # (D, 4D)
    ("mlp", "b1"): ("mlp",),  # (4D,)
    ("mlp", "w2"): ("mlp", "embed"),  # (4D, D)
    ("mlp", "b2"): ("embed",),  # (D,)
    ("ln", "scale"): ("dx", "dt"),  # a LayerNorm over the (dx, dt) fiber (rank4jax.nn)
    ("ln", "bias"): ("dx", "dt"),
    ("embed", "sem"): ("vocab", "dx"),  # Esem (V, dx)
    ("embed", "tmp"): ("vocab", "dt"),  # Etmp (V, dt)
    ("embed", "tok"): ("vocab", "embed"),  # the flat code's E (V, D)
    ("readout", "tmp"): ("vocab", "dt"),  # W′ (V, dt)
    ("features", "sem"): ("features", "dx"),  # rank4jax.nn.OuterProductEmbed: Wsem (F, dx)
    ("features", "tmp"): ("features", "dt"),  # Wtmp (F, dt)
    ("features", "sem_bias"): ("dx",),
    ("features", "tmp_bias"): ("dt",),
    ("outputs", "sem"): ("outputs", "dx"),  # rank4jax.nn.FactorisedReadout: A (O, dx)
    ("outputs", "tmp"): ("outputs", "dt"),  # B (O, dt)
}

DEFAULT_RULES = (
    ("heads", MODEL_AXIS),
    ("mlp", MODEL_AXIS),
    ("embed", None),
    ("kv", None),
    ("dx", None),
    ("dt", None),
    ("vocab", None),
    ("features", None),
    ("outputs", None),
)


def logical_axes(parent, name, ndim: int | None) -> tuple | None:
    """The logical names of a parameter ``parent.name`` with ``ndim`` dimensions; None for a parameter
    no rule names (a score variant's, the baseline's position table: replicated)."""
    names = LOGICAL_AXES.get((parent, name))
    return names if names is not None and ndim == len(names) else None


def resolve(names: tuple, rules=DEFAULT_RULES) -> PartitionSpec:
    """Logical names → the PartitionSpec of their mesh axes under ``rules`` (name → axis or None)."""
    table = dict(rules)
    return PartitionSpec(*(table.get(name) for name in names))


def leaf_partition(parent, name, ndim: int | None) -> PartitionSpec:
    """The trainer's PartitionSpec of a parameter ``parent.name`` (:data:`DEFAULT_RULES`; replicated
    when no rule names it)."""
    spec = resolve(logical_axes(parent, name, ndim) or ())
    return spec if any(axis is not None for axis in spec) else PartitionSpec()
