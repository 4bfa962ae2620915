"""Preemption with real signals: SIGTERM saves within seconds, a second signal while the
run saves or exits harms nothing, and a multi-stage command stops at its interrupted stage.

Both train the tiny run (tests/helpers.py); the SIGTERM test at XLA's default flags, as the one test
of the product's own compile settings. The exact resume after a signal and the best-step rule are in
``test_training.test_interrupted_run_resumes_to_identical_parameters``.
"""

import json
import os
import signal
import time

import numpy as np
import pytest

from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.runs import load_run
from rank4jax.training.metrics import read_metrics
from tests import launcher
from tests.helpers import tiny_flags

# From SIGTERM to exit: finish the running step, save, write the summary and plots, exit. Measured
# about 3 s on 2 cores; generous for CI noise.
EXIT_WITHIN_S = 45.0


def _wait_for_training(metrics_path: str, proc: launcher.Proc, timeout: float = 240.0, records: int = 1) -> None:
    """Until the run has logged ``records`` training records (compiled and stepping)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        if os.path.isfile(metrics_path):
            with open(metrics_path, encoding="utf-8") as f:
                if sum(json.loads(line).get("split") == "train" for line in f if line.strip()) >= records:
                    return
        time.sleep(0.2)
    proc.kill()
    pytest.fail("the run did not start training in time")


def _signal_and_wait(proc: launcher.Proc, signals: tuple) -> tuple[float, str]:
    start = time.time()
    for sig in signals:
        proc.send_signal(sig)
        time.sleep(0.3)
    _, stderr = proc.communicate(timeout=300)
    return time.time() - start, stderr


def test_sigterm_saves_within_seconds_a_second_harms_nothing_and_the_products_flags_train_the_same(tmp_path, tiny_run):
    """train.py as a user runs it: XLA's default flags (every other test compiles at the suite's,
    tests/conftest.py) on one device. Its logged losses agree with the shared tiny run's (the same
    config, in-process at the suite's flags over two devices) to float32 rounding; then SIGTERM, and a
    second one 0.3 s later (while the first one's checkpoint is saved, or while the process exits: 143,
    never a kill by the default handler), stop it within seconds with that checkpoint complete."""
    workdir = str(tmp_path / "run")
    args = ("train.py", f"--workdir={workdir}", *tiny_flags(num_steps=100_000))
    proc = launcher.start(*args, env=launcher.command_env() | {"XLA_FLAGS": ""})
    _wait_for_training(os.path.join(workdir, "metrics.jsonl"), proc, records=3)
    elapsed, stderr = _signal_and_wait(proc, (signal.SIGTERM, signal.SIGTERM))
    assert proc.returncode == 143, stderr
    assert elapsed < EXIT_WITHIN_S, f"{elapsed:.1f} s from SIGTERM to exit"
    assert "Traceback" not in stderr
    logged = [{r["step"]: r["loss"] for r in read_metrics(run)["train"]} for run in (workdir, str(tiny_run))]
    assert sorted(logged[1]) == [2, 4, 6] and set(logged[1]) <= set(logged[0])
    np.testing.assert_allclose([logged[0][s] for s in (2, 4, 6)], [logged[1][s] for s in (2, 4, 6)], rtol=1e-5)
    with RunCheckpoints(workdir, read_only=True) as ckpt:
        step = ckpt.latest_step()
        assert step is not None and step >= 6
        validated = {r["step"]: r["window_ce"] for r in read_metrics(workdir)["validation"]}
        best = min((s for s in ckpt.all_steps() if s in validated), key=lambda s: (validated[s], s))
        assert ckpt.best_metric() == (best, validated[best])
    assert load_run(workdir, "latest").step == step  # the save is complete
    with open(os.path.join(workdir, "train_summary.json"), encoding="utf-8") as f:
        assert json.load(f)["interrupted"] == "SIGTERM"


def test_compare_stops_at_an_interrupted_first_stage(tmp_path):
    """The two stages are the tiny runs (config files of the user's kind, from tests/helpers), long
    enough to be training when the signal comes."""
    workdir = str(tmp_path / "cmp")
    for family in ("rank4", "baseline"):
        (tmp_path / f"{family}.py").write_text(
            "from tests.helpers import tiny_config\n\n\ndef get_config():\n"
            f"    return tiny_config(model_family={family!r}, num_steps=100_000, eval_every=1000,\n"
            "                       checkpoint_every=1000)\n"
        )
    proc = launcher.start(
        "compare.py",
        f"--rank4_config={tmp_path / 'rank4.py'}",
        f"--baseline_config={tmp_path / 'baseline.py'}",
        f"--workdir={workdir}",
    )
    _wait_for_training(os.path.join(workdir, "rank4", "metrics.jsonl"), proc)
    elapsed, stderr = _signal_and_wait(proc, (signal.SIGTERM,))
    assert proc.returncode == 143, stderr
    assert elapsed < EXIT_WITHIN_S
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped: stage 'rank4'") and "rerun the same command" in last, stderr
    assert not os.path.exists(os.path.join(workdir, "baseline"))  # the second stage never started
    assert not os.path.exists(os.path.join(workdir, "compare.md"))
    assert not os.path.isdir(os.path.join(workdir, "rank4", "eval"))  # nor the first one's evaluation
