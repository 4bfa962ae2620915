"""Faults of input: data files that are not stories, degenerate data, sizes that cannot fit, settings
and files of the wrong shape, changed data; each a clear line (an ``error:`` or a warning)."""

import dataclasses
import json
import os
import re
import sys
import time

import jax
import pytest

from rank4jax.checkpoint import storage
from rank4jax.errors import (
    CheckpointError,
    ConfigError,
    DataError,
    WorkdirError,
)
from rank4jax.evaluation.report import evaluate_run
from rank4jax.runs import describe_run, load_run
from rank4jax.training.loop import train
from tests import launcher
from tests.fault_helpers import BAD_FILES, ROC_HEADER, ROC_ROW, _roc_text
from tests.helpers import tiny_config


@pytest.mark.parametrize(
    "encoding", ["utf-8", "utf-8-sig", "cp1252", "utf-16"], ids=["utf8", "utf8_bom", "windows1252", "utf16_bom"]
)
def test_csv_files_as_spreadsheets_write_them_are_read(encoding, tmp_path, capsys):
    from rank4jax.data.readers import read_stories

    path = tmp_path / "stories.csv"
    path.write_bytes(_roc_text().encode(encoding))
    stories = read_stories(str(path))
    assert [s.story_id for s in stories] == ["s0", "s1", "s2"]
    assert stories[0].sentences[0] == "Anna went to the café." and stories[0].sentences[4] == "Then she drank it."
    err = capsys.readouterr().err
    assert ("read as Windows-1252 (detected)" in err) == (encoding == "cp1252")


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_files_that_are_not_stories_are_one_short_line(name, tmp_path):
    from rank4jax.data.readers import read_stories
    from rank4jax.errors import DataError

    content, message = BAD_FILES[name]
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        read_stories(str(path))
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and len(text) < 300 and "\n" not in text, text


def test_degenerate_data_is_counted_warned_about_or_refused(tmp_path, capsys):
    """A vocabulary of only the special tokens is an error; cut sentences, unknown tokens and
    duplicate story ids are counted in the data summary and warned about when large."""
    from rank4jax.engine.data_setup import prepare_data, prepare_split
    from rank4jax.errors import DataError

    with pytest.raises(DataError, match=r"has 0 token\(s\) besides PAD/UNK/BOS/EOS .*lower tokenizer.min_count"):
        prepare_data(tiny_config(**{"tokenizer.min_count": 10**6}))
    rows = [ROC_ROW.format(i=i % 30) for i in range(40)]  # 40 stories, 10 repeat an id
    rows += [f"u{i},T,Zyx{i} qwv{i} went.,Kjh{i} sat.,Pqr{i} ran.,Wvu{i} hid.,Mno{i} slept.\r\n" for i in range(10)]
    path = tmp_path / "roc.csv"
    path.write_text(ROC_HEADER + "".join(rows), encoding="utf-8")
    config = tiny_config(**{"data.source": "file", "data.path": str(path), "model.n_tokens": 4})
    data = prepare_data(config)
    summary = data.summary()
    err = capsys.readouterr().err
    assert summary["duplicate_ids"] == 10 and "10 of 50 stories repeat an earlier story's id" in err
    # "Anna went to the café ." (6 tokens) and "Then she drank it ." (5) are cut to 4, in 40 stories
    assert summary["truncated_sentences"] == 80 and summary["truncated_fraction"] == round(80 / 250, 4)
    assert "80 of 250 sentences (32%) are longer than model.n_tokens=4 tokens and are cut" in err
    unknown = tmp_path / "unknown.txt"  # evaluation text made of words the vocabulary never saw
    unknown.write_text("Blorp zanged quix. Frel mop dax. Vin tor lek. Sar pim ox. Gup lat wex.\n", encoding="utf-8")
    held_out = prepare_split(config, data.tokenizer, "all", path=str(unknown))[1]
    assert held_out.unk_rate == 15 / 20  # the 15 words are UNK, the 5 full stops are known
    assert f"{unknown}: 75% of all the tokens are unknown to the vocabulary (UNK)" in capsys.readouterr().err


