"""The command lines: --help, user errors as one line without a traceback, configs load."""

import glob
import importlib.util
import math
import os
import re

import jax
import jax.numpy as jnp
import pytest

from rank4jax.engine import sharding
from rank4jax.engine.programs import build_programs, optim_key
from rank4jax.engine.run_config import validate
from rank4jax.errors import ConfigError
from rank4jax.models.family import get_family
from tests.conftest import REPO
from tests.launcher import run

CONFIG_FILES = sorted(p for p in glob.glob(str(REPO / "configs" / "*.py")) if not p.endswith("__init__.py"))


def test_config_files_are_found():
    names = [os.path.basename(p) for p in CONFIG_FILES]
    assert names == [
        "baseline_paper.py",
        "baseline_rocstories.py",
        "baseline_rocstories_wide.py",
        "baseline_storycloze.py",
        "default.py",
        "rocstories.py",
        "rocstories_paper.py",
        "splm.py",
        "splm_rocstories.py",
        "storycloze.py",
    ]


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_every_config_file_loads_and_validates(path):
    spec = importlib.util.spec_from_file_location("cfg", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.__doc__ and "python train.py" in module.__doc__ and "runtime" in module.__doc__.lower()
    config = module.get_config()
    validate(config)
    # the config's train and eval steps at its own sizes, by shape only (jax.eval_shape: nothing is
    # allocated or compiled, so the paper-size configs are checked too)
    family = get_family(config.model_family)
    model_cfg = family.make_config(config.model, 1000)
    programs = build_programs(family, model_cfg, optim_key(config.optim), sharding.make_mesh(1, 1))
    n, t, b = config.model.n_tokens, config.model.n_slices, config.batch_size
    windows = jax.ShapeDtypeStruct((b, t + 1, n), jnp.int32)
    state, metrics = jax.eval_shape(programs.train_step, programs.abstract, windows)
    assert state.step.shape == () and jax.tree.map(lambda x: x.shape, state.params) == jax.tree.map(
        lambda x: x.shape, programs.abstract.params
    )
    assert {k: v.shape for k, v in metrics.items()} == dict.fromkeys(
        ("loss", "grad_norm", "param_norm", "update_norm", "last_slice_ce_sum", "last_slice_tokens", "learning_rate"),
        (),
    )
    sums = jax.eval_shape(programs.eval_step, programs.abstract.params, windows)
    assert {k: v.shape for k, v in sums.items()} == dict.fromkeys(
        ("window_ce_sum", "window_tokens", "last_slice_ce_sum", "last_slice_tokens", "correct_tokens"), ()
    )
    trained = {k: v for k, v in programs.abstract.params.items() if k != "buffers"}  # not the SPLM's fixed table
    assert family.count_params(model_cfg) == sum(x.size for x in jax.tree.leaves(trained))


def test_help_lists_flags():
    # absl's --help prints usage to stdout and exits with status 1 (its convention)
    out = run("train.py", "--help")
    assert "--workdir" in out.stdout and "--config" in out.stdout and "Traceback" not in out.stderr
    out = run("eval.py", "--help")  # the other commands' flags: tests/test_docs.py, from their sources
    assert "--split" in out.stdout and "--step" in out.stdout and "Traceback" not in out.stderr


def test_config_errors_are_one_line_before_any_data_is_read(tmp_path):
    """An unknown key (caught as the flags parse) and a bad value (caught by ``validate``, after JAX
    imports) are each one line and status 2 from the command; the other refusals take the same path
    (``run_reporting_user_errors``) and are tested in-process where they are made (missing data:
    test_training; the ZPX score: test_zpx)."""
    out = run("train.py", f"--workdir={tmp_path}", "--config=configs/splm.py", "--config.model.dropout=0.1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: unknown config key 'model.dropout'")
    out = run("train.py", f"--workdir={tmp_path}", "--config.model.dropout=1.5")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: model.dropout must be a number in [0, 1)")


def test_eval_without_checkpoints_is_a_clear_error(tmp_path):
    out = run("eval.py", f"--workdir={tmp_path}")
    assert out.returncode == 2 and "error: no checkpoints in" in out.stderr and "Traceback" not in out.stderr


def test_missing_config_file(tmp_path):  # an unknown (nested) key: test_print_config_lists_every_key_…
    out = run("train.py", f"--workdir={tmp_path}", "--config=configs/nope.py")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: --config: no such config file: configs/nope.py"
    ]


def test_a_config_file_is_the_users_python(tmp_path):
    """A config file that raises shows its traceback, as Python prints it (its own line named), exit 1;
    a syntax error is the file's own too; one with no get_config or returning something else is one
    line (exit 2; the launch shows the first, the rest are the same functions in-process)."""
    import types

    from rank4jax.cli import config_refusal, config_value
    from rank4jax.errors import ConfigError

    (tmp_path / "raises.py").write_text('def get_config():\n    raise RuntimeError("boom")\n')
    out = run("train.py", f"--workdir={tmp_path}/w", f"--config={tmp_path}/raises.py")
    assert out.returncode == 1 and "Traceback (most recent call last)" in out.stderr
    assert f'File "{tmp_path}/raises.py", line 2, in get_config' in out.stderr
    assert out.stderr.rstrip().endswith("RuntimeError: boom")
    syntax, noget = tmp_path / "syntax.py", tmp_path / "noget.py"
    syntax.write_text("def get_config(:\n")
    with pytest.raises(SyntaxError):  # the file's own: its traceback
        config_refusal("config", str(syntax), ["train.py", f"--config={syntax}"])
    noget.write_text("x = 1\n")
    two = ["compare.py", "--rank4_config=configs/storycloze.py", f"--baseline_config={noget}"]
    assert config_refusal("rank4_config", "configs/storycloze.py", two) is None
    assert config_refusal("baseline_config", str(noget), two) == (
        f"config file {noget} defines no get_config() (it must return an ml_collections.ConfigDict)"
    )
    out = run("train.py", f"--workdir={tmp_path}/w", f"--config={noget}")
    refusal = f"error: config file {noget} defines no get_config() (it must return an ml_collections.ConfigDict)"
    assert (out.returncode, out.stderr.strip().splitlines()[-1]) == (2, refusal)
    with pytest.raises(ConfigError, match="get_config\\(\\) returned int, not an ml_collections.ConfigDict"):
        config_value(types.SimpleNamespace(value=3))


