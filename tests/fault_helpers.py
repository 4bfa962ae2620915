"""What the fault tests share: the tiny run as flags, a fresh interpreter, kinds of checkpoint damage,
ROCStories text and the files that are not stories."""

import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from rank4jax.checkpoint import storage
from rank4jax.runs import describe_run, load_run
from rank4jax.training import workdir_lock
from tests.conftest import REPO, SUBPROCESS_XLA_FLAGS
from tests.helpers import free_port, tiny_config, tiny_flags  # noqa: F401 -- re-exported

TINY_FLAGS = tiny_flags()  # the tiny run (tests/helpers.TINY) as command-line flags


def _start(args, **kwargs):
    """A fresh interpreter, for the tests that read its output as it comes or signal it while it imports."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=SUBPROCESS_XLA_FLAGS)
    return subprocess.Popen(
        [sys.executable, *args], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs
    )


def _jaxlib_loaded(pid) -> bool:
    """jaxlib's library is mapped into the process: it is importing the libraries."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
            return "jaxlib" in f.read()
    except OSError:
        return False


def _holder_pid(workdir) -> int | None:
    try:
        with open(os.path.join(workdir, workdir_lock.LOCK_FILE), encoding="utf-8") as f:
            return json.load(f)["pid"]
    except (OSError, ValueError, KeyError):
        return None


DAMAGE = {  # what each does to a checkpoint's files (orbax's layout: the tests may know it, rank4jax does not)
    "truncated_arrays": lambda s: [_truncate(f) for f in glob.glob(f"{s}/*/ocdbt.process_0/d/*")],
    "missing_arrays": lambda s: [os.remove(f) for f in glob.glob(f"{s}/*/ocdbt.process_0/d/*")],
    "empty_config": lambda s: open(f"{s}/config/metadata", "w").close(),
    "empty_manifest": lambda s: [open(f, "w").close() for f in glob.glob(f"{s}/**/manifest.ocdbt", recursive=True)],
    "empty_array_metadata": lambda s: [open(f"{s}/{item}/_METADATA", "w").close() for item in ("params", "opt_state")],
    "missing_tokenizer": lambda s: shutil.rmtree(f"{s}/tokenizer"),
    "empty_step_dir": lambda s: (shutil.rmtree(s), os.makedirs(s)),
}


# A restore that fails on a damaged checkpoint abandons TensorStore's other reads; their callbacks may
# find orbax's event loop closed and print "Exception ignored" (a library's lines in a rare fault, which
# the product lets through with its own line about the checkpoint after them). Not this suite's output.
LIBRARY_LINES_OF_A_DAMAGED_READ = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _truncate(path):  # to 16 bytes: every array's data is cut (half a file may still hold the parameters)
    with open(path, "r+b") as f:
        f.truncate(min(16, os.path.getsize(path)))


def _params(workdir, step):
    return load_run(str(workdir), step).params


def restore_state_numpy(workdir, step):
    """The whole train state of a checkpoint (with its own optimiser structure)."""
    with storage.RunCheckpoints(str(workdir), read_only=True) as ckpt:
        run = describe_run(ckpt, step)
        return ckpt.restore_state(step, run.abstract_state)


ROC_HEADER = "storyid,storytitle,sentence1,sentence2,sentence3,sentence4,sentence5\r\n"


ROC_ROW = "s{i},Title,Anna went to the café.,She ordered tea.,It was hot.,She waited.,Then she drank it.\r\n"


def _roc_text(rows=3):
    return ROC_HEADER + "".join(ROC_ROW.format(i=i) for i in range(rows))


BAD_FILES = {
    "json.json": (b'[{"story": "Anna went out."}]', "looks like JSON (detected from its name)"),
    "json.txt": (b'{"story": "Anna went out."}\n', "looks like JSON (detected from its first character)"),
    "sheet.csv": (b"PK\x03\x04" + bytes(200), "not a text file (detected: a zip archive (an .xlsx/.ods spreadsheet"),
    "data.bin": (b"Anna went out.\nShe came back.\n\x00\x01\x02" + bytes(range(256)) * 60, "a NUL byte on line 3"),
    "stories.gz": (b"\x1f\x8b\x08" + bytes(100), "gzip-compressed: decompress it first"),
    "mixed.txt": (b"Anna went out.\nShe \x81came back.\n", "line 2: neither UTF-8 nor Windows-1252 text (byte 0x81)"),
    # binary named .csv: read as a file, not as a header of mojibake ("unrecognised CSV header ['t3��']")
    "random.csv": (b"t3\xe9\xfe\xe2,\n\x04" + bytes(range(256)) * 4, "a NUL byte on line 2"),
    "no_nul.csv": (
        b"t3\x9b\xe9\n" + bytes(range(1, 256)) * 4,
        "line 1: neither UTF-8 nor Windows-1252 text (byte 0x9b)",
    ),
    "control.csv": (b"\x01\x02\x03,\x04\n", "not a text file (detected: unprintable characters in its first line)"),
    "empty.csv": (b"", "the file is empty"),
    "empty.txt": (b"", "the file is empty"),
}


def _mount_namespaces() -> bool:
    """Whether this machine lets a test mount a tmpfs in a private mount namespace (root, unshare)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    probe = ["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"]
    return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0


def _bytes(size: str) -> float:
    """'290 KB' or '1.4 MB' (a storage error's figure) in bytes."""
    number, unit = size.split()
    return float(number) * {"KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
