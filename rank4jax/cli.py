"""Helpers shared by the command-line entry points."""

from __future__ import annotations

import sys

from rank4jax.errors import UserError


def run_reporting_user_errors(fn, *args, **kwargs):
    """Run ``fn``; a :class:`UserError` becomes one line on stderr and exit status 2 (no traceback)."""
    try:
        return fn(*args, **kwargs)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
