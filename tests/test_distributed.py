"""A real two-process run: ``train.py --distributed`` as two processes on this machine (coordinator on
127.0.0.1, one CPU device each, JAX's CPU collectives over gloo)."""

import re
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np

from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.engine.sharding import replica_digest
from rank4jax.records import read_metrics
from rank4jax.runs import load_run
from rank4jax.training.loop import train
from tests import launcher
from tests.helpers import free_port, tiny_config, tiny_flags

STEPS = 4
FLAGS = {"num_steps": STEPS}  # the rest: the tiny run (tests/helpers.TINY)


def _start_two_processes(workdir, **overrides):
    port = free_port()
    args = tiny_flags(**{k.replace(".", "__"): v for k, v in (FLAGS | overrides).items()})
    return [  # one CPU device per process
        launcher.start(
            "train.py",
            "--config=configs/default.py",
            f"--workdir={workdir}",
            *args,
            "--distributed",
            f"--coordinator_address=127.0.0.1:{port}",
            "--num_processes=2",
            f"--process_id={i}",
            merge_stderr=True,
        )
        for i in range(2)
    ]


def test_two_process_run_matches_one_process_restores_and_resumes_in_one(tmp_path):
    procs = _start_two_processes(tmp_path / "two")
    single = train(tiny_config(num_steps=STEPS, **{"mesh.data": 1}), str(tmp_path / "one"))  # meanwhile
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=600)
        outputs.append(out)
        assert p.returncode == 0, out[-3000:]
    digests = [re.search(r"process (\d) of 2: parameters ([0-9a-f]{16})", out) for out in outputs]
    assert [int(d.group(1)) for d in digests] == [0, 1]
    assert digests[0].group(2) == digests[1].group(2)  # both processes end with the same parameters
    assert "mesh {'data': 2, 'model': 1} over 2 of 2 devices" in outputs[0]
    assert "step 2: val" in outputs[0] and "step 2: val" not in outputs[1]  # process 0 logs
    # the checkpoint written by two processes restores in one, equal to the one-process run's
    # (the same global batches: each process takes its half of every global batch)
    with RunCheckpoints(str(tmp_path / "two")) as ckpt:
        assert ckpt.all_steps() == [2, 4]
    two = load_run(str(tmp_path / "two"), "latest").params
    one = load_run(str(tmp_path / "one"), "latest").params
    assert single["step"] == STEPS
    for a, b in zip(jax.tree_util.tree_leaves(two), jax.tree_util.tree_leaves(one), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    # ... and resumes in one process (the iterator state does not depend on the process count):
    # two more steps on each equal each other
    for name in ("two", "one"):
        assert train(tiny_config(num_steps=STEPS + 2, **{"mesh.data": 1}), str(tmp_path / name))["step"] == STEPS + 2
    two = load_run(str(tmp_path / "two"), "latest").params
    one = load_run(str(tmp_path / "one"), "latest").params
    for a, b in zip(jax.tree_util.tree_leaves(two), jax.tree_util.tree_leaves(one), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def test_sigterm_to_one_process_stops_both_at_the_same_step(tmp_path):
    """JAX's preemption sync point: a SIGTERM to process 1 alone makes both processes save the same
    step and exit with 143, with equal parameters."""
    long_run = {"num_steps": 100_000, "log_every": 20, "eval_every": 1000, "checkpoint_every": 1000}
    procs = _start_two_processes(tmp_path, **long_run)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and '"step": 40,' in metrics.read_text()):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no training progress"
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outputs[0][-2000:] + outputs[1][-2000:]
    assert not any("Reached preemption sync point" in out for out in outputs)  # the run's own line says it
    stopped = [re.search(r"process \d of 2: parameters ([0-9a-f]{16})", out).group(1) for out in outputs]
    assert stopped[0] == stopped[1]
    step = int(re.search(r"SIGTERM at step (\d+): checkpoint saved", outputs[0]).group(1))
    assert step == read_metrics(str(tmp_path))["train"][-1]["step"]  # logged at the signal, the step both saved
    with RunCheckpoints(str(tmp_path)) as ckpt:  # saved without a validation (the signal skips it)
        assert ckpt.all_steps() == [step] and ckpt.best_metric() is None
    params = load_run(str(tmp_path), "latest").params  # the parameters both processes printed the digest of
    assert replica_digest(jax.tree.map(jnp.asarray, params)) == stopped[0]
