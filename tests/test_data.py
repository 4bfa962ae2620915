"""Readers, tokenizers, windows, splits and the grain pipeline."""

import dataclasses

import numpy as np
import pytest
from helpers import tiny_config

from rank4jax.data import readers, tokenizers, windows
from rank4jax.data.pipeline import eval_batches, train_dataset
from rank4jax.errors import ConfigError, DataError


def test_storycloze_reader_on_shared_data(cloze_path):
    stories = readers.read_stories(cloze_path)
    assert len(stories) == 1571
    assert all(len(s.sentences) == 5 for s in stories)
    assert all(s.endings is not None and s.sentences[-1] == s.endings[s.right_ending] for s in stories)
    first = stories[0]
    assert first.sentences[0] == "Rick grew up in a troubled household."
    assert first.sentences[4] == "He is happy now." and first.endings[1] == "He joined a gang."
    assert len({s.story_id for s in stories}) == 1571


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


ROC_HEADER = "storyid,storytitle,sentence1,sentence2,sentence3,sentence4,sentence5\n"


def test_rocstories_reader(tmp_path):
    path = write(tmp_path, "roc.csv", ROC_HEADER + "id1,Title,A b.,C d.,E f.,G h.,I j.\nid2,T,1.,2.,3.,4.,5.\n")
    stories = readers.read_stories(path)
    assert [s.story_id for s in stories] == ["id1", "id2"]
    assert stories[0].sentences == ("A b.", "C d.", "E f.", "G h.", "I j.") and stories[0].endings is None


def test_missing_file_and_missing_columns(tmp_path):
    with pytest.raises(DataError, match="not found: .*nope.csv"):
        readers.read_stories(str(tmp_path / "nope.csv"))
    path = write(tmp_path, "bad.csv", "storyid,sentence1\nx,y\n")
    with pytest.raises(DataError, match="bad.csv: unrecognised CSV header"):
        readers.read_stories(path)
    with pytest.raises(DataError, match="bad.csv: not a ROCStories CSV: missing column"):
        readers.read_rocstories_csv(path)


def test_empty_sentence_and_short_row_name_the_row(tmp_path):
    path = write(tmp_path, "roc.csv", ROC_HEADER + "id1,T,a.,b.,c.,d.,e.\nid2,T,a.,,c.,d.,e.\n")
    with pytest.raises(DataError, match=r"roc.csv: row 3: empty field 'sentence2'"):
        readers.read_stories(path)
    path = write(tmp_path, "short.csv", ROC_HEADER + "id1,T,a.,b.\n")
    with pytest.raises(DataError, match=r"short.csv: row 2: missing field 'sentence3'"):
        readers.read_stories(path)
    cloze = "InputSentence1,InputSentence2,InputSentence3,InputSentence4,RandomFifthSentenceQuiz1,"
    cloze += "RandomFifthSentenceQuiz2,AnswerRightEnding\na.,b.,c.,d.,e.,f.,3\n"
    with pytest.raises(DataError, match=r"row 2: AnswerRightEnding must be 1 or 2"):
        readers.read_stories(write(tmp_path, "cloze.csv", cloze))


def test_empty_file_has_no_stories(tmp_path):
    with pytest.raises(DataError, match="no stories"):
        readers.read_stories(write(tmp_path, "empty.csv", ROC_HEADER))
    with pytest.raises(DataError, match="no stories"):
        readers.read_stories(write(tmp_path, "empty.txt", "\n\n"))


def test_plain_text_line_and_paragraph_modes(tmp_path):
    one_per_line = write(tmp_path, "a.txt", "Ann ran. She fell! Was it bad? No.\nBob sat. He ate.\n")
    stories = readers.read_stories(one_per_line)
    assert [s.sentences for s in stories] == [
        ("Ann ran.", "She fell!", "Was it bad?", "No."),
        ("Bob sat.", "He ate."),
    ]
    paragraphs = write(tmp_path, "b.txt", "Ann ran.\nShe fell.\n\nBob sat. He ate.\n   \nCy.\n")
    stories = readers.read_stories(paragraphs)
    assert [s.sentences for s in stories] == [("Ann ran.", "She fell."), ("Bob sat.", "He ate."), ("Cy.",)]


TEXTS = [
    "Rick grew up in a troubled household.",
    "He never found good support in family, and turned to gangs.",
]


