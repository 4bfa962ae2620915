"""Story readers: ROCStories CSV, Story Cloze CSV, and plain text (SPEC §1).

Every reader returns a list of :class:`Story`. Malformed input raises :class:`DataError` naming
the file and row.
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import hashlib
import io
import os
import re

from rank4jax.errors import DataError, say

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
    if os.path.getsize(path) == 0:
        raise DataError(f"{path}: the file is empty")


_MAGIC = {  # file signatures of formats people pass by mistake
    b"PK\x03\x04": "a zip archive (an .xlsx/.ods spreadsheet is one): export it as CSV",
    b"\x1f\x8b": "gzip-compressed: decompress it first",
    b"BZh": "bzip2-compressed: decompress it first",
    b"\xfd7zXZ": "xz-compressed: decompress it first",
    b"%PDF": "a PDF document",
    b"\xd0\xcf\x11\xe0": "a legacy Office document (.xls/.doc): export it as CSV",
}


def _line_of(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def read_text_file(path: str) -> str:
    """The file's text, decoded as its writer most likely meant it: UTF-8 (with or without the BOM
    spreadsheet programs write), UTF-16 with a BOM, or else Windows-1252 (spreadsheets' plain "CSV"
    on Windows; a warning says so). Binary files, archives and JSON are refused in one line that
    names the file, the detected format and, for undecodable text, the line."""
    _check_file(path)
    with open(path, "rb") as f:
        data = f.read()
    for magic, what in _MAGIC.items():
        if data.startswith(magic):
            raise DataError(f"{path}: not a text file (detected: {what})")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError as e:
            raise DataError(
                f"{path}: UTF-16 text (from its byte-order mark) that does not decode: {e.reason}"
            ) from None
    elif b"\x00" in data[:65536]:
        nul = data.index(b"\x00")
        raise DataError(f"{path}: not a text file (detected: binary data, a NUL byte on line {_line_of(data, nul)})")
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as utf8_error:
            try:
                text = data.decode("cp1252")
            except UnicodeDecodeError:
                line = _line_of(data, utf8_error.start)
                raise DataError(
                    f"{path}: line {line}: neither UTF-8 nor Windows-1252 text (byte 0x{data[utf8_error.start]:02x}); "
                    "save it as UTF-8"
                ) from None
            line = _line_of(data, utf8_error.start)
            say(f"rank4jax: warning: {path} is not UTF-8 (line {line}); read as Windows-1252 (detected)")
    by_name = path.lower().endswith((".json", ".jsonl", ".ndjson"))
    if by_name or text.lstrip()[:1] in ("{", "["):
        raise DataError(
            f"{path}: looks like JSON (detected from its {'name' if by_name else 'first character'}); "
            "expected a ROCStories / Story Cloze CSV or plain text with one story per paragraph"
        )
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_csv(path: str, required: tuple[str, ...], kind: str) -> list[tuple[int, dict]]:
    text = read_text_file(path)
    csv.field_size_limit(max(csv.field_size_limit(), len(text)))  # a long sentence is no malformed field
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        header = [h.strip() for h in reader.fieldnames or []]
        reader.fieldnames = header
        missing = [c for c in required if c not in header]
        if missing:
            raise DataError(f"{path}: not a {kind} CSV: missing column(s) {', '.join(missing)}")
        return [(row_number, row) for row_number, row in enumerate(reader, start=2)]
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
    text = read_text_file(path)
    if _BLANK_LINE.search(text.strip()):
        paragraphs = [" ".join(block.split()) for block in _BLANK_LINE.split(text) if block.strip()]
    else:
        paragraphs = [line.strip() for line in text.splitlines() if line.strip()]
    stories = []
    for paragraph in paragraphs:
        sentences = tuple(split_sentences(paragraph))
        stories.append(Story(text_id(sentences), sentences))
    return stories


def _clean_first_line(first: bytes) -> str | None:
    """The first line of a file's first bytes when they are plainly text (no NUL byte; UTF-16 with a
    byte-order mark, or UTF-8 up to the first line end), else None."""
    if first.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return first.decode("utf-16", errors="replace").split("\n", 1)[0]
    if b"\x00" in first:
        return None
    try:
        return first.split(b"\n", 1)[0].decode("utf-8-sig").rstrip("\r")
    except UnicodeDecodeError:
        return None


def detect_format(path: str) -> str:
    """'rocstories', 'storycloze' or 'text' from the file's header (CSV) or extension."""
    _check_file(path)
    if not path.lower().endswith(".csv"):
        return "text"
    with open(path, "rb") as f:
        first = f.read(65536)
    first_line = _clean_first_line(first)
    if first_line is None:  # binary, or not UTF-8: the reader says what it is (or decodes Windows-1252)
        first_line = read_text_file(path).split("\n", 1)[0]
    header = [h.strip() for h in next(csv.reader([first_line]), [])]
    if not header or not all(h.isprintable() for h in header):
        raise DataError(f"{path}: not a text file (detected: unprintable characters in its first line)")
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
