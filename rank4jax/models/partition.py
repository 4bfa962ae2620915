"""The parameters' partition over a (data, model) mesh, by name: the attention heads (the H axis of
WQ/WK/WV; the baseline's head columns) and the MLP hidden width (4D) along ``model``, everything else
replicated. The trainer's shardings (``rank4jax.engine.sharding``) and ``rank4jax.nn``'s parameter
metadata both read it, so a module's parameters are sharded as the trainer shards the same tree."""

from __future__ import annotations

from jax.sharding import PartitionSpec

MODEL_AXIS = "model"

# (parent key, leaf key) → PartitionSpec over the leaf's dimensions
_RULES = {
    ("attn", "wq"): PartitionSpec(MODEL_AXIS, None, None),  # (H, D, D)
    ("attn", "wk"): PartitionSpec(MODEL_AXIS, None, None),
    ("attn", "wv"): PartitionSpec(MODEL_AXIS, None, None),
    ("attn", "q"): PartitionSpec(None, MODEL_AXIS),  # baseline (D, D): output columns = heads
    ("attn", "k"): PartitionSpec(None, MODEL_AXIS),
    ("attn", "v"): PartitionSpec(None, MODEL_AXIS),
    ("attn", "o"): PartitionSpec(MODEL_AXIS, None),  # baseline (D, D): input rows = heads
    ("mlp", "w1"): PartitionSpec(None, MODEL_AXIS),  # (D, 4D)
    ("mlp", "b1"): PartitionSpec(MODEL_AXIS),  # (4D,)
    ("mlp", "w2"): PartitionSpec(MODEL_AXIS, None),  # (4D, D)
}


def leaf_partition(parent, name, ndim: int | None) -> PartitionSpec:
    """The PartitionSpec of a parameter named ``parent.name`` with ``ndim`` dimensions (``_RULES``;
    replicated when no rule names it)."""
    spec = _RULES.get((parent, name))
    return spec if spec is not None and ndim == len(spec) else PartitionSpec()