@pytest.mark.parametrize("lowercase", [False, True])
def test_word_tokenizer_round_trip_and_save(tmp_path, lowercase):
    tok = tokenizers.WordTokenizer.build(TEXTS * 2 + ["rare"], min_count=2, lowercase=lowercase)
    assert tok.tokens[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert "rare" not in tok.tokens
    ids = tok.encode(TEXTS[1])
    assert min(ids) >= 4
    expected = TEXTS[1].lower() if lowercase else TEXTS[1]
    assert tok.decode(ids) == expected
    assert tok.encode(tok.decode(ids)) == ids
    assert tok.encode("rare words") == [tokenizers.UNK_ID, tokenizers.UNK_ID]
    tok.save(str(tmp_path / "tok"))
    again = tokenizers.load_tokenizer(str(tmp_path / "tok"))
    assert again.encode(TEXTS[0]) == tok.encode(TEXTS[0]) and again.vocab_size == tok.vocab_size
    with pytest.raises(DataError, match="token id 999 is outside the vocabulary"):
        tok.decode([4, 999])


def test_word_tokenizer_contractions_and_punctuation():
    tok = tokenizers.WordTokenizer.build(["It wasn't long before Rick's dog (Max) barked, loudly!"])
    text = "It wasn't long before Rick's dog (Max) barked, loudly!"
    assert tok.decode(tok.encode(text)) == text


def test_sentencepiece_tokenizer_round_trip_and_determinism(tmp_path, cloze_path):
    stories = readers.read_stories(cloze_path)[:300]
    texts = [s for story in stories for s in story.sentences]
    tok = tokenizers.SentencePieceTokenizer.train(texts, vocab_size=400, model_type="unigram", seed=3)
    assert tok.vocab_size <= 400
    for text in texts[:20]:
        assert tok.decode(tok.encode(text)) == text
    tok.save(str(tmp_path / "spm"))
    again = tokenizers.load_tokenizer(str(tmp_path / "spm"))
    assert again.encode(texts[5]) == tok.encode(texts[5])
    other = tokenizers.SentencePieceTokenizer.train(texts, vocab_size=400, model_type="unigram", seed=3)
    assert other.model_proto == tok.model_proto
    bpe = tokenizers.build_tokenizer("sentencepiece", texts, vocab_size=300, model_type="bpe")
    assert bpe.decode(bpe.encode(texts[0])) == texts[0]


def test_sentencepiece_small_inline_corpus():
    tok = tokenizers.SentencePieceTokenizer.train(TEXTS * 20, vocab_size=50, seed=0)
    assert tok.decode(tok.encode(TEXTS[0])) == TEXTS[0]
    assert tok.encode("") == []


def test_load_tokenizer_errors(tmp_path):
    with pytest.raises(DataError, match="no tokenizer found"):
        tokenizers.load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(DataError, match="malformed tokenizer file"):
        tokenizers.load_tokenizer(str(tmp_path))


def test_windows_shapes_padding_truncation_and_skips():
    tok = tokenizers.WordTokenizer.build(["a b c d e f g"])
    stories = [
        readers.Story("s1", ("a b c d e.", "f.", "g a.", "b.", "c.")),  # 5 sentences
        readers.Story("s2", ("a.", "b.")),  # too short for T+1 = 3
        readers.Story("s3", ("a.", "b.", "c.")),  # exactly T+1
    ]
    ws = windows.make_windows(stories, tok, n_tokens=4, n_slices=2)
    assert ws.windows.shape == (4, 3, 4) and ws.windows.dtype == np.int32
    assert ws.n_skipped == 1 and ws.story_index.tolist() == [0, 0, 0, 2]
    a, b, c, d = (tok.encode(w)[0] for w in "abcd")
    assert ws.windows[0, 0].tolist() == [a, b, c, d]  # "a b c d e ." truncated to N = 4
    assert ws.windows[0, 1].tolist() == [tok.encode("f")[0], tok.encode(".")[0], 0, 0]  # PAD-padded
    np.testing.assert_array_equal(ws.windows[1, :2], ws.windows[0, 1:])  # consecutive windows overlap


def test_cloze_windows(cloze_path):
    stories = readers.read_stories(cloze_path)[:10]
    tok = tokenizers.WordTokenizer.build(s for st in stories for s in st.sentences + st.endings)
    pairs, labels = windows.cloze_windows(stories, tok, n_tokens=16, n_slices=4)
    assert pairs.shape == (10, 2, 5, 16) and labels.tolist() == [st.right_ending for st in stories]
    np.testing.assert_array_equal(pairs[:, 0, :4], pairs[:, 1, :4])
    ws = windows.make_windows(stories, tok, 16, 4)
    np.testing.assert_array_equal(pairs[np.arange(10), labels], ws.windows)


def test_check_token_ids():
    windows.check_token_ids(np.array([[0, 5]]), 6, "train windows")
    with pytest.raises(DataError, match=r"train windows: token id 6 at index \(0, 1\) is outside"):
        windows.check_token_ids(np.array([[0, 6]]), 6, "train windows")


def test_split_is_deterministic_and_roughly_80_10_10():
    ids = [f"story-{i}" for i in range(5000)]
    splits = [windows.split_of(i) for i in ids]
    assert splits == [windows.split_of(i) for i in ids]
    counts = {name: splits.count(name) / len(ids) for name in windows.SPLITS}
    assert abs(counts["train"] - 0.8) < 0.03 and abs(counts["validation"] - 0.1) < 0.02
    # pinned: SHA-256 based, so stable across Python processes and versions
    assert splits[:8] == ["train", "train", "train", "test", "train", "test", "validation", "test"]
    with pytest.raises(DataError, match="split fractions"):
        windows.split_of("x", (0.5, 0.2, 0.2))


def test_train_pipeline_shuffles_per_epoch_and_restores_state():
    data = np.arange(10 * 3 * 2, dtype=np.int32).reshape(10, 3, 2)
    ds = train_dataset(data, batch_size=4, seed=7, num_epochs=2)
    batches = [b[:, 0, 0] // 6 for b in ds]
    assert len(batches) == 5 and all(b.shape == (4,) for b in batches)
    seen = np.concatenate(batches)
    assert sorted(seen[:10].tolist()) == list(range(10)) and sorted(seen[10:].tolist()) == list(range(10))
    assert seen[:10].tolist() != seen[10:].tolist()  # reshuffled
    it = iter(train_dataset(data, batch_size=4, seed=7))
    next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    it2 = iter(train_dataset(data, batch_size=4, seed=7))
    it2.set_state(state)
    for e in expected:
        np.testing.assert_array_equal(next(it2), e)


def test_train_pipeline_process_sharding_and_errors():
    data = np.arange(8 * 2 * 1, dtype=np.int32).reshape(8, 2, 1)
    whole = iter(train_dataset(data, 4, seed=0))
    p0 = iter(train_dataset(data, 4, seed=0, process_index=0, process_count=2))
    p1 = iter(train_dataset(data, 4, seed=0, process_index=1, process_count=2))
    for _ in range(5):  # each process holds its half of the one global batch, epoch after epoch
        a, b, w = next(p0), next(p1), next(whole)
        assert a.shape == (2, 2, 1) and b.shape == (2, 2, 1)
        np.testing.assert_array_equal(np.concatenate([a, b]), w)
    assert p0.get_state() == p1.get_state() == whole.get_state()  # process-count-free iterator state
    with pytest.raises(DataError, match="fewer than one batch"):
        train_dataset(data, 16, seed=0)
    with pytest.raises(DataError, match="not divisible"):
        train_dataset(data, 5, seed=0, process_count=2)


def test_train_pipeline_maps_batches_and_resumes():
    data = np.arange(10 * 3 * 2, dtype=np.int32).reshape(10, 3, 2)

    def layout(batch):
        return {"rows": batch[:, :, :1], "n": np.int32(len(batch))}

    it = iter(train_dataset(data, 4, seed=3, batch_map=layout))
    plain = iter(train_dataset(data, 4, seed=3))
    first = next(it)
    np.testing.assert_array_equal(first["rows"], next(plain)[:, :, :1])
    state = it.get_state()
    expected = [next(it) for _ in range(3)]
    resumed = iter(train_dataset(data, 4, seed=3, batch_map=layout))
    resumed.set_state(state)
    for e in expected:
        np.testing.assert_array_equal(next(resumed)["rows"], e["rows"])


def test_eval_batches_pad_last_batch():
    data = np.ones((5, 3, 2), np.int32)
    batches = list(eval_batches({"windows": data}, 2))
    assert len(batches) == 3 and batches[-1]["mask"].tolist() == [True, False]
    assert batches[-1]["windows"][1].sum() == 0


def test_a_data_path_with_the_builtin_source_is_one_error_saying_what_to_set():
    from rank4jax.engine.run_config import validate

    with pytest.raises(ConfigError, match=r"data.path='my.txt' is set but data.source='builtin'.*data.source=file"):
        validate(tiny_config(**{"data.path": "my.txt"}))


def test_evaluated_stories_the_run_trained_on_are_counted_with_a_warning(capsys):
    from rank4jax.engine.data_setup import check_held_out, load_stories

    config = tiny_config()
    split = windows.split_stories(load_stories(config)[0], tuple(config.data.split))
    assert check_held_out(config, split["validation"], "all", path="other.csv") == 0
    assert capsys.readouterr().err == ""
    renamed = [dataclasses.replace(s, story_id=f"copy-{s.story_id}") for s in split["train"][:5]]  # same text
    mixed = split["validation"][:3] + renamed + split["train"][5:7]
    assert check_held_out(config, mixed, "all", path="other.csv") == 7
    assert "7 of the 10 evaluated stories are stories this run trained on" in capsys.readouterr().err
    assert check_held_out(config, split["test"], "test") == 0  # the run's own held-out split: not read
