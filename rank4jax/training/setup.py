"""The setup steps of a training run: prepare it (lock, workdir check, data, mesh, model config,
programs, evaluators), then restore its train state or create it.

A workdir that already holds checkpoints must come from the same model, tokenizer and data config
(``run_config.identity_differences``) and the same data bytes; a damaged newest checkpoint falls back
to the newest readable one (single process: the damaged ones are moved aside). Changed ``optim``
settings are allowed on resume: the state is restored into the optimiser it was saved with, then Adam's
moments and step are carried into the new one (``state.carry_optimizer_state``).
"""

from __future__ import annotations

import contextlib
import dataclasses

import jax
import ml_collections

from rank4jax.checkpoint.storage import CHECKPOINT_DIR, RunCheckpoints
from rank4jax.engine import sharding
from rank4jax.engine.batches import batch_layout
from rank4jax.engine.data_setup import RunData, prepare_data, validation_windows
from rank4jax.engine.programs import CompiledStep, Programs, StepPolicy, build_programs, optim_key
from rank4jax.engine.run_config import (
    FINGERPRINT_KEY,
    IDENTITY_SECTIONS,
    data_fingerprint,
    identity_differences,
    to_json_dict,
    with_added_defaults,
)
from rank4jax.engine.state import TrainState, abstract_train_state, carry_optimizer_state, learning_rate_schedule
from rank4jax.errors import CheckpointError, say
from rank4jax.evaluation.evaluators import Evaluators
from rank4jax.models.family import SELECTIONS, ModelFamily, get_family
from rank4jax.records import check_own_paths
from rank4jax.runs import first_readable
from rank4jax.training.layout_choice import choose_layout
from rank4jax.training.workdir_lock import WorkdirLock


@dataclasses.dataclass
class Run:
    """Everything a training run holds fixed: set up once, read by the loop and its actions."""

    config: ml_collections.ConfigDict
    workdir: str
    family: ModelFamily
    model_cfg: object
    data: RunData
    layout: object  # the step's batch layout (rank4jax.engine.batches)
    programs: Programs
    evaluators: Evaluators
    ckpt: RunCheckpoints
    saved: dict | None  # the config the workdir's checkpoints were written with (None: a new run)
    saved_config: dict  # what this run's checkpoints carry: its config and the data's fingerprint
    n_params: int
    lock: WorkdirLock
    val_windows: object  # (W, T+1, N) numpy: the validation split's windows
    step_fn: CompiledStep  # the train step for ``layout`` (compiled per batch shape, on first use)

    @property
    def tokenizer(self):
        return self.data.tokenizer

    @property
    def selection_label(self) -> str:
        """What this run's selection loss measures (``config.selection``)."""
        return self.family.selection_label(self.config.selection)

    @property
    def is_main(self) -> bool:
        return jax.process_index() == 0