def test_a_message_line_is_one_write(monkeypatch):
    """Warnings and errors reach stderr text and newline together: ``print`` writes them separately,
    and a Ctrl-C handled between the two glued the stop line onto a cut-sentences warning (CI, once)."""
    from rank4jax.engine.data_setup import data_warnings

    class Split:  # what data_warnings reads of a split's windows
        n_sentences, n_truncated, unk_rate = 10, 5, 0.5

        def __len__(self):
            return 3

    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    data_warnings("stories.csv", {"train": Split()}, n_tokens=8, duplicates=2, n_stories=9)
    assert len(writes) == 3 and all(w.startswith("rank4jax: warning: stories.csv: ") for w in writes), writes
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in writes), writes


def test_a_model_too_large_for_memory_is_refused_before_allocating(tmp_path):
    from rank4jax.errors import ConfigError

    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"the model has [0-9,]{17,} parameters: .* GiB per device, more than the"):
        train(tiny_config(**{"model.dx": 100000, "model.dt": 8, "model.n_tokens": 16}), str(tmp_path / "run"))
    assert time.perf_counter() - start < 60
    assert not (tmp_path / "run").exists()  # nothing saved, nothing left


def test_a_very_long_sentence_is_read_not_called_malformed(tmp_path):
    """A 100,000-word sentence is past the csv module's default field limit (131,072 characters)."""
    from rank4jax.data.readers import read_stories

    long = " ".join(["word"] * 100_000) + "."
    path = tmp_path / "long.csv"
    path.write_text(ROC_HEADER + f"s1,T,{long},Two.,Three.,Four.,Five.\r\n", encoding="utf-8")
    (story,) = read_stories(str(path), "rocstories")
    assert story.sentences[0] == long and len(story.sentences) == 5


def test_cloze_contexts_settings_and_data_are_one_line_each(tiny_run, tmp_path):
    from rank4jax.experiments.cloze_contexts import check_settings, context_spread

    refusals = {
        (1, (8,), 200): "--pool must be at least 2 (the pool factor divides by pool − 1), got 1",
        (128, (0, 8), 200): "--ks must each be at least 1, got 0,8",
        (128, (-1,), 200): "--ks must each be at least 1, got -1",
        (128, (100000,), 200): "--ks: K=100000 is more than the pool of --pool=128 lenders it is drawn from",
        (128, (8,), 1): "--draws must be at least 2 (the spread's standard deviation needs two), got 1",
    }
    for (pool, ks, draws), message in refusals.items():
        with pytest.raises(ConfigError) as caught:
            check_settings(pool, ks, draws)
        assert str(caught.value) == message
    rocstories = tmp_path / "roc.csv"  # five sentences a story: no endings to choose between
    rocstories.write_text(
        "storyid,storytitle,sentence1,sentence2,sentence3,sentence4,sentence5\n"
        "a,,Tom ran.,He fell.,He cried.,Mom came.,All was well.\n"
    )
    with pytest.raises(DataError) as caught:
        context_spread(str(tiny_run), str(rocstories), ks=(8,), draws=2)
    assert str(caught.value).startswith(f"{rocstories} holds 0 Story Cloze stories (a context, two endings")
    import rank4jax.experiments.cloze_contexts as cloze_contexts

    with pytest.MonkeyPatch.context() as patch:  # a file whose one story the run trained on
        patch.setattr(cloze_contexts, "check_held_out", lambda *args, **kwargs: 1)
        with pytest.raises(ConfigError, match="^1 of the 1 stories of .* are stories this run trained on"):
            context_spread(str(tiny_run), str(rocstories), ks=(8,), draws=2)
    out = launcher.run("cloze_contexts.py", f"--workdir={tiny_run}", "--cloze_data=x.csv", "--ks=a")
    assert (out.returncode, out.stderr) == (2, "error: --ks must be whole numbers separated by commas, got 'a'\n")


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_device_or_a_fifo_as_data_is_refused_unread(kind, tmp_path):
    """/dev/zero spun at 100 % CPU (the data was hashed before the "not a file" check) and a FIFO with
    no writer blocked; both are one DataError now, before anything is read."""
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    with pytest.raises(DataError, match=f"^data path is not a file: {re.escape(path)}$"):
        train(tiny_config(**{"data.source": "file", "data.path": path}), str(tmp_path / "run"))


