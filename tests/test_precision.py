"""The precision policy, gradient accumulation, the FLOP count and MFU, the profiler
switch and the accelerator check at a tiny size."""

import functools
import glob
import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bench import accelerator_check
from bench.common import synthetic_windows
from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.data.compact import compact_windows
from rank4jax.engine import sharding
from rank4jax.engine.batches import n_windows
from rank4jax.engine.programs import StepPolicy, gradients
from rank4jax.engine.run_config import validate
from rank4jax.errors import ConfigError
from rank4jax.models import flops
from rank4jax.models.common import window_keys
from rank4jax.models.family import get_family
from rank4jax.models.precision import cast_to_compute
from rank4jax.runs import load_run
from rank4jax.training.loop import train
from rank4jax.training.metrics import read_metrics
from tests.helpers import tiny_config

FAMILIES = {  # name → (family, config overrides)
    "rank4": ("rank4", {}),
    "baseline": ("baseline", {}),
    "rank4_zpx": ("rank4", {"model.zpx.score": "zpx_angle_sphere"}),
    "splm": ("splm", {}),
}
ANALYTIC = ("rank4", {"model.attention": "analytic"})  # the §6 backward: a custom VJP
VOCAB = 40


def _family(name: str):
    family_name, overrides = FAMILIES.get(name, ANALYTIC)
    config = tiny_config(model_family=family_name, **overrides)
    family = get_family(family_name)
    return family, family.make_config(config.model, VOCAB)


def _windows(cfg, batch=8, seed=0):
    return synthetic_windows(batch, cfg.n_slices, cfg.n_tokens, VOCAB, seed=seed)


