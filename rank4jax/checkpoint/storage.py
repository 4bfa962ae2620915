"""orbax-checkpoint storage of a run: train state, grain iterator state, run config and tokenizer.

Every checkpoint is self-contained (``eval.py`` needs only the workdir). One preservation policy
keeps the latest ``keep`` checkpoints *and* the best by the validation selection loss — a best-only policy
could delete the newest checkpoint and break resume. What to do with an unreadable checkpoint is
``rank4jax.checkpoint.damage``; rebuilding a run from one is ``rank4jax.runs``.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import glob
import inspect
import json
import math
import os
import shutil
import tempfile
import types

import grain
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.experimental import multihost_utils
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from rank4jax.checkpoint.damage import CheckpointDamaged, check_finite, check_readable, reason
from rank4jax.data.tokenizers import tokenizer_from_dict
from rank4jax.errors import CheckpointError, WorkdirError, say
from rank4jax.noise import storage_fault

# A validated checkpoint's metrics: the run's selection loss (config.selection) under SELECTION_METRIC,
# with the validation window loss and LS(T) beside it. Checkpoints written before selection became a
# setting carry only "val_window_ce", which was then always the selection loss.
SELECTION_METRIC = "val_selection"
BEST_METRIC = "val_window_ce"


def selection_value(metrics: dict):
    """A checkpoint's selection loss from its saved metrics (None: not there)."""
    value = metrics.get(SELECTION_METRIC, metrics.get(BEST_METRIC))
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def checkpoint_metrics(validation: dict, selection_key: str) -> dict:
    """What a validated checkpoint carries: its selection loss (``validation[selection_key]``), the
    window loss and LS(T)."""
    return {
        SELECTION_METRIC: validation[selection_key],
        BEST_METRIC: validation["window_ce"],
        "val_last_slice_ce": validation["last_slice_ce"],
    }


METRICS_ITEM = "metrics"  # the manager's own item: checkpoints/<step>/metrics/metrics


CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged_checkpoints"


def storage_error(error: BaseException, workdir: str, step: int | None, detail: str = "") -> BaseException:
    """A failed save as one WorkdirError: the step whose save failed (``step``: the caller knows which
    save it waited for; an earlier one whose partial directory is still there counts first), the cause
    (by the errno of the OSError behind it: no space, quota, read-only, permission; ``detail`` follows
    it in brackets) and every checkpoint intact on disk. The failed save's partial directory is removed.
    Not a storage fault: the exception itself (a bug keeps its traceback)."""
    os_error = storage_fault(error)
    if os_error is None:
        return error
    cause = os.strerror(os_error.errno) + (f" ({detail})" if detail else "")
    directory = checkpoint_dir(workdir)
    partial = glob.glob(os.path.join(directory, "*.orbax-checkpoint-tmp*"))  # saves that failed (none is running)
    steps = [step, *(int(os.path.basename(p).split(".")[0]) for p in partial)]
    failed = min((s for s in steps if s is not None), default=None)  # the first save that failed
    if jax.process_index() == 0:  # the processes share the directory
        _remove_partial_saves(directory)
    close_abandoned_coroutines(writes=True)  # the failed save's coroutines: none prints at exit
    steps_on_disk = sorted(int(n) for n in _listdir(directory) if n.isdigit())
    intact = [n for n in steps_on_disk if _committed(os.path.join(directory, str(n)))]
    broken = [n for n in steps_on_disk if n not in intact and n != failed]  # e.g. emptied by a failed deletion
    kept = (
        f"checkpoints {', '.join(map(str, intact))} are intact"
        if len(intact) > 1
        else (f"checkpoint {intact[0]} is intact" if intact else "no checkpoint was saved before it")
    )
    if broken:
        kept += (
            f" ({', '.join(map(str, broken))} incomplete: {'its' if len(broken) == 1 else 'their'} files were removed)"
        )
    if failed in intact:  # the save completed; what followed it (the keep policy's deletions) failed
        return WorkdirError(f"checkpoint {failed} in {workdir} was saved, but what followed it failed: {cause}; {kept}")
    return WorkdirError(f"cannot save checkpoint {failed} in {workdir}: {cause}; {kept}")