def prepare_run(config: ml_collections.ConfigDict, workdir: str, stack: contextlib.ExitStack) -> Run:
    """Lock the workdir, check its checkpoints against ``config``, read the data, build the mesh,
    the model config, the programs and the evaluators. Nothing is allocated for the model yet."""
    family = get_family(config.model_family)
    # one writer per workdir; a refused run leaves the workdir as it was
    lock = stack.enter_context(WorkdirLock(workdir, enabled=jax.process_index() == 0, undo=(CHECKPOINT_DIR,)))
    check_own_paths(workdir)  # nothing the run writes may follow a link out of the workdir
    ckpt = stack.enter_context(RunCheckpoints(workdir, config.keep_checkpoints, selection=SELECTIONS[config.selection]))
    fingerprint = data_fingerprint(config)  # the data files' bytes, read once: checked, then saved
    tokenizer, saved = _check_workdir(ckpt, config, workdir, fingerprint)
    data = prepare_data(config, tokenizer)
    val_windows = validation_windows(data)  # refuse a run with nothing to validate on before any work
    model_cfg = family.make_config(config.model, data.tokenizer.vocab_size)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.model)
    policy = StepPolicy.of(config)
    accum = policy.grad_accum_steps  # each microbatch splits over the data axis too
    sharding.check_divisibility(
        mesh,
        batch_sizes={
            "batch_size" if accum == 1 else "batch_size / grad_accum_steps": config.batch_size // accum,
            "eval_batch_size": config.eval_batch_size,
        },
        n_heads=config.model.get("n_heads"),  # None for a family without heads (the SPLM)
        hidden=4 * config.model.dx * config.model.dt,
    )
    programs = build_programs(family, model_cfg, optim_key(config.optim, config.num_steps), mesh, policy)
    n_params = family.count_params(model_cfg)
    sharding.check_state_fits(programs.abstract, programs.state_sharding, n_params)  # before allocating
    sharding.check_batches_fit(config, data.tokenizer.vocab_size, mesh.shape[sharding.DATA_AXIS])
    groups = mesh.shape[sharding.DATA_AXIS]  # a compact training batch: a group per device and microbatch
    train_windows = data.windows["train"].windows
    layout, timings, step_fn = choose_layout(config, family, model_cfg, programs, train_windows, groups * accum, saved)
    if timings and jax.process_index() == 0:
        figures = ", ".join(f"{name} {1e3 * s:.1f}" for name, s in sorted(timings.items(), key=lambda kv: kv[1]))
        say(f"rank4jax: batch layout {layout.name}, the fastest measured (ms per train step: {figures})")
    eval_layout = batch_layout(config, family, model_cfg, groups, layout.name)
    evaluators = Evaluators(programs, config.eval_batch_size, eval_layout)
    saved_config = to_json_dict(config) | {"batch_layout": layout.name, FINGERPRINT_KEY: fingerprint}
    return Run(
        config,
        workdir,
        family,
        model_cfg,
        data,
        layout,
        programs,
        evaluators,
        ckpt,
        saved,
        saved_config,
        n_params,
        lock,
        val_windows,
        step_fn,
    )


def _check_workdir(ckpt: RunCheckpoints, config, workdir: str, fingerprint: str | None):
    """(tokenizer, saved config dict) of an existing run, after checking its config matches;
    (None, None) for a new run. A config mismatch is never damage."""
    steps = ckpt.all_steps()
    if not steps:
        return None, None
    if ckpt.released(steps[-1]):
        raise CheckpointError(
            f"{workdir} holds a released run's parameters only (no optimiser state, no data position): training "
            "cannot resume from it; study it (eval.py, predict.py, rank4jax.load_run), or train anew in another "
            "--workdir; nothing was changed"
        )

    def check(step):
        saved, tokenizer = ckpt.load_meta(step)
        diffs = identity_differences(saved, config)
        old = saved.get(FINGERPRINT_KEY)
        if not diffs and old and fingerprint and old != fingerprint:
            diffs = [
                f"the data at {config.data.path} has changed since these checkpoints were written "
                f"(SHA-256 {old[:12]}… then, {fingerprint[:12]}… now)"
            ]
        old_batch = saved.get("batch_size")
        if not diffs and old_batch is not None and old_batch != config.batch_size:
            raise CheckpointError(
                f"{workdir} was trained with batch_size={old_batch}: its saved data position counts batches of "
                f"{old_batch}, so batch_size={config.batch_size} would skip or repeat windows. Resume with "
                f"--config.batch_size={old_batch} (grad_accum_steps splits a batch without changing the update), "
                "or use a new --workdir; nothing was changed."
            )
        if diffs:
            more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
            raise CheckpointError(
                f"{workdir} holds checkpoints of a different config: {diffs[0]}{more}. "
                "Use a new --workdir, or the config that wrote these checkpoints; nothing was changed."
            )
        return tokenizer, with_added_defaults(saved)

    single = jax.process_count() == 1
    return first_readable(ckpt, steps[::-1] if single else steps[-1:], check, set_aside=single)[1]


