"""Tests of transformer_lib/bpe.py and the tokenizer files (chapter "Tokens"): the incremental trainer
equals the naive one merge for merge, the encoder equals tiktoken's and Hugging Face's given the
same merges, decoding inverts encoding, special tokens never come from text unasked."""

import json
import random
from itertools import pairwise

import pytest
import regex
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from benchmarks.tokenizer import naive_train_bpe
from transformer_lib.data import SHIPPED_PATH

SHAKESPEARE = SHIPPED_PATH.read_text(encoding="utf-8")
# Strings a tokenizer gets wrong first: combining marks, emoji with joiners and skin tones,
# right-to-left text, NUL and control characters, long runs of one character, contractions in
# capitals, digits, tabs and blank lines, and text that looks like a special token.
ADVERSARIAL = [
    "e\u0301 cafe\u0301 \u00e9 n\u0303o\u0308",
    "\U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f44d\U0001f3fd \U0001f1eb\U0001f1f7!",
    "\u05e9\u05dc\u05d5\u05dd \u0639\u0627\u0644\u0645 mixed \u202eright-to-left\u202c",
    "a\x00b\x01\x7f\u0085c",
    "a" * 5000 + " " + "\n" * 300 + "!" * 777,
    "I'LL WE'VE you'd it's O'er  \t\t tabs\t\n\n\n blank   lines  ",
    "1234567890 3.14159 2024-11-26 1,000,000 \u0663\u0664\u0665",
    "<|endoftext|> <|im_start|>user <eos> [CLS]",
    "\u4f60\u597d\uff0c\u4e16\u754c \u3053\u3093\u306b\u3061\u306f \ud55c\uad6d\uc5b4",
    "\ufeffbyte order mark, \u00a0non-breaking, \u2028line separator",
]
TEXTS = {"shakespeare": SHAKESPEARE[:60_000], "mixed": SHAKESPEARE[200_000:230_000] + "".join(ADVERSARIAL) * 3}


@pytest.mark.parametrize("pattern", ["gpt2", "gpt4"])
@pytest.mark.parametrize("name", TEXTS)
def test_incremental_training_equals_the_naive_recount(name, pattern):
    ours = tl.train_bpe(TEXTS[name], 256 + 150, pattern)
    assert ours.merges == naive_train_bpe(TEXTS[name], 256 + 150, pattern)


def test_a_smaller_vocabulary_is_a_prefix_of_a_larger_one():
    big, small = tl.train_bpe(SHAKESPEARE[:100_000], 900), tl.train_bpe(SHAKESPEARE[:100_000], 400)
    assert small.merges == big.merges[: 400 - 256]


def test_ties_go_to_the_smaller_pair():
    # the chunks are "ab", "cd" and "," (punctuation is its own chunk): (97, 98) and (99, 100) tie
    tok = tl.train_bpe("ab,cd,ab,cd,ab,cd", 257)
    assert tok.merges == [(97, 98)]
    tok = tl.train_bpe("cd,ab,cd,ab,cd,ab", 257)  # order in the text does not matter
    assert tok.merges == [(97, 98)]


def test_training_stops_when_no_pair_is_left():
    tok = tl.train_bpe("aaaa", 300)
    assert [tok.token_bytes[i] for i in range(256, tok.vocab_size)] == [b"aa", b"aaaa"]


@pytest.fixture(scope="module")
def trained():
    """Tokenizers trained on several texts, patterns and sizes, with specials."""
    out = {}
    for pattern in ("gpt2", "gpt4"):
        for size in (300, 1000, 3000):
            out[pattern, size] = tl.train_bpe(SHAKESPEARE[: 40 * size], size + 1, pattern, specials=["<|endoftext|>"])
    out["mixed", 700] = tl.train_bpe(TEXTS["mixed"], 700, "gpt4")
    return out


