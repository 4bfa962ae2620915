"""The one writer of every file a command writes under a workdir. No component below the workdir may be a
symbolic link, and a file written over must be a regular file with one hard link; files are written
atomically (a temporary beside, then a rename) as the user's umask says; a refusal is one WorkdirError,
raised before anything is written."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import stat

import numpy as np

from rank4jax.errors import WorkdirError

REFUSED = "a run writes only its own files and folders: remove it, or use another --workdir; nothing was changed"


def _parts(relative: str) -> list[str]:
    return [p for p in os.path.normpath(relative).split(os.sep) if p not in ("", ".")]


def path_in(workdir: str, relative: str, file: bool = False) -> str:
    """``workdir/relative`` once each component below ``workdir`` is checked: no symbolic link, every
    parent a directory, the last (if it exists) a regular file with one hard link or (unless ``file``) a
    directory."""
    path, parts = workdir, _parts(relative)
    if ".." in parts:
        raise WorkdirError(f"{relative} is not below the workdir {workdir}")
    for n, part in enumerate(parts):
        path, last = os.path.join(path, part), n == len(parts) - 1
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(info.st_mode):
            raise WorkdirError(f"{path} is a symbolic link (to {os.readlink(path)}); {REFUSED}")
        if not ((stat.S_ISDIR(info.st_mode) and not (last and file)) or (last and stat.S_ISREG(info.st_mode))):
            raise WorkdirError(f"{path} is not a {'regular file' if last else 'directory'}; nothing was changed")
        if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
            raise WorkdirError(f"{path} is a hard link ({info.st_nlink} names share its file); {REFUSED}")
    return os.path.join(workdir, *parts)


def make_dirs(workdir: str, relative: str = "") -> str:
    """Create ``workdir`` and ``workdir/relative`` directory by directory (each checked); its path."""
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as e:
        raise WorkdirError(f"cannot create the workdir {workdir}: {e.strerror}") from None
    done = ""
    for part in _parts(relative):
        done = os.path.join(done, part)
        path = path_in(workdir, done)
        try:
            os.mkdir(path)  # 0777 less the umask
        except FileExistsError:
            path_in(workdir, done)  # raced: it must still be a directory of its own
        except OSError as e:
            raise WorkdirError(f"cannot create {path}: {e.strerror}") from None
    return os.path.join(workdir, *_parts(relative))


def write_bytes(workdir: str, relative: str, data: bytes) -> str:
    """Write ``data`` to ``workdir/relative`` atomically; its path."""
    path = path_in(workdir, relative, file=True)
    make_dirs(workdir, os.path.dirname(relative))
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise WorkdirError(f"cannot write {path}: {e.strerror}") from None
        raise
    return path


def write_text(workdir: str, relative: str, text: str) -> str:
    return write_bytes(workdir, relative, text.encode("utf-8"))


def write_json(workdir: str, relative: str, data, default=None) -> str:
    """``data`` as indented JSON (``default``: as ``json.dumps`` takes it)."""
    return write_text(workdir, relative, json.dumps(data, indent=2, default=default))


def save_figure(fig, workdir: str, relative: str, **options) -> str:
    """A matplotlib figure as a PNG, rendered in memory (``savefig`` would follow a link)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **options)
    return write_bytes(workdir, relative, buffer.getvalue())


def save_npz(workdir: str, relative: str, **arrays) -> str:
    """numpy arrays as a compressed ``.npz``, built in memory."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    return write_bytes(workdir, relative, buffer.getvalue())


def open_own(workdir: str, relative: str, flags: int) -> int:
    """A descriptor of ``workdir/relative`` (created when absent; never through a link or a FIFO's wait)
    that must be a regular file with one hard link: the lock and the metrics log, written in place."""
    path = path_in(workdir, relative, file=True)
    make_dirs(workdir, os.path.dirname(relative))
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as e:
        raise WorkdirError(f"cannot write {path}: {e.strerror}; nothing was changed") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
        os.close(fd)
        raise WorkdirError(f"{path} is {'a hard link' if stat.S_ISREG(info.st_mode) else 'not a regular file'}; "
                           f"{REFUSED}")  # fmt: skip
    return fd


def append_line(workdir: str, relative: str, line: str) -> None:
    """Append one line (a metrics record) to ``workdir/relative``."""
    try:
        with os.fdopen(open_own(workdir, relative, os.O_WRONLY | os.O_APPEND), "a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as e:
        raise WorkdirError(f"cannot write {os.path.join(workdir, relative)}: {e.strerror}") from None
