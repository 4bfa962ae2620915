"""A saved run rebuilt from its checkpoint alone: the run config and tokenizer it carries, its model
family and model config (score variant included), and the parameters.

``load_run(workdir)`` is the public way to study a trained run (notebooks, the README)::

    run = rank4jax.load_run("runs/default")              # step="best" | "latest" | a number
    logits = rank4jax.forward(run.params, inputs, run.model_cfg)

Evaluation uses ``restore_run`` with its own placement of the parameters (a mesh's shardings).
"""

from __future__ import annotations

import dataclasses
import os
import shutil

import jax
import numpy as np

from rank4jax import files
from rank4jax.checkpoint.damage import CheckpointDamaged
from rank4jax.checkpoint.storage import RunCheckpoints
from rank4jax.engine.run_config import FINGERPRINT_KEY, from_json_dict
from rank4jax.engine.sharding import with_shardings
from rank4jax.engine.state import TrainState, abstract_train_state
from rank4jax.errors import CheckpointError, say
from rank4jax.models.family import ModelFamily, get_family
from rank4jax.records import DAMAGED_DIR


@dataclasses.dataclass
class SavedRun:
    """What a checkpoint says about its run: config, tokenizer, model family and config, and the
    abstract train state (ShapeDtypeStructs) to restore into."""

    step: int
    config: object  # ml_collections.ConfigDict
    tokenizer: object
    family: ModelFamily
    model_cfg: object
    abstract_state: TrainState
    data_fingerprint: str | None = None  # the training data's bytes when the checkpoint was written


def resolve_step(ckpt, which: str | int | None) -> int:
    """'best', 'latest' or a whole step number → an existing step of ``ckpt`` (``RunCheckpoints``)."""
    steps = ckpt.all_steps()
    if not steps:
        raise CheckpointError(f"no checkpoints in {ckpt.workdir}")
    if which in (None, "best"):
        return ckpt.best_step(say_fallback=True)
    if which == "latest":
        return steps[-1]
    if isinstance(which, bool) or (isinstance(which, float | np.floating) and not float(which).is_integer()):
        raise CheckpointError(f"checkpoint step must be 'best', 'latest' or a whole number, got {which!r}")
    try:
        step = int(which)
    except ValueError:
        raise CheckpointError(f"checkpoint step must be 'best', 'latest' or a number, got {which!r}") from None
    if step not in steps:
        raise CheckpointError(f"no checkpoint at step {step} in {ckpt.workdir}; available: {steps}")
    return step


def describe_run(ckpt: RunCheckpoints, step: str | int = "best") -> SavedRun:
    step = resolve_step(ckpt, step)
    saved, tokenizer = ckpt.load_meta(step)
    config = from_json_dict(saved)
    family = get_family(config.model_family)
    model_cfg = family.make_config(config.model, tokenizer.vocab_size)
    abstract = abstract_train_state(config.optim, family, model_cfg)
    return SavedRun(step, config, tokenizer, family, model_cfg, abstract, saved.get(FINGERPRINT_KEY))


def restore_run(ckpt: RunCheckpoints, which: str | int = "best", place=None):
    """(SavedRun, parameters) of checkpoint ``which`` ('best', 'latest' or a step). ``place(run)``
    gives the abstract parameters with their shardings (default: the run's, unsharded). For 'best'
    and 'latest' a damaged checkpoint, or one deleted while it is read (a training run in the same
    workdir), falls back to the newest readable other one with a warning; a damaged step asked for by
    number is one error."""
    place = place or (lambda run: run.abstract_state.params)

    def load(step):
        run = describe_run(ckpt, step)
        return run, ckpt.restore_params(step, place(run))

    first = resolve_step(ckpt, which)
    if which not in (None, "best", "latest"):
        return load(first)
    candidates = [first] + [s for s in reversed(ckpt.all_steps()) if s != first]
    return first_readable(ckpt, candidates, load)[1]


@dataclasses.dataclass
class LoadedRun:
    """A trained run as numpy on the host: ``params`` feed ``rank4jax.forward`` (or the family's own
    functions) with ``model_cfg`` directly."""

    params: dict  # nested dict of numpy arrays
    model_cfg: object  # Rank4Config, BaselineConfig, … as the library builds it
    tokenizer: object
    config: object  # the run config (ml_collections.ConfigDict)
    step: int
    family: ModelFamily