def _tiktoken(tok):
    tiktoken = pytest.importorskip("tiktoken")
    specials = {s: i for s, i in tok.special_ids.items()}
    return tiktoken.Encoding(
        "book", pat_str=tok.pattern, mergeable_ranks=tok.mergeable_ranks(), special_tokens=specials
    )


def test_ids_equal_tiktokens_given_the_same_ranks(trained):
    for key, tok in trained.items():
        enc = _tiktoken(tok)
        for text in [SHAKESPEARE, *ADVERSARIAL]:
            assert tok.encode_ordinary(text) == enc.encode_ordinary(text), (key, text[:40])
        text = "To be<|endoftext|> or not"
        assert tok.encode(text, allowed_special="all") == enc.encode(text, allowed_special="all"), key


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte, which Hugging Face's byte-level BPE writes."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def _hugging_face(tok):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Regex, decoders, models, pre_tokenizers

    show = _bytes_to_unicode()
    spell = lambda b: "".join(show[x] for x in b)  # noqa: E731
    vocab = {spell(b): i for i, b in enumerate(tok.token_bytes)}
    merges = [(spell(tok.token_bytes[a]), spell(tok.token_bytes[b])) for a, b in tok.merges]
    hf = tokenizers.Tokenizer(models.BPE(vocab, merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(tok.pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    return hf


def test_ids_equal_hugging_faces_given_the_same_vocabulary_and_merges(trained):
    for key, tok in trained.items():
        hf = _hugging_face(tok)
        for text in [SHAKESPEARE[:200_000], *ADVERSARIAL]:
            assert hf.encode(text).ids == tok.encode_ordinary(text), (key, text[:40])


def test_rustbpe_learns_the_same_merges_under_the_same_tie_rule():
    rustbpe = pytest.importorskip("rustbpe")
    for pattern in ("gpt2", "gpt4"):
        theirs = rustbpe.Tokenizer()
        theirs.train_from_iterator(iter([SHAKESPEARE]), 256 + 1000, pattern=tl.PATTERNS[pattern])
        ranks = {bytes(b): i for b, i in theirs.get_mergeable_ranks()}
        assert ranks == tl.train_bpe(SHAKESPEARE, 256 + 1000, pattern).mergeable_ranks(), pattern


def test_hugging_faces_trainer_differs_only_in_how_it_breaks_ties():
    # Hugging Face's trainer learns the same merges in another order: at a tie it prefers the pair
    # whose ids are smaller in its own numbering, which sorts the bytes by their printable stand-ins.
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.train_from_iterator(
        [SHAKESPEARE],
        trainers.BpeTrainer(
            vocab_size=1256, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),  # fmt: skip
    )
    unshow = {c: b for b, c in _bytes_to_unicode().items()}
    merged = [m if isinstance(m, list) else m.split(" ") for m in json.loads(hf.to_str())["model"]["merges"]]
    theirs = [b"".join(bytes(unshow[c] for c in part) for part in m) for m in merged]
    ours_tok = tl.train_bpe(SHAKESPEARE, 1256)
    ours = ours_tok.token_bytes[256:]
    assert set(theirs) == set(ours)
    first = next(i for i, (a, b) in enumerate(zip(theirs, ours, strict=True)) if a != b)
    # at the first difference, the two candidate merges are equally frequent at that point
    before = tl.BPETokenizer(ours_tok.merges[:first])
    counts = {}
    for chunk in regex.findall(ours_tok.pattern, SHAKESPEARE):
        ids = before.encode_ordinary(chunk)
        for pair in pairwise(ids):
            key = before.token_bytes[pair[0]] + before.token_bytes[pair[1]]
            counts[key] = counts.get(key, 0) + 1
    assert counts[theirs[first]] == counts[ours[first]]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_decode_inverts_encode_for_every_string(text):
    tok = _small()
    assert tok.decode(tok.encode_ordinary(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 255 + 300), max_size=40))
def test_decoding_never_fails_on_any_ids(ids):
    assert isinstance(_small().decode(ids), str)  # a cut through a character reads as U+FFFD


_SMALL: list = []


def _small():
    if not _SMALL:
        _SMALL.append(tl.train_bpe(SHAKESPEARE[:50_000] + "".join(ADVERSARIAL), 556, "gpt4"))
    return _SMALL[0]


def test_the_encoder_caches_chunks_without_changing_ids():
    tok = tl.train_bpe(SHAKESPEARE[:50_000], 600)
    first = tok.encode(SHAKESPEARE[:100_000])
    assert tok._cache and tok.encode(SHAKESPEARE[:100_000]) == first
    assert tl.BPETokenizer(tok.merges).encode(SHAKESPEARE[:100_000]) == first


def test_special_tokens_are_never_made_from_text_unless_allowed():
    tok = tl.train_bpe(SHAKESPEARE[:20_000], 300, specials=["<|endoftext|>"])
    eot = tok.special_ids["<|endoftext|>"]
    prompt = "Ignore this.<|endoftext|>New document"
    with pytest.raises(ValueError, match=r"spells the special token '<\|endoftext\|>'.*allowed_special"):
        tok.encode(prompt)
    assert eot not in tok.encode_ordinary(prompt)
    assert tok.decode(tok.encode_ordinary(prompt)) == prompt
    assert tok.encode(prompt, allowed_special={"<|endoftext|>"}).count(eot) == 1
    assert tok.encode(prompt, allowed_special="all") == tok.encode(prompt, allowed_special={"<|endoftext|>"})
    assert tok.decode(tok.encode(prompt, allowed_special="all"), skip_specials=False) == prompt
    assert tok.decode(tok.encode("a", eos=True)) == "a"
    with pytest.raises(ValueError, match="not special tokens of this tokenizer"):
        tok.encode("a", allowed_special={"<pad>"})


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: tl.train_bpe("abc", 255), ValueError, ["vocab_size", "255"]),
        (lambda: tl.train_bpe("abc", 256.0), TypeError, ["vocab_size", "256.0"]),
        (lambda: tl.train_bpe("abc", 300, specials=["<a>"] * 2), ValueError, ["distinct", "'<a>', '<a>'"]),
        (lambda: tl.train_bpe(b"abc", 300), TypeError, ["text", "bytes"]),
        (lambda: tl.train_bpe("abc", 300, pattern="gpt3"), ValueError, ["'gpt3'", "gpt2", "gpt4"]),
        (lambda: tl.train_bpe("abc", 300, pattern="(unclosed"), ValueError, ["pattern", "(unclosed"]),
        (lambda: tl.train_bpe("a\ud800b", 300), ValueError, ["surrogate", "index 1"]),
        (lambda: tl.BPETokenizer([(97, 98)]).encode("x\udfffy"), ValueError, ["surrogate", "index 1"]),
        (lambda: tl.BPETokenizer([(97, 300)]), ValueError, ["merge 0", "(97, 300)"]),
        (lambda: tl.BPETokenizer([(97, 98), (97, 98)]), ValueError, ["repeats", "(97, 98)"]),
        (lambda: tl.BPETokenizer([], specials=["<a>", "<a>"]), ValueError, ["distinct"]),
        (lambda: tl.BPETokenizer([]).decode([256]), ValueError, ["256", "vocab_size=256"]),
        (lambda: tl.BPETokenizer([]).decode([-1]), ValueError, ["-1"]),
        (lambda: tl.BPETokenizer([]).decode([1.0]), TypeError, ["1.0", "float"]),
        (lambda: tl.BPETokenizer([]).encode("a", eos=True), ValueError, ["end-of-text"]),
        (lambda: tl.bytes_per_token(tl.BPETokenizer([]), ""), ValueError, ["empty"]),
    ],
)
def test_bad_input_gets_a_clear_error(call, error, words):
    with pytest.raises(error) as info:
        call()
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_the_character_tokenizer_shares_the_interface():
    text = "To be, or not to be"
    for tok in (tl.CharTokenizer.from_text(text), tl.train_bpe(text, 270)):
        assert tok.decode(tok.encode(text)) == text
        assert all(0 <= i < tok.vocab_size for i in tok.encode(text))
        assert tl.tokenizer_from_dict(tok.to_dict()) == tok


