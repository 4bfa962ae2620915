"""What the entry points share: one line and a status for every way a command ends early: a user error
``error: <message>`` (2), Ctrl-C ``stopped: Ctrl-C <what is saved>`` (130), SIGTERM ``stopped: <message>``
(143); a bad flag is absl's own message (2), a config file or override the project's own check."""

from __future__ import annotations

import contextlib
import difflib
import importlib.util
import logging
import os
import sys

import ml_collections

from rank4jax import signals
from rank4jax.errors import ConfigError, StageInterrupted, StorageFaultsSaidOnce, UserError, say, terminal_safe

CONFIG_FLAGS = ("config", "rank4_config", "baseline_config", "baseline_wide_config")  # the commands' config files


def run_command(fn, stopped: str = "; nothing was saved"):
    """``fn()`` as a command's body, ending early as the module docstring says. ``stopped``: what a Ctrl-C
    line says is saved (or a callable giving it then, e.g. a run's latest checkpoint)."""
    for name in ("absl", "asyncio"):  # a disk filled during a save: the save's error says it once
        logging.getLogger(name).addFilter(StorageFaultsSaidOnce())
    try:
        with signals.noted():
            result = fn()
            signals.check()  # noted after the last check: the work is done, the command still stops
        return result
    except UserError as e:
        say(f"error: {e}")
        sys.exit(2)
    except StageInterrupted as e:
        say(f"stopped: {e}")
        sys.exit(e.status)
    except KeyboardInterrupt:
        say(f"stopped: Ctrl-C{stopped() if callable(stopped) else stopped}")
        sys.exit(130)


def run_experiment(what: str, fn):
    """:func:`run_command` for an experiment: its finished runs are kept, and a rerun resumes the rest."""
    return run_command(fn, f" during the {what}; rerun the same command to resume (finished runs are kept)")


def no_arguments(argv: list[str]) -> None:
    """A command takes flags only: a list flag written with spaces (``--widths=8, 16``) is one line, 2."""
    if len(argv) > 1:
        say(f"error: unexpected arguments {argv[1:]}: flags take their values after '=', a list's without spaces "
            "(--widths=64,128)")  # fmt: skip
        sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parser for ``app.run(..., flags_parser=parse_flags)``: a bad flag is absl's own message on one
    line (``error: ...``), status 2, instead of its ``FATAL`` line."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        say(f"error: {terminal_safe(str(e))}\nPass --help for usage.")
        sys.exit(2)


def config_file_arguments(argv: list[str]) -> dict[str, str]:
    """``{flag: path}`` of the config files on a command line (``--config=f.py`` or ``--config f.py``)."""
    found = {}
    for i, arg in enumerate(argv[1:], start=1):
        name, eq, value = arg.removeprefix("--").partition("=")
        if arg.startswith("--") and name in CONFIG_FLAGS:
            found[name] = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return found


def config_file_refusal(flag: str, path: str) -> str | None:
    """Why ``path`` cannot be a config file (missing, a directory, not Python), or None."""
    if not os.path.exists(path):
        return f"--{flag}: no such config file: {path}"
    if os.path.isdir(path):
        return f"--{flag}: {path} is a directory, not a config file (a configs/*.py file)"
    if not path.endswith(".py"):
        return f"--{flag}: {path} is not a Python config file (a configs/*.py file with get_config())"
    return None


def config_refusal(flag: str, path: str, argv: list[str]) -> str | None:
    """The project's check of a config file named or overridden on the command line: one that cannot be
    (:func:`config_file_refusal`), one without ``get_config()``, or a ``--<flag>.<key>=`` override of a
    key it lacks (with the closest); None when fine. The file runs as ml_collections runs it: what its
    own code raises keeps its traceback."""
    overrides = [a.removeprefix(f"--{flag}.").partition("=")[0] for a in argv[1:] if a.startswith(f"--{flag}.")]
    if not overrides and flag not in config_file_arguments(argv):
        return None
    if refusal := config_file_refusal(flag, path):
        return refusal
    spec = importlib.util.spec_from_file_location(f"{flag}_check", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_config", None)):
        return f"config file {path} defines no get_config() (it must return an ml_collections.ConfigDict)"
    config = module.get_config()
    for key in overrides:
        node, parts = config, key.split(".")
        for depth, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node:
                known = [".".join([*parts[:depth], k]) for k in node.keys()] if hasattr(node, "keys") else []
                close = difflib.get_close_matches(key, known, n=1, cutoff=0.8)
                hint = f" (did you mean {close[0]}?)" if close else ""
                return f"unknown config key '{key}' in --{flag}.{key}{hint}; train.py --print_config lists every key"
            node = node[part]
    return None


@contextlib.contextmanager
def config_flag_errors(**defaults):
    """Around ``config_flags.DEFINE_config_file`` (ml_collections loads the file there when overridden):
    each config file (``defaults``: flag → its default file) is checked first, a refusal one line, 2."""
    for flag, path in ({f: p for f, p in defaults.items() if p} | config_file_arguments(sys.argv)).items():
        refusal = config_refusal(flag, path, sys.argv)
        if refusal:
            say(f"error: {refusal}")
            sys.exit(2)
    yield


def config_value(holder):
    """The ConfigDict of a ``DEFINE_config_file`` flag, or one ConfigError saying what it is not."""
    try:
        config = holder.value
    except OSError as e:  # a default config file not found from here (ml_collections loads it lazily)
        raise ConfigError(f"cannot load the config file ({' '.join(str(e).split())}); name one with --config") from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(f"the config file's get_config() returned {type(config).__name__}, not an "
                          "ml_collections.ConfigDict")  # fmt: skip
    if "model_family" not in config:
        raise ConfigError("the config file's ConfigDict has no model_family (start from configs/default.py)")
    return config