def test_raising_num_steps_under_a_decaying_schedule_says_the_rate_jump(tmp_path, capsys):
    """A cosine run resumed with more steps re-stretches the decay; the resume says by how much the
    rate at the resumed step moves, not only "num_steps: 6 → 10"."""
    from rank4jax.engine.state import learning_rate_schedule

    config = tiny_config(**{"optim.schedule": "cosine"})
    train(config, str(tmp_path))
    longer = tiny_config(**{"optim.schedule": "cosine", "num_steps": 10})
    train(longer, str(tmp_path))
    before = float(learning_rate_schedule(config.optim, 6)(6))
    after = float(learning_rate_schedule(longer.optim, 10)(6))
    expected = (
        f"rank4jax: warning: num_steps 6 → 10 stretches the cosine decay over the new length: the learning "
        f"rate at step 6 goes from {before:.3g} to {after:.3g}"
    )
    assert expected in capsys.readouterr().err


def test_json_files_of_the_wrong_shape_are_read_as_absent(tmp_path, capsys):
    """A run's config.json {"optim": 5}, a train_summary.json [1] and metrics records without their
    figures crashed ladder.py (and train.py at the end of training) on every rerun; each is now read as
    absent, with a warning naming it."""
    from rank4jax.experiments import ladder as lad
    from rank4jax.training.metrics import read_json, read_metrics, training_seconds

    (tmp_path / "train_summary.json").write_text("[1]")
    assert read_json(str(tmp_path / "train_summary.json"), "the run's summary") is None
    assert "holds a JSON list, not an object; read as absent" in capsys.readouterr().err
    lines = [
        {"step": 2, "split": "train", "loss": 1.0, "windows_per_s": 8.0, "interval_s": 2.0},
        {"step": 4, "split": "train", "loss": 1.0},  # no windows_per_s
        {"step": 4, "split": "validation", "window_ce": 2.0},  # no last_slice_ce
        {"step": 6, "split": "validation", "window_ce": 2.0, "last_slice_ce": 3.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    metrics = read_metrics(str(tmp_path))
    assert [r["step"] for r in metrics["train"]] == [2] and [r["step"] for r in metrics["validation"]] == [6]
    assert "2 unreadable line(s) skipped" in capsys.readouterr().err
    assert training_seconds(metrics["train"], 8) == 2.0
    run = tmp_path / "d8" / "rank4"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"optim": 5}')
    lad.check_trained_rates(str(tmp_path), {"d8/rank4": tiny_config()})  # no rate known: nothing refused
    (run / "diverged.json").write_text("{}")
    assert lad.train_run("d8/rank4", tiny_config(), str(run)) is None  # recorded as diverged, no error text


def test_loading_a_run_logs_no_warning(tiny_run, caplog):
    """Every load_run printed orbax's two read-only warnings ("…setting save_interval_steps=0", "Given
    directory is read only"); a reader now opens the manager without orbax's read_only flag, and
    refuses to save by itself."""
    import logging

    from rank4jax.checkpoint.storage import RunCheckpoints

    with caplog.at_level(logging.WARNING):
        load_run(str(tiny_run))
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    with RunCheckpoints(str(tiny_run), read_only=True) as reader, pytest.raises(CheckpointError, match="to read"):
        reader.save(99, None, None, {}, None)


def test_a_batch_whose_logits_cannot_fit_is_refused_before_training(tmp_path):
    """--config.eval_batch_size=100000000 trained, then failed allocating 22 GiB at the first
    validation; now one ConfigError before any step."""
    with pytest.raises(ConfigError, match=r"^eval_batch_size=100,000,000: one batch's logits \(32 positions × "):
        train(tiny_config(eval_batch_size=100_000_000), str(tmp_path))
    assert not (tmp_path / "checkpoints").exists() or os.listdir(tmp_path / "checkpoints") == []


def test_windows_that_cannot_fit_in_memory_are_refused_before_allocating(tmp_path):
    """--config.model.n_tokens=10000000 failed deep in numpy (or as RESOURCE_EXHAUSTED); now one line."""
    with pytest.raises(
        ConfigError, match=r"^model.n_tokens=10,000,000: the .* windows of 5 states of 10,000,000 tokens"
    ):
        train(tiny_config(**{"model.n_tokens": 10_000_000}), str(tmp_path))


def test_changed_data_contents_are_refused_on_resume_and_by_evaluation(tmp_path):
    """A resume and eval.py read the data a checkpoint's config names whatever it now holds: a changed
    file (or a crafted config naming another) was split and scored as if held out. Its bytes are checked."""
    rows = [
        f"s{i},T,Anna went to the shop {i}.,She bought tea.,It was hot.,She waited.,She drank it.\r\n"
        for i in range(60)
    ]
    path = tmp_path / "roc.csv"
    path.write_text(ROC_HEADER + "".join(rows), encoding="utf-8")
    config = tiny_config(**{"data.source": "file", "data.path": str(path), "num_steps": 2})
    workdir = str(tmp_path / "run")
    train(config, workdir)
    config.num_steps = 4
    assert train(config, workdir)["step"] == 4  # the same contents: resumes
    assert evaluate_run(workdir, split="test", num_examples=0, rollout_steps=0)["stories"] > 0
    path.write_text(ROC_HEADER + "".join(rows[:-1]) + rows[-1].replace("tea", "coffee"), encoding="utf-8")
    config.num_steps = 6
    with pytest.raises(CheckpointError, match=f"the data at {path} has changed since these checkpoints were written"):
        train(config, workdir)
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]
    with pytest.raises(DataError, match=f"^the data at {re.escape(str(path))} has changed since"):
        evaluate_run(workdir, split="test", num_examples=0, rollout_steps=0)


