"""rank4jax against the independent PyTorch peer (``../shared/bench/torch_rank4.py``).

``fixtures/torch_reference.npz`` holds the peer's parameters, logits, window loss and parameter
gradients for a tiny config on ragged windows with PAD (float32, eval mode), written by
``fixtures/make_torch_reference.py``; torch is not needed here. The peer's parameters are mapped onto
rank4jax's tree (nn.Linear weights transposed, LayerNorm (D,) vectors as (dx, dt), the stacked
(3, H, D, D) WQ/WK/WV split) and the JAX model must reproduce its values.

Tolerance: float32 on both sides, different summation orders (the peer forms the full readout
matrix, rank4jax contracts the fibers): |Δ| ≤ 2e-5 + 1e-4·|value| for logits, loss and gradients.
Measured at the fixture's creation: logits 7.2e-7 (largest |logit| 2.5), loss 4.8e-7, gradients
1.0e-7 (largest 0.21).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rank4jax.models import rank4
from rank4jax.models.family import RANK4
from tests.fixtures.make_torch_reference import SIZES

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "torch_reference.npz")
ATOL, RTOL = 2e-5, 1e-4


@pytest.fixture(scope="module")
def peer():
    return dict(np.load(FIXTURE))


def _config():
    s = SIZES
    return rank4.Rank4Config(
        vocab_size=s["V"], n_tokens=s["N"], n_slices=s["T"], dx=s["dx"], dt=s["dt"], n_heads=s["H"],
        n_layers=s["L"], dropout=0.0,
    )  # fmt: skip


def from_torch(tree: dict, prefix: str, cfg) -> dict:
    """The peer's named arrays (``prefix`` "param:" or "grad:") → rank4jax's parameter tree."""

    def get(name):
        return jnp.asarray(tree[prefix + name])

    def fiber(name):  # LayerNorm (D,) → (dx, dt), D = dx-major
        return get(name).reshape(cfg.dx, cfg.dt)

    layers = []
    for i in range(cfg.n_layers):
        wq, wk, wv = get(f"wqkv.{i}")  # (H, D, D) each, q = u @ W[h] in both
        layers.append({
            "attn": {"wq": wq, "wk": wk, "wv": wv},
            "ln_attn": {"scale": fiber(f"ln_a.{i}.weight"), "bias": fiber(f"ln_a.{i}.bias")},
            "ln_mlp": {"scale": fiber(f"ln_m.{i}.weight"), "bias": fiber(f"ln_m.{i}.bias")},
            "mlp": {
                "w1": get(f"mlp.{i}.0.weight").T, "b1": get(f"mlp.{i}.0.bias"),
                "w2": get(f"mlp.{i}.2.weight").T, "b2": get(f"mlp.{i}.2.bias"),
            },
        })  # fmt: skip
    return {
        "embed": {"sem": get("esem.weight"), "tmp": get("etmp.weight")},
        "readout": {"tmp": get("wprime")},
        "final_ln": {"scale": fiber("ln_f.weight"), "bias": fiber("ln_f.bias")},
        "layers": layers,
    }


def test_tree_mapping_covers_every_parameter(peer):
    cfg = _config()
    ours = jax.eval_shape(lambda k: rank4.init_params(k, cfg), jax.random.key(0))
    mapped = from_torch(peer, "param:", cfg)
    assert jax.tree.structure(mapped) == jax.tree.structure(ours)
    assert jax.tree.map(lambda a: a.shape, mapped) == jax.tree.map(lambda a: a.shape, ours)
    n_torch = sum(v.size for k, v in peer.items() if k.startswith("param:"))
    assert n_torch == sum(x.size for x in jax.tree.leaves(mapped)) == RANK4.count_params(cfg)


def test_logits_loss_and_gradients_match_the_pytorch_peer(peer):
    cfg = _config()
    params = from_torch(peer, "param:", cfg)
    windows = jnp.asarray(peer["windows"])
    logits = jax.jit(rank4.forward, static_argnums=2)(params, windows[:, :-1], cfg)  # (B, N, T, V), the peer's layout
    np.testing.assert_allclose(logits, peer["logits"], rtol=RTOL, atol=ATOL)

    def objective(p):
        return RANK4.loss_sums(p, windows, cfg, train=False)["objective"]

    loss, grads = jax.jit(jax.value_and_grad(objective))(params)  # jitted: eager compiles every primitive
    np.testing.assert_allclose(loss, peer["loss"], rtol=RTOL, atol=ATOL)
    expected = from_torch(peer, "grad:", cfg)
    for (path, got), want in zip(
        jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(expected), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=jax.tree_util.keystr(path))