def _equations(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (jit, custom_jvp, scan) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in value if isinstance(value, list | tuple) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bf16_policy_dtypes_at_each_site(name):
    """Parameters float32; every matmul's inputs bfloat16; the softmax's max, every sum (LayerNorm
    statistics, softmax sums, loss sums) and the losses float32."""
    family, cfg = _family(name)
    params = jax.eval_shape(lambda key: family.init(key, cfg), jax.random.key(0))
    assert {leaf.dtype for leaf in jax.tree.leaves(params) if jnp.issubdtype(leaf.dtype, jnp.floating)} == {
        jnp.dtype("float32")
    }
    windows = jnp.asarray(_windows(cfg))
    closed = jax.make_jaxpr(lambda p: family.loss_sums(cast_to_compute(p, "bfloat16"), windows, cfg))(params)
    eqns = list(_equations(closed.jaxpr))

    def input_dtypes(primitive):
        return {str(v.aval.dtype) for e in eqns if e.primitive.name == primitive for v in e.invars}

    assert input_dtypes("dot_general") == {"bfloat16"}
    assert input_dtypes("reduce_max") == {"float32"}
    assert input_dtypes("reduce_sum") <= {"float32", "int32"}
    assert {str(v.aval.dtype) for v in closed.jaxpr.outvars} == {"float32"}


@pytest.mark.parametrize("name", [*FAMILIES, "rank4_analytic"])
def test_bf16_gradients_are_float32_for_every_family(name):
    """The gradient reaching the float32 parameters is float32 for every family, the §6 custom VJP
    included (its input cotangent once came back float32 for a bfloat16 input: a crash at trace time)."""
    family, cfg = _family(name)
    params = jax.eval_shape(lambda key: family.init(key, cfg), jax.random.key(0))
    windows = jnp.asarray(_windows(cfg))
    keys = window_keys(jax.random.key(1), len(windows))
    _, _, grads = jax.eval_shape(lambda p: gradients(p, windows, keys, family, cfg, StepPolicy("bfloat16"), 1), params)
    assert jax.tree.map(lambda g: (g.shape, g.dtype), grads) == jax.tree.map(lambda p: (p.shape, p.dtype), params)


def test_bf16_gradient_agrees_with_float32_within_bf16_precision():
    """One step's gradient in bfloat16 against float32: relative L2 error 1.1 % measured (0.4 % for
    the baseline; bfloat16's epsilon is 0.39 %); the loss within 2e-4 relative."""
    family, cfg = _family("rank4")
    params = family.init(jax.random.key(0), cfg)
    windows = jnp.asarray(_windows(cfg))
    keys = window_keys(jax.random.key(1), len(windows))
    out = {
        dtype: jax.jit(lambda p, dtype=dtype: gradients(p, windows, keys, family, cfg, StepPolicy(dtype), 1))(params)
        for dtype in ("float32", "bfloat16")
    }
    (loss32, _, g32), (loss16, _, g16) = out["float32"], out["bfloat16"]
    assert {leaf.dtype for leaf in jax.tree.leaves(g16)} == {jnp.dtype("float32")}
    error = float(optax.tree.norm(jax.tree.map(jnp.subtract, g32, g16)) / optax.tree.norm(g32))
    assert 0 < error < 0.03
    assert abs(float(loss16) - float(loss32)) < 2e-4 * float(loss32)


def test_a_bf16_run_lands_near_the_f32_run_and_resumes_as_f32(tmp_path):
    """200 steps of the tiny run in each dtype: validation window CE within 0.005 nats (measured
    3.6035 f32, 3.6038 bf16); the bf16 run's checkpoints hold float32 arrays and an f32 run resumes them."""
    flags = dict(num_steps=200, eval_every=100, checkpoint_every=100, log_every=50)
    f32 = train(tiny_config(**flags), str(tmp_path / "f32"))
    bf16 = train(tiny_config(compute_dtype="bfloat16", **flags), str(tmp_path / "bf16"))
    a, b = f32["final_validation"]["window_ce"], bf16["final_validation"]["window_ce"]
    assert b != a and abs(b - a) < 0.005, (a, b)
    with RunCheckpoints(str(tmp_path / "bf16"), read_only=True) as ckpt:
        metadata = ckpt.manager.item_metadata(200)
        stored = [metadata["params"], metadata["opt_state"]]
    floating = {leaf.dtype for leaf in jax.tree.leaves(stored) if np.issubdtype(leaf.dtype, np.floating)}
    assert floating == {np.dtype("float32")}  # parameters and Adam's moments; the step and key are integers
    resumed = train(tiny_config(**(flags | {"num_steps": 202})), str(tmp_path / "bf16"))
    assert resumed["step"] == 202
    params = load_run(str(tmp_path / "bf16"), "latest").params
    assert {leaf.dtype for leaf in jax.tree.leaves(params)} == {np.dtype("float32")}


@pytest.mark.parametrize("name,layout,k", [("rank4", "full", 2), ("rank4", "compact", 4)])
def test_gradient_accumulation_equals_the_full_batch(name, layout, k):
    """k microbatches of B/k on two devices: the same loss, sums and gradient as one batch of B,
    dropout on (each window keeps its masks: its key is its own). The baseline's decode draws its
    masks from the same per-window keys (measured equal too, rtol 2e-5; not repeated here: each
    of its decode programs compiles for seconds)."""
    family, cfg = _family(name)
    assert cfg.dropout > 0
    mesh = sharding.make_mesh(2, 1)
    params = family.init(jax.random.key(0), cfg)
    windows = _windows(cfg, batch=8, seed=3)

    @functools.partial(jax.jit, static_argnums=2)
    def run(p, b, steps):
        keys = window_keys(jax.random.key(7), n_windows(b))
        return gradients(p, b, keys, family, cfg, StepPolicy(grad_accum_steps=steps), 2)

    results = {}
    for steps in (1, k):
        batch = compact_windows(windows, groups=2 * steps, buckets=4) if layout == "compact" else windows
        results[steps] = jax.device_get(run(params, sharding.put_batch(batch, sharding.batch_sharding(mesh)), steps))
    for got, want in zip(jax.tree.leaves(results[k]), jax.tree.leaves(results[1]), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-7)


def test_the_new_config_keys_are_checked_one_line_each():
    with pytest.raises(ConfigError, match=r"batch_size \(8\) must be a multiple of grad_accum_steps \(3\)"):
        validate(tiny_config(grad_accum_steps=3))
    with pytest.raises(ConfigError, match="compute_dtype must be one of float32, bfloat16"):
        validate(tiny_config(compute_dtype="float16"))
    with pytest.raises(ConfigError, match="profile_steps must be 'first:last'"):
        validate(tiny_config(profile_steps="5:2"))
    with pytest.raises(ConfigError) as caught:
        validate(tiny_config(profile_steps="50:60", num_steps=40))
    assert str(caught.value) == "profile_steps=50:60 starts after num_steps=40: nothing would be traced"


def test_a_trace_that_cannot_be_started_or_written_is_one_warning(tmp_path, monkeypatch, capsys):
    """A full disk while the profiler writes (JAX raises RESOURCE_EXHAUSTED from stop_trace) or a
    directory it cannot make: one warning each, the run's step contexts go on, nothing raised."""
    from rank4jax.training.profiling import Profiler

    def full_disk():
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: No space left on device\nmore detail")

    monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: None)
    monkeypatch.setattr(jax.profiler, "stop_trace", full_disk)
    profiler = Profiler(str(tmp_path), "2:3")
    for step in (1, 2, 3, 4):
        with profiler.step(step):
            pass
        profiler.step_done(step, None)
    profiler.stop()  # the run's end: nothing left to write
    expected = (
        f"rank4jax: warning: the profile of steps 2-3 was not written under {tmp_path}/profile: "
        "RESOURCE_EXHAUSTED: No space left on device; training goes on without it\n"
    )
    assert capsys.readouterr().err == expected

    monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: full_disk())
    profiler = Profiler(str(tmp_path), "1:2")
    for step in (1, 2):
        with profiler.step(step):
            pass
        profiler.step_done(step, None)
    assert capsys.readouterr().err == expected.replace(
        "the profile of steps 2-3 was not written", "cannot start the profile"
    )


