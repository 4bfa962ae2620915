"""Data- and head-parallel sharding on 2 simulated CPU devices (see conftest)."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from rank4jax.engine import sharding
from rank4jax.engine.programs import build_programs, optim_key
from rank4jax.errors import ConfigError
from rank4jax.models.family import RANK4
from rank4jax.runs import load_run
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics
from tests.helpers import compile_log, tiny_config

MESHES = {"single": (1, 1), "data2": (2, 1), "model2": (1, 2)}


def mesh_config(name, **overrides):
    data, model = MESHES[name]
    base = {"num_steps": 3, "log_every": 1, "eval_every": 3, "checkpoint_every": 3, "mesh.data": data}
    return tiny_config(**(base | {"mesh.model": model} | overrides))


def test_two_devices_are_simulated():
    assert jax.device_count() == 2


def test_one_device_vs_data_vs_model_parallel_match(tmp_path):
    losses, params = {}, {}
    for name in MESHES:
        train(mesh_config(name), str(tmp_path / name))
        losses[name] = [r["loss"] for r in read_metrics(str(tmp_path / name))["train"]]
        params[name] = load_run(str(tmp_path / name), "latest").params
    assert len(losses["single"]) == 3
    for name in ("data2", "model2"):
        np.testing.assert_allclose(losses[name], losses["single"], rtol=0, atol=1e-5)
        for a, b in zip(
            jax.tree_util.tree_leaves(params[name]), jax.tree_util.tree_leaves(params["single"]), strict=True
        ):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("first,second", [("data2", "single"), ("single", "model2")])
def test_checkpoint_restores_onto_another_mesh(tmp_path, first, second):
    train(mesh_config("single", num_steps=4, eval_every=2, checkpoint_every=2), str(tmp_path / "ref"))
    train(mesh_config(first, num_steps=2, eval_every=2, checkpoint_every=2), str(tmp_path / "run"))
    summary = train(mesh_config(second, num_steps=4, eval_every=2, checkpoint_every=2), str(tmp_path / "run"))
    assert summary["step"] == 4
    ref = load_run(str(tmp_path / "ref"), "latest").params
    got = load_run(str(tmp_path / "run"), "latest").params
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_state_is_sharded_by_name_and_step_compiles_once():
    config = tiny_config()
    mesh = sharding.make_mesh(1, 2)
    model_cfg = RANK4.make_config(config.model, 50)
    programs = build_programs(RANK4, model_cfg, optim_key(config.optim), mesh)
    shardings = programs.state_sharding
    assert shardings.params["layers"][0]["attn"]["wq"].spec == PartitionSpec("model", None, None)
    assert shardings.params["layers"][0]["mlp"]["w1"].spec == PartitionSpec(None, "model")
    assert shardings.params["embed"]["sem"].spec == PartitionSpec()
    assert shardings.opt_state[0].mu["layers"][0]["attn"]["wv"].spec == PartitionSpec("model", None, None)
    state = programs.init(jax.random.key(0))
    wq = state.params["layers"][0]["attn"]["wq"]
    assert len(wq.addressable_shards) == 2 and wq.addressable_shards[0].data.shape[0] == model_cfg.n_heads // 2
    rng = np.random.default_rng(0)
    shape = (config.batch_size, model_cfg.n_slices + 1, model_cfg.n_tokens)
    batches = [rng.integers(0, 50, shape, dtype=np.int32) for _ in range(3)]
    with compile_log() as compiled:
        for batch in batches:
            state, metrics = programs.train_step(state, sharding.put_batch(batch, programs.batch_sharding))
    assert compiled == ["jit(train_step)"]  # one program for the three steps
    single = build_programs(RANK4, model_cfg, optim_key(config.optim), sharding.make_mesh(1, 1))
    alone = single.init(jax.random.key(0))  # the same three steps on one device: the same loss and state
    for batch in batches:
        alone, alone_metrics = single.train_step(alone, sharding.put_batch(batch, single.batch_sharding))
    assert int(state.step) == int(alone.step) == 3
    np.testing.assert_allclose(float(metrics["loss"]), float(alone_metrics["loss"]), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(alone.params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "overrides,match",
    [
        ({"mesh.data": 3}, "needs 3 devices; only 2"),
        ({"mesh.model": 0}, "mesh.model must be a positive integer"),
        ({"mesh.data": -1, "mesh.model": 3}, "does not divide the 2 available devices"),
        ({"mesh.data": 1, "mesh.model": 2, "model.n_heads": 3}, "n_heads=3 is not divisible by the model axis"),
        ({"mesh.data": 2, "mesh.model": 1, "batch_size": 9}, "batch_size 9 is not divisible by the data axis"),
    ],
)
def test_bad_mesh_is_a_clear_error(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        train(tiny_config(**overrides), str(tmp_path))
