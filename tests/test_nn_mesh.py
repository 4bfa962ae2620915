"""rank4jax.nn and rank4jax.forward on any mesh (the suite's two simulated CPU devices): parameters carry
logical axis names that flax's rules resolve (the trainer's layout by default, a user's axes by their
rules), and the layer runs forward and backward with its parameters sharded under Explicit and Auto
mesh axes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, PartitionSpec

import rank4jax
import rank4jax.nn as r4nn
from rank4jax.engine.sharding import state_shardings
from tests.helpers import numpy_params

CFG = rank4jax.Rank4Config(vocab_size=11, n_tokens=3, n_slices=2, dx=2, dt=3, n_heads=2, n_layers=1, dropout=0.0)
X = jnp.asarray(np.random.default_rng(0).standard_normal((2, 3, 4, 2, 4)), jnp.float32)  # (B, frames, patches, dx, dt)
MASK = jnp.ones((2, 3, 4), bool).at[0, 2, 1:].set(False)


def _block_loss(block, x):
    return jnp.sum(jnp.sin(block(x, MASK, is_causal=True, causal_axis=0)))


def _spec(param) -> PartitionSpec:
    return param.get_value().sharding.spec


def test_every_parameter_carries_logical_names_resolved_to_the_trainers_layout():
    """nnx.get_partition_spec resolves the names by the default rules to the trainer's (data, model)
    layout; every module with weights carries names, OuterProductEmbed and FactorisedReadout included;
    built under the trainer's mesh, the parameters are placed as the trainer places the same tree."""
    model = r4nn.Rank4Model(CFG, rngs=nnx.Rngs(0))
    specs = nnx.get_partition_spec(nnx.state(model, nnx.Param))
    assert specs["layers"][0]["attn"]["wq"].get_value() == PartitionSpec("model", None, None)
    assert specs["layers"][0]["mlp"]["w1"].get_value() == PartitionSpec(None, "model")
    assert specs["embed"]["sem"].get_value() == PartitionSpec(None, None)
    assert model.layers[0].attn.wq.get_metadata()["out_sharding"] == ("heads", "embed", "kv")
    assert model.embed.sem.get_metadata()["out_sharding"] == ("vocab", "dx")
    rngs = nnx.Rngs(0)
    for module in (r4nn.OuterProductEmbed(5, 2, 3, rngs=rngs), r4nn.FactorisedReadout(2, 3, 7, rngs=rngs)):
        names = [v.get_metadata().get("out_sharding") for v in jax.tree.leaves(nnx.state(module), is_leaf=_is_var)]
        assert all(names) and {n[0] for n in names if len(n) == 2} <= {"features", "outputs"}
    mesh = jax.make_mesh((1, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    with jax.set_mesh(mesh):
        params = r4nn.Rank4Model(CFG, rngs=nnx.Rngs(0)).to_params()
    want = state_shardings(mesh, params)
    placed = jax.tree.map(lambda leaf, s: leaf.sharding.is_equivalent_to(s, leaf.ndim), params, want)
    assert all(jax.tree.leaves(placed))
    assert params["layers"][0]["attn"]["wq"].sharding.spec == PartitionSpec("model", None, None)


def _is_var(v):
    return isinstance(v, nnx.Variable)


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_block_forward_and_grad_with_sharded_heads(axis_type):
    """Built under jax.make_mesh((1, 2), ("data", "model")) (Explicit axes are its default) the block's
    head and MLP axes are sharded on model; its forward and nnx.grad give the unsharded block's values."""
    reference = r4nn.Rank4Block(2, 4, 2, dropout=0.0, rngs=nnx.Rngs(0))
    want, want_grad = reference(X, MASK, is_causal=True, causal_axis=0), nnx.grad(_block_loss)(reference, X)
    with jax.set_mesh(jax.make_mesh((1, 2), ("data", "model"), axis_types=(axis_type,) * 2)):
        block = r4nn.Rank4Block(2, 4, 2, dropout=0.0, rngs=nnx.Rngs(0))
        assert (_spec(block.attn.wq), _spec(block.mlp.w1)) == (
            PartitionSpec("model", None, None),
            PartitionSpec(None, "model"),
        )
        eager, grads = nnx.jit(lambda b, x: (b(x, MASK, is_causal=True, causal_axis=0), nnx.grad(_block_loss)(b, x)))(
            block, X
        )
    np.testing.assert_allclose(np.asarray(eager), np.asarray(want), rtol=0, atol=1e-6)
    np.testing.assert_allclose(grads.attn.wq.get_value(), want_grad.attn.wq.get_value(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(grads.mlp.w2.get_value(), want_grad.mlp.w2.get_value(), rtol=0, atol=1e-5)


def test_forward_and_grad_with_the_trainers_shardings_on_explicit_axes():
    """rank4jax.forward and its gradient with the parameters placed as the trainer places them, under a
    mesh with Explicit axes: the unsharded values."""
    params = numpy_params(rank4jax.init_params, CFG)
    inputs = jnp.asarray(
        np.random.default_rng(1).integers(0, CFG.vocab_size, (2, CFG.n_slices, CFG.n_tokens)), jnp.int32
    )

    def loss(params):
        return jnp.sum(jnp.sin(rank4jax.forward(params, inputs, CFG)))

    want = jax.jit(jax.value_and_grad(loss))(params)
    mesh = jax.make_mesh((1, 2), ("data", "model"))
    with jax.set_mesh(mesh):
        sharded = jax.device_put(params, state_shardings(mesh, params))
        got = jax.jit(jax.value_and_grad(loss))(sharded)
    assert got[1]["layers"][0]["attn"]["wq"].sharding.spec == PartitionSpec("model", None, None)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-5), got[1], want[1]
    )


def test_a_users_mesh_shards_by_the_rules_they_pass():
    """On a ("fsdp", "tensor") mesh the default rules name an axis the mesh lacks: one line says which
    rule to pass; with nnx.logical_axis_rules mapping the heads and the MLP width to tensor, the
    parameters are sharded on tensor and the forward runs."""
    with jax.set_mesh(jax.make_mesh((1, 2), ("fsdp", "tensor"))):
        with pytest.raises(
            ValueError, match=r"Rank4Attention.wq: logical axis 'heads' maps to mesh axis 'model', which"
        ):
            r4nn.Rank4Block(2, 4, 2, rngs=nnx.Rngs(0))
        with nnx.logical_axis_rules([("heads", "tensor"), ("mlp", "tensor")]):
            block = r4nn.Rank4Block(2, 4, 2, dropout=0.0, rngs=nnx.Rngs(0))
            specs = nnx.get_partition_spec(nnx.state(block, nnx.Param))
        assert (_spec(block.attn.wq), _spec(block.mlp.w2)) == (
            PartitionSpec("tensor", None, None),
            PartitionSpec("tensor", None),
        )
        assert specs["attn"]["wq"].get_value() == PartitionSpec("tensor", None, None)
        out = block(X, MASK, is_causal=True, causal_axis=0)
    want = r4nn.Rank4Block(2, 4, 2, dropout=0.0, rngs=nnx.Rngs(0))(X, MASK, is_causal=True, causal_axis=0)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=0, atol=1e-6)


def test_with_partitioning_as_kernel_init():
    """nnx.with_partitioning works where one spec fits every map (Rank4Attention's (H, D, D)); a block's
    maps of two ranks are refused in one line that says what to pass instead."""
    with jax.set_mesh(jax.make_mesh((1, 2), ("fsdp", "tensor"))):
        init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("tensor", None, None))
        attn = r4nn.Rank4Attention(2, 4, 2, kernel_init=init, rngs=nnx.Rngs(0))
        assert _spec(attn.wq) == PartitionSpec("tensor", None, None) and attn(X).shape == X.shape
        with pytest.raises(
            ValueError, match=r"Rank4MLP.w1: kernel_init's partitioning \('tensor', None, None\) names 3 axes"
        ):
            r4nn.Rank4Block(2, 4, 2, kernel_init=init, rngs=nnx.Rngs(0))
