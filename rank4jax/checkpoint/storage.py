"""A run's checkpoints through orbax's public API (docs/operations.md): ``checkpoints/<step>/`` holds
``params`` and ``opt_state`` (``StandardSave``), ``data_iter``, ``config`` and ``tokenizer`` (JSON); the
policy keeps the latest ``keep`` and the best the run's log validates (``rank4jax.records``)."""

from __future__ import annotations

import contextlib
import errno
import gc
import math
import os
import shutil
import tempfile

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils
from orbax.checkpoint.checkpoint_managers import preservation_policy as pp

from rank4jax.checkpoint.damage import CheckpointDamaged, check_finite, check_position, check_shapes, shapes_of
from rank4jax.data.tokenizers import tokenizer_from_dict
from rank4jax.errors import CheckpointError, WorkdirError, say, storage_fault
from rank4jax.models.family import SELECTIONS
from rank4jax.records import CHECKPOINT_DIR, CONFIG_FILE, best_validated, check_own_paths, read_json

# A save must find SPACE_MARGIN times the state's bytes plus SPACE_SLACK free (TensorStore's files for
# one state differ in number with how its writes were batched; tiny checkpoints take 172-303 KB).
SPACE_MARGIN, SPACE_SLACK = 1.25, 2**20
JSON_ITEMS = ("data_iter", "config", "tokenizer")


def checkpoint_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def split_state(state) -> tuple[dict, dict]:
    """(parameters, the train state's other fields as a dict)."""
    return state.params, {name: getattr(state, name) for name in state.__dataclass_fields__ if name != "params"}


def storage_error(error: BaseException, workdir: str, step: int | None, detail: str = "") -> BaseException:
    """A failed save as one WorkdirError naming the first save that failed (``step``, or an earlier one
    whose partial directory is left, which is removed), the cause and every checkpoint intact; any
    error that is not a storage fault is returned as it is (a bug keeps its traceback)."""
    os_error = storage_fault(error)
    if os_error is None:
        return error
    cause = os.strerror(os_error.errno) + (f" ({detail})" if detail else "")
    directory = checkpoint_dir(workdir)
    partial = partial_saves(directory, remove=jax.process_index() == 0)  # the processes share it
    failed = min((s for s in (step, *partial) if s is not None), default=None)
    steps = sorted(ocp.utils.checkpoint_steps(directory)) if os.path.isdir(directory) else []
    intact = [n for n in steps if any(os.scandir(os.path.join(directory, str(n))))]
    broken = ", ".join(str(n) for n in steps if n not in intact)  # emptied by a deletion that failed half-way
    names, many = ", ".join(map(str, intact)), len(intact) > 1
    kept = f"checkpoint{'s' * many} {names} {'are' if many else 'is'} intact" if intact else "no checkpoint was saved"
    kept += f" ({broken} incomplete: {'their' if ',' in broken else 'its'} files were removed)" if broken else ""
    if failed in intact:  # the save completed; what followed it (the keep policy's deletions) failed
        return WorkdirError(f"checkpoint {failed} in {workdir} was saved, but what followed it failed: {cause}; {kept}")
    return WorkdirError(f"cannot save checkpoint {failed} in {workdir}: {cause}; {kept}")


def partial_saves(directory: str, remove: bool) -> list[int]:
    """The steps of orbax's temporary directories of saves that did not finish; ``remove``: remove them
    too (a resume never reads them: their space back)."""
    partial = [t.get() for t in ocp.utils.tmp_checkpoints(directory)] if os.path.isdir(directory) else []
    for path in partial if remove else ():
        shutil.rmtree(path, ignore_errors=True)
    return [ocp.utils.step_from_checkpoint_name(path.name) for path in partial]


def _size(n: float, up: bool) -> str:
    """``n`` bytes in KB, MB or GB, rounded up (a need) or down (free space): the two never look equal."""
    unit, scale, digits = ("KB", 1e3, 0) if n < 1e6 else (("MB", 1e6, 1) if n < 1e9 else ("GB", 1e9, 1))
    shown = (math.ceil if up else math.floor)(n / scale * 10**digits) / 10**digits
    return f"{shown:.{digits}f} {unit}"


def free_bytes(directory: str) -> int:
    return shutil.disk_usage(directory).free


class KeepBest(pp.PreservationPolicy):
    """Preserves the best checkpoint the run's log validates by ``selection`` (orbax's policy protocol)."""

    def __init__(self, workdir: str, selection: str):
        self.workdir, self.selection = workdir, selection

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        best = best_validated(self.workdir, [c.step for c in checkpoints], self.selection)
        return [best is not None and c.step == best[0] for c in checkpoints]


