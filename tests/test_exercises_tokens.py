"""The chapter "Tokens" checks accept right answers and reject plausible wrong ones with the right message."""

import math
from itertools import pairwise

import pytest
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import tokens

MERGE, ENCODE, BPB = tokens.check_merge, tokens.check_encode_chunk, tokens.check_bits_per_byte
CASES = Table()

# ---------------------------------------------------------------- check_merge


@CASES.add(MERGE, "passed")
def merge_library(ids, pair, new_id):
    return tl.bpe_merge(ids, pair, new_id)


@CASES.add(MERGE, "passed")
def merge_by_index(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i : i + 2] == list(pair):
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


@CASES.add(MERGE, "failed", "first occurrence only")
def merge_once(ids, pair, new_id):
    for k in range(len(ids) - 1):
        if (ids[k], ids[k + 1]) == tuple(pair):
            return [*ids[:k], new_id, *ids[k + 2 :]]
    return list(ids)


@CASES.add(MERGE, "failed", "scanned from the right")
def merge_from_right(ids, pair, new_id):
    return tl.bpe_merge(ids[::-1], pair[::-1], new_id)[::-1]


@CASES.add(MERGE, "failed", "skip both ids")
def merge_overlapping(ids, pair, new_id):
    return [new_id if (x, y) == tuple(pair) else x for x, y in pairwise([*ids, None])]


@CASES.add(MERGE, "failed", "the pair reversed")
def merge_reversed(ids, pair, new_id):
    return tl.bpe_merge(ids, pair[::-1], new_id)


@CASES.add(MERGE, "failed", "changed ids in place")
def merge_in_place(ids, pair, new_id):
    ids[:] = tl.bpe_merge(ids, pair, new_id)
    return ids


@CASES.add(MERGE, "failed", "return a list of ints")
def merge_string(ids, pair, new_id):
    return str(tl.bpe_merge(ids, pair, new_id))


@CASES.add(MERGE, "failed", "IndexError")
def merge_off_the_end(ids, pair, new_id):
    out, i = [], 0
    while i < len(ids):
        if ids[i] == pair[0] and ids[i + 1] == pair[1]:  # reads past the end
            out.append(new_id)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


# ---------------------------------------------------------------- check_encode_chunk


@CASES.add(ENCODE, "passed")
def encode_model_answer(ids, ranks):
    while len(ids) > 1:
        pairs = [p for p in pairwise(ids) if p in ranks]
        if not pairs:
            break
        pair = min(pairs, key=ranks.get)
        ids = tl.bpe_merge(ids, pair, ranks[pair])
    return ids


@CASES.add(ENCODE, "passed")
def encode_every_merge_in_order(ids, ranks):
    # replaying the whole merge list once, in order, gives the same ids
    for pair, new_id in sorted(ranks.items(), key=lambda item: item[1]):
        ids = tl.bpe_merge(ids, pair, new_id)
    return ids


@CASES.add(ENCODE, "failed", "leftmost pair")
def encode_leftmost(ids, ranks):
    return tokens._leftmost(ids, ranks)


@CASES.add(ENCODE, "failed", "merged once and stopped")
def encode_one_pass(ids, ranks):
    pairs = [p for p in pairwise(ids) if p in ranks]
    if not pairs:
        return ids
    pair = min(pairs, key=ranks.get)
    return tl.bpe_merge(ids, pair, ranks[pair])


@CASES.add(ENCODE, "failed", "longest token")
def encode_greedy(ids, ranks):
    pieces = {i: bytes([i]) for i in range(256)}
    for (a, b), new_id in sorted(ranks.items(), key=lambda item: item[1]):
        pieces[new_id] = pieces[a] + pieces[b]
    vocab = {v: k for k, v in pieces.items()}
    data, out, i = bytes(ids), [], 0
    while i < len(data):
        j = max(j for j in range(i + 1, len(data) + 1) if data[i:j] in vocab)
        out.append(vocab[data[i:j]])
        i = j
    return out


@CASES.add(ENCODE, "failed", "changed ranks")
def encode_pops_ranks(ids, ranks):
    out = encode_model_answer(ids, ranks)
    ranks.clear()
    return out


@CASES.add(ENCODE, "failed", "expected")
def encode_latest_first(ids, ranks):
    while len(ids) > 1:
        pairs = [p for p in pairwise(ids) if p in ranks]
        if not pairs:
            break
        pair = max(pairs, key=ranks.get)
        ids = tl.bpe_merge(ids, pair, ranks[pair])
    return ids


# ---------------------------------------------------------------- check_bits_per_byte


@CASES.add(BPB, "passed")
def bpb_model_answer(nats_per_token, n_tokens, n_bytes):
    return nats_per_token * n_tokens / (n_bytes * math.log(2))


@CASES.add(BPB, "passed")
def bpb_log2(nats_per_token, n_tokens, n_bytes):
    return nats_per_token / math.log(2) * n_tokens / n_bytes


@CASES.add(BPB, "failed", "left the loss in nats")
def bpb_nats(nats_per_token, n_tokens, n_bytes):
    return nats_per_token * n_tokens / n_bytes


@CASES.add(BPB, "failed", "bits per token")
def bpb_per_token(nats_per_token, n_tokens, n_bytes):
    return nats_per_token / math.log(2)


@CASES.add(BPB, "failed", "log base 10")
def bpb_log10(nats_per_token, n_tokens, n_bytes):
    return nats_per_token * n_tokens / (n_bytes * math.log10(2))


@CASES.add(BPB, "failed", "multiplied by the bytes per token")
def bpb_upside_down(nats_per_token, n_tokens, n_bytes):
    return nats_per_token * n_bytes / (n_tokens * math.log(2))


@CASES.add(BPB, "failed", "return a float")
def bpb_string(nats_per_token, n_tokens, n_bytes):
    return f"{bpb_model_answer(nats_per_token, n_tokens, n_bytes):.3f}"


def test_the_library_passes_its_own_checks():
    assert MERGE(tl.bpe_merge, verbose=False)
    tok = tl.BPETokenizer([])
    assert ENCODE(lambda ids, ranks: tl.BPETokenizer._encode_chunk(_with(ranks), bytes(ids).decode()), verbose=False)
    del tok


def _with(ranks):
    """A tokenizer whose merges are the pairs of ``ranks``, in the order of their ids."""
    return tl.BPETokenizer([pair for pair, _ in sorted(ranks.items(), key=lambda item: item[1])])


STUB_CASES = [case(c, stub, "not implemented") for c in (MERGE, ENCODE, BPB)]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
