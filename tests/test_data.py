"""Tests for transformer_lib/data/: the tokenizer, the synthetic and dates tasks, the corpus
(local file, cache, checksum, offline fallback; never the network) and batch sampling."""

import datetime
import hashlib
import os
import random
import re
import urllib.error
from pathlib import Path

import pytest
import torch

from transformer_lib import data as D
from transformer_lib.data import corpus as C


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    """No test may download: offline, an empty cache, no local copy unless a test sets one."""
    monkeypatch.setenv(D.OFFLINE_ENV, "1")
    monkeypatch.setenv(D.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(D.PATH_ENV, raising=False)

    def refuse(url, timeout):
        raise AssertionError("a test tried to use the network")

    monkeypatch.setattr(C, "_fetch", refuse)


# --- tokenizer ---------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_specials():
    tok = D.CharTokenizer.from_text("hello world", specials=D.SPECIALS)
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 3 + len(set("hello world"))
    ids = tok.encode("hello", bos=True, eos=True)
    assert ids[0] == 1 and ids[-1] == 2 and min(ids[1:-1]) >= 3
    assert tok.decode(ids) == "hello"
    assert tok.decode(torch.tensor(ids + [0, 0])) == "hello"
    assert tok.decode(ids, skip_specials=False) == "<bos>hello<eos>"


def test_tokenizer_without_specials_and_unknown_characters():
    tok = D.CharTokenizer.from_text("abc")
    assert tok.encode("cab") == [2, 0, 1] and tok.pad_id is None
    with pytest.raises(ValueError, match="'z' is not in the tokenizer's vocabulary"):
        tok.encode("abz")
    with pytest.raises(ValueError, match="no <eos>"):
        tok.encode("a", eos=True)
    with pytest.raises(ValueError, match="distinct"):
        D.CharTokenizer("aa")


def test_tokenizer_save_and_load(tmp_path):
    tok = D.CharTokenizer.from_text("The quick brown fox\n", specials=D.SPECIALS)
    torch.save({"tokenizer": tok.to_dict()}, tmp_path / "t.pt")
    loaded = D.CharTokenizer.from_dict(torch.load(tmp_path / "t.pt", weights_only=True)["tokenizer"])
    assert loaded == tok and loaded.encode("fox") == tok.encode("fox")


def test_pad_sequences():
    out = D.pad_sequences([[5, 6], [7], []], pad_id=0)
    assert out.dtype == torch.long and out.tolist() == [[5, 6], [7, 0], [0, 0]]
    assert D.pad_sequences([[1]], length=3).tolist() == [[1, 0, 0]]


# --- sequence tasks ----------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["copy", "reverse", "sort"])
def test_sequence_task_layout_and_answers(task):
    d = D.sequence_task(task, n_train=300, n_val=50, n_symbols=6, min_len=2, max_len=7, seed=1)
    assert d.train_src.shape == (300, 7) and d.train_tgt.shape == (300, 9) and d.val_src.shape == (50, 7)
    for src, tgt in zip(torch.cat([d.train_src, d.val_src]), torch.cat([d.train_tgt, d.val_tgt]), strict=True):
        s = [int(i) for i in src if i != 0]
        assert 2 <= len(s) <= 7 and all(3 <= i < 9 for i in s)
        assert tgt[0] == 1 and tgt[len(s) + 1] == 2 and (tgt[len(s) + 2 :] == 0).all()
        expected = {"copy": s, "reverse": s[::-1], "sort": sorted(s)}[task]
        assert tgt[1 : len(s) + 1].tolist() == expected
    assert d.src_tokenizer.vocab_size == 9 and d.context_len == 9


def test_sequence_task_splits_are_disjoint_and_seeded():
    d = D.sequence_task("reverse", n_train=2000, n_val=500, n_symbols=4, min_len=1, max_len=6)
    train = {tuple(r.tolist()) for r in d.train_src}
    val = {tuple(r.tolist()) for r in d.val_src}
    assert len(train) == 2000 and len(val) == 500 and not train & val
    again = D.sequence_task("reverse", n_train=2000, n_val=500, n_symbols=4, min_len=1, max_len=6)
    assert torch.equal(again.train_src, d.train_src) and torch.equal(again.val_tgt, d.val_tgt)
    other = D.sequence_task("reverse", n_train=2000, n_val=500, n_symbols=4, min_len=1, max_len=6, seed=1)
    assert not torch.equal(other.train_src, d.train_src)
    with pytest.raises(ValueError, match="fewer than"):
        D.sequence_task("copy", n_train=100, n_val=10, n_symbols=2, min_len=1, max_len=3)


# --- dates ---------------------------------------------------------------------------------------

# How datetime.strptime reads each format, after ordinal suffixes, "the" and "of" are removed.
STRPTIME = {
    "d month yyyy": "%d %B %Y",
    "mon d, yyyy": "%b %d, %Y",
    "dd/mm/yy": "%d/%m/%y",
    "weekday the dth of month yyyy": "%A %d %B %Y",
    "yyyy.mm.dd": "%Y.%m.%d",
    "month dth yyyy": "%B %d %Y",
    "mm/dd/yyyy": "%m/%d/%Y",
    "wkd, d mon yyyy": "%a, %d %b %Y",
    "dd.mm.yyyy": "%d.%m.%Y",
    "weekday, month d, yyyy": "%A, %B %d, %Y",
    "d mon yy": "%d %b %y",
    "yyyymmdd": "%Y%m%d",
    "the dth of month, yyyy": "%d %B, %Y",
}


def parse(text: str, fmt: str) -> datetime.date:
    text = re.sub(r"(\d)(st|nd|rd|th)\b", r"\1", text)
    text = re.sub(r"\b(the|of) ", "", text)
    return datetime.datetime.strptime(text, STRPTIME[fmt]).date()


def sample_dates(n: int = 3000) -> list[datetime.date]:
    g = torch.Generator().manual_seed(0)
    span = (D.DATE_LAST - D.DATE_FIRST).days
    edges = [D.DATE_FIRST, D.DATE_LAST, datetime.date(2000, 2, 29), datetime.date(2026, 11, 21)]
    return edges + [D.DATE_FIRST + datetime.timedelta(days=int(i)) for i in torch.randint(span + 1, (n,), generator=g)]


def test_there_are_at_least_ten_date_formats():
    assert len(D.DATE_FORMATS) >= 10 and set(STRPTIME) == set(D.DATE_FORMATS)
    assert D.render_date(datetime.date(2026, 11, 21), "weekday the dth of month yyyy") == (
        "saturday the 21st of november 2026"
    )


def test_every_format_parses_back_to_the_same_date():
    for date in sample_dates():
        for fmt in D.DATE_FORMATS:
            text = D.render_date(date, fmt)
            assert text == text.lower() and len(text) <= 40
            assert parse(text, fmt) == date, (fmt, text)


def test_weekdays_are_correct():
    for date in sample_dates(500):
        weekday = date.strftime("%A").lower()
        for fmt in ("weekday the dth of month yyyy", "weekday, month d, yyyy"):
            assert D.render_date(date, fmt).startswith(weekday)
        assert D.render_date(date, "wkd, d mon yyyy").startswith(weekday[:3] + ",")


def test_no_string_names_two_dates():
    seen = {}
    for date in sample_dates():
        for fmt in D.DATE_FORMATS:
            assert seen.setdefault(D.render_date(date, fmt), date) == date


def test_dates_task_targets_are_iso_and_held_out_dates_are_unseen():
    d = D.dates_task(n_train=3000, n_val=300, seed=3)
    src_tok, tgt_tok = d.src_tokenizer, d.tgt_tokenizer
    assert src_tok.vocab_size <= 45 and tgt_tok.vocab_size == 14 and d.train_src.shape[1] <= 40
    assert d.train_tgt.shape[1] == 12 and (d.train_tgt[:, 0] == 1).all() and (d.train_tgt[:, -1] == 2).all()
    iso = {}
    for split, src, tgt in (("train", d.train_src, d.train_tgt), ("val", d.val_src, d.val_tgt)):
        dates = [datetime.date.fromisoformat(tgt_tok.decode(t)) for t in tgt]
        texts = [src_tok.decode(s) for s in src]
        for text, date in list(zip(texts, dates, strict=True))[:200]:
            assert any(D.render_date(date, f) == text for f in D.DATE_FORMATS), (text, date)
        iso[split] = set(dates)
    assert len(iso["val"]) == 300 and not iso["train"] & iso["val"]
    again = D.dates_task(n_train=3000, n_val=300, seed=3)
    assert torch.equal(again.train_src, d.train_src) and torch.equal(again.val_tgt, d.val_tgt)


# --- corpus ------------------------------------------------------------------------------------


def test_local_path_and_environment_variable(tmp_path, monkeypatch):
    f = tmp_path / "my_text.txt"
    f.write_text("to be or not to be\n", encoding="utf-8")
    c = D.load_corpus(f)
    assert (c.text, c.name) == ("to be or not to be\n", "my_text")
    monkeypatch.setenv(D.PATH_ENV, str(f))
    with pytest.warns(UserWarning, match="not the expected Tiny Shakespeare"):
        c = D.load_corpus()
    assert c.text.startswith("to be") and c.name == "tiny_shakespeare"
    monkeypatch.setenv(D.PATH_ENV, str(tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError, match="TINY_SHAKESPEARE"):
        D.load_corpus()


LOCAL_COPY = os.environ.get(D.PATH_ENV)  # read before the fixture hides it; CI sets it


def test_tiny_shakespeare_ships_with_the_package_and_is_verified(monkeypatch, tmp_path):
    """No network and no environment variable: the shipped copy, byte for byte the published one."""
    assert D.SHIPPED_PATH.is_file() and D.sha256_of(D.SHIPPED_PATH) == D.TINY_SHAKESPEARE_SHA256
    c = D.load_corpus()
    assert (c.name, c.source) == ("tiny_shakespeare", str(D.SHIPPED_PATH))
    assert len(c.text) == 1_115_394 and c.text.startswith("First Citizen:")
    changed = tmp_path / "tinyshakespeare.txt"  # an edited copy is never used silently
    changed.write_text(c.text.replace("Citizen", "Senator", 1), encoding="utf-8")
    monkeypatch.setattr(C, "SHIPPED_PATH", changed)
    with pytest.warns(UserWarning, match="has been changed"), pytest.warns(UserWarning, match="offline fallback"):
        assert D.load_corpus().name == "python_stdlib"


@pytest.fixture
def no_shipped_copy(monkeypatch, tmp_path):
    """An install without the shipped text: the cache, the download and the fallback."""
    monkeypatch.setattr(C, "SHIPPED_PATH", tmp_path / "not-shipped.txt")


@pytest.mark.skipif(not LOCAL_COPY or not Path(LOCAL_COPY).is_file(), reason="TINY_SHAKESPEARE is not set")
def test_real_tiny_shakespeare_from_environment(monkeypatch):
    monkeypatch.setenv(D.PATH_ENV, LOCAL_COPY)
    c = D.load_corpus()
    assert len(c.text) == 1_115_394 and c.text.startswith("First Citizen:")


def test_checksum_mismatch_raises_and_keeps_nothing(tmp_path, monkeypatch, no_shipped_copy):
    monkeypatch.setattr(C, "_fetch", lambda url, timeout: b"not shakespeare")
    cache = tmp_path / "c"
    with pytest.raises(D.ChecksumError, match="was not kept"):
        D.load_corpus(offline=False, cache_dir=cache)
    assert not cache.exists() or not any(cache.iterdir())


def test_download_is_cached_and_verified(tmp_path, monkeypatch, no_shipped_copy):
    content = b"Good morrow, cousin.\n" * 100
    monkeypatch.setattr(C, "TINY_SHAKESPEARE_SHA256", hashlib.sha256(content).hexdigest())
    calls = []
    monkeypatch.setattr(C, "_fetch", lambda url, timeout: calls.append(url) or content)
    cache = tmp_path / "c"
    assert D.load_corpus(offline=False, cache_dir=cache).text == content.decode()
    assert D.load_corpus(offline=False, cache_dir=cache).name == "tiny_shakespeare" and len(calls) == 1
    assert [p.name for p in cache.iterdir()] == ["tinyshakespeare.txt"]
    (cache / "tinyshakespeare.txt").write_bytes(b"corrupted")  # a bad cached copy is replaced
    with pytest.warns(UserWarning, match="checksum is wrong"):
        assert D.load_corpus(offline=False, cache_dir=cache).text == content.decode()
    assert len(calls) == 2


def test_offline_fallback_warns_and_is_large_enough(tmp_path, no_shipped_copy):
    with pytest.warns(UserWarning, match="offline fallback corpus"):
        c = D.load_corpus(cache_dir=tmp_path / "empty")  # ATTENTION_EXECUTED_OFFLINE=1 (fixture)
    assert c.name == "python_stdlib" and len(c.text) >= 100_000 and c.text.isascii()
    assert c.text == D.python_stdlib_corpus()  # deterministic


def test_network_failure_falls_back(tmp_path, monkeypatch, no_shipped_copy):
    def fail(url, timeout):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(C, "_fetch", fail)
    with pytest.warns(UserWarning, match="download failed"):
        c = D.load_corpus(offline=False, cache_dir=tmp_path / "c")
    assert c.name == "python_stdlib"


# --- splits and batches ------------------------------------------------------------------------


def test_corpus_split_never_overlaps():
    tokens = torch.arange(1000)
    train, val = D.split_tokens(tokens, 0.1)
    assert len(train) == 900 and len(val) == 100 and train.max() < val.min()
    assert torch.equal(torch.cat([train, val]), tokens)


def test_get_batch_shift_and_device(gen):
    data = torch.arange(100)
    x, y = D.get_batch(data, context_len=8, batch_size=5, generator=gen, device="cpu")
    assert x.shape == y.shape == (5, 8) and x.device.type == "cpu"
    assert torch.equal(y, x + 1)  # data[i] == i, so the next token is x + 1
    assert int(y.max()) < 100
    with pytest.raises(ValueError, match="context_len"):
        D.get_batch(torch.arange(8), context_len=8, batch_size=1)


def test_lm_batches_are_seeded_resumable_and_split_by_rank():
    train, val = D.split_tokens(torch.arange(500))
    b = D.LMBatches(train, val, context_len=4, batch_size=3, seed=7)
    x, _ = b("val")
    assert int(x.min()) >= 450  # validation windows come from the validation split
    state = b.state_dict()
    first = b("train")
    b.load_state_dict(state)
    assert all(torch.equal(p, q) for p, q in zip(first, b("train"), strict=True))
    world = D.LMBatches(train, val, 4, 6, seed=1)("train")[0]
    ranks = [D.LMBatches(train, val, 4, 3, seed=1, rank=r, world_size=2)("train")[0] for r in range(2)]
    assert torch.equal(torch.cat(ranks), world)
    with pytest.raises(ValueError, match="split"):
        b("test")


def test_seq2seq_batches_teacher_forcing_layout():
    d = D.sequence_task("copy", n_train=100, n_val=20, seed=0)
    src, tgt_in, tgt_out = D.Seq2SeqBatches(d, batch_size=8, seed=0)("val")
    assert src.shape == (8, 10) and tgt_in.shape == tgt_out.shape == (8, 11)
    assert (tgt_in[:, 0] == 1).all() and torch.equal(tgt_in[:, 1:], tgt_out[:, :-1])
    val_rows = {tuple(r.tolist()) for r in d.val_src}
    assert all(tuple(r.tolist()) in val_rows for r in src)


# --- date formats, field by field (chapter "Encoder-decoder and cross-attention")
# --------------------------------------------------


def test_date_field_spans_show_each_field_where_it_was_written():
    rng = random.Random(0)
    months = [datetime.date(2000, m, 1).strftime("%B").lower() for m in range(1, 13)]
    for _ in range(200):
        date = D.DATE_FIRST + datetime.timedelta(days=rng.randrange((D.DATE_LAST - D.DATE_FIRST).days + 1))
        for fmt in D.DATE_FORMATS:
            text, spans = D.date_field_spans(date, fmt)
            assert text == D.render_date(date, fmt) and D.date_format_of(text, date) in D.DATE_FORMATS
            assert {"day", "month", "year"} <= set(spans)
            year = text[spans["year"].start : spans["year"].stop]
            assert year in (str(date.year), f"{date.year % 100:02d}")
            day = text[spans["day"].start : spans["day"].stop]
            assert int(day.rstrip("stndrh")) == date.day
            month = text[spans["month"].start : spans["month"].stop]
            assert month in (f"{date.month:02d}", months[date.month - 1], months[date.month - 1][:3])
            covered = sorted(i for r in spans.values() for i in r)
            assert len(covered) == len(set(covered))  # fields never overlap


def test_date_format_of_and_render_date_reject_unknown_formats():
    date = datetime.date(2026, 11, 21)
    with pytest.raises(ValueError, match="no format"):
        D.date_format_of("21 nov 2026 at noon", date)
    with pytest.raises(ValueError, match="DATE_FORMATS"):
        D.render_date(date, "dd mm")