def _committed(step_dir: str) -> bool:
    """Whether a step directory holds a whole checkpoint: orbax's commit marker is there."""
    return os.path.isfile(os.path.join(step_dir, "commit_success.txt")) or os.path.isfile(
        os.path.join(step_dir, "_CHECKPOINT_METADATA")
    )


def _remove_partial_saves(directory: str) -> None:
    """Remove the temporary directories of saves that failed: space back (a resume never reads them)."""
    for path in glob.glob(os.path.join(directory, "*.orbax-checkpoint-tmp*")):
        shutil.rmtree(path, ignore_errors=True)


def _listdir(directory: str) -> list[str]:
    try:
        return [n for n in os.listdir(directory) if os.path.isdir(os.path.join(directory, n))]
    except OSError:
        return []


# What a save must find free: SPACE_MARGIN times the largest checkpoint so far, plus SPACE_SLACK. The
# files TensorStore writes for the same state differ with how its writes were batched (the number of
# OCDBT data files, each rounded up to the disk's blocks): tiny runs' checkpoints take 172 to 303 KB.
SPACE_MARGIN, SPACE_SLACK = 1.25, 2**20


def bytes_on_disk(path: str) -> int:
    """The bytes a directory tree takes on its disk (the blocks allocated to its files)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # removed meanwhile: it takes nothing
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


def free_bytes(directory: str) -> int:
    """The bytes a process may still write on the disk that holds (or will hold) ``directory``."""
    while not os.path.isdir(directory) and os.path.dirname(directory) != directory:
        directory = os.path.dirname(directory)  # orbax makes checkpoints/ at the first save
    return shutil.disk_usage(directory).free


def _size(n: float, up: bool) -> str:
    """``n`` bytes in KB, MB or GB, rounded up (``up``) or down: a need shown rounded up and the free
    space down never look equal."""
    unit, scale, digits = ("KB", 1e3, 0) if n < 1e6 else (("MB", 1e6, 1) if n < 1e9 else ("GB", 1e9, 1))
    shown = n / scale * 10**digits
    return f"{(math.ceil(shown) if up else math.floor(shown)) / 10**digits:.{digits}f} {unit}"


def smallest_array(tree) -> dict | None:
    """The nested dicts of ``tree`` down to its smallest leaf reached through dict keys only (the
    first of equal sizes), or None when no leaf is."""
    leaves = [
        (path, leaf)
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
        if all(isinstance(key, jax.tree_util.DictKey) for key in path)
    ]
    if not leaves:
        return None
    path, subtree = min(leaves, key=lambda item: math.prod(item[1].shape))
    for key in reversed(path):
        subtree = {key.key: subtree}
    return subtree


ORBAX_READ = "_read_array_index_and_device_put"  # orbax's coroutine reading one array (its serialization module)


def close_abandoned_coroutines(*, writes: bool = False) -> int:
    """After a failed restore (a damaged checkpoint) or save (``writes``: a full disk), reported by the
    caller: orbax leaves the reads of the other arrays (and a failed save's writes) suspended in
    coroutines whose event loop has closed, and some never started. Collected later, a suspended one
    prints "Exception ignored in: <coroutine …>" with a traceback (orbax turns the GeneratorExit of
    ``close()`` into an Exception, or fails to import at shutdown) and an unstarted one "coroutine …
    was never awaited" at exit. They are closed here instead, where the failure is handled, the
    exception of each caught by type. Returns how many were closed (tests/test_faults.py holds orbax's
    read's name)."""
    closed = 0
    for obj in gc.get_objects():
        if not isinstance(obj, types.CoroutineType) or "/orbax/" not in obj.cr_code.co_filename:
            continue
        state = inspect.getcoroutinestate(obj)
        suspended = state == inspect.CORO_SUSPENDED and (writes or obj.cr_code.co_name == ORBAX_READ)
        if state == inspect.CORO_CREATED or suspended:
            try:
                obj.close()
            except Exception:  # noqa: BLE001 -- orbax's error for the read or write: the failure is reported
                pass
            closed += 1
    return closed


def _refuse_link(directory: str) -> None:
    """A WorkdirError when a run's own checkpoint directory is a symbolic link: followed, a resumed
    run would write into (and its keep policy delete from) whatever it points to, another run's
    checkpoints say."""
    if os.path.islink(directory):
        raise WorkdirError(
            f"{directory} is a symbolic link (to {os.readlink(directory)}); a run writes only into its own "
            "directories: replace the link by a copy, or use another --workdir"
        )


def checkpoint_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


class _Manager(ocp.CheckpointManager):
    """The manager, reading a checkpoint's metrics as absent when they are unreadable (a damaged
    file would otherwise raise from the manager's constructor, which reads every step's metrics):
    that checkpoint is not a candidate for the best step, and a warning says so once. Private:
    orbax 0.12 has no public hook for it (tests/test_faults.py checks that the method is there)."""

    _warned: set = set()

    def _get_metrics(self, step: int):
        try:
            metrics = super()._get_metrics(step)
        except (ValueError, OSError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            metrics = e
        if metrics is None or (isinstance(metrics, dict) and selection_value(metrics) is not None):
            return metrics
        if (str(self.directory), step) not in self._warned:
            self._warned.add((str(self.directory), step))
            why = reason(metrics) if isinstance(metrics, BaseException) else f"no {SELECTION_METRIC} in {metrics!r:.60}"
            say(
                f"rank4jax: warning: checkpoint {step}'s validation loss is unreadable ({why}); "
                "not a candidate for best"
            )
        return None


def _handlers() -> ocp.handlers.DefaultCheckpointHandlerRegistry:
    """Each item's handler by the args it is saved or restored with. The train state is saved and
    restored whole by the standard handler; ``PyTreeRestore`` reads the same files through the PyTree
    handler, which can restore part of the tree (the parameters without the optimiser's moments)."""
    registry = ocp.handlers.DefaultCheckpointHandlerRegistry()
    # added first: a step's metadata names the handler registered last for an item, which must stay
    # the standard one (as in every checkpoint written before; tests/test_faults.py holds it)
    registry.add("state", ocp.args.PyTreeRestore, ocp.PyTreeCheckpointHandler())
    pairs = {
        "state": ((ocp.args.StandardSave, ocp.args.StandardRestore), ocp.StandardCheckpointHandler()),
        "data_iter": (
            (grain.checkpoint.CheckpointSave, grain.checkpoint.CheckpointRestore),
            grain.checkpoint.CheckpointHandler(),
        ),
        "config": ((ocp.args.JsonSave, ocp.args.JsonRestore), ocp.JsonCheckpointHandler()),
        "tokenizer": ((ocp.args.JsonSave, ocp.args.JsonRestore), ocp.JsonCheckpointHandler()),
    }
    for item, (arg_types, handler) in pairs.items():
        for arg_type in arg_types:
            registry.add(item, arg_type, handler)
    return registry


class RunCheckpoints:
    """A thin wrapper over ``ocp.CheckpointManager`` with this project's items."""

    def __init__(self, workdir: str, keep: int = 3, read_only: bool = False):
        directory = checkpoint_dir(workdir)
        if read_only and not os.path.isdir(directory):
            raise CheckpointError(f"no checkpoints in {workdir} (expected {directory})")
        if not read_only:
            _refuse_link(directory)
        policy = pp.AnyPreservationPolicy(
            [
                pp.LatestN(n=keep),
                pp.BestN(get_metric_fn=selection_value, reverse=True, n=1, keep_checkpoints_without_metrics=False),
            ]
        )
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy,
            best_fn=selection_value,  # also makes the manager store each checkpoint's metrics
            best_mode="min",
            create=not read_only,
            # a reader never saves (``save`` refuses); orbax's own read_only flag is not set, since it
            # only adds a warning on every open ("Given directory is read only") to what create=False does
            read_only=False,
            # a failed save's partial directory is removed here, before the manager is built (orbax's
            # own clean-up runs in a thread it does not join, racing whatever moves the directory next)
            cleanup_tmp_directories=False,
        )
        if not read_only and jax.process_index() == 0:  # the processes share the directory
            _remove_partial_saves(directory)
        self.workdir, self.read_only = workdir, read_only
        self.saving = None  # the step of the latest save requested (asynchronous)
        self.largest, self.measured = 0, None  # the largest checkpoint's bytes on disk, the last step measured
        self.manager = _Manager(directory, options=options, handler_registry=_handlers())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # the run's own error goes on: a pending save failing as well (a full disk) would mask it
            with contextlib.suppress(Exception):
                self.close()
            if isinstance(exc, WorkdirError) and jax.process_index() == 0:  # a failed save: none is running now
                _remove_partial_saves(checkpoint_dir(self.workdir))

    def close(self) -> None:
        self.wait_until_finished()
        try:
            self.manager.close()  # waits for the step metadata writes too
        except Exception as e:  # noqa: BLE001
            raise storage_error(e, self.workdir, self.saving) from None

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def best_step(self, *, say_fallback: bool = False) -> int | None:
        """The step with the lowest validation selection loss by the manager's own ``best_fn``
        bookkeeping (the latest if no checkpoint carries a metric, e.g. only preemption saves;
        ``say_fallback``: warn when that is so)."""
        best = self.manager.best_step()
        if best is not None:
            return best
        latest = self.latest_step()
        if say_fallback and latest is not None:
            say(f"rank4jax: warning: no checkpoint in {self.workdir} carries a validation loss; "
                f"'best' is the latest, step {latest}")  # fmt: skip
        return latest

    def metric(self, step: int) -> float | None:
        """The validation selection loss a checkpoint carries (None: saved without one, or unreadable)."""
        metrics = self.manager.metrics(step)
        return None if metrics is None else float(selection_value(metrics))

    def add_metric(self, step: int, metrics: dict) -> None:
        """Give a saved checkpoint the metrics it was saved without, through the handler the manager
        reads them with (a checkpoint's ``metrics`` item), then reread the checkpoints."""
        if jax.process_index() == 0:  # the processes share the directory
            directory = epath.Path(self.step_dir(step)) / METRICS_ITEM
            directory.mkdir(exist_ok=True)
            ocp.JsonCheckpointHandler(filename=METRICS_ITEM).save(directory, args=ocp.args.JsonSave(metrics))
        self.manager.reload()

    def best_metric(self) -> tuple[int, float] | None:
        """(step, validation selection loss) of the best checkpoint that carries one, else None."""
        best = self.manager.best_step()
        return None if best is None else (best, float(selection_value(self.manager.metrics(best))))

    def reached_preemption(self, step: int) -> bool:
        """True at the step every process of a multi-process run agreed to stop at after a
        preemption notice (SIGTERM to any process; JAX's preemption sync point, through orbax).
        Always False in a single process, where the loop's signal flag is the trigger."""
        return jax.process_count() > 1 and self.manager.reached_preemption(step)

    def resolve_step(self, which: str | int | None) -> int:
        """'best', 'latest' or a step number → an existing step."""
        steps = self.all_steps()
        if not steps:
            raise CheckpointError(f"no checkpoints in {self.workdir}")
        if which in (None, "best"):
            return self.best_step(say_fallback=True)
        if which == "latest":
            return steps[-1]
        if isinstance(which, bool) or (isinstance(which, float) and not which.is_integer()):
            raise CheckpointError(f"checkpoint step must be 'best', 'latest' or a whole number, got {which!r}")
        try:
            step = int(which)
        except ValueError:
            raise CheckpointError(f"checkpoint step must be 'best', 'latest' or a number, got {which!r}") from None
        if step not in steps:
            raise CheckpointError(f"no checkpoint at step {step} in {self.workdir}; available: {steps}")
        return step

    def _check_writable(self, step: int) -> None:
        """A checkpoints/ that has become unwritable (read-only, immutable, permissions) is one error
        before the save, where orbax would wait minutes at its directory-creation barrier and then fail
        with a traceback. ``os.access`` asks the kernel (it sees the immutable flag and read-only
        mounts, for root too); only when it says no is a directory tried, for the cause's errno."""
        directory = checkpoint_dir(self.workdir)
        if os.access(directory, os.W_OK | os.X_OK):
            return
        self.wait_until_finished()  # an earlier save still being written fails first, and is named
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".writable-", dir=directory))
            error = OSError(errno.EACCES, os.strerror(errno.EACCES))  # access() said no: believe it
        except OSError as e:
            error = e
        raise storage_error(error, self.workdir, step) from None

    def _check_space(self, step: int, state) -> None:
        """A save the disk cannot hold is one error before any of it is written. Failing midway, the
        save's writes still in flight in TensorStore finish after orbax has closed their event loop,
        and each prints "Event loop is closed" with a traceback that no caller can intercept. A save
        needs ``SPACE_MARGIN`` times the largest checkpoint written so far (the state's bytes before
        the first) plus ``SPACE_SLACK``. The earlier save finishes first (orbax's ``save`` waits for
        it anyway) and is measured, once."""
        self.wait_until_finished()
        latest = self.manager.latest_step()
        if latest not in (None, self.measured):
            self.largest, self.measured = max(self.largest, bytes_on_disk(self.step_dir(latest))), latest
        state_bytes = sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree_util.tree_leaves(state))
        need = SPACE_MARGIN * max(self.largest, state_bytes) + SPACE_SLACK
        free = free_bytes(checkpoint_dir(self.workdir))
        if free < need:
            error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            detail = f"it needs about {_size(need, up=True)}, {_size(free, up=False)} free"
            raise storage_error(error, self.workdir, step, detail) from None

    def _agree_to_save(self, step: int, state) -> None:
        """Process 0 checks the directory the processes share (``_check_writable``, ``_check_space``),
        and every process hears its answer before any enters orbax's save: a refusal stops them all
        (refused by process 0 alone, the others waited at orbax's barrier until JAX's distributed
        service aborted them, five minutes later)."""
        error = None
        if jax.process_index() == 0:
            try:
                self._check_writable(step)
                self._check_space(step, state)
            except Exception as e:  # noqa: BLE001 -- raised below, once the other processes know
                error = e
        if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(error is not None)):
            error = error or WorkdirError(
                f"process 0 refused to save checkpoint {step} in {self.workdir} (its error says why)"
            )
        if error is not None:
            raise error

    def save(self, step: int, state, data_iter, config: dict, tokenizer, metrics: dict | None) -> None:
        if self.read_only:
            raise CheckpointError(f"the checkpoints of {self.workdir} were opened to read; nothing was saved")
        self._agree_to_save(step, state)
        args = ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data_iter=grain.checkpoint.CheckpointSave(data_iter),
            config=ocp.args.JsonSave(config),
            tokenizer=ocp.args.JsonSave(tokenizer.to_dict()),
        )
        try:
            self.manager.save(step, args=args, metrics=metrics, force=True)
        except Exception as e:  # noqa: BLE001 -- a full or read-only disk: one line (storage_error)
            try:  # the earlier save, if still being written, finishes (or fails: the first failure is named)
                self.manager.wait_until_finished()
            except Exception as earlier:  # noqa: BLE001
                raise storage_error(earlier, self.workdir, self.saving) from None
            raise storage_error(e, self.workdir, step) from None
        self.saving = step  # written in the background until the next save or wait

    def wait_until_finished(self) -> None:
        """Block until the asynchronous saves are on disk (their storage errors surface here)."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise storage_error(e, self.workdir, self.saving) from None

    def load_meta(self, step: int):
        """(saved run config dict, tokenizer) of a checkpoint."""
        try:
            restored = self.manager.restore(
                step, args=ocp.args.Composite(config=ocp.args.JsonRestore(), tokenizer=ocp.args.JsonRestore())
            )
            config = dict(restored["config"])
            tokenizer = tokenizer_from_dict(dict(restored["tokenizer"]), where=f"checkpoint {step}")
        except Exception as e:  # noqa: BLE001 -- whatever the libraries raise, the files are unreadable
            raise CheckpointDamaged(self.workdir, step, e) from None
        if not config.get("model_family"):
            raise CheckpointDamaged(self.workdir, step, "its saved config is empty")
        return config, tokenizer

    def step_dir(self, step: int) -> str:
        return os.path.join(checkpoint_dir(self.workdir), str(step))

    def set_aside(self, step: int) -> str:
        """Move a damaged checkpoint out of the manager's directory into ``damaged_checkpoints/``
        (never deleted) and forget it; returns where it went."""
        target_dir = os.path.join(os.path.abspath(self.workdir), DAMAGED_DIR)
        _refuse_link(target_dir)
        os.makedirs(target_dir, exist_ok=True)
        target, n = os.path.join(target_dir, str(step)), 1
        while os.path.exists(target):
            target, n = os.path.join(target_dir, f"{step}.{n}"), n + 1
        shutil.move(self.step_dir(step), target)
        self.manager.reload()
        return target

    def restore_params(self, step: int, abstract_params):
        """Restore only the parameters of checkpoint ``step`` onto the shardings carried by
        ``abstract_params`` (ShapeDtypeStructs): a partial restore that never reads the optimiser
        moments (two thirds of the state's bytes under AdamW)."""
        self._read_first(step, abstract_params, prefix="params.")
        params = self._read_params(step, abstract_params)
        check_finite(self.workdir, step, params)
        return params

    def _read_params(self, step: int, abstract_params):
        target = {"params": abstract_params}
        args = ocp.args.PyTreeRestore(
            item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True
        )
        try:  # the model is built from this checkpoint's own config: a failure here is damage
            return self.manager.restore(step, args=ocp.args.Composite(state=args))["state"]["params"]
        except Exception as e:  # noqa: BLE001
            close_abandoned_coroutines()
            raise CheckpointDamaged(self.workdir, step, e) from None

    def _read_first(self, step: int, abstract_params, prefix: str = "") -> None:
        """Before orbax restores many arrays at once: read the state's arrays whose names start with
        ``prefix`` through TensorStore alone (damaged data files or manifest, ``check_readable``),
        then one small array through orbax (damaged tree metadata): a damaged checkpoint fails here,
        with no read in flight. A failed restore of many arrays closes orbax's event loop under the
        reads still running in TensorStore, and each prints "Event loop is closed" as it finishes."""
        check_readable(self.workdir, step, os.path.join(self.step_dir(step), "state"), prefix)
        one = smallest_array(abstract_params)
        if one is not None:
            self._read_params(step, one)

    def restore_state(self, step: int, abstract_state, data_iter=None):
        """Restore the train state onto the shardings carried by ``abstract_state`` (ShapeDtypeStructs),
        and the iterator in place when given.

        grain saves the iterator state per process (``process_<i>-of-<n>.json``). The training
        pipeline's state does not depend on the process count (every process draws the same global
        batches, ``rank4jax.data.pipeline``), so a run saved by n processes resumes on another count
        from process 0's state."""
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        other_count_state = None
        if data_iter is not None:
            iter_dir = os.path.join(checkpoint_dir(self.workdir), str(step), "data_iter")
            own = f"process_{jax.process_index()}-of-{jax.process_count()}.json"
            saved = (
                sorted(f for f in os.listdir(iter_dir) if f.startswith("process_0-of-"))
                if os.path.isdir(iter_dir)
                else []
            )
            if os.path.isfile(os.path.join(iter_dir, own)) or not saved:
                items["data_iter"] = grain.checkpoint.CheckpointRestore(data_iter)
            else:
                with open(os.path.join(iter_dir, saved[0]), encoding="utf-8") as f:
                    other_count_state = json.load(f)
        self._read_first(step, abstract_state["params"] if isinstance(abstract_state, dict) else abstract_state.params)
        try:  # the caller checked the saved config matches: a failure here is damage
            restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001
            close_abandoned_coroutines()
            raise CheckpointDamaged(self.workdir, step, e) from None
        check_finite(self.workdir, step, restored["state"])
        if other_count_state is not None:
            data_iter.set_state(other_count_state)
        return restored["state"]