def test_refusals_before_any_work(tiny_run_copy, tmp_path, monkeypatch, capsys):
    """Each refused in one line before the run trains or writes: a workdir that is a file, a seed out of
    range, a lock file the disk cannot hold, a disk too small for the next save (found at the start, not
    after training to it), a ladder's --status on a workdir that does not exist, compare's
    --cloze_contexts=-1 (before its first stage trains); a vocabulary's escape sequences are shown
    escaped; a checkpoint without a data fingerprint names the file it evaluates on."""
    import errno

    from rank4jax.cli import terminal_safe
    from rank4jax.experiments import compare, ladder

    (tmp_path / "file").write_text("x")
    with pytest.raises(WorkdirError, match="is a file, not a directory; nothing was changed"):
        train(tiny_config(), str(tmp_path / "file"))
    for seed in (-1, 2**70):
        with pytest.raises(ConfigError, match="seed must be an integer from 0 to 4,294,967,295"):
            train(tiny_config(seed=seed), str(tmp_path / "seed"))
    real_pwrite = os.pwrite

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(WorkdirError, match=r"cannot write the lock file .*\.lock: No space left on device"):
        train(tiny_config(), str(tmp_path / "lock"))
    monkeypatch.setattr(os, "pwrite", real_pwrite)
    before = (tiny_run_copy / "metrics.jsonl").read_text()
    monkeypatch.setattr(storage, "free_bytes", lambda directory: 1000)
    with pytest.raises(WorkdirError, match=r"cannot save checkpoint 8 in .*: No space left on device \(it needs"):
        train(tiny_config(num_steps=8), str(tiny_run_copy))
    assert (tiny_run_copy / "metrics.jsonl").read_text() == before  # nothing trained
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="no ladder there yet"):
        ladder.status(tiny_config(), str(tmp_path / "none"), ladder.LadderPlan())
    with pytest.raises(ConfigError, match="--cloze_contexts must be a non-negative integer"):
        compare.compare(tiny_config(), tiny_config(model_family="baseline"), str(tmp_path / "cmp"), cloze_contexts=-1)
    assert not (tmp_path / "cmp").exists()
    assert terminal_safe("a\x1b[2Jb\x07") == "a\\x1b[2Jb\\x07"
    import dataclasses

    from rank4jax.engine.sharding import check_batches_fit
    from rank4jax.prediction import predict_next

    huge = load_run(str(tiny_run_copy))  # one window's logits beyond memory: named as n_tokens, not the batch
    huge.model_cfg = dataclasses.replace(huge.model_cfg, n_tokens=10**9)
    with pytest.raises(ConfigError, match="^model.n_tokens=1,000,000,000: one window's logits need"):
        predict_next(huge, ["a."] * 4)
    with pytest.raises(ConfigError, match="^model.n_tokens=1,000,000,000: .* lower model.n_tokens$"):
        check_batches_fit(tiny_config(**{"model.n_tokens": 10**9}), 200, 1, ("eval_batch_size",))
    run = describe_run(storage.RunCheckpoints(str(tiny_run_copy), read_only=True), "latest")
    run.data_fingerprint, run.config.data.source, run.config.data.path = None, "file", "stories.csv"
    from rank4jax.evaluation.report import check_same_data

    check_same_data(run, "w")
    assert "records no fingerprint of its data: evaluating on stories.csv as it is now" in capsys.readouterr().err