def test_flop_counts_by_hand():
    """2 × multiply-adds, one window. Rank-4, N=T=2, dx=dt=2 (D=4), H=1, L=1, V=10, P=4: Q/K/V
    2·3·4·16 = 384, scores and weighted sum 2·2·16·4 = 256, MLP 2·2·4·4·16 = 1024, readout 2·4·4·10 =
    320. Baseline (same sizes): Lc = 1 + 4 = 5, S = 7 slots, 7 queries: Q/K/V/O 2·4·7·16 = 896, MLP
    2·2·7·4·16 = 1792, attention 2·2·7·7·4 = 784; readout at N+1 = 3 targets 2·3·4·10 = 240."""
    sizes = dict(n_tokens=2, n_slices=2, dx=2, dt=2, n_heads=1, n_layers=1, dropout=0.0)
    rank4_cfg = get_family("rank4").make_config(sizes, 10)
    baseline_cfg = get_family("baseline").make_config(sizes, 10)
    assert flops.rank4_forward(rank4_cfg) == 384 + 256 + 1024 + 320
    assert flops.baseline_forward(baseline_cfg) == 896 + 1792 + 784 + 240
    assert flops.stream_forward(baseline_cfg) == 896 + 1792 + 784 + 2 * 7 * 4 * 10
    assert flops.train_flops_per_window(get_family("rank4"), rank4_cfg) == 3 * 1984
    assert flops.train_flops_per_window(get_family("splm"), None) is None


def test_profile_steps_write_a_trace_and_the_log_carries_model_flops(tmp_path, capsys):
    """Steps 2-3 traced (validation at step 2 among them): the XPlane file names the model's scopes
    and the evaluation, the Perfetto trace the train steps; the log's FLOP/s are the analytic count's."""
    config = tiny_config(num_steps=4, profile_steps="2:3")
    train(config, str(tmp_path))
    profile = str(tmp_path / "profile")
    (xplane,) = glob.glob(f"{profile}/plugins/profile/*/*.xplane.pb")
    (perfetto,) = glob.glob(f"{profile}/plugins/profile/*/perfetto_trace.json.gz")
    names = open(xplane, "rb").read()
    for scope in (b"jit(train_step)/", b"attention/", b"mlp/", b"readout", b"evaluation"):
        assert scope in names, scope
    events = json.loads(gzip.open(perfetto).read())["traceEvents"]
    assert any(event.get("name") == "train" for event in events)  # the StepTraceAnnotation
    assert f"rank4jax: profile of steps 2-3 written under {profile}" in capsys.readouterr().out
    cfg = get_family("rank4").make_config(config.model, load_run(str(tmp_path), "latest").tokenizer.vocab_size)
    for record in read_metrics(str(tmp_path))["train"]:
        expected = record["windows_per_s"] * 3 * flops.rank4_forward(cfg) / jax.device_count()
        assert record["analytic_flops_per_s_per_device"] == pytest.approx(expected, rel=1e-12)
        assert "mfu" not in record and "analytic_mfu" not in record  # no peak for a CPU


def test_accelerator_check_runs_end_to_end_at_a_tiny_size(capsys):
    accelerator_check.main(["--tiny", "--precisions=bf16", "--steps=1", "--rounds=1", "--train_steps=2"])
    out = capsys.readouterr().out
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [(r["family"], r["precision"]) for r in rows] == [("rank4", "bf16"), ("baseline", "bf16")]
    from rank4jax.models.flops import train_flops_per_window

    configs = accelerator_check.family_configs(tiny=True)
    for r in rows:  # the figures are one timing's: 8 windows per step_ms, the analytic FLOPs of each
        assert r["windows_per_s"] == pytest.approx(8 / (r["step_ms"] / 1e3), rel=1e-12)
        per_window = train_flops_per_window(*configs[r["family"]])
        assert r["tflops"] == pytest.approx(r["windows_per_s"] * per_window / 1e12, rel=1e-12)
        assert r["bf16_peak_fraction"] is None  # no peak for a CPU
    assert "| rank4 | bf16 |" in out and "baseline (free-running) step time / rank-4 step time, bf16:" in out
    assert "training run configs/default.py bf16, 2 steps" in out and "first validation (step 2) LS(T)" in out


