"""orbax-checkpoint storage of a run, through orbax's public API only.

A checkpoint (``checkpoints/<step>/``) holds five items: ``params`` and ``opt_state`` (the rest of the
train state), each a ``StandardSave``, so evaluation restores one item; ``data_iter`` (the pipeline's
``get_state()``, the same for any process count), ``config`` and ``tokenizer`` (JSON). orbax alone
reads it (docs/operations.md). The policy keeps the latest ``keep`` and the best: the checkpoint whose
logged validation (``rank4jax.records``) has the lowest selection loss. ``legacy`` reads the earlier
layout; ``damage`` says what an unreadable checkpoint is."""

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

from rank4jax.checkpoint import legacy
from rank4jax.checkpoint.damage import CheckpointDamaged, check_finite, storage_fault
from rank4jax.data.tokenizers import tokenizer_from_dict
from rank4jax.errors import CheckpointError, WorkdirError, say
from rank4jax.models.family import SELECTIONS
from rank4jax.records import CHECKPOINT_DIR, CONFIG_FILE, best_validated, check_own_paths, read_json

# What a save must find free: SPACE_MARGIN times the state's bytes, plus SPACE_SLACK (TensorStore's
# files for the same state differ in number with how its writes were batched; tiny checkpoints take
# 172-303 KB).
SPACE_MARGIN, SPACE_SLACK = 1.25, 2**20


def checkpoint_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def split_state(state) -> tuple[dict, dict]:
    """(parameters, the rest of the train state as a dict of its other fields)."""
    return state.params, {name: getattr(state, name) for name in state.__dataclass_fields__ if name != "params"}


def storage_error(error: BaseException, workdir: str, step: int | None, detail: str = "") -> BaseException:
    """A failed save as one WorkdirError: the step whose save failed (an earlier one whose partial
    directory is still there counts first), the cause (no space, quota, read-only, permission;
    ``detail`` follows it) and every checkpoint intact on disk; the partial directories are removed.
    Not a storage fault: the exception itself (a bug keeps its traceback)."""
    os_error = storage_fault(error)
    if os_error is None:
        return error
    cause = os.strerror(os_error.errno) + (f" ({detail})" if detail else "")
    directory = checkpoint_dir(workdir)
    partial = [ocp.utils.step_from_checkpoint_name(p.name) for p in _partial_saves(directory)]
    failed = min((s for s in (step, *partial) if s is not None), default=None)  # the first save that failed
    if jax.process_index() == 0:  # the processes share the directory
        remove_partial_saves(directory)
    steps = sorted(ocp.utils.checkpoint_steps(directory)) if os.path.isdir(directory) else []
    intact = [n for n in steps if any(os.scandir(os.path.join(directory, str(n))))]
    broken = [n for n in steps if n not in intact]  # emptied by a deletion that failed half-way
    many = len(intact) > 1
    kept = f"checkpoint{'s' * many} {', '.join(map(str, intact))} {'are' if many else 'is'} intact"
    kept = kept if intact else "no checkpoint was saved before it"
    if broken:
        whose = "its" if len(broken) == 1 else "their"
        kept += f" ({', '.join(map(str, broken))} incomplete: {whose} files were removed)"
    if failed in intact:  # the save completed; what followed it (the keep policy's deletions) failed
        return WorkdirError(f"checkpoint {failed} in {workdir} was saved, but what followed it failed: {cause}; {kept}")
    return WorkdirError(f"cannot save checkpoint {failed} in {workdir}: {cause}; {kept}")


def _partial_saves(directory: str) -> list:
    """The directories of saves that did not finish (orbax's temporary checkpoints)."""
    return [t.get() for t in ocp.utils.tmp_checkpoints(directory)] if os.path.isdir(directory) else []


def remove_partial_saves(directory: str) -> None:
    """Remove the saves that failed (a resume never reads them): their space back."""
    for path in _partial_saves(directory):
        shutil.rmtree(path, ignore_errors=True)


def _size(n: float, up: bool) -> str:
    """``n`` bytes in KB, MB or GB, rounded up (``up``) or down: a need and the free space never look equal."""
    unit, scale, digits = ("KB", 1e3, 0) if n < 1e6 else (("MB", 1e6, 1) if n < 1e9 else ("GB", 1e9, 1))
    shown = n / scale * 10**digits
    return f"{(math.ceil(shown) if up else math.floor(shown)) / 10**digits:.{digits}f} {unit}"


def free_bytes(directory: str) -> int:
    """The bytes a process may still write on the disk that holds ``directory``."""
    return shutil.disk_usage(directory).free


