"""The training loop: resumable, sharded, checkpointed, with progress bar, metrics and curves.

Rerunning the same command resumes from the latest checkpoint (train state, grain iterator state);
SIGINT/SIGTERM save a checkpoint and stop (in a multi-process run, SIGTERM to any process is a
preemption notice: every process saves at the same step, JAX's preemption sync point). A run
interrupted at step k and resumed ends with the same parameters as an uninterrupted one. NaN/inf in
the loss or gradient norm stops the run before anything is saved for the bad steps.

The train step is compiled ahead of time on the first batch before the loop; its memory analysis
is printed and kept in the run summary, and a compilation beyond the shapes the batch layout can
produce stops the run (``steps.CompiledStep``). Batches arrive from the grain pipeline already in
the step's layout (full, trimmed or compact).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time

import jax
import ml_collections
import numpy as np
from tqdm.auto import tqdm

from rank4jax.data.pipeline import train_dataset
from rank4jax.errors import CheckpointError, TrainingDivergedError, say
from rank4jax.models.family import get_family
from rank4jax.training import sharding
from rank4jax.training.batches import batch_layout
from rank4jax.training.checkpointing import BEST_METRIC, RunCheckpoints, first_readable, with_shardings
from rank4jax.training.data_setup import prepare_data, validation_windows
from rank4jax.training.early_stopping import EarlyStopping
from rank4jax.training.evaluation import evaluate_windows
from rank4jax.training.metrics import SUMMARY_FILE, MetricsWriter, plot_curves
from rank4jax.training.programs import batches_key, optim_key, run_programs
from rank4jax.training.run_config import (
    FINGERPRINT_KEY,
    data_fingerprint,
    identity_differences,
    to_json_dict,
    validate,
)
from rank4jax.training.state import carry_optimizer_state, make_optimizer
from rank4jax.training.steps import CompiledStep, describe_memory
from rank4jax.training.workdir_lock import WorkdirLock, make_workdir


class StopRequest:
    """Turns SIGINT/SIGTERM into a flag the loop checks after every step. It stays installed until
    the last checkpoint is written, so a second signal during that save cannot cut it short.

    Single process only (``enabled``): a flag set in one process of a multi-process run would make
    it save alone; there JAX's preemption notifier keeps SIGTERM and the processes agree on a step."""

    def __init__(self, enabled: bool = True):
        self.signal: int | None = None
        self.enabled = enabled
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM) if self.enabled else ():
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:
            say(f"rank4jax: {signal.Signals(signum).name} again: still saving the checkpoint")
        self.signal = self.signal or signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _check_workdir(ckpt: RunCheckpoints, config, workdir: str, fingerprint: str | None):
    """(tokenizer, saved config dict) of an existing run, after checking its config matches;
    (None, None) for a new run.

    A damaged newest checkpoint falls back to the newest readable one (single process: the damaged
    ones are moved aside, ``checkpointing.first_readable``); a config mismatch is never damage."""
    steps = ckpt.all_steps()
    if not steps:
        return None, None

    def check(step):
        saved, tokenizer = ckpt.load_meta(step)
        diffs = identity_differences(saved, config)
        old = saved.get(FINGERPRINT_KEY)
        if not diffs and old and fingerprint and old != fingerprint:
            diffs = [
                f"the data at {config.data.path} has changed since these checkpoints were written "
                f"(SHA-256 {old[:12]}… then, {fingerprint[:12]}… now)"
            ]
        if diffs:
            more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
            raise CheckpointError(
                f"{workdir} holds checkpoints of a different config: {diffs[0]}{more}. "
                "Use a new --workdir, or the config that wrote these checkpoints; nothing was changed."
            )
        return tokenizer, saved

    single = jax.process_count() == 1
    return first_readable(ckpt, steps[::-1] if single else steps[-1:], check, set_aside=single)[1]