def test_a_config_file_that_cannot_be_one_is_refused_by_name(tmp_path):
    """Found on the command line in both spellings, each refused in one line before ml_collections
    tries to load it (with ``--config.<key>`` overrides it would raise from inside the flag's definition)."""
    from rank4jax.cli import config_file_arguments, config_file_refusal

    argv = ["train.py", "--config=a.py", "--config.num_steps=3", "--rank4_config", "b.py", "--workdir=w"]
    assert config_file_arguments(argv) == {"config": "a.py", "rank4_config": "b.py"}
    yaml = tmp_path / "c.yaml"
    yaml.write_text("x: 1\n")
    assert (
        config_file_refusal("config", str(tmp_path / "missing.py"))
        == f"--config: no such config file: {tmp_path}/missing.py"
    )
    assert (
        config_file_refusal("config", str(tmp_path))
        == f"--config: {tmp_path} is a directory, not a config file (a configs/*.py file)"
    )
    assert config_file_refusal("config", str(yaml)).startswith(f"--config: {yaml} is not a Python config file")
    assert config_file_refusal("config", str(REPO / "configs" / "default.py")) is None
    out = run("train.py", f"--config={tmp_path / 'missing.py'}", "--config.num_steps=3", f"--workdir={tmp_path / 'w'}")
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: --config: no such config file: {tmp_path}/missing.py"
    ]


def test_a_config_file_setting_a_wrong_type_shows_where(tmp_path):
    """A wrong-type assignment in a config file is the file's own error: its traceback, the config
    file's line in it, status 1."""
    path = tmp_path / "wrong_type.py"
    path.write_text(
        "import ml_collections\n\n\ndef get_config():\n"
        "    c = ml_collections.ConfigDict({'num_steps': 3})\n    c.num_steps = 'many'\n    return c\n"
    )
    out = run("train.py", f"--workdir={tmp_path}/w", f"--config={path}")
    assert out.returncode == 1 and "Traceback (most recent call last)" in out.stderr
    assert f'File "{path}", line 6, in get_config' in out.stderr and "TypeError: Could not override field" in out.stderr


def test_print_config_lists_every_key_resolved_and_an_unknown_key_reads_plainly(tmp_path):
    import json

    out = run("train.py", "--config=configs/rocstories.py", "--print_config", "--config.optim.schedule=cosine")
    assert out.returncode == 0 and "Traceback" not in out.stderr
    printed = json.loads(out.stdout)
    assert printed["optim"]["schedule"] == "cosine" and printed["selection"] == "window"
    assert printed["model"]["objective_slices"] == "all" and printed["data"]["source"] == "file"
    out = run("train.py", f"--workdir={tmp_path}", "--config.model.dxx=3")
    assert out.returncode == 2 and out.stderr.strip().splitlines()[-1] == (
        "error: unknown config key 'model.dxx' in --config.model.dxx (did you mean model.dx?); "
        "train.py --print_config lists every key"
    )


def test_a_config_without_the_later_keys_reads_as_the_runs_saved_before_them():
    """``run_config.ADDED_DEFAULTS`` is the one source of a missing key's value: ``validate`` fills
    them (``complete``), configs/default.py sets every one for new runs, and no library module reads
    a run config key with a default of its own."""
    import re

    from configs import default
    from rank4jax.engine.run_config import ADDED_DEFAULTS, complete

    config = default.get_config()
    for *parents, key in ADDED_DEFAULTS:
        section = config
        for name in parents:
            section = section[name]
        assert key in section, key  # new runs take configs/default.py's value
        with section.unlocked():
            del section[key]
    validate(config)
    for path, value in ADDED_DEFAULTS.items():
        section = config
        for name in path[:-1]:
            section = section[name]
        assert section[path[-1]] == value, path
    assert complete(config) is config
    sources = [p for p in (REPO / "rank4jax").rglob("*.py") if p.name != "run_config.py"]
    defaulted = [f"{p.name}: {m}" for p in sources for m in re.findall(r"config\.get\([^)]*,[^)]*\)", p.read_text())]
    assert defaulted == []


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("learning_rate", math.inf, "optim.learning_rate must be positive and finite, got inf"),
        ("weight_decay", math.nan, "optim.weight_decay must be a non-negative finite number, got nan"),
        ("weight_decay", math.inf, "optim.weight_decay must be a non-negative finite number, got inf"),
    ],
)
def test_non_finite_optimiser_settings_are_refused_before_training(key, value, message):
    """They passed validation and ended as "diverged … try a lower learning_rate"."""
    from configs import default

    config = default.get_config()
    config.optim[key] = value
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        validate(config)


def test_a_fractional_step_is_refused(tiny_run):
    """load_run(W, 2.5) loaded step 2."""
    from rank4jax.errors import CheckpointError
    from rank4jax.runs import load_run

    with pytest.raises(CheckpointError, match=r"whole number, got 2\.5"):
        load_run(str(tiny_run), 2.5)