def restore_or_init(run: Run, train_iter) -> TrainState:
    """The newest readable checkpoint's state (and ``train_iter`` moved to its position), or a fresh
    state created directly sharded (with the family's data-derived buffers)."""
    programs = run.programs
    if run.ckpt.latest_step() is None:
        state = programs.init(jax.random.key(run.config.seed))
        if run.family.init_from_data is not None:  # data-derived buffers, then kept by every checkpoint
            params = run.family.init_from_data(state.params, run.data.windows["train"].windows, run.model_cfg)
            state = state.replace(params=jax.device_put(params, programs.state_sharding.params))
        return state
    changed = optim_changes(run.saved, run.config)
    others = setting_changes(run.saved, run.saved_config)
    if others and run.is_main:
        say(f"rank4jax: settings changed on resume: {'; '.join(others)}")
    abstract = programs.abstract
    if changed:  # restore into the optimiser state the checkpoint was written with
        abstract = abstract_train_state(ml_collections.ConfigDict(run.saved["optim"]), run.family, run.model_cfg)
    target = sharding.with_shardings(abstract, sharding.state_shardings(programs.mesh, abstract))
    single = jax.process_count() == 1
    _, state = first_readable(
        run.ckpt,
        run.ckpt.all_steps()[::-1] if single else [run.ckpt.latest_step()],
        lambda step: run.ckpt.restore_state(step, target, train_iter),
        set_aside=single,
    )
    jump = schedule_jump(run.saved, run.config, int(jax.device_get(state.step)))
    if jump and run.is_main:
        say(jump)
    if changed:
        fresh = jax.jit(programs.optimizer.init, out_shardings=programs.state_sharding.opt_state)(state.params)
        opt_state = carry_optimizer_state(state.opt_state, fresh, state.step)
        state = state.replace(opt_state=jax.device_put(opt_state, programs.state_sharding.opt_state))
        if run.is_main:
            what = "; ".join(changed)
            say(f"rank4jax: optimiser settings changed on resume ({what}): Adam moments and step carried over")
    return state


def schedule_jump(saved: dict | None, config, step: int) -> str | None:
    """A warning when a resume changes ``num_steps`` under a decaying schedule (which is stretched over
    ``num_steps``): the learning rate at ``step`` before and after; None when nothing jumps."""
    old_steps = (saved or {}).get("num_steps")
    if config.optim.schedule == "constant" or old_steps is None or old_steps == config.num_steps:
        return None
    before = float(learning_rate_schedule(ml_collections.ConfigDict(saved["optim"]), old_steps)(step))
    after = float(learning_rate_schedule(config.optim, config.num_steps)(step))
    return (
        f"rank4jax: warning: num_steps {old_steps} → {config.num_steps} stretches the {config.optim.schedule} "
        f"decay over the new length: the learning rate at step {step} goes from {before:.3g} to {after:.3g}"
    )


# Not compared on resume: the sections checked as the run's identity, the optimiser (its own line),
# and the data's hash a checkpoint records beside the config.
_NOT_SETTINGS = (*IDENTITY_SECTIONS, "optim", FINGERPRINT_KEY)


def setting_changes(saved: dict | None, current: dict) -> list[str]:
    """The run settings (outside the identity and ``optim``) a resume changes, "key: old → new", from
    the config the checkpoints carry and the one this run's will (``Run.saved_config``: its batch
    layout resolved)."""
    flat_old, flat_new = _flatten(saved or {}), _flatten(current)
    keys = sorted(k for k in set(flat_old) | set(flat_new) if k.split(".")[0] not in _NOT_SETTINGS)
    return [f"{k}: {flat_old.get(k)!r} → {flat_new.get(k)!r}" for k in keys if flat_old.get(k) != flat_new.get(k)]


def _flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def optim_changes(saved: dict | None, config) -> list[str]:
    """``optim`` fields that differ between a checkpoint's config and this run's."""
    old, new = (saved or {}).get("optim") or {}, to_json_dict(config)["optim"]
    if not old:
        return []
    return [f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