def item_handlers() -> dict:
    """Each item's handler (the metadata of a checkpoint names the same)."""
    json_items = {name: ocp.JsonCheckpointHandler() for name in ("data_iter", "config", "tokenizer")}
    return {"params": ocp.StandardCheckpointHandler(), "opt_state": ocp.StandardCheckpointHandler()} | json_items


class KeepBest(pp.PreservationPolicy):
    """Preserves the checkpoint ``best(steps)`` names among the candidates (orbax's policy protocol)."""

    def __init__(self, best):
        self.best = best

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        del context
        best = self.best([c.step for c in checkpoints])
        return [c.step == best for c in checkpoints]


class RunCheckpoints:
    """A run's checkpoints: ``ocp.CheckpointManager`` with this project's items and policy.
    ``selection``: the validation metric that names the best checkpoint (the run's selection loss;
    None: the one its ``config.json`` names)."""

    def __init__(self, workdir: str, keep: int = 3, read_only: bool = False, selection: str | None = None):
        directory = checkpoint_dir(workdir)
        if read_only and not os.path.isdir(directory):
            raise CheckpointError(f"no checkpoints in {workdir} (expected {directory})")
        if not read_only:
            check_own_paths(workdir, (CHECKPOINT_DIR,))
            if jax.process_index() == 0:  # the processes share the directory
                remove_partial_saves(directory)
        self.workdir, self.read_only = workdir, read_only
        saved = read_json(os.path.join(workdir, CONFIG_FILE), "the run's config") or {}
        self.selection = selection or SELECTIONS.get(saved.get("selection"), SELECTIONS["window"])
        self.saving = None  # the step of the latest save requested (asynchronous)
        policy = pp.AnyPreservationPolicy([pp.LatestN(n=keep), KeepBest(self._best_among)])
        options = ocp.CheckpointManagerOptions(
            preservation_policy=policy, create=not read_only, cleanup_tmp_directories=False
        )
        self.manager = ocp.CheckpointManager(directory, options=options, item_handlers=item_handlers())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # the run's own error goes on: a pending save failing as well (a full disk) would mask it
            with contextlib.suppress(Exception):
                self.close()
            if isinstance(exc, WorkdirError) and jax.process_index() == 0:  # a failed save: none is running now
                remove_partial_saves(checkpoint_dir(self.workdir))

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

    def _best_among(self, steps) -> int | None:
        best = best_validated(self.workdir, steps, self.selection)
        return None if best is None else best[0]

    def best_metric(self) -> tuple[int, float] | None:
        """(step, validation selection loss) of the best checkpoint on disk the run's log validates."""
        return best_validated(self.workdir, self.all_steps(), self.selection)

    def best_step(self, *, say_fallback: bool = False) -> int | None:
        """The best validated checkpoint; the latest when the log validates none (only preemption saves,
        or no log; ``say_fallback``: warn)."""
        best, latest = self.best_metric(), self.latest_step()
        if best is None and say_fallback and latest is not None:
            say(f"rank4jax: warning: no checkpoint in {self.workdir} has a logged validation loss; "
                f"'best' is the latest, step {latest}")  # fmt: skip
        return latest if best is None else best[0]

    def reached_preemption(self, step: int) -> bool:
        """True at the step every process of a multi-process run agreed to stop at after a
        preemption notice (JAX's preemption sync point, through orbax); False in a single process."""
        return jax.process_count() > 1 and self.manager.reached_preemption(step)

    def _check_room(self, step: int, state) -> None:
        """An unwritable checkpoints/ or a disk that cannot hold the save is one error before any of it
        is written: ``SPACE_MARGIN`` times the state's bytes plus ``SPACE_SLACK`` must be free."""
        directory = checkpoint_dir(self.workdir)
        if not os.access(directory, os.W_OK | os.X_OK):
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
        """Every process's earlier save finishes first (its failure is named, as that step's); then process
        0 checks the directory the processes share, and every process hears its answer before any enters
        orbax's save: a refusal stops them all at once. Before the first save nothing is waited for (a
        signal while a run starts then never lands inside orbax, which would log it as a failed save)."""
        if self.saving is not None:
            self.wait_until_finished()
        error = None
        if jax.process_index() == 0:
            try:
                self._check_room(step, state)
            except Exception as e:  # noqa: BLE001 -- raised below, once the other processes know
                error = e
        if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(error is not None)):
            error = error or WorkdirError(
                f"process 0 refused to save checkpoint {step} in {self.workdir} (its error says why)"
            )
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
        """Restore ``items`` of checkpoint ``step``: a failure is damage (the config was checked first)."""
        try:
            return self.manager.restore(step, args=ocp.args.Composite(**items))
        except Exception as e:  # noqa: BLE001 -- whatever the libraries raise, the files are unreadable
            error = CheckpointDamaged(self.workdir, step, e)  # keeps the reason only, not the frames
        gc.collect()  # what the failed restore abandoned and no one holds is collected now, before our line
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
        path = self.step_dir(step)
        return not legacy.is_legacy(path) and not os.path.isdir(os.path.join(path, "opt_state"))

    def step_dir(self, step: int) -> str:
        return os.path.join(checkpoint_dir(self.workdir), str(step))

    def _check_fits(self, step: int, item: str, abstract) -> None:
        """The arrays ``abstract`` asks for against the item's own metadata (no array read): an item whose
        arrays do not fit the run's config (another run's, an edited config) is damage, found before any
        restore starts."""
        try:
            saved = shapes_of(self.manager.item_metadata(step)[item])
        except Exception as e:  # noqa: BLE001 -- whatever the libraries raise, the metadata is unreadable
            raise CheckpointDamaged(self.workdir, step, e) from None
        check_shapes(self.workdir, step, item, saved, abstract)

    def restore_params(self, step: int, abstract_params):
        """The parameters of checkpoint ``step`` alone (the optimiser's moments are never read), onto the
        shardings ``abstract_params`` (ShapeDtypeStructs) carry."""
        if legacy.is_legacy(self.step_dir(step)):
            params = legacy.restore_params(self.workdir, step, self.step_dir(step), abstract_params)
        else:
            self._check_fits(step, "params", abstract_params)
            params = self._restore(step, params=ocp.args.StandardRestore(abstract_params))["params"]
        check_finite(self.workdir, step, params)
        return params

    def restore_state(self, step: int, abstract_state, data_iter=None):
        """The train state onto the shardings ``abstract_state`` carries; the data iterator moved to the
        checkpoint's position when given. Every item is checked against what the step implies first (its
        arrays' shapes, the optimiser's step, the data position): one that does not fit is damage."""
        if legacy.is_legacy(self.step_dir(step)):
            state = legacy.restore_state(self.workdir, step, self.step_dir(step), abstract_state, data_iter)
        else:
            params, rest = split_state(abstract_state)
            self._check_fits(step, "params", params)
            self._check_fits(step, "opt_state", rest)
            items = {"params": ocp.args.StandardRestore(params), "opt_state": ocp.args.StandardRestore(rest)}
            restored = self._restore(step, **items, **({"data_iter": ocp.args.JsonRestore()} if data_iter else {}))
            check_position(
                self.workdir, step, restored["opt_state"]["step"], restored.get("data_iter", {"next_index": step})
            )
            state = abstract_state.replace(params=restored["params"], **restored["opt_state"])
            if data_iter is not None:
                data_iter.set_state(restored["data_iter"])
        check_finite(self.workdir, step, state)
        return state


