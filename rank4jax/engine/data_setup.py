"""From a run config to tokenized windows for every split (the training side of the data layer)."""

from __future__ import annotations

import collections
import dataclasses

import ml_collections
import numpy as np

from rank4jax.data import corpus, readers, tokenizers, windows
from rank4jax.engine import sharding
from rank4jax.engine.run_config import tokenizer_options
from rank4jax.errors import ConfigError, DataError, say


@dataclasses.dataclass
class RunData:
    tokenizer: tokenizers.Tokenizer
    stories: dict[str, list[readers.Story]]  # split → stories
    windows: dict[str, windows.WindowSet]  # split → windows (W, T+1, N)
    source: str

    duplicate_ids: int = 0  # stories whose id an earlier story already had

    def summary(self) -> dict:
        sentences = sum(w.n_sentences for w in self.windows.values())
        return {
            "source": self.source,
            "vocab_size": self.tokenizer.vocab_size,
            **{f"{s}_stories": len(v) for s, v in self.stories.items()},
            **{f"{s}_windows": len(w) for s, w in self.windows.items()},
            "skipped_stories": sum(w.n_skipped for w in self.windows.values()),
            "duplicate_ids": self.duplicate_ids,
            "truncated_sentences": sum(w.n_truncated for w in self.windows.values()),
            "truncated_fraction": round(sum(w.n_truncated for w in self.windows.values()) / max(sentences, 1), 4),
            **{f"unk_rate_{s}": round(w.unk_rate, 4) for s, w in self.windows.items()},
        }


MIN_REAL_TOKENS = 5  # a vocabulary with fewer real tokens (besides PAD/UNK/BOS/EOS) cannot be learnt from
WARN_TRUNCATED = 0.05  # warn when more than this fraction of sentences are cut to N tokens
WARN_UNK = 0.10  # warn when more than this fraction of a split's tokens are UNK


def _warn(message: str) -> None:
    say(f"rank4jax: warning: {message}")


def data_warnings(source: str, made: dict, n_tokens: int, duplicates: int = 0, n_stories: int = 0) -> None:
    """Warnings (stderr) for data that is valid but degenerate: many sentences cut to N tokens, many
    unknown tokens, duplicate story ids."""
    sentences = sum(w.n_sentences for w in made.values())
    truncated = sum(w.n_truncated for w in made.values())
    if sentences and truncated / sentences > WARN_TRUNCATED:
        _warn(
            f"{source}: {truncated:,} of {sentences:,} sentences ({truncated / sentences:.0%}) are longer than "
            f"model.n_tokens={n_tokens} tokens and are cut; raise model.n_tokens"
        )
    for name, ws in made.items():
        if len(ws) and ws.unk_rate > WARN_UNK:
            which = "of all the tokens" if name == "all" else f"of the {name} split's tokens"
            _warn(f"{source}: {ws.unk_rate:.0%} {which} are unknown to the vocabulary (UNK)")
    if duplicates:
        _warn(
            f"{source}: {duplicates:,} of {n_stories:,} stories repeat an earlier story's id (kept; they share a split)"
        )


def load_stories(config: ml_collections.ConfigDict, path: str | None = None) -> tuple[list[readers.Story], str]:
    """The run's stories: the built-in corpus, ``data.path`` (several files separated by commas), or an
    explicit ``path`` that replaces it."""
    if not path and config.data.source == "builtin":
        return corpus.generate_stories(config.data.builtin_stories, seed=config.data.builtin_seed), "builtin"
    source = path or config.data.path
    fmt = "auto" if path else config.data.format
    stories = [story for p in source.split(",") if p.strip() for story in readers.read_stories(p.strip(), fmt)]
    return stories, source


def check_windows_fit(stories, n_tokens: int, n_slices: int) -> None:
    """A ConfigError, before anything is allocated, when the stories' windows (int32, T+1 states of N
    tokens) would take more than this machine's memory (``model.n_tokens`` = 10⁷ failed deep in numpy)."""
    n_windows = sum(max(0, len(story.sentences) - n_slices) for story in stories)
    needed, memory = n_windows * (n_slices + 1) * n_tokens * 4, sharding.host_memory_bytes()
    if memory and needed > memory:
        raise ConfigError(
            f"model.n_tokens={n_tokens:,}: the {n_windows:,} windows of {n_slices + 1} states of {n_tokens:,} tokens "
            f"need {needed / 2**30:,.1f} GiB, more than this machine's {memory / 2**30:,.1f} GiB; lower model.n_tokens"
        )


