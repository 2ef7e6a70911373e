"""The chapter 9 checks accept right answers and reject plausible wrong ones with the right message."""

import torch

import transformer_lib as tl
from transformer_lib.data import get_batch
from transformer_lib.exercises import ch09


def run(checker, fn):
    return checker(fn, verbose=False)


# ---------------------------------------------------------------- check_lm_targets


def lm_model_answer(data, starts, block_size):
    offsets = starts[:, None] + torch.arange(block_size)  # (B, T)
    return data[offsets], data[offsets + 1]


def lm_loop_answer(data, starts, block_size):
    xs = [data[s : s + block_size] for s in starts.tolist()]
    ys = [data[s + 1 : s + block_size + 1] for s in starts.tolist()]
    return torch.stack(xs), torch.stack(ys)


def lm_no_shift(data, starts, block_size):
    x, _ = lm_model_answer(data, starts, block_size)
    return x, x.clone()


def lm_wrong_way(data, starts, block_size):
    offsets = starts[:, None] + torch.arange(block_size)
    return data[offsets], data[offsets - 1]


def lm_swapped(data, starts, block_size):
    x, y = lm_model_answer(data, starts, block_size)
    return y, x


def lm_one_too_long(data, starts, block_size):
    offsets = starts[:, None] + torch.arange(block_size + 1)
    return data[offsets[:, :-1]], data[offsets]


def lm_shift_by_two(data, starts, block_size):
    offsets = starts[:, None] + torch.arange(block_size)
    return data[offsets], data[(offsets + 2).clamp_max(len(data) - 1)]


def lm_float(data, starts, block_size):
    x, y = lm_model_answer(data, starts, block_size)
    return x.float(), y.float()


def lm_stub(data, starts, block_size):
    raise NotImplementedError


def test_lm_targets_accepts_right_answers():
    assert run(ch09.check_lm_targets, lm_model_answer).passed
    assert run(ch09.check_lm_targets, lm_loop_answer).passed


def test_lm_targets_matches_get_batch(gen):
    data = torch.randint(0, 9, (40,), generator=gen)
    starts = torch.randint(len(data) - 6, (4,), generator=torch.Generator().manual_seed(1))
    x, y = get_batch(data, 6, 4, generator=torch.Generator().manual_seed(1))
    assert all(torch.equal(a, b) for a, b in zip(lm_model_answer(data, starts, 6), (x, y), strict=True))


def test_lm_targets_rejects_no_shift():
    r = run(ch09.check_lm_targets, lm_no_shift)
    assert r.status == "failed"
    assert "your targets equal the inputs (no shift)" in r.message


def test_lm_targets_rejects_shift_the_wrong_way():
    r = run(ch09.check_lm_targets, lm_wrong_way)
    assert r.status == "failed"
    assert "shifted the wrong way" in r.message


def test_lm_targets_rejects_swapped_pair():
    r = run(ch09.check_lm_targets, lm_swapped)
    assert "x and y are swapped" in r.message


def test_lm_targets_rejects_wrong_length():
    r = run(ch09.check_lm_targets, lm_one_too_long)
    assert "y has shape (2, 5); expected (B, T) = (2, 4)" in r.message


def test_lm_targets_rejects_shift_by_two():
    r = run(ch09.check_lm_targets, lm_shift_by_two)
    assert "y[b, t] should be data[starts[b] + t + 1]" in r.message


def test_lm_targets_rejects_float_ids():
    r = run(ch09.check_lm_targets, lm_float)
    assert "dtype torch.float32" in r.message and "integer ids" in r.message


def test_lm_targets_reports_stub():
    assert run(ch09.check_lm_targets, lm_stub).status == "not implemented"


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


def top_k_drops_kth(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits <= kth, float("-inf"))