def test_tokenizer_files_round_trip_and_are_checked(tmp_path):
    bpe = tl.train_bpe(SHAKESPEARE[:20_000], 400, "gpt4", specials=["<|endoftext|>"])
    char = tl.CharTokenizer.from_text("hello", specials=tl.SPECIALS)
    for tok in (bpe, char):
        path = tl.save_tokenizer(tok, tmp_path / f"{tok.kind}.json")
        assert tl.load_tokenizer(path) == tok
        assert tl.save_tokenizer(tok, path) == path  # the same tokenizer again: nothing to protect
    with pytest.raises(FileExistsError, match="force=True"):
        tl.save_tokenizer(char, tmp_path / "bpe.json")
    tl.save_tokenizer(char, tmp_path / "bpe.json", force=True)
    assert tl.load_tokenizer(tmp_path / "bpe.json") == char
    path = tl.save_tokenizer(bpe, tmp_path / "damaged.json")
    data = json.loads(path.read_text())
    data["tokenizer"]["merges"][3] = [data["tokenizer"]["merges"][3][1], data["tokenizer"]["merges"][3][0]]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="damaged.json fails its checksum"):
        tl.load_tokenizer(path)
    for content, words in [("{", "not JSON"), ('{"format": "x"}', "not a tokenizer file"),
                           ('{"format": "attention-executed-tokenizer", "version": 9}', "version 9")]:  # fmt: skip
        path.write_text(content)
        with pytest.raises(ValueError, match=words):
            tl.load_tokenizer(path)
    with pytest.raises(IsADirectoryError, match="is a folder"):
        tl.save_tokenizer(bpe, tmp_path)


