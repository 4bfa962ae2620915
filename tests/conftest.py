"""Test setup: two simulated CPU devices (set before jax initialises its backend)."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_CLOZE = REPO.parent / "shared" / "data" / "storycloze_val_2016.csv"


@pytest.fixture
def cloze_path():
    if not SHARED_CLOZE.is_file():
        pytest.skip(f"shared Story Cloze data not found at {SHARED_CLOZE} (present in CI, absent on a fresh clone)")
    return str(SHARED_CLOZE)
