"""Stories → int32 windows (T+1, N), and the deterministic train/validation/test split (SPEC §1).

Axes: W windows, T input slices (a window holds T+1 states), N tokens per state.
A state is one sentence encoded, truncated or PAD-padded to N tokens (no BOS/EOS). A story with
S sentences gives S-T windows (one per T+1 consecutive sentences); stories shorter than T+1 are
skipped and counted.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

import numpy as np

from rank4jax.data.readers import Story
from rank4jax.data.tokenizers import Tokenizer
from rank4jax.errors import DataError
from rank4jax.tokens import PAD_ID, UNK_ID

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class WindowSet:
    windows: np.ndarray  # (W, T+1, N) int32
    story_index: np.ndarray  # (W,) index of the source story in the input list
    n_skipped: int  # stories with fewer than T+1 sentences
    n_sentences: int = 0  # sentences of the stories that gave windows
    n_truncated: int = 0  # of those, sentences longer than N tokens (cut to N)

    @property
    def unk_rate(self) -> float:
        """Fraction of the windows' real (non-PAD) tokens that are UNK (0 for no tokens)."""
        real = int(np.count_nonzero(self.windows != PAD_ID))
        return int(np.count_nonzero(self.windows == UNK_ID)) / real if real else 0.0

    def __len__(self) -> int:
        return len(self.windows)


def encode_state(tokenizer: Tokenizer, sentence: str, n_tokens: int) -> np.ndarray:
    """One sentence → (N,) int32, truncated or PAD-padded."""
    ids = tokenizer.encode(sentence)[:n_tokens]
    state = np.full((n_tokens,), PAD_ID, dtype=np.int32)
    state[: len(ids)] = ids
    return state


def encode_story(tokenizer: Tokenizer, sentences: Sequence[str], n_tokens: int) -> np.ndarray:
    """(S, N) int32 for a story of S sentences."""
    return np.stack([encode_state(tokenizer, s, n_tokens) for s in sentences]).reshape(-1, n_tokens)


def make_windows(stories: Sequence[Story], tokenizer: Tokenizer, n_tokens: int, n_slices: int) -> WindowSet:
    """All windows of T+1 consecutive states of every story long enough."""
    windows, index, skipped, sentences, truncated = [], [], 0, 0, 0
    for i, story in enumerate(stories):
        if len(story.sentences) < n_slices + 1:
            skipped += 1
            continue
        ids = [tokenizer.encode(sentence) for sentence in story.sentences]
        sentences += len(ids)
        truncated += sum(len(x) > n_tokens for x in ids)
        states = np.full((len(ids), n_tokens), PAD_ID, np.int32)
        for row, x in zip(states, ids, strict=True):
            row[: min(len(x), n_tokens)] = x[:n_tokens]
        for start in range(len(states) - n_slices):
            windows.append(states[start : start + n_slices + 1])
            index.append(i)
    if windows:
        array = np.stack(windows).astype(np.int32)
    else:
        array = np.zeros((0, n_slices + 1, n_tokens), np.int32)
    return WindowSet(array, np.asarray(index, dtype=np.int64), skipped, sentences, truncated)


def cloze_windows(stories: Sequence[Story], tokenizer: Tokenizer, n_tokens: int, n_slices: int):
    """For Story Cloze stories: (W, 2, T+1, N) windows whose last state is each candidate ending,
    and the (W,) index of the right one. The context is the T sentences before the ending."""
    pairs, labels = [], []
    for story in stories:
        if story.endings is None or len(story.sentences) - 1 < n_slices:
            continue
        context = encode_story(tokenizer, story.sentences[-1 - n_slices : -1], n_tokens)
        pair = [np.concatenate([context, encode_state(tokenizer, e, n_tokens)[None]]) for e in story.endings]
        pairs.append(np.stack(pair))
        labels.append(story.right_ending)
    if not pairs:
        return np.zeros((0, 2, n_slices + 1, n_tokens), np.int32), np.zeros((0,), np.int32)
    return np.stack(pairs).astype(np.int32), np.asarray(labels, np.int32)


def trim_padding(windows: np.ndarray, multiple: int = 1) -> np.ndarray:
    """Cut the trailing token columns that are PAD in every state of every window of the batch.

    windows (B, T+1, N) → (B, T+1, N') with N' the smallest multiple of ``multiple`` (at most N)
    that keeps every non-PAD token, so a batch of short sentences costs N'/N of the full width.
    A batch holding a window whose first T states are all PAD is returned uncut (such a window
    has no token to attend to, and a model may treat it by its full width). ``multiple`` bounds
    the number of distinct shapes a jitted step sees to ⌈N / multiple⌉.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be at least 1, got {multiple}")
    n_tokens = windows.shape[2]
    used = np.any(windows != PAD_ID, axis=(0, 1))  # (N,) columns holding a token anywhere
    if not used.any() or not np.all(np.any(windows[:, :-1] != PAD_ID, axis=(1, 2))):
        return windows
    n_keep = min(n_tokens, -(-(int(np.flatnonzero(used)[-1]) + 1) // multiple) * multiple)
    return windows[:, :, :n_keep]


def check_token_ids(array: np.ndarray, vocab_size: int, what: str) -> None:
    """DataError naming the first id outside [0, vocab_size)."""
    bad = np.argwhere((array < 0) | (array >= vocab_size))
    if len(bad):
        where = tuple(int(i) for i in bad[0])
        raise DataError(
            f"{what}: token id {int(array[where])} at index {where} is outside the vocabulary (size {vocab_size})"
        )


def split_fraction(story_id: str, salt: str = "") -> float:
    """A stable uniform number in [0, 1) from the story id (SHA-256, independent of Python's hash)."""
    digest = hashlib.sha256((salt + story_id).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_of(story_id: str, fractions: Sequence[float] = (0.8, 0.1, 0.1), salt: str = "") -> str:
    """'train', 'validation' or 'test' for a story id, by a stable hash."""
    if len(fractions) != 3 or any(f < 0 for f in fractions) or not np.isclose(sum(fractions), 1.0):
        raise DataError(f"split fractions must be three non-negative numbers summing to 1, got {tuple(fractions)}")
    u = split_fraction(story_id, salt)
    if u < fractions[0]:
        return "train"
    return "validation" if u < fractions[0] + fractions[1] else "test"


def split_stories(stories: Sequence[Story], fractions: Sequence[float] = (0.8, 0.1, 0.1), salt: str = "") -> dict:
    """{split: [stories]} by :func:`split_of` on each story id."""
    out = {name: [] for name in SPLITS}
    for story in stories:
        out[split_of(story.story_id, fractions, salt)].append(story)
    return out
