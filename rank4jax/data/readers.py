"""Story readers: ROCStories CSV, Story Cloze CSV, and plain text (SPEC §1).

Every reader returns a list of :class:`Story`. Malformed input raises :class:`DataError` naming
the file and row.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import os
import re

from rank4jax.errors import DataError

ROCSTORIES_COLUMNS = (
    "storyid",
    "storytitle",
    "sentence1",
    "sentence2",
    "sentence3",
    "sentence4",
    "sentence5",
)
CLOZE_INPUTS = ("InputSentence1", "InputSentence2", "InputSentence3", "InputSentence4")
CLOZE_ENDINGS = ("RandomFifthSentenceQuiz1", "RandomFifthSentenceQuiz2")
CLOZE_ANSWER = "AnswerRightEnding"
CLOZE_ID = "InputStoryid"

_BLANK_LINE = re.compile(r"\n[ \t]*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


@dataclasses.dataclass(frozen=True)
class Story:
    """An ordered list of sentences. Story Cloze stories also keep both candidate endings."""

    story_id: str
    sentences: tuple[str, ...]
    endings: tuple[str, str] | None = None  # Story Cloze candidates
    right_ending: int | None = None  # 0 or 1: index into ``endings``


def text_id(sentences) -> str:
    """A stable id from the story text (for data without story ids)."""
    return hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest()[:16]


def split_sentences(text: str) -> list[str]:
    """Split a paragraph into sentences at ., ! or ? followed by whitespace."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise DataError(f"data file not found: {path}")
    if not os.path.isfile(path):
        raise DataError(f"data path is not a file: {path}")


def _read_csv(path: str, required: tuple[str, ...], kind: str) -> list[tuple[int, dict]]:
    _check_file(path)
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise DataError(f"{path}: not a {kind} CSV: missing column(s) {', '.join(missing)}")
            return [(row_number, row) for row_number, row in enumerate(reader, start=2)]
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except csv.Error as e:
        raise DataError(f"{path}: malformed CSV: {e}") from None


def _field(path: str, row_number: int, row: dict, column: str) -> str:
    value = row.get(column)
    if value is None:
        raise DataError(f"{path}: row {row_number}: missing field {column!r} (short row)")
    value = value.strip()
    if not value:
        raise DataError(f"{path}: row {row_number}: empty field {column!r}")
    return value


def read_rocstories_csv(path: str) -> list[Story]:
    """ROCStories: ``storyid,storytitle,sentence1..sentence5``."""
    stories = []
    for row_number, row in _read_csv(path, ROCSTORIES_COLUMNS, "ROCStories"):
        sentences = tuple(_field(path, row_number, row, f"sentence{i}") for i in range(1, 6))
        story_id = (row.get("storyid") or "").strip() or text_id(sentences)
        stories.append(Story(story_id, sentences))
    return stories


def read_storycloze_csv(path: str) -> list[Story]:
    """Story Cloze: four ``InputSentence`` columns, two candidate endings and ``AnswerRightEnding``
    (1 or 2). The story is the four inputs plus the right ending; both candidates are kept."""
    stories = []
    for row_number, row in _read_csv(path, CLOZE_INPUTS + CLOZE_ENDINGS + (CLOZE_ANSWER,), "Story Cloze"):
        inputs = tuple(_field(path, row_number, row, c) for c in CLOZE_INPUTS)
        endings = tuple(_field(path, row_number, row, c) for c in CLOZE_ENDINGS)
        answer = _field(path, row_number, row, CLOZE_ANSWER)
        if answer not in ("1", "2"):
            raise DataError(f"{path}: row {row_number}: {CLOZE_ANSWER} must be 1 or 2, got {answer!r}")
        right = int(answer) - 1
        sentences = inputs + (endings[right],)
        story_id = (row.get(CLOZE_ID) or "").strip() or text_id(sentences)
        stories.append(Story(story_id, sentences, endings=endings, right_ending=right))
    return stories


def read_text(path: str) -> list[Story]:
    """Plain text: stories separated by blank lines, or (with no blank lines) one story per line;
    each story is split into sentences."""
    _check_file(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if _BLANK_LINE.search(text.strip()):
        paragraphs = [" ".join(block.split()) for block in _BLANK_LINE.split(text) if block.strip()]
    else:
        paragraphs = [line.strip() for line in text.splitlines() if line.strip()]
    stories = []
    for paragraph in paragraphs:
        sentences = tuple(split_sentences(paragraph))
        stories.append(Story(text_id(sentences), sentences))
    return stories


def detect_format(path: str) -> str:
    """'rocstories', 'storycloze' or 'text' from the file's header (CSV) or extension."""
    _check_file(path)
    if not path.lower().endswith(".csv"):
        return "text"
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), [])
    if all(c in header for c in CLOZE_INPUTS):
        return "storycloze"
    if all(c in header for c in ROCSTORIES_COLUMNS):
        return "rocstories"
    raise DataError(
        f"{path}: unrecognised CSV header {header[:8]}; expected ROCStories columns "
        f"({', '.join(ROCSTORIES_COLUMNS)}) or Story Cloze columns ({', '.join(CLOZE_INPUTS)}, ...)"
    )


READERS = {"rocstories": read_rocstories_csv, "storycloze": read_storycloze_csv, "text": read_text}


def read_stories(path: str, data_format: str = "auto") -> list[Story]:
    """Read any supported file; ``data_format`` is 'auto', 'rocstories', 'storycloze' or 'text'."""
    if data_format == "auto":
        data_format = detect_format(path)
    if data_format not in READERS:
        raise DataError(f"unknown data format {data_format!r}; expected auto, {', '.join(READERS)}")
    stories = READERS[data_format](path)
    if not stories:
        raise DataError(f"{path}: no stories found")
    return stories
