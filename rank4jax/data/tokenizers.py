"""Tokenizers behind one interface, both with PAD=0, UNK=1, BOS=2, EOS=3 (SPEC §1).

- :class:`WordTokenizer`: a word-level vocabulary built from a corpus (the paper's choice;
  36,711 types over the ROCStories pool), with min-count and lowercase options.
- :class:`SentencePieceTokenizer`: a sentencepiece model trained on the training split, with the
  special ids and the random seed set explicitly.

Both save to and load from a directory (``tokenizer.json`` plus, for sentencepiece, ``spm.model``);
:func:`load_tokenizer` restores either.
"""

from __future__ import annotations

import base64
import collections
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Protocol

import sentencepiece as spm

from rank4jax.errors import DataError
from rank4jax.tokens import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, UNK_ID

META_FILE = "tokenizer.json"
SPM_FILE = "spm.model"

_WORD = re.compile(r"\w+(?:'\w+)*|[^\w\s]")
_NO_SPACE_BEFORE = re.compile(r"^(?:[.,!?;:%)\]}]|'\w*)$")
_NO_SPACE_AFTER = frozenset("([{$")


class Tokenizer(Protocol):
    """The interface the data pipeline uses."""

    kind: str

    def to_dict(self) -> dict: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def pieces(self, text: str) -> list[tuple[str, int]]: ...

    def piece(self, token_id: int) -> str: ...

    def save(self, directory: str) -> None: ...


def _write_meta(directory: str, meta: dict) -> None:
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, META_FILE + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, ensure_ascii=False)
    os.replace(tmp, os.path.join(directory, META_FILE))


class WordTokenizer:
    """Word-level vocabulary: specials, then word types by descending count (ties alphabetical)."""

    kind = "word"

    def __init__(self, tokens: Sequence[str], lowercase: bool = False):
        if tuple(tokens[:4]) != SPECIAL_TOKENS:
            raise DataError(f"word vocabulary must start with {SPECIAL_TOKENS}, got {tuple(tokens[:4])}")
        self.tokens = list(tokens)
        self.lowercase = lowercase
        self._index = {t: i for i, t in enumerate(self.tokens)}

    @classmethod
    def build(cls, texts: Iterable[str], min_count: int = 1, lowercase: bool = False, max_size: int | None = None):
        counts = collections.Counter()
        for text in texts:
            counts.update(cls.split(text, lowercase))
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        if max_size is not None:
            words = words[: max(0, max_size - len(SPECIAL_TOKENS))]
        return cls(list(SPECIAL_TOKENS) + words, lowercase)

    @staticmethod
    def split(text: str, lowercase: bool = False) -> list[str]:
        return _WORD.findall(text.lower() if lowercase else text)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode(self, text: str) -> list[int]:
        return [self._index.get(w, UNK_ID) for w in self.split(text, self.lowercase)]

    def pieces(self, text: str) -> list[tuple[str, int]]:
        """The text as this tokenizer reads it: each word (an unknown one as it was written) and its id."""
        words = self.split(text, self.lowercase)
        return list(zip(words, self.encode(text), strict=True))

    def piece(self, token_id: int) -> str:
        return self.tokens[int(token_id)]

    def decode(self, ids: Iterable[int]) -> str:
        out = ""
        for i in ids:
            i = int(i)
            if i in (PAD_ID, BOS_ID, EOS_ID):
                continue
            if not 0 <= i < len(self.tokens):
                raise DataError(f"token id {i} is outside the vocabulary (size {len(self.tokens)})")
            word = self.tokens[i]
            if out and not _NO_SPACE_BEFORE.match(word) and out[-1] not in _NO_SPACE_AFTER:
                out += " "
            out += word
        return out

    def to_dict(self) -> dict:
        return {"kind": self.kind, "lowercase": self.lowercase, "tokens": self.tokens}

    def save(self, directory: str) -> None:
        _write_meta(directory, self.to_dict())


class SentencePieceTokenizer:
    """A sentencepiece model with PAD=0, UNK=1, BOS=2, EOS=3."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes):
        self.model_proto = model_proto
        self._sp = spm.SentencePieceProcessor(model_proto=model_proto)
        ids = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(f"sentencepiece model has special ids {ids}, expected (0, 1, 2, 3)")

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int = 8000,
        model_type: str = "unigram",
        seed: int = 0,
        character_coverage: float = 1.0,
    ):
        """Train on ``texts`` (the training split). ``vocab_size`` is an upper bound on small corpora."""
        if model_type not in ("unigram", "bpe", "word", "char"):
            raise DataError(f"sentencepiece model_type must be unigram, bpe, word or char, got {model_type!r}")
        model = io.BytesIO()
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(list(texts)),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                hard_vocab_limit=False,
                shuffle_input_sentence=False,
                num_threads=1,
                minloglevel=2,
            )
        except RuntimeError as e:
            raise DataError(f"sentencepiece training failed: {e}") from None
        return cls(model.getvalue())

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        return list(self._sp.encode(text))

    def pieces(self, text: str) -> list[tuple[str, int]]:
        """The text as this tokenizer reads it: each piece and its id."""
        ids = self.encode(text)
        return [(self._sp.id_to_piece(i), i) for i in ids]

    def piece(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids if int(i) not in (PAD_ID, BOS_ID, EOS_ID)]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise DataError(f"token id {bad[0]} is outside the vocabulary (size {self.vocab_size})")
        return self._sp.decode(ids)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model_proto_base64": base64.b64encode(self.model_proto).decode("ascii")}

    def save(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, SPM_FILE), "wb") as f:
            f.write(self.model_proto)
        _write_meta(directory, {"kind": self.kind, "model_file": SPM_FILE})


def load_tokenizer(directory: str) -> WordTokenizer | SentencePieceTokenizer:
    """Restore a tokenizer saved by either class's ``save``."""
    meta_path = os.path.join(directory, META_FILE)
    if not os.path.isfile(meta_path):
        raise DataError(f"no tokenizer found: {meta_path} is missing")
    try:
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{meta_path}: malformed tokenizer file ({e})") from None
    if meta.get("kind") == SentencePieceTokenizer.kind and "model_proto_base64" not in meta:
        model_path = os.path.join(directory, meta.get("model_file", SPM_FILE))
        if not os.path.isfile(model_path):
            raise DataError(f"sentencepiece model file missing: {model_path}")
        with open(model_path, "rb") as f:
            return SentencePieceTokenizer(f.read())
    return tokenizer_from_dict(meta, where=meta_path)


def tokenizer_from_dict(meta: dict, where: str = "tokenizer") -> WordTokenizer | SentencePieceTokenizer:
    """Inverse of ``to_dict`` (used for the copy stored in every checkpoint)."""
    kind = meta.get("kind")
    if kind == WordTokenizer.kind:
        return WordTokenizer(meta["tokens"], lowercase=bool(meta.get("lowercase", False)))
    if kind == SentencePieceTokenizer.kind:
        return SentencePieceTokenizer(base64.b64decode(meta["model_proto_base64"]))
    raise DataError(f"{where}: unknown tokenizer kind {kind!r}")


def build_tokenizer(kind: str, texts: Sequence[str], **options) -> WordTokenizer | SentencePieceTokenizer:
    """Build a tokenizer of ``kind`` ('word' or 'sentencepiece') from the training texts."""
    if kind == "word":
        return WordTokenizer.build(texts, **options)
    if kind == "sentencepiece":
        return SentencePieceTokenizer.train(texts, **options)
    raise DataError(f"unknown tokenizer kind {kind!r}; expected 'word' or 'sentencepiece'")