def test_the_logged_xla_flops_are_the_compiled_steps_cost_analysis(tmp_path):
    """``CompiledStep`` adds XLA's FLOP count of the executable each call runs (a (64, 64) matmul:
    2·64³ each); a run logs, per interval, the FLOPs of its steps over the interval's time (one shape
    here, so each two-step interval ran the same FLOPs). The run measures its layout (``auto``: trimmed
    to a multiple of N, so one shape, and full width), and the steps timed for that are not counted."""
    from rank4jax.engine.programs import CompiledStep

    step = CompiledStep(jax.jit(lambda a, b: a @ b), max_shapes=1)
    x = jnp.ones((64, 64))
    for _ in range(3):
        step(x, x)
    assert step.flops_done == 3 * 2 * 64**3
    config = tiny_config(num_steps=4, log_every=2, batch_layout="auto", compact_buckets=0, trim_padding_multiple=8)
    assert train(config, str(tmp_path))["batch_layout"] in ("trimmed", "full")
    records = read_metrics(str(tmp_path))["train"]
    first, second = (r["xla_flops_per_s_per_device"] * r["interval_s"] for r in records)
    assert [r["step"] for r in records] == [2, 4] and first == pytest.approx(second, rel=1e-9) and first > 0


def test_mfu_is_the_compiled_flops_over_the_compute_dtypes_peak():
    """``mfu`` = XLA's per-device FLOP/s over the peak of the run's compute dtype; ``analytic_mfu`` the
    full-width analytic count over the same peak; neither without a known peak."""
    from rank4jax.training.utilization import peak_flops, utilization

    class Device:
        def __init__(self, kind):
            self.device_kind = kind

    assert peak_flops(Device("NVIDIA H200"), "bfloat16") == 989e12
    assert peak_flops(Device("NVIDIA H200"), "float32") == 67e12
    assert peak_flops(Device("NVIDIA H100 PCIe"), "float32") == 51e12
    assert peak_flops(Device("TPU v5 lite"), "float32") is None  # float32 matmuls run as bf16 passes there
    assert peak_flops(jax.devices()[0], "bfloat16") is None
    assert utilization(100.0, 3e9, 5e11, 2, 1e12) == {
        "xla_flops_per_s_per_device": 5e11,
        "analytic_flops_per_s_per_device": 1.5e11,
        "mfu": 0.5,
        "analytic_mfu": 0.15,
    }
    assert utilization(100.0, None, 5e11, 1, None) == {"xla_flops_per_s_per_device": 5e11}


def test_xla_counts_a_sharded_programs_flops_per_device():
    """The count ``CompiledStep`` adds is the partitioned program's: a matmul whose rows are split over
    the two devices counts half of 2·64³ (so the log's figure is per device)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from rank4jax.engine.programs import CompiledStep

    mesh = jax.make_mesh((2,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    x = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P("data", None)))
    w = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, P()))
    step = CompiledStep(jax.jit(lambda a, b: a @ b), max_shapes=1)
    step(x, w)
    assert step.flops_done == 64**3


def test_gradient_accumulation_counts_every_microbatch():
    """XLA's cost analysis counts a ``lax.scan``'s body once; the train step with grad_accum_steps = 2
    adds the microbatch gradient's count once more, so k = 1 and k = 2 count the same FLOPs per window
    (to the gradients' accumulation and scaling, a few per parameter)."""
    import ml_collections

    from rank4jax.engine.programs import StepPolicy, build_programs, optim_key
    from rank4jax.engine.sharding import make_mesh
    from rank4jax.models.family import get_family
    from rank4jax.training.layout_choice import train_step

    config = tiny_config()
    family = get_family(config.model_family)
    model_cfg = family.make_config(config.model, 40)
    windows = np.random.default_rng(0).integers(1, 40, (8, config.model.n_slices + 1, config.model.n_tokens))
    per_step = {}
    for k in (1, 2):
        programs = build_programs(family, model_cfg, optim_key(config.optim), make_mesh(1, 1), StepPolicy("float32", k))
        step = train_step(programs, ml_collections.ConfigDict({"name": "full", "max_shapes": 1}))
        state = programs.init(jax.random.key(0))
        step(state, jnp.asarray(windows, jnp.int32))
        per_step[k] = step.flops_done
    n_params = family.count_params(model_cfg)
    assert per_step[1] > 100 * n_params and abs(per_step[2] - per_step[1]) < 8 * n_params, per_step
