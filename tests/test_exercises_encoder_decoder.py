"""The chapter "Encoder-decoder and cross-attention" checks accept right answers and reject plausible wrong ones with
the right message."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

from transformer_lib.exercises import encoder_decoder

SHIFT = encoder_decoder.check_teacher_forcing_shift
GREEDY = encoder_decoder.check_greedy_decode
CASES = Table()  # the rows of the answers below that are written as functions

# ---------------------------------------------------------------- check_teacher_forcing_shift


@CASES.add(SHIFT, "passed")
def shift_model_answer(tgt):
    return tgt[:, :-1], tgt[:, 1:]


@CASES.add(SHIFT, "failed", "there is no shift")
def shift_none(tgt):
    return tgt, tgt


@CASES.add(SHIFT, "failed", "there is no shift")
def shift_none_trimmed(tgt):
    return tgt[:, 1:], tgt[:, 1:]


@CASES.add(SHIFT, "failed", "the shift goes the wrong way")
def shift_wrong_way(tgt):
    return tgt[:, 1:], tgt[:, :-1]


@CASES.add(SHIFT, "failed", "your decoder input has shape (3, 5)", "expected (3, 4)")
def shift_full_input(tgt):
    return tgt, tgt[:, 1:]


@CASES.add(SHIFT, "failed", "your targets have shape (3, 3)")
def shift_drops_eos_column_from_targets(tgt):
    return tgt[:, :-1], tgt[:, 1:-1]


@CASES.add(SHIFT, "failed", "contains <bos>")
def shift_targets_with_bos(tgt):
    return tgt[:, :-1], tgt[:, :-1].roll(-1, dims=1)


@CASES.add(SHIFT, "failed", "has no <eos>")
def shift_eos_removed_from_targets(tgt):
    out = tgt[:, 1:].clone()
    out[out == 2] = 0
    return tgt[:, :-1], out


@CASES.add(SHIFT, "failed", "dtype torch.float32")
def shift_float(tgt):
    return tgt[:, :-1].float(), tgt[:, 1:].float()


@CASES.add(SHIFT, "failed", "changed its argument tgt in place")
def shift_in_place(tgt):
    tgt[tgt == 2] = 0
    return tgt[:, :-1], tgt[:, 1:]


@CASES.add(SHIFT, "failed", "return a pair")
def shift_returns_one_tensor(tgt):
    return torch.stack([tgt[:, :-1], tgt[:, 1:]])


SHIFT_CASES = [
    case(SHIFT, lambda t: [t[:, :-1], t[:, 1:]], "passed", id="a list"),
    case(SHIFT, stub, "not implemented"),
]


# ---------------------------------------------------------------- check_greedy_decode


@CASES.add(GREEDY, "passed")
def greedy_model_answer(model, src, max_new_tokens):
    c = model.config
    memory, src_keep = model.encode(src)
    out = torch.full((src.shape[0], 1), c.bos_id, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_new_tokens):
        nxt = model.decode(out, memory, src_keep)[:, -1].argmax(dim=-1)  # (B,)
        nxt = torch.where(done, torch.full_like(nxt, c.pad_id), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done = done | (nxt == c.eos_id)
        if done.all():
            break
    return out[:, 1:]


def make_greedy(
    start=None, keep_bos=False, pad_after_eos=True, stop="all", position=-1, axis=-1, keep_eos=True, forward=False
):
    """A greedy decoder with one deliberate slip, for the tests below."""

    def fn(model, src, max_new_tokens):
        c = model.config
        memory, src_keep = model.encode(src)
        B = src.shape[0]
        out = torch.full((B, 1), c.bos_id if start is None else start, dtype=torch.long)
        done = torch.zeros(B, dtype=torch.bool)
        for _ in range(max_new_tokens):
            logits = model(src, out)[0] if forward else model.decode(out, memory, src_keep)
            nxt = logits[:, position].argmax(dim=axis)
            ended = nxt == c.eos_id
            if pad_after_eos:
                nxt = torch.where(done, torch.full_like(nxt, c.pad_id), nxt)
                if not keep_eos:
                    nxt = torch.where(ended, torch.full_like(nxt, c.pad_id), nxt)
            out = torch.cat([out, nxt[:, None]], dim=1)
            done = done | ended
            if (stop == "all" and done.all()) or (stop == "any" and done.any()):
                break
        return out if keep_bos else out[:, 1:]

    return fn


@CASES.add(GREEDY, "failed", "called the decoder with an empty prefix")
def greedy_from_an_empty_prefix(model, src, max_new_tokens):
    memory, src_keep = model.encode(src)
    out = torch.zeros(src.shape[0], 0, dtype=torch.long)
    for _ in range(max_new_tokens):
        nxt = model.decode(out, memory, src_keep)[:, -1].argmax(-1)
        out = torch.cat([out, nxt[:, None]], dim=1)
    return out


GREEDY_CASES = [
    case(GREEDY, lambda m, s, n: m.greedy_decode(s, max_new_tokens=n), "passed", id="library"),
    case(GREEDY, make_greedy(forward=True), "passed", id="through forward"),
    case(GREEDY, make_greedy(keep_bos=True), "failed", "the first column of your output is <bos>", id="keeps bos"),
    case(GREEDY, make_greedy(pad_after_eos=False), "failed", "goes on after its <eos>", id="no pad after eos"),
    case(GREEDY, make_greedy(stop="never"), "failed",
         "every row had ended after 6 steps, but your output has 8 columns", id="never stops"),
    case(GREEDY, make_greedy(stop="any"), "failed", "you stopped after 2 steps, but row 0 had not ended yet",
         id="stops at the first eos"),
    *(
        case(GREEDY, make_greedy(start=start), "failed", "decoding must start from a column of <bos>",
             id=f"starts from {start}")
        for start in (0, 2)
    ),
    case(GREEDY, make_greedy(position=0), "failed", "the prediction of the first position (logits[:, 0])",
         id="first position"),
    case(GREEDY, make_greedy(axis=0), "failed", "argmax over the vocabulary axis (dim=-1)", id="argmax over batch"),
    case(GREEDY, make_greedy(keep_eos=False), "failed", "has <pad> where it should have its <eos>",
         id="eos replaced by pad"),
    case(GREEDY, lambda m, s, n: m.greedy_decode(s, max_new_tokens=n).tolist(), "failed", "returned a list",
         id="a list"),
    case(GREEDY, stub, "not implemented"),
]  # fmt: skip


@pytest.mark.parametrize(FIELDS, CASES + SHIFT_CASES + GREEDY_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
