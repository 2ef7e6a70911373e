"""The chapter 8 checks accept right answers and reject plausible wrong ones with the right message."""

import torch

from transformer_lib.exercises import ch08


def run(checker, fn):
    return checker(fn, verbose=False)


# ---------------------------------------------------------------- check_teacher_forcing_shift


def shift_model_answer(tgt):
    return tgt[:, :-1], tgt[:, 1:]


def shift_none(tgt):
    return tgt, tgt


def shift_none_trimmed(tgt):
    return tgt[:, 1:], tgt[:, 1:]


def shift_wrong_way(tgt):
    return tgt[:, 1:], tgt[:, :-1]


def shift_full_input(tgt):
    return tgt, tgt[:, 1:]


def shift_drops_eos_column_from_targets(tgt):
    return tgt[:, :-1], tgt[:, 1:-1]


def shift_targets_with_bos(tgt):
    return tgt[:, :-1], tgt[:, :-1].roll(-1, dims=1)


def shift_eos_removed_from_targets(tgt):
    out = tgt[:, 1:].clone()
    out[out == 2] = 0
    return tgt[:, :-1], out


def shift_float(tgt):
    return tgt[:, :-1].float(), tgt[:, 1:].float()


def shift_in_place(tgt):
    tgt[tgt == 2] = 0
    return tgt[:, :-1], tgt[:, 1:]


def shift_returns_one_tensor(tgt):
    return torch.stack([tgt[:, :-1], tgt[:, 1:]])


def shift_stub(tgt):
    raise NotImplementedError


def test_shift_accepts_model_answer_and_a_list():
    assert run(ch08.check_teacher_forcing_shift, shift_model_answer).passed
    assert run(ch08.check_teacher_forcing_shift, lambda t: [t[:, :-1], t[:, 1:]]).passed


def test_shift_rejects_no_shift():
    for fn in (shift_none, shift_none_trimmed):
        r = run(ch08.check_teacher_forcing_shift, fn)
        assert r.status == "failed"
        assert "there is no shift" in r.message


def test_shift_rejects_wrong_direction():
    r = run(ch08.check_teacher_forcing_shift, shift_wrong_way)
    assert "the shift goes the wrong way" in r.message


def test_shift_rejects_wrong_shapes():
    r = run(ch08.check_teacher_forcing_shift, shift_full_input)
    assert "your decoder input has shape (3, 5)" in r.message and "expected (3, 4)" in r.message
    r = run(ch08.check_teacher_forcing_shift, shift_drops_eos_column_from_targets)
    assert "your targets have shape (3, 3)" in r.message


def test_shift_rejects_bos_in_targets_and_missing_eos():
    r = run(ch08.check_teacher_forcing_shift, shift_targets_with_bos)
    assert "contains <bos>" in r.message
    r = run(ch08.check_teacher_forcing_shift, shift_eos_removed_from_targets)
    assert "has no <eos>" in r.message


def test_shift_rejects_float_in_place_and_one_tensor():
    assert "dtype torch.float32" in run(ch08.check_teacher_forcing_shift, shift_float).message
    assert "changed its argument tgt in place" in run(ch08.check_teacher_forcing_shift, shift_in_place).message
    assert "return a pair" in run(ch08.check_teacher_forcing_shift, shift_returns_one_tensor).message


def test_shift_stub_is_not_implemented():
    assert run(ch08.check_teacher_forcing_shift, shift_stub).status == "not implemented"


# ---------------------------------------------------------------- check_greedy_decode


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


def test_greedy_accepts_model_answer_library_and_forward():
    assert run(ch08.check_greedy_decode, greedy_model_answer).passed
    assert run(ch08.check_greedy_decode, lambda m, s, n: m.greedy_decode(s, max_new_tokens=n)).passed
    assert run(ch08.check_greedy_decode, make_greedy(forward=True)).passed


def test_greedy_rejects_bos_in_output():
    r = run(ch08.check_greedy_decode, make_greedy(keep_bos=True))
    assert r.status == "failed"
    assert "the first column of your output is <bos>" in r.message


def test_greedy_rejects_no_padding_after_eos():
    r = run(ch08.check_greedy_decode, make_greedy(pad_after_eos=False))
    assert "goes on after its <eos>" in r.message


def test_greedy_rejects_not_stopping_and_stopping_early():
    r = run(ch08.check_greedy_decode, make_greedy(stop="never"))
    assert "every row had ended after 6 steps, but your output has 8 columns" in r.message
    r = run(ch08.check_greedy_decode, make_greedy(stop="any"))
    assert "you stopped after 2 steps, but row 0 had not ended yet" in r.message


def test_greedy_rejects_missing_bos():
    for start in (0, 2):
        r = run(ch08.check_greedy_decode, make_greedy(start=start))
        assert "decoding must start from a column of <bos>" in r.message


def test_greedy_rejects_first_position_and_wrong_axis():
    r = run(ch08.check_greedy_decode, make_greedy(position=0))
    assert "the prediction of the first position (logits[:, 0])" in r.message
    r = run(ch08.check_greedy_decode, make_greedy(axis=0))
    assert "argmax over the vocabulary axis (dim=-1)" in r.message


def test_greedy_rejects_eos_replaced_by_pad():
    r = run(ch08.check_greedy_decode, make_greedy(keep_eos=False))
    assert "has <pad> where it should have its <eos>" in r.message


def test_greedy_rejects_a_list_and_an_empty_prefix():
    r = run(ch08.check_greedy_decode, lambda m, s, n: m.greedy_decode(s, max_new_tokens=n).tolist())
    assert "returned a list" in r.message

    def empty_start(model, src, max_new_tokens):
        memory, src_keep = model.encode(src)
        out = torch.zeros(src.shape[0], 0, dtype=torch.long)
        for _ in range(max_new_tokens):
            nxt = model.decode(out, memory, src_keep)[:, -1].argmax(-1)
            out = torch.cat([out, nxt[:, None]], dim=1)
        return out

    r = run(ch08.check_greedy_decode, empty_start)
    assert "called the decoder with an empty prefix" in r.message


def test_greedy_stub_is_not_implemented():
    def stub(model, src, max_new_tokens):
        raise NotImplementedError

    assert run(ch08.check_greedy_decode, stub).status == "not implemented"
