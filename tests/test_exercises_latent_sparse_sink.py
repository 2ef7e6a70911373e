"""The chapter "Latent, sparse and sink attention" checks accept right answers and reject plausible wrong ones with the
right message."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import latent_sparse_sink

SINK, FOLD = latent_sparse_sink.check_sink_softmax, latent_sparse_sink.check_fold_query
CASES = Table()


@CASES.add(SINK, "passed")
def sink_model_answer(scores, sink):
    column = sink[:, None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]


@CASES.add(SINK, "passed")
def sink_by_hand(scores, sink):
    s = sink[:, None, None]
    m = torch.maximum(scores.amax(-1, keepdim=True), s)
    e = torch.exp(scores - m)
    return e / (e.sum(-1, keepdim=True) + torch.exp(s - m))


@CASES.add(SINK, "failed", "renormalised")
def sink_renormalised(scores, sink):
    return sink_model_answer(scores, sink) / sink_model_answer(scores, sink).sum(-1, keepdim=True)


@CASES.add(SINK, "failed", "NaN or inf")
def sink_no_max(scores, sink):
    e = torch.exp(scores)
    return e / (e.sum(-1, keepdim=True) + torch.exp(sink)[:, None, None])


@CASES.add(SINK, "failed", "has shape")
def sink_column_kept(scores, sink):
    column = sink[:, None, None].expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)


@CASES.add(SINK, "failed", "head axis")
def sink_one_for_all(scores, sink):
    return sink_model_answer(scores, sink[:1].expand(sink.shape[0]))


@CASES.add(SINK, "failed", "dtype")
def sink_float32(scores, sink):
    return sink_model_answer(scores.float(), sink.float())


@CASES.add(FOLD, "passed")
def fold_model_answer(q_nope, w_uk):
    return torch.einsum("bhtn,hnc->bhtc", q_nope, w_uk)


@CASES.add(FOLD, "passed")
def fold_matmul(q_nope, w_uk):
    return q_nope @ w_uk[None]  # (B, h, T, n) @ (1, h, n, c)


@CASES.add(FOLD, "failed", "transpose")
def fold_transposed(q_nope, w_uk):
    return q_nope @ w_uk.transpose(-1, -2)[None]


@CASES.add(FOLD, "failed", "summed over the heads")
def fold_summed(q_nope, w_uk):
    return torch.einsum("bhtn,gnc->bhtc", q_nope, w_uk)


@CASES.add(FOLD, "failed", "head 0")
def fold_first_head(q_nope, w_uk):
    return q_nope @ w_uk[0]


def test_the_library_passes_its_own_checks():
    def library_sink(scores, sink):
        return tl.sink_softmax(scores, sink)

    def library_fold(q_nope, w_uk):
        h, n, c = w_uk.shape
        latent = torch.eye(c, dtype=w_uk.dtype)  # the scores against the unit latents are the folded query
        keys = torch.einsum("hnc,tc->htn", w_uk, latent)  # (h, c, n): head i's key of each unit latent
        return torch.einsum("bhtn,hsn->bhts", q_nope, keys)

    assert SINK(library_sink, verbose=False)
    assert FOLD(library_fold, verbose=False)


STUB_CASES = [case(SINK, stub, "not implemented"), case(FOLD, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
