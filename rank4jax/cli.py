"""Helpers shared by the command-line entry points."""

from __future__ import annotations

import contextlib
import sys

from rank4jax.errors import StageInterrupted, UserError


def run_reporting_user_errors(fn, *args, **kwargs):
    """Run ``fn``; a :class:`UserError` becomes one line on stderr and exit status 2 (no traceback);
    an interrupted stage of a multi-stage command one line and 130 (SIGINT) or 143 (SIGTERM)."""
    try:
        return fn(*args, **kwargs)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except StageInterrupted as e:
        print(f"stopped: {e}", file=sys.stderr)
        sys.exit(e.status)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flags parser for ``app.run(..., flags_parser=parse_flags)``: a bad flag or an unknown
    ``--config.<key>`` override becomes one line on stderr and exit status 2."""
    from absl import flags

    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}\nPass --help for usage.", file=sys.stderr)
    except (AttributeError, KeyError) as e:
        _unknown_config_key(e, argv)
    sys.exit(2)


def _unknown_config_key(error: Exception, argv: list[str]) -> None:
    key = str(error).strip("\"'")
    culprit = next((a for a in argv[1:] if a.startswith("--config.") and key in a), None)
    where = f" in {culprit.split('=')[0]}" if culprit else ""
    print(f"error: unknown config key {key!r}{where}; see the config file for valid keys", file=sys.stderr)


@contextlib.contextmanager
def config_flag_errors():
    """Around ``config_flags.DEFINE_config_file``: ml_collections applies ``--config.<key>`` overrides
    while defining the flag and raises AttributeError/KeyError for a key the config lacks."""
    try:
        yield
    except (AttributeError, KeyError) as e:
        _unknown_config_key(e, sys.argv)
        sys.exit(2)


def config_value(holder):
    """The ConfigDict of a ``DEFINE_config_file`` flag; a file that fails to load is a ConfigError."""
    from rank4jax.errors import ConfigError

    try:
        config = holder.value
        _ = config.model_family  # a config file that failed to load reports it on first access
    except OSError as e:
        detail = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
        detail = detail.replace("Configuration is not available because of an earlier failure to load: ", "")
        raise ConfigError(f"cannot load the config file: {detail}") from None
    return config