class RunCheckpoints:
    """A run's checkpoints: ``ocp.CheckpointManager`` with this project's items and policy. ``selection``:
    the validation metric naming the best checkpoint (None: the one the run's ``config.json`` names)."""

    def __init__(self, workdir: str, keep: int = 3, read_only: bool = False, selection: str | None = None):
        directory = checkpoint_dir(workdir)
        if read_only and not os.path.isdir(directory):
            raise CheckpointError(f"no checkpoints in {workdir} (expected {directory})")
        if not read_only:
            check_own_paths(workdir, (CHECKPOINT_DIR,))
            partial_saves(directory, remove=jax.process_index() == 0)
        self.workdir, self.read_only, self.saving = workdir, read_only, None  # saving: the latest step requested
        saved = read_json(os.path.join(workdir, CONFIG_FILE), "the run's config") or {}
        self.selection = selection or SELECTIONS.get(saved.get("selection"), SELECTIONS["window"])
        policy = pp.AnyPreservationPolicy([pp.LatestN(n=keep), KeepBest(workdir, self.selection)])
        options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=not read_only,
                                               cleanup_tmp_directories=False)  # fmt: skip
        handlers = {"params": ocp.StandardCheckpointHandler(), "opt_state": ocp.StandardCheckpointHandler()}
        handlers |= {name: ocp.JsonCheckpointHandler() for name in JSON_ITEMS}
        self.manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            return self.close()
        with contextlib.suppress(Exception):  # the run's own error goes on; a failing pending save would mask it
            self.close()
        if isinstance(exc, WorkdirError) and jax.process_index() == 0:  # a failed save: none is running now
            partial_saves(checkpoint_dir(self.workdir), remove=True)

    def close(self) -> None:
        self.wait_until_finished()
        try:
            self.manager.close()
        except Exception as e:  # noqa: BLE001
            raise storage_error(e, self.workdir, self.saving) from None

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def best_metric(self) -> tuple[int, float] | None:
        """(step, validation selection loss) of the best checkpoint on disk the run's log validates."""
        return best_validated(self.workdir, self.all_steps(), self.selection)

    def best_step(self, *, say_fallback: bool = False) -> int | None:
        """The best validated checkpoint; the latest when the log validates none (``say_fallback``: warn)."""
        best, latest = self.best_metric(), self.latest_step()
        if best is None and say_fallback and latest is not None:
            say(f"rank4jax: warning: no checkpoint in {self.workdir} has a logged validation loss; "
                f"'best' is the latest, step {latest}")  # fmt: skip
        return latest if best is None else best[0]

    def reached_preemption(self, step: int) -> bool:
        """Whether every process of a multi-process run agreed to stop at ``step`` after a preemption
        notice (JAX's preemption sync point, through orbax); False in a single process."""
        return jax.process_count() > 1 and self.manager.reached_preemption(step)

    def _check_room(self, step: int, state) -> None:
        """An unwritable checkpoints/, or less free than the save needs, is one error before any write."""
        directory = checkpoint_dir(self.workdir)
        if not os.access(directory, os.W_OK | os.X_OK):  # its errno from a try (EROFS, EPERM under chattr +i)
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".writable-", dir=directory))
                error = OSError(errno.EACCES, os.strerror(errno.EACCES))  # access() said no: believe it
            except OSError as e:
                error = e
            raise storage_error(error, self.workdir, step) from None
        state_bytes = sum(getattr(leaf, "nbytes", 0) for leaf in jax.tree_util.tree_leaves(state))
        need, free = SPACE_MARGIN * state_bytes + SPACE_SLACK, free_bytes(directory)
        if free < need:
            detail = f"it needs about {_size(need, up=True)}, {_size(free, up=False)} free"
            raise storage_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), self.workdir, step, detail) from None

    def agree_to_save(self, step: int, state) -> None:
        """The earlier save finishes (its failure named as that step's); process 0 checks the shared
        directory and every process hears its answer before any enters orbax's save, so a refusal stops
        them all. Before the first save nothing is waited for."""
        if self.saving is not None:
            self.wait_until_finished()
        error = None
        if jax.process_index() == 0:
            try:
                self._check_room(step, state)
            except Exception as e:  # noqa: BLE001 -- raised below, once the other processes know
                error = e
        if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(error is not None)):
            error = error or WorkdirError(f"process 0 refused to save checkpoint {step} in {self.workdir} "
                                          "(its error says why)")  # fmt: skip
        if error is not None:
            raise error

    def save(self, step: int, state, data_iter, config: dict, tokenizer) -> None:
        if self.read_only:
            raise CheckpointError(f"the checkpoints of {self.workdir} were opened to read; nothing was saved")
        self.agree_to_save(step, state)
        params, rest = split_state(state)
        args = ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(rest),
            data_iter=ocp.args.JsonSave(data_iter.get_state()),
            config=ocp.args.JsonSave(config),
            tokenizer=ocp.args.JsonSave(tokenizer.to_dict()),
        )
        try:
            self.manager.save(step, args=args, force=True)
        except Exception as e:  # noqa: BLE001 -- a full or read-only disk: one line (storage_error)
            raise storage_error(e, self.workdir, step) from None
        self.saving = step  # written in the background until the next save or wait

    def wait_until_finished(self) -> None:
        """Block until the asynchronous saves are on disk (their storage errors surface here)."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001
            raise storage_error(e, self.workdir, self.saving) from None

    def _restore(self, step: int, **items):
        """``items`` of checkpoint ``step``; a failure is damage (the config and shapes were checked first)."""
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001 -- whatever the libraries raise, the files are unreadable
            error = CheckpointDamaged(self.workdir, step, e)  # keeps the reason only, not the frames
        gc.collect()  # what the failed restore abandoned is collected now, before our line
        raise error

    def load_meta(self, step: int):
        """(saved run config dict, tokenizer) of a checkpoint."""
        restored = self._restore(step, config=ocp.args.JsonRestore(), tokenizer=ocp.args.JsonRestore())
        config = dict(restored["config"] or {})
        if not config.get("model_family"):
            raise CheckpointDamaged(self.workdir, step, "its saved config is empty")
        try:
            return config, tokenizer_from_dict(dict(restored["tokenizer"]), where=f"checkpoint {step}")
        except Exception as e:  # noqa: BLE001
            raise CheckpointDamaged(self.workdir, step, e) from None

    def released(self, step: int) -> bool:
        """Whether checkpoint ``step`` is a released run's: its parameters, config and tokenizer alone."""
        return not any(os.path.isdir(os.path.join(self.step_dir(step), item)) for item in ("opt_state", "state"))

    def step_dir(self, step: int) -> str:
        return os.path.join(checkpoint_dir(self.workdir), str(step))

    def _check_fits(self, step: int, item: str, abstract) -> None:
        """The arrays ``abstract`` asks for against the item's metadata (no array read), before a restore."""
        if os.path.isdir(os.path.join(self.step_dir(step), "state")):
            raise CheckpointError(
                f"checkpoint {step} in {self.workdir} has the layout before 2026-12-05 (one 'state' "
                "item), which rank4jax no longer reads: commit 5da16f5 resumes and evaluates it"
            )
        try:
            saved = shapes_of(self.manager.item_metadata(step)[item])
        except Exception as e:  # noqa: BLE001 -- whatever the libraries raise, the metadata is unreadable
            raise CheckpointDamaged(self.workdir, step, e) from None
        check_shapes(self.workdir, step, item, saved, abstract)

    def restore_params(self, step: int, abstract_params):
        """The parameters alone (the optimiser's moments are never read), onto ``abstract_params``' shardings."""
        self._check_fits(step, "params", abstract_params)
        params = self._restore(step, params=ocp.args.StandardRestore(abstract_params))["params"]
        check_finite(self.workdir, step, params)
        return params

    def restore_state(self, step: int, abstract_state, data_iter=None):
        """The train state onto ``abstract_state``'s shardings, and ``data_iter`` moved to the checkpoint's
        position; every item checked against what the step implies first (``damage``)."""
        params, rest = split_state(abstract_state)
        self._check_fits(step, "params", params)
        self._check_fits(step, "opt_state", rest)
        items = {"params": ocp.args.StandardRestore(params), "opt_state": ocp.args.StandardRestore(rest)}
        restored = self._restore(step, **items, **({"data_iter": ocp.args.JsonRestore()} if data_iter else {}))
        position = restored.get("data_iter", {"next_index": step})
        check_position(self.workdir, step, restored["opt_state"]["step"], position)
        state = abstract_state.replace(params=restored["params"], **restored["opt_state"])
        if data_iter is not None:
            data_iter.set_state(restored["data_iter"])
        check_finite(self.workdir, step, state)
        return state