def prepare_data(
    config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer | None = None, path: str | None = None
) -> RunData:
    """Read, split, tokenize (building the tokenizer on the training split unless given) and window."""
    stories, source = load_stories(config, path)
    split = windows.split_stories(stories, tuple(config.data.split), config.data.split_salt)
    if not split["train"]:
        raise DataError(f"{source}: the training split is empty ({len(stories)} stories in all)")
    if tokenizer is None:
        # The paper builds its vocabulary over the whole pool ("all"); the default is the training split.
        pool = stories if config.tokenizer.build_on == "all" else split["train"]
        texts = [s for story in pool for s in story.sentences]
        tokenizer = tokenizers.build_tokenizer(config.tokenizer.kind, texts, **tokenizer_options(config))
        real = tokenizer.vocab_size - len(tokenizers.SPECIAL_TOKENS)
        if real < MIN_REAL_TOKENS:
            raise DataError(
                f"{source}: the vocabulary built from {len(texts):,} training sentences has {real} token(s) besides "
                f"PAD/UNK/BOS/EOS (at least {MIN_REAL_TOKENS} needed); lower tokenizer.min_count or use more data"
            )
    n, t = config.model.n_tokens, config.model.n_slices
    check_windows_fit(stories, n, t)
    made = {name: windows.make_windows(split[name], tokenizer, n, t) for name in windows.SPLITS}
    if not len(made["train"]):
        longest = max(len(s.sentences) for s in stories)
        raise ConfigError(
            f"model.n_slices={t} needs stories of at least T+1={t + 1} sentences, "
            f"but the longest story in {source} has {longest}"
        )
    for name, ws in made.items():
        windows.check_token_ids(ws.windows, tokenizer.vocab_size, f"{source} ({name} windows)")
    duplicates = sum(count - 1 for count in collections.Counter(s.story_id for s in stories).values())
    data_warnings(source, made, n, duplicates, len(stories))
    return RunData(tokenizer, split, made, source, duplicates)


def prepare_split(
    config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer, split: str, path: str | None = None
) -> tuple[list[readers.Story], windows.WindowSet, str]:
    """The stories and windows of one split with a saved tokenizer (evaluation): a split of the run's
    data (or of ``path``, split the same way), or ``split="all"``: every story, for an external test
    set such as an official Story Cloze file."""
    stories, source = load_stories(config, path)
    if split != "all":
        stories = windows.split_stories(stories, tuple(config.data.split), config.data.split_salt)[split]
    check_windows_fit(stories, config.model.n_tokens, config.model.n_slices)
    made = windows.make_windows(stories, tokenizer, config.model.n_tokens, config.model.n_slices)
    windows.check_token_ids(made.windows, tokenizer.vocab_size, f"{source} ({split} windows)")
    data_warnings(source, {split: made}, config.model.n_tokens)
    return stories, made, source


def validation_windows(data: RunData) -> np.ndarray:
    ws = data.windows["validation"].windows
    if not len(ws):
        raise DataError(f"{data.source}: the validation split has no windows; use more stories or change data.split")
    return ws


def _context_text(story: readers.Story, n_slices: int) -> str:
    return " ".join(" ".join(story.sentences[:n_slices]).lower().split())


def check_held_out(
    config: ml_collections.ConfigDict, stories, split: str, path: str | None = None, *, warn: bool = True
) -> int | None:
    """How many of the evaluated ``stories`` (a split of ``path``, or ``split="train"``/``"all"`` of the
    run's own data) are stories the run trained on — the same story id, or the same first T sentences
    as a story of its training split — with one warning naming the count (``warn``); 0 for the run's own
    validation and test splits (disjoint by construction), None when the run's data cannot be read."""
    if path is None and split in ("validation", "test"):
        return 0
    try:
        own, _ = load_stories(config)
    except (DataError, OSError):
        return None
    train = windows.split_stories(own, tuple(config.data.split), config.data.split_salt)["train"]
    t = config.model.n_slices
    ids, texts = {s.story_id for s in train}, {_context_text(s, t) for s in train}
    count = sum(s.story_id in ids or _context_text(s, t) in texts for s in stories)
    if count and warn:
        _warn(
            f"{count:,} of the {len(stories):,} evaluated stories are stories this run trained on (the same story "
            f"id, or the same first {t} sentences, as one of its training split): their figures are not held out"
        )
    return count