def test_a_named_pattern_and_its_text_give_the_same_checksum_but_other_merges_do_not():
    a = tl.BPETokenizer([(97, 98)], "gpt2")
    assert tl.tokenizer_checksum(a) == tl.tokenizer_checksum(tl.BPETokenizer([(97, 98)], tl.PATTERNS["gpt2"]))
    assert tl.tokenizer_checksum(a) != tl.tokenizer_checksum(tl.BPETokenizer([(98, 97)], "gpt2"))
    assert tl.tokenizer_checksum(a) != tl.tokenizer_checksum(tl.BPETokenizer([(97, 98)], "gpt4"))


def test_random_merge_lists_encode_like_tiktoken():
    # not only trained merges: any valid merge list (each pair of earlier ids, distinct bytes)
    tiktoken = pytest.importorskip("tiktoken")
    rng = random.Random(0)
    merges, seen = [], {bytes([b]) for b in range(256)}
    token_bytes = [bytes([b]) for b in range(256)]
    letters = [ord(c) for c in "etaoin shrdlu"]
    while len(merges) < 200:
        a = rng.choice(letters + list(range(256, 256 + len(merges))))
        b = rng.choice(letters + list(range(256, 256 + len(merges))))
        if token_bytes[a] + token_bytes[b] in seen:
            continue
        seen.add(token_bytes[a] + token_bytes[b])
        token_bytes.append(token_bytes[a] + token_bytes[b])
        merges.append((a, b))
    tok = tl.BPETokenizer(merges)
    enc = tiktoken.Encoding("r", pat_str=tok.pattern, mergeable_ranks=tok.mergeable_ranks(), special_tokens={})
    text = SHAKESPEARE[:30_000].lower()
    assert tok.encode(text) == enc.encode_ordinary(text)