def top_k_keeps_one_more(logits, k):
    kth = torch.topk(logits, min(k + 1, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_zero_fill(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, 0.0)


def top_k_tiny_fill(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, -1e-9)


def top_k_no_min(logits, k):
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_wrong_axis(logits, k):
    kth = torch.topk(logits, k, dim=0).values[-1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_k_in_place(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill_(logits < kth, float("-inf"))


def top_k_scatter_no_ties(logits, k):
    idx = torch.topk(logits, min(k, logits.shape[-1]), dim=-1).indices
    out = torch.full_like(logits, float("-inf"))
    return out.scatter(-1, idx, logits.gather(-1, idx))


def top_k_probabilities(logits, k):
    return torch.softmax(top_k_model_answer(logits, k), dim=-1)


def top_k_nanogpt_indexing(logits, k):
    kth = torch.topk(logits, min(k, logits.shape[-1])).values[:, [-1]]
    return logits.masked_fill(logits < kth, float("-inf"))


def test_top_k_accepts_right_answers():
    for fn in (top_k_model_answer, top_k_sort_answer, top_k_finfo_min, top_k_generate_way,
               ch09.reference_top_k_logits):  # fmt: skip
        assert run(ch09.check_top_k_filter, fn).passed, fn.__name__


def test_reference_matches_generate(gen):
    # GPT.generate with top_k only ever samples among the tokens the reference keeps
    tl.set_seed(0)
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=8, n_layers=1, n_heads=2, d_model=16)).eval()
    idx = torch.randint(0, 11, (64, 3), generator=gen)
    with torch.no_grad():
        logits = model(idx)[0][:, -1]  # (64, V)
    out = model.generate(idx, 1, top_k=3, generator=torch.Generator().manual_seed(0))[:, -1]
    kept = torch.isfinite(ch09.reference_top_k_logits(logits, 3))
    assert kept.sum(-1).eq(3).all()
    assert kept[torch.arange(64), out].all()


def test_top_k_rejects_dropping_the_kth():
    r = run(ch09.check_top_k_filter, top_k_drops_kth)
    assert r.status == "failed"
    assert "row 0 keeps 1 logit, expected 2" in r.message and "the k-th largest logit must stay too" in r.message


def test_top_k_rejects_keeping_one_more():
    r = run(ch09.check_top_k_filter, top_k_keeps_one_more)
    assert "keeps 3 logits, expected 2" in r.message and "kept logits below the k-th largest" in r.message


def test_top_k_rejects_zero_fill():
    r = run(ch09.check_top_k_filter, top_k_zero_fill)
    assert "you set it to 0" in r.message and "0 is an ordinary logit" in r.message


def test_top_k_rejects_tiny_negative_fill():
    r = run(ch09.check_top_k_filter, top_k_tiny_fill)
    assert "you set it to -1e-09" in r.message and "float('-inf')" in r.message


def test_top_k_rejects_k_larger_than_vocabulary():
    r = run(ch09.check_top_k_filter, top_k_no_min)
    assert r.status == "failed"
    assert "k = 10 (> V)" in r.message and "return the logits unchanged" in r.message


def test_top_k_rejects_wrong_axis():
    r = run(ch09.check_top_k_filter, top_k_wrong_axis)
    assert "along the first axis (across the batch)" in r.message


def test_top_k_rejects_in_place_change():
    r = run(ch09.check_top_k_filter, top_k_in_place)
    assert "changed the logits it was given (in place)" in r.message


def test_top_k_rejects_dropping_ties():
    r = run(ch09.check_top_k_filter, top_k_scatter_no_ties)
    assert "tie at the k-th place" in r.message and "keeps 2 logits, expected 3" in r.message


def test_top_k_rejects_probabilities():
    r = run(ch09.check_top_k_filter, top_k_probabilities)
    assert "you returned probabilities" in r.message


def test_top_k_explains_batch_only_indexing():
    r = run(ch09.check_top_k_filter, top_k_nanogpt_indexing)
    assert r.status == "failed"
    assert "(a batch of sequences)" in r.message and "values[..., -1:]" in r.message


def test_top_k_reports_stub():
    assert run(ch09.check_top_k_filter, lambda logits, k: (_ for _ in ()).throw(NotImplementedError)).status == (
        "not implemented"
    )
