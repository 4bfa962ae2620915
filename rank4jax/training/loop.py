"""The trainer: set the run up, then a loop of periodic actions, then finish.

Rerunning the same command resumes from the latest checkpoint (train state, grain iterator state).
SIGTERM saves a checkpoint at the next step and stops (in a multi-process run, SIGTERM to any process
is a preemption notice: every process saves at the same step, JAX's preemption sync point); Ctrl-C is
Python's ``KeyboardInterrupt``: the run unwinds (a save in flight finishes) and the latest checkpoint
is where a rerun resumes. A run interrupted at step k and resumed ends with the same parameters as an
uninterrupted one. NaN/inf in the loss or gradient norm stops the run before anything is saved for
the bad steps.

The train step is compiled ahead of time on the first batch, before the loop; its memory analysis
is printed and kept in the run summary, and a compilation beyond the shapes the batch layout can
produce stops the run (``programs.CompiledStep``). Batches arrive from the grain pipeline already
in the step's layout (full, trimmed or compact).
"""

from __future__ import annotations

import contextlib
import time

import jax

from rank4jax import signals
from rank4jax.data.pipeline import train_dataset
from rank4jax.engine import sharding
from rank4jax.engine.programs import describe_memory
from rank4jax.engine.run_config import validate
from rank4jax.errors import StageInterrupted
from rank4jax.signals import SigtermRequest
from rank4jax.training.actions import PeriodicActions
from rank4jax.training.early_stopping import EarlyStopping
from rank4jax.training.output import Output, write_summary
from rank4jax.training.profiling import Profiler
from rank4jax.training.setup import Run, prepare_run, restore_or_init


def train(config, workdir: str, *, hooks=()) -> dict:
    """Train (or resume) the run of ``config`` in ``workdir``; returns the summary it writes.

    ``hooks``: callables ``hook(step, state)`` run after every step (tests use them to interrupt).
    """
    validate(config)
    started = time.time()
    with contextlib.ExitStack() as stack:
        # SIGTERM: the loop saves at its next step, then stops (Ctrl-C: KeyboardInterrupt unwinds the run)
        stop = stack.enter_context(SigtermRequest(enabled=jax.process_count() == 1))
        run = prepare_run(config, workdir, stack)
        batches = iter(_train_dataset(run))
        stack.callback(batches.close)  # its prefetch thread ends with the run, however the run ends
        state = restore_or_init(run, batches)
        start = int(jax.device_get(state.step))
        patience = config.early_stop_patience
        early = EarlyStopping.resume(patience, run.ckpt.best_metric() if patience else None, start, config.eval_every)
        end = start if early.stopped else config.num_steps  # a run that stopped early trains no further
        out = stack.enter_context(Output(run, start, trains=start < end))
        out.announce(early)
        profiler = Profiler(workdir, config.profile_steps, enabled=run.is_main, say=out.say)
        stack.callback(profiler.stop)  # a run ending inside the range still writes its trace
        if start < end:  # a disk that cannot hold the next save: refused before training to it
            run.ckpt.agree_to_save(min(end, (start // config.checkpoint_every + 1) * config.checkpoint_every), state)
        signals.check()
        first = _compile_on_first_batch(run, state, batches, out) if start < end else None
        signals.check()
        out.start_clock()  # the logged training time leaves the compilation out
        actions = PeriodicActions(run, out, early, stop)
        actions.validate_the_end(start, state)  # a finished run's last checkpoint carries its loss
        state = _loop(run, state, first, batches, actions, hooks, out, profiler, (start, end))
        run.ckpt.wait_until_finished()
        if jax.process_count() > 1:  # every process holds the same replicated parameters
            digest = sharding.check_replicas_agree(state.params)
            print(f"rank4jax: process {jax.process_index()} of {jax.process_count()}: parameters {digest}")
        final_step = int(jax.device_get(state.step))
        summary = write_summary(run, actions, start, final_step, time.time() - started)
    if actions.interrupted and run.is_main:  # its checkpoint is saved; the summary says so
        print(f"rank4jax: SIGTERM at step {final_step}: checkpoint saved; rerun the same command to resume")
    if stop.received and not actions.interrupted:  # SIGTERM while it finished: complete; the command stops here
        raise StageInterrupted(f"SIGTERM after training had ended; {workdir} is complete at step {final_step}")
    return summary


def _train_dataset(run: Run):
    return train_dataset(
        run.data.windows["train"].windows,
        run.config.batch_size,
        seed=run.config.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        batch_map=run.layout,  # grain builds the step's batches (full, trimmed or compact)
    )


def _compile_on_first_batch(run: Run, state, batches, out: Output):
    """The first batch on the devices, with the train step compiled for it ahead of time."""
    batch = sharding.put_batch(next(batches), run.programs.batch_sharding)
    run.step_fn.compile(state, batch)
    out.say(f"rank4jax: compiled train step ({run.layout.name} batches): {describe_memory(run.step_fn.peak_memory())}")
    return batch


def _loop(run: Run, state, first, batches, actions, hooks, out: Output, profiler: Profiler, steps: tuple):
    """Steps ``start + 1 .. end`` of ``steps``, each followed by the hooks and the periodic actions."""
    start, end = steps
    for step in range(start + 1, end + 1):
        signals.check()  # a command's Ctrl-C stops here: the latest checkpoint is where a rerun resumes
        with profiler.step(step):
            batch = first if step == start + 1 else sharding.put_batch(next(batches), run.programs.batch_sharding)
            state, metrics = run.step_fn(state, batch)
        profiler.step_done(step, metrics)
        out.step_done(metrics)
        for hook in hooks:
            hook(step, state)
        if actions(step, state, batches):
            break
    return state