def _optim_changes(saved: dict | None, config) -> list[str]:
    """``optim`` fields that differ between a checkpoint's config and this run's."""
    old, new = (saved or {}).get("optim") or {}, to_json_dict(config)["optim"]
    if not old:
        return []
    return [f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _flush_train_metrics(pending: list, step: int, since: float, batch_size: int, resumed_at: int = 0) -> dict:
    """Fetch the pending step metrics (this waits for the steps to finish: dispatch is asynchronous,
    so the interval is timed after the fetch, from ``since``, the end of the previous one)."""
    fetched = jax.device_get(pending)
    seconds = time.perf_counter() - since
    losses = np.array([m["loss"] for m in fetched], np.float64)
    norms = np.array([m["grad_norm"] for m in fetched], np.float64)
    bad = ~(np.isfinite(losses) & np.isfinite(norms))
    if bad.any():
        first = step - len(fetched) + 1 + int(np.argmax(bad))
        i = int(np.argmax(bad))
        advice = "Try a lower optim.learning_rate or set optim.grad_clip_norm."
        if resumed_at and step - len(fetched) == resumed_at:  # right after a resume: suspect the checkpoint
            advice = (
                f"This is the first interval after resuming from checkpoint {resumed_at}: its optimiser state "
                f"may be damaged; move checkpoints/{resumed_at} aside to resume from the one before (if that "
                "diverges too, lower optim.learning_rate)."
            )
        raise TrainingDivergedError(
            f"training diverged at step {first}: loss={losses[i]}, grad_norm={norms[i]}. "
            f"Stopped without saving; the checkpoints already in the workdir are intact. {advice}"
        )
    ls_tokens = sum(float(m["last_slice_tokens"]) for m in fetched)
    return {
        "step": step,
        "split": "train",
        "loss": float(losses.mean()),
        "last_slice_ce": sum(float(m["last_slice_ce_sum"]) for m in fetched) / max(ls_tokens, 1.0),
        "grad_norm": float(norms.mean()),  # L2 norms (big_vision): gradient and update means over
        "update_norm": float(np.mean([m["update_norm"] for m in fetched])),  # the interval,
        "param_norm": float(fetched[-1]["param_norm"]),  # parameters after its last step
        "windows_per_s": len(fetched) * batch_size / max(seconds, 1e-9),
    }


def train(config: ml_collections.ConfigDict, workdir: str, *, hooks=()) -> dict:
    """Train (or resume) the run of ``config`` in ``workdir``; returns the summary it writes.

    ``hooks``: callables ``hook(step, state)`` run after every step (tests use them to interrupt).
    """
    validate(config)
    family = get_family(config.model_family)
    make_workdir(workdir)
    started = time.time()
    with contextlib.ExitStack() as stack:
        stack.enter_context(WorkdirLock(workdir, enabled=jax.process_index() == 0))  # one writer per workdir
        ckpt = stack.enter_context(RunCheckpoints(workdir, keep=config.keep_checkpoints))
        fingerprint = data_fingerprint(config)  # the data files' bytes, read once: checked, then saved
        tokenizer, saved = _check_workdir(ckpt, config, workdir, fingerprint)
        data = prepare_data(config, tokenizer)
        tokenizer = data.tokenizer
        val_windows = validation_windows(data)
        model_cfg = family.make_config(config.model, tokenizer.vocab_size)
        mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
        sharding.check_divisibility(
            mesh,
            batch_sizes={"batch_size": config.batch_size, "eval_batch_size": config.eval_batch_size},
            n_heads=config.model.get("n_heads"),  # None for a family without heads (the SPLM)
            hidden=4 * config.model.dx * config.model.dt,
        )
        batch_sharding = sharding.batch_sharding(mesh)
        layout = batch_layout(config, family, model_cfg, groups=mesh.shape[sharding.DATA_AXIS])
        # built once per process for this model, optimiser, mesh and layout (a later run reuses them)
        programs = run_programs(family, model_cfg, optim_key(config.optim), mesh, batches_key(config, layout))
        optimizer, init_fn, abstract = programs.optimizer, programs.init_fn, programs.abstract
        state_sharding = programs.state_sharding  # the state is created directly sharded
        n_params = family.count_params(model_cfg)
        sharding.check_state_fits(abstract, state_sharding, n_params)  # before allocating
        train_iter = iter(
            train_dataset(
                data.windows["train"].windows,
                config.batch_size,
                seed=config.seed,
                process_index=jax.process_index(),
                process_count=jax.process_count(),
                batch_map=layout,  # grain builds the step's batches (full, trimmed or compact)
            )
        )
        latest = ckpt.latest_step()
        if latest is None:
            state = programs.init(jax.random.key(config.seed))
            if family.init_from_data is not None:  # data-derived buffers, then kept by every checkpoint
                params = family.init_from_data(state.params, data.windows["train"].windows, model_cfg)
                state = state.replace(params=jax.device_put(params, state_sharding.params))
        else:  # the newest readable checkpoint (damaged ones are moved aside in a single process)
            single = jax.process_count() == 1
            changed_optim = _optim_changes(saved, config)
            saved_abstract = abstract
            if changed_optim:  # restore into the optimiser state the checkpoint was written with
                old = functools.partial(init_fn, optimizer=make_optimizer(ml_collections.ConfigDict(saved["optim"])))
                saved_abstract = jax.eval_shape(old, jax.random.key(config.seed))
            target = with_shardings(saved_abstract, sharding.state_shardings(mesh, saved_abstract))
            latest, state = first_readable(
                ckpt,
                ckpt.all_steps()[::-1] if single else [latest],
                lambda step: ckpt.restore_state(step, target, train_iter),
                set_aside=single,
            )
            if changed_optim:
                fresh = jax.jit(optimizer.init, out_shardings=state_sharding.opt_state)(state.params)
                opt_state = carry_optimizer_state(state.opt_state, fresh, state.step)
                state = state.replace(opt_state=jax.device_put(opt_state, state_sharding.opt_state))
                if jax.process_index() == 0:
                    say(
                        f"rank4jax: optimiser settings changed on resume ({'; '.join(changed_optim)}): "
                        "Adam moments and step carried over"
                    )
        train_step = CompiledStep(programs.train_step, max_shapes=layout.max_shapes)
        eval_step = programs.eval_step
        is_main = jax.process_index() == 0
        log = print if is_main else (lambda *a, **k: None)
        writer = stack.enter_context(MetricsWriter(workdir, enabled=is_main))
        saved_config = to_json_dict(config) | {FINGERPRINT_KEY: fingerprint}
        start = int(jax.device_get(state.step))
        patience = config.get("early_stop_patience", 0)
        early = EarlyStopping.resume(patience, ckpt.best_metric() if patience else None, start, config.eval_every)
        end = start if early.stopped else config.num_steps  # a run that stopped early trains no further
        if early.stopped:
            log(f"rank4jax: {workdir} stopped early at step {start} (best step {early.best_step}); nothing to train")
        elif start == 0:
            log(f"rank4jax: {family.name} model, {n_params:,} parameters; data {json.dumps(data.summary())}")
            log(f"rank4jax: mesh {dict(mesh.shape)} over {mesh.devices.size} of {jax.device_count()} devices")
        else:
            log(f"rank4jax: resuming {workdir} from step {start}")
        next_batch = None
        if start < end:  # compile ahead of time on the first batch, before the loop
            next_batch = sharding.put_batch(next(train_iter), batch_sharding)
            train_step.compile(state, next_batch)
            log(f"rank4jax: compiled train step ({layout.name} batches): {describe_memory(train_step.peak_memory())}")

        def evaluate_and_log(step):
            metrics = evaluate_windows(
                eval_step, state.params, val_windows, config.eval_batch_size, batch_sharding, layout
            )
            if not np.isfinite(metrics["window_ce"]):
                raise TrainingDivergedError(f"validation loss is {metrics['window_ce']} at step {step}; not saved")
            writer.write({"step": step, "split": "validation", **metrics})
            return metrics

        def log_line(text):
            if is_main:
                bar.write(text)

        last_val, interrupted = None, None  # every checkpoint carries its validation loss
        pending, t_last = [], time.perf_counter()
        bar = tqdm(
            total=config.num_steps,
            initial=start,
            disable=not (config.progress_bar and is_main),
            unit="step",
            dynamic_ncols=True,
        )
        with StopRequest(enabled=jax.process_count() == 1) as stop, bar:
            for step in range(start + 1, end + 1):
                batch = next_batch if next_batch is not None else sharding.put_batch(next(train_iter), batch_sharding)
                next_batch = None
                state, metrics = train_step(state, batch)
                pending.append(metrics)
                bar.update(1)
                for hook in hooks:
                    hook(step, state)
                if ckpt.reached_preemption(step):  # every process of a multi-process run, same step
                    stop.signal = stop.signal or signal.SIGTERM
                is_last = step == config.num_steps
                validate_now = (step % config.eval_every == 0 or is_last) and not stop.signal
                # with early stopping every validated step is checkpointed (its state resumes from them)
                checkpoint_now = step % config.checkpoint_every == 0 or is_last or (patience and validate_now)
                if step % config.log_every == 0 or step % config.eval_every == 0 or is_last or stop.signal:
                    record = _flush_train_metrics(pending, step, t_last, config.batch_size, resumed_at=start)
                    writer.write(record)
                    bar.set_postfix(loss=f"{record['loss']:.3f}", win_s=f"{record['windows_per_s']:.0f}")
                    pending, t_last = [], time.perf_counter()
                if validate_now:
                    last_val = evaluate_and_log(step)
                    v = last_val
                    log_line(
                        f"step {step}: val {family.selection_loss} {v['window_ce']:.4f}, "
                        f"LS(T) {v['last_slice_ce']:.4f}, token acc {v['token_accuracy']:.3f}"
                    )
                    t_last = time.perf_counter()
                    if early.update(step, v["window_ce"]):
                        log_line(
                            f"step {step}: stopping early: no improvement of the validation {family.selection_loss} "
                            f"in {patience} validations (best {early.best:.4f} at step {early.best_step})"
                        )
                if stop.signal:
                    # preemption: save now, no validation pass. Saved without a metric, the step is
                    # never the best one; a resumed run validates at its next eval_every boundary.
                    ckpt.save(step, state, train_iter, saved_config, tokenizer, None)
                    interrupted = signal.Signals(stop.signal).name
                    break
                if checkpoint_now:
                    ckpt.save(step, state, train_iter, saved_config, tokenizer, {BEST_METRIC: last_val["window_ce"]})
                if early.stopped:
                    break
            ckpt.wait_until_finished()  # a second signal while this runs is only noted
        final_step = int(jax.device_get(state.step))
        best = ckpt.best_step()
        if jax.process_count() > 1:  # every process holds the same replicated parameters
            digest = sharding.check_replicas_agree(state.params)
            print(f"rank4jax: process {jax.process_index()} of {jax.process_count()}: parameters {digest}")
    summary_path = os.path.join(workdir, SUMMARY_FILE)
    previous = {}
    if start > 0 and os.path.isfile(summary_path):
        with open(summary_path, encoding="utf-8") as f:
            previous = json.load(f)
    previous_s = float(previous.get("wall_time_total_s", 0.0))
    ran = final_step > start  # rerunning a finished run trains nothing: its time and figures stay
    elapsed = time.time() - started if ran else 0.0
    summary = {
        "workdir": os.path.abspath(workdir),
        "model_family": family.name,
        "selection_loss": family.selection_loss,  # what "window_ce" measures for this family
        "parameters": n_params,
        "step": final_step,
        "best_step": best,
        "interrupted": interrupted,
        "early_stopped": early.stopped,  # stopped by early_stop_patience before num_steps
        "wall_time_s": elapsed,
        "wall_time_total_s": previous_s + elapsed,  # across resumptions
        "final_validation": last_val if ran else previous.get("final_validation"),
        "batch_layout": layout.name,  # what the train step consumed: full, trimmed or compact batches
        "compiled_train_step": train_step.peak_memory() if ran else previous.get("compiled_train_step"),
        "data": data.summary(),
    }
    if jax.process_index() == 0:
        with open(summary_path, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
        plot_curves(workdir)
    if interrupted and jax.process_index() == 0:
        print(f"rank4jax: {interrupted} at step {final_step}: checkpoint saved; rerun the same command to resume")
    return summary