def test_round_six_refusals_of_the_python_api(tiny_run, capsys):
    """Each a one-line ValueError or ConfigError (were ZeroDivisionError, AttributeError, KeyError or a
    model of another shape), a workdir given to from_run included."""
    import flax.nnx as nnx
    import jax.numpy as jnp

    import rank4jax
    import rank4jax.nn as r4nn

    cfg = rank4jax.Rank4Config(vocab_size=11, n_tokens=3, n_slices=2, dx=2, dt=3, n_heads=2, n_layers=1)
    block = r4nn.Rank4Block(2, 3, 2, rngs=nnx.Rngs(0))
    params = rank4jax.init_params(jax.random.key(0), cfg)
    cases = (
        (lambda: block(jnp.zeros((0, 4, 2, 3))), r"x holds no windows \(B = 0"),
        (lambda: block(jnp.ones((1, 4, 2, 3)), rngs=nnx.Rngs(params=3)), "the rngs given have no dropout stream"),
        (lambda: r4nn.Rank4Model.from_params(params, dataclasses.replace(cfg, n_heads=1)),
         r"the parameters' \['layers'\]\[0\]\['attn'\]\['wk'\] is \(2, 6, 6\); the config makes it \(1, 6, 6\)"),
        (lambda: r4nn.OuterProductEmbed(3, 2, 2, rngs=nnx.Rngs(0))(jnp.ones((1, 4, 3), jnp.int32)), "must be floating"),
        (lambda: r4nn.FactorisedReadout(2, 3, 5, rngs=None), r"pass rngs=nnx.Rngs\(seed\)"),
    )  # fmt: skip
    for call, message in cases:
        with pytest.raises((ValueError, ConfigError), match=message):
            call()
    with pytest.raises(ConfigError, match=r"from_run takes a loaded run: from_run\(rank4jax.load_run\("):
        r4nn.from_run(str(tiny_run))


def test_round_six_messages(tiny_run, tiny_run_copy, tmp_path, capsys):
    """``--data=,`` is refused before evaluating; a window whose attention cannot fit is refused by
    name; a message's terminal escapes are shown, not sent; a rerun past num_steps says so; a FIFO as
    the lock is one line; words left by a list flag with spaces are one line."""
    from rank4jax.engine.sharding import check_window_fits
    from rank4jax.errors import say

    with pytest.raises(ConfigError, match="--data names no file: ','"):
        evaluate_run(str(tiny_run), split="all", data_path=",")
    with pytest.raises(ConfigError, match=r"one window's attention weights of a head need .* GiB"):
        check_window_fits(10**6, 4, 147)
    say("error: data file not found: /x\x1b]0;PWNED\x07.csv")
    assert capsys.readouterr().err == "error: data file not found: /x\\x1b]0;PWNED\\x07.csv\n"
    assert train(tiny_config(num_steps=4), str(tiny_run_copy))["step"] == 6
    assert "is at step 6, num_steps=4: nothing to train" in capsys.readouterr().out
    os.remove(tiny_run_copy / ".lock")
    os.mkfifo(tiny_run_copy / ".lock")
    with pytest.raises(WorkdirError, match=r"\.lock is not a regular file; nothing was changed"):
        train(tiny_config(), str(tiny_run_copy))
    from rank4jax.cli import no_arguments

    with pytest.raises(SystemExit) as stopped:  # what app.run hands main after --widths=8, 16
        no_arguments(["ladder.py", "16"])
    assert stopped.value.code == 2 and capsys.readouterr().err == (
        "error: unexpected arguments ['16']: flags take their values after '=', a list's without spaces "
        "(--widths=64,128)\n")  # fmt: skip
