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


def _start_two_processes(workdir, **overrides):
    port = free_port()
    args = tiny_flags(**{k.replace(".", "__"): v for k, v in overrides.items()})
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


def test_two_processes_stop_together_on_a_sigterm_and_their_checkpoint_restores_and_resumes_in_one(tmp_path):
    """JAX's preemption sync point: a SIGTERM to process 1 alone makes both processes save the same
    step and exit with 143, with equal parameters; the checkpoint the two wrote restores in one
    process equal to a one-process run to that step (the same global batches: each process takes its
    half of every global batch), and resumes in one (the iterator state does not depend on the process
    count): two more steps on each equal each other."""
    long_run = {"num_steps": 100_000, "log_every": 2, "eval_every": 1000, "checkpoint_every": 1000}
    procs = _start_two_processes(tmp_path / "two", **long_run)
    metrics = tmp_path / "two" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.is_file() and '"step": 4,' in metrics.read_text()):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no training progress"
        time.sleep(0.1)
    procs[1].send_signal(signal.SIGTERM)
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outputs[0][-2000:] + outputs[1][-2000:]
    digests = [re.search(r"process (\d) of 2: parameters ([0-9a-f]{16})", out) for out in outputs]
    assert [int(d.group(1)) for d in digests] == [0, 1] and digests[0].group(2) == digests[1].group(2)
    assert "mesh {'data': 2, 'model': 1} over 2 of 2 devices" in outputs[0]
    step = int(re.search(r"SIGTERM at step (\d+): checkpoint saved", outputs[0]).group(1))
    synced = outputs[0].rfind("Reached preemption sync point")  # orbax logs it (three lines): ours comes last
    assert synced < outputs[0].find(f"SIGTERM at step {step}: checkpoint saved")
    assert "SIGTERM at step" not in outputs[1]  # process 0 logs
    assert step == read_metrics(str(tmp_path / "two"))["train"][-1]["step"]  # logged at the signal, the step saved
    with RunCheckpoints(str(tmp_path / "two")) as ckpt:  # saved without a validation (the signal skips it)
        assert ckpt.all_steps() == [step] and ckpt.best_metric() is None
    two = load_run(str(tmp_path / "two"), "latest").params  # the parameters both processes printed the digest of
    assert replica_digest(jax.tree.map(jnp.asarray, two)) == digests[0].group(2)
    one_process = {"mesh.data": 1, **long_run}
    assert train(tiny_config(**one_process | {"num_steps": step}), str(tmp_path / "one"))["step"] == step
    _assert_close(two, load_run(str(tmp_path / "one"), "latest").params)
    for name in ("two", "one"):
        assert train(tiny_config(**one_process | {"num_steps": step + 2}), str(tmp_path / name))["step"] == step + 2
    _assert_close(*(load_run(str(tmp_path / name), "latest").params for name in ("two", "one")))


def _assert_close(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)
