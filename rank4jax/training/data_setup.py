"""From a run config to tokenized windows for every split (the training side of the data layer)."""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from rank4jax.data import corpus, readers, tokenizers, windows
from rank4jax.errors import ConfigError, DataError
from rank4jax.training.run_config import tokenizer_options


@dataclasses.dataclass
class RunData:
    tokenizer: tokenizers.Tokenizer
    stories: dict[str, list[readers.Story]]  # split → stories
    windows: dict[str, windows.WindowSet]  # split → windows (W, T+1, N)
    source: str

    def summary(self) -> dict:
        return {
            "source": self.source,
            "vocab_size": self.tokenizer.vocab_size,
            **{f"{s}_stories": len(v) for s, v in self.stories.items()},
            **{f"{s}_windows": len(w) for s, w in self.windows.items()},
            "skipped_stories": sum(w.n_skipped for w in self.windows.values()),
        }


def load_stories(config: ml_collections.ConfigDict, path: str | None = None) -> tuple[list[readers.Story], str]:
    """The run's stories: the built-in corpus, ``data.path`` (several files separated by commas), or an
    explicit ``path`` that replaces it."""
    if not path and config.data.source == "builtin":
        return corpus.generate_stories(config.data.builtin_stories, seed=config.data.builtin_seed), "builtin"
    source = path or config.data.path
    fmt = "auto" if path else config.data.format
    stories = [story for p in source.split(",") if p.strip() for story in readers.read_stories(p.strip(), fmt)]
    return stories, source


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
    n, t = config.model.n_tokens, config.model.n_slices
    made = {name: windows.make_windows(split[name], tokenizer, n, t) for name in windows.SPLITS}
    if not len(made["train"]):
        longest = max(len(s.sentences) for s in stories)
        raise ConfigError(
            f"model.n_slices={t} needs stories of at least T+1={t + 1} sentences, "
            f"but the longest story in {source} has {longest}"
        )
    for name, ws in made.items():
        windows.check_token_ids(ws.windows, tokenizer.vocab_size, f"{source} ({name} windows)")
    return RunData(tokenizer, split, made, source)


def prepare_split(
    config: ml_collections.ConfigDict, tokenizer: tokenizers.Tokenizer, split: str, path: str | None = None
) -> tuple[list[readers.Story], windows.WindowSet, str]:
    """The stories and windows of one split with a saved tokenizer (evaluation): a split of the run's
    data (or of ``path``, split the same way), or ``split="all"``: every story, for an external test
    set such as an official Story Cloze file."""
    stories, source = load_stories(config, path)
    if split != "all":
        stories = windows.split_stories(stories, tuple(config.data.split), config.data.split_salt)[split]
    made = windows.make_windows(stories, tokenizer, config.model.n_tokens, config.model.n_slices)
    windows.check_token_ids(made.windows, tokenizer.vocab_size, f"{source} ({split} windows)")
    return stories, made, source


def validation_windows(data: RunData) -> np.ndarray:
    ws = data.windows["validation"].windows
    if not len(ws):
        raise DataError(f"{data.source}: the validation split has no windows; use more stories or change data.split")
    return ws
