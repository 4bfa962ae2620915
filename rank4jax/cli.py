"""Helpers shared by the command-line entry points."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import traceback

from rank4jax.errors import SIGNAL_STATUS, StageInterrupted, UserError, interrupt, say
from rank4jax.startup import exit_on_signals


def run_reporting_user_errors(fn, *args, **kwargs):
    """Run ``fn``; a :class:`UserError` becomes one line on stderr and exit status 2 (no traceback);
    an interrupted stage of a multi-stage command one line and 130 (SIGINT) or 143 (SIGTERM)."""
    try:
        return fn(*args, **kwargs)
    except UserError as e:
        say(f"error: {e}")
        sys.exit(2)
    except StageInterrupted as e:
        say(f"stopped: {e}")
        exit_after_signal(e.status)


def exit_after_signal(status: int) -> None:
    """Exit with a signal's status (130/143) once what was in flight is safe: at once, not through the
    interpreter's shutdown, where the libraries' threads (XLA, TensorStore) are joined under it and
    Python has put the default handlers back, so a second signal would kill the process (-15)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def terminal_safe(text: str) -> str:
    """``text`` with its control characters (a vocabulary's terminal escape sequences, say) shown as
    escapes instead of reaching the terminal raw."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags parser for ``app.run(..., flags_parser=parse_flags)``: a bad flag or an unknown
    ``--config.<key>`` override becomes one line on stderr and exit status 2. A config file is the
    user's own Python: an exception it raises shows its traceback (as ml_collections formats it into
    the flag error, or as Python prints it)."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        traced = "Traceback (most recent call last)" in str(e)  # a config file raised: its traceback as is
        say(f"error: {e}" if traced else f"error: {e}\nPass --help for usage.")
    except Exception as e:  # noqa: BLE001 -- an unknown override key: one line; a config file's own error: raised
        _flag_exception(e, argv)
    sys.exit(2)


def _raised_in_config_file(error: BaseException, argv: list[str]) -> bool:
    """Whether the exception comes from a config file's own code (a frame in it, or its syntax)."""
    files = {os.path.abspath(path) for path in config_file_arguments(argv).values()}
    if isinstance(error, SyntaxError) and error.filename and os.path.abspath(error.filename) in files:
        return True
    return any(os.path.abspath(frame.filename) in files for frame in traceback.extract_tb(error.__traceback__))


def _missing_get_config(error: BaseException, argv: list[str]) -> str | None:
    """The config file named on the command line that defines no ``get_config``, behind ``error``
    (ml_collections loads the file of flag ``--<name>`` as module ``<name>_config``)."""
    match = re.search(r"module '(\w+)_config' has no attribute 'get_config'", str(error))
    return config_file_arguments(argv).get(match.group(1)) if match else None


def _flag_exception(error: BaseException, argv: list[str]) -> None:
    if _raised_in_config_file(error, argv):
        raise error  # the user's own code: its traceback
    missing = _missing_get_config(error, argv)
    if missing:
        say(f"error: config file {missing} defines no get_config() (it must return an ml_collections.ConfigDict)")
    elif isinstance(error, (AttributeError, KeyError)):
        _unknown_config_key(error, argv)
    else:
        raise error


def _unknown_config_key(error: Exception, argv: list[str]) -> None:
    """One plain line for an override of a key the config lacks (ml_collections wraps a KeyError whose
    text is the quoted key and, maybe, a line suggesting the closest one)."""
    while isinstance(error, AttributeError | KeyError) and error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]
    text = str(error.args[0]) if error.args else str(error)
    first, _, hint = text.partition("\n")
    key = first.strip("\"' ")
    culprit = next((a for a in argv[1:] if a.startswith("--config.") and key in a), None)
    where = f" in {culprit.split('=')[0]}" if culprit else ""
    hint = f" ({hint.strip().rstrip('?')}?)" if hint.strip() else ""
    say(f"error: unknown config key '{key}'{where}{hint}; train.py --print_config lists every key")


CONFIG_FLAGS = ("config", "rank4_config", "baseline_config", "baseline_wide_config")  # the commands' config files


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


@contextlib.contextmanager
def config_flag_errors():
    """Around ``config_flags.DEFINE_config_file``: a config file that cannot be one is refused first
    (ml_collections loads it while defining the flag when ``--config.<key>`` overrides are given, and
    would raise from deep inside), then AttributeError/KeyError for a key the config lacks."""
    for flag, path in config_file_arguments(sys.argv).items():
        refusal = config_file_refusal(flag, path)
        if refusal:
            say(f"error: {refusal}")
            sys.exit(2)
    try:
        yield
    except Exception as e:  # noqa: BLE001
        _flag_exception(e, sys.argv)
        sys.exit(2)


def config_value(holder):
    """The ConfigDict of a ``DEFINE_config_file`` flag; a file that fails to load is a ConfigError."""
    import ml_collections

    from rank4jax.errors import ConfigError

    config = holder.value
    try:
        _ = config.model_family  # a config file that failed to load reports it on first access
    except OSError as e:
        detail = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        detail = detail.replace("Configuration is not available because of an earlier failure to load: ", "")
        raise ConfigError(f"cannot load the config file: {detail}") from None
    except AttributeError:
        pass
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(
            f"the config file's get_config() returned {type(config).__name__}, not an ml_collections.ConfigDict"
        )
    if "model_family" not in config:
        raise ConfigError("the config file's ConfigDict has no model_family (start from configs/default.py)")
    return config


@contextlib.contextmanager
def stop_on_signals(what: str, after: str = "no report was written after it"):
    """SIGINT/SIGTERM during a command that has nothing to save (evaluation), or whose training stages
    save on their own (experiments): one line on stderr (``stopped: <SIGNAL> during <what>; <after>``)
    and exit status 130/143, no traceback. The signal is recorded before it interrupts, so an interrupt
    that a library catches and swallows (or that lands in a finalizer, where Python only prints it as
    "Exception ignored") still stops the command when the block ends, saying that the block finished."""
    received, finished = [], False

    def handler(signum, frame):
        received.append(signum)
        interrupt(signum, frame, KeyboardInterrupt())

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
        finished = True
    except KeyboardInterrupt as e:  # a run that was starting (SignalInterrupt: which signal), or a Ctrl-C
        received.append(getattr(e, "signum", signal.SIGINT))  # that arrived before the handler
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if received:
        name = signal.Signals(received[0]).name
        say(f"stopped: {name} after the {what} had finished; its output is written" if finished
            else f"stopped: {name} during {what}; {after}")  # fmt: skip
        exit_after_signal(SIGNAL_STATUS[name])  # nothing is left to save


def run_experiment(what: str, fn):
    """The body of an experiment command (compare, ladder, zpx_plan, splm_report, cloze_contexts): a
    user error is one line (status 2); a training stage stopped by a signal saves, then one line
    (its own, 130/143); a signal anywhere else (setting up, compiling, evaluating) one line with the
    resume hint. Afterwards, a signal while the results print says that they are complete."""
    with stop_on_signals(what, after="rerun the same command to resume (finished runs are kept)"):
        result = run_reporting_user_errors(fn)
    exit_on_signals(f"after the {what} had finished; its results are written")
    return result