def shapes_of(tree) -> dict:
    """{"a/b/0/c": shape} of a tree's arrays (or their metadata): each key by its name, so a namedtuple's
    fields (attributes in memory, dict keys in orbax's metadata) read alike."""

    def name(key):
        return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))))

    return {"/".join(map(name, p)): tuple(a.shape) for p, a in jax.tree_util.tree_leaves_with_path(tree)}


def check_shapes(workdir: str, step: int, item: str, saved: dict, abstract) -> None:
    """``saved`` (:func:`shapes_of` an item on disk) against the arrays ``abstract`` asks for."""
    wanted = shapes_of(abstract)
    for name in sorted(set(saved) | set(wanted)):
        if saved.get(name) != wanted.get(name):
            raise CheckpointDamaged(
                workdir,
                step,
                f"its {item} {name} is {saved.get(name, 'absent')}, where its config makes it "
                f"{wanted.get(name, 'absent')}",
            )


def check_position(workdir: str, step: int, saved_step, data_state) -> None:
    """A checkpoint of step ``step`` holds the optimiser at that step and the data iterator at that
    batch (``{"next_index": step}``: one global batch a step); anything else (another step's item, a
    hand-edited value) is damage."""
    if int(np.asarray(saved_step)) != step:
        raise CheckpointDamaged(workdir, step, f"its optimiser state is at step {int(np.asarray(saved_step))}")
    index = data_state.get("next_index") if isinstance(data_state, dict) else None
    if not (
        isinstance(data_state, dict) and set(data_state) == {"next_index"} and type(index) is int and index == step
    ):
        shown = repr(data_state)
        raise CheckpointDamaged(
            workdir, step, f"its data position is {shown[:60] + '...' if len(shown) > 60 else shown}, not batch {step}"
        )