def load_run(workdir: str, step: str | int = "best") -> LoadedRun:
    """The parameters (alone: the optimiser moments are never read), model config, tokenizer, run
    config and step of a run's checkpoint ``step`` ('best', 'latest' or a number), on the CPU."""
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])

    def on_cpu(run):
        params = run.abstract_state.params
        return with_shardings(params, jax.tree_util.tree_map(lambda _: cpu, params))

    with RunCheckpoints(workdir, read_only=True) as ckpt:
        run, params = restore_run(ckpt, step, on_cpu)
    params = jax.tree_util.tree_map(np.asarray, params)
    return LoadedRun(params, run.model_cfg, run.tokenizer, run.config, run.step, run.family)


def move_aside(ckpt, step: int) -> str:
    """Move ``ckpt``'s damaged checkpoint ``step`` into ``damaged_checkpoints/`` (never deleted); returns
    where it went."""
    target_dir = files.make_dirs(ckpt.workdir, DAMAGED_DIR)
    target, n = os.path.join(target_dir, str(step)), 1
    while os.path.exists(target):
        target, n = os.path.join(target_dir, f"{step}.{n}"), n + 1
    shutil.move(ckpt.step_dir(step), target)
    ckpt.manager.reload()
    return target


def first_readable(ckpt, candidates, load, *, set_aside: bool = False):
    """``(step, load(step))`` for the first of ``candidates`` (steps, best first) that reads; each
    damaged one is named in a warning and, when ``set_aside``, moved into ``damaged_checkpoints/``
    once a readable one is found (if none is, all stay where they are); a step deleted meanwhile is
    skipped. No readable candidate: one CheckpointError listing why."""
    problems, damaged = [], []
    for step in candidates:
        try:
            result = load(step)
        except CheckpointDamaged as e:
            if not os.path.isdir(ckpt.step_dir(step)):  # deleted while being read (another run's keep policy)
                problems.append(f"{step}: removed while being read")
                say(f"rank4jax: warning: checkpoint {step} was removed while being read; trying another")
                ckpt.manager.reload()
                continue
            problems.append(f"{step}: {e.reason}")
            damaged.append(step)
            say(f"rank4jax: warning: {e}; trying the next older checkpoint")
            continue
        for bad in damaged if set_aside else ():
            say(f"rank4jax: moved damaged checkpoint {bad} to {move_aside(ckpt, bad)} (kept for inspection)")
        return step, result
    why = "; ".join(problems) or "none saved"
    raise CheckpointError(f"no readable checkpoint in {ckpt.workdir} ({why}); nothing was moved or deleted")


RELEASED_FILES = ("config.json", "metrics.jsonl", "train_summary.json")  # the run's record, beside its parameters


def release_run(workdir: str, out: str, step: str | int = "best") -> int:
    """Write the released form of a trained run into ``out`` (a new folder): checkpoint ``step`` holding
    its parameters (float32, orbax ``StandardSave``), saved config and tokenizer, and no optimiser state
    or data position, beside the run's config.json, metrics.jsonl and train_summary.json. It loads and
    evaluates as any workdir (``load_run``, eval.py, predict.py); training refuses to resume from it.
    Returns the step released."""
    import orbax.checkpoint as ocp

    if os.path.exists(out):
        raise CheckpointError(f"{out} exists: a release is written into a new folder")
    with RunCheckpoints(workdir, read_only=True) as ckpt:
        run, params = restore_run(ckpt, step)
        config, _ = ckpt.load_meta(run.step)
    params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
    files.make_dirs(out, "checkpoints")
    args = ocp.args.Composite(
        params=ocp.args.StandardSave(params),
        config=ocp.args.JsonSave(config),
        tokenizer=ocp.args.JsonSave(run.tokenizer.to_dict()),
    )
    handlers = {"params": ocp.StandardCheckpointHandler(), "config": ocp.JsonCheckpointHandler(),
                "tokenizer": ocp.JsonCheckpointHandler()}  # fmt: skip
    with ocp.CheckpointManager(os.path.abspath(os.path.join(out, "checkpoints")), item_handlers=handlers) as manager:
        manager.save(run.step, args=args)
        manager.wait_until_finished()
    for name in RELEASED_FILES:
        with open(os.path.join(workdir, name), "rb") as f:
            files.write_bytes(out, name, f.read())
    return run.step
