"""The chapter "A GPT from scratch" checks accept right answers and reject plausible wrong ones with the right
message."""

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.data import get_batch
from transformer_lib.exercises import gpt

LM = gpt.check_lm_targets
TOP_K = gpt.check_top_k_filter
CASES = Table()  # the rows of the answers below that are written as functions

# ---------------------------------------------------------------- check_lm_targets


@CASES.add(LM, "passed")
def lm_model_answer(data, starts, context_len):
    offsets = starts[:, None] + torch.arange(context_len)  # (B, T)
    return data[offsets], data[offsets + 1]


@CASES.add(LM, "passed")
def lm_loop_answer(data, starts, context_len):
    xs = [data[s : s + context_len] for s in starts.tolist()]
    ys = [data[s + 1 : s + context_len + 1] for s in starts.tolist()]
    return torch.stack(xs), torch.stack(ys)


@CASES.add(LM, "failed", "your targets equal the inputs (no shift)")
def lm_no_shift(data, starts, context_len):
    x, _ = lm_model_answer(data, starts, context_len)
    return x, x.clone()


@CASES.add(LM, "failed", "shifted the wrong way")
def lm_wrong_way(data, starts, context_len):
    offsets = starts[:, None] + torch.arange(context_len)
    return data[offsets], data[offsets - 1]


@CASES.add(LM, "failed", "x and y are swapped")
def lm_swapped(data, starts, context_len):
    x, y = lm_model_answer(data, starts, context_len)
    return y, x


@CASES.add(LM, "failed", "y has shape (2, 5); expected (B, T) = (2, 4)")
def lm_one_too_long(data, starts, context_len):
    offsets = starts[:, None] + torch.arange(context_len + 1)
    return data[offsets[:, :-1]], data[offsets]


@CASES.add(LM, "failed", "y[b, t] should be data[starts[b] + t + 1]")
def lm_shift_by_two(data, starts, context_len):
    offsets = starts[:, None] + torch.arange(context_len)
    return data[offsets], data[(offsets + 2).clamp_max(len(data) - 1)]


@CASES.add(LM, "failed", "dtype torch.float32", "integer ids")
def lm_float(data, starts, context_len):
    x, y = lm_model_answer(data, starts, context_len)
    return x.float(), y.float()


def test_lm_targets_matches_get_batch(gen):
    data = torch.randint(0, 9, (40,), generator=gen)
    starts = torch.randint(len(data) - 6, (4,), generator=torch.Generator().manual_seed(1))
    x, y = get_batch(data, 6, 4, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(lm_model_answer(data, starts, 6), (x, y), strict=True))


LM_CASES = [
    case(LM, stub, "not implemented"),
]


# ---------------------------------------------------------------- check_top_k_filter


def top_k_model_answer(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]  # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_sort_answer(logits, k):
    sorted_logits = torch.sort(logits, dim=-1, descending=True).values
    kth = sorted_logits[..., min(k, logits.shape[-1]) - 1 : min(k, logits.shape[-1])]
    return torch.where(logits >= kth, logits, torch.full_like(logits, float("-inf")))


def top_k_finfo_min(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, torch.finfo(logits.dtype).min)


def top_k_generate_way(logits, k):
    # the filter GPT.generate applies, on a (B, V) view
    flat = logits.reshape(-1, logits.shape[-1])
    kth = torch.topk(flat, min(k, flat.shape[-1])).values[:, -1:]
    return flat.masked_fill(flat < kth, float("-inf")).reshape(logits.shape)


@CASES.add(TOP_K, "failed", "row 0 keeps 1 logit, expected 2", "the k-th largest logit must stay too")
def top_k_drops_kth(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits <= kth, float("-inf"))


@CASES.add(TOP_K, "failed", "keeps 3 logits, expected 2", "kept logits below the k-th largest")
def top_k_keeps_one_more(logits, k):
    kth = torch.topk(logits, min(k + 1, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


@CASES.add(TOP_K, "failed", "you set it to 0", "0 is an ordinary logit")
def top_k_zero_fill(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, 0.0)


@CASES.add(TOP_K, "failed", "you set it to -1e-09", "float('-inf')")
def top_k_tiny_fill(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -1e-9)


@CASES.add(TOP_K, "failed", "k = 10 (> vocab_size)", "return the logits unchanged")
def top_k_no_min(logits, k):
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


@CASES.add(TOP_K, "failed", "along the first axis (across the batch)")
def top_k_wrong_axis(logits, k):
    kth = torch.topk(logits, k, dim=0).values[-1:]
    return logits.masked_fill(logits < kth, float("-inf"))


@CASES.add(TOP_K, "failed", "changed the logits it was given in place")
def top_k_in_place(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill_(logits < kth, float("-inf"))


@CASES.add(TOP_K, "failed", "tie at the k-th place", "keeps 2 logits, expected 3")
def top_k_scatter_no_ties(logits, k):
    idx = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, idx, logits.gather(-1, idx))


@CASES.add(TOP_K, "failed", "you returned probabilities")
def top_k_probabilities(logits, k):
    return torch.softmax(top_k_model_answer(logits, k), dim=-1)


# a batch-only index, as nanoGPT writes it
@CASES.add(TOP_K, "failed", "(a batch of sequences)", "values[..., -1:]")
def top_k_nanogpt_indexing(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1])).values[:, [-1]]
    return logits.masked_fill(logits < kth, float("-inf"))


def test_reference_matches_generate(gen):
    # GPT.generate with top_k only ever samples among the tokens the reference keeps
    tl.set_seed(0)
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=8, n_layers=1, n_heads=2, d_model=16)).eval()
    idx = torch.randint(0, 11, (64, 3), generator=gen)
    with torch.no_grad():
        logits = model(idx)[0][:, -1]  # (64, V)
    out = model.generate(idx, 1, top_k=3, generator=torch.Generator().manual_seed(0))[:, -1]
    kept = torch.isfinite(gpt.reference_top_k_logits(logits, 3))
    assert kept.sum(-1).eq(3).all()
    assert kept[torch.arange(64), out].all()


TOP_K_CASES = [
    *(
        case(TOP_K, fn, "passed")
        for fn in (top_k_model_answer, top_k_sort_answer, top_k_finfo_min, top_k_generate_way,
                   gpt.reference_top_k_logits)
    ),
    case(TOP_K, stub, "not implemented"),
]  # fmt: skip


@pytest.mark.parametrize(FIELDS, CASES + LM_CASES + TOP_K_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
