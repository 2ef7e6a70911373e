"""The chapter "Fine-tuning" checks accept right answers and reject plausible wrong ones with the right message;
their reference answers agree with the library's LoRA, loss mask and parameter count."""

import random

import pytest
import torch
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.data.instructions import InstructionBatches
from transformer_lib.exercises import fine_tuning

WEIGHT, MASK, COUNT = (
    fine_tuning.check_lora_weight,
    fine_tuning.check_response_mask,
    fine_tuning.check_lora_parameter_count,
)
CASES = Table()


# ---------------------------------------------------------------- ex-15-1: the adapted weight


@CASES.add(WEIGHT, "passed")
def weight_model_answer(W, A, B, alpha):
    return W + (alpha / A.shape[0]) * (B @ A)


@CASES.add(WEIGHT, "passed")
def weight_addmm(W, A, B, alpha):
    return torch.addmm(W, B, A, alpha=alpha / A.shape[0])


@CASES.add(WEIGHT, "passed")
def weight_transposed_twice(W, A, B, alpha):
    return W + alpha / len(A) * (A.T @ B.T).T


@CASES.add(WEIGHT, "failed", "left out the scale")
def weight_no_scale(W, A, B, alpha):
    return W + B @ A


@CASES.add(WEIGHT, "failed", "you scaled by alpha;", "divide it by the rank")
def weight_scale_alpha(W, A, B, alpha):
    return W + alpha * (B @ A)


@CASES.add(WEIGHT, "failed", "scaled by r / alpha")
def weight_scale_r_over_alpha(W, A, B, alpha):
    return W + (A.shape[0] / alpha) * (B @ A)


@CASES.add(WEIGHT, "failed", "integer division", "rank r = 3 and alpha = 7")
def weight_integer_division(W, A, B, alpha):
    return W + (alpha // A.shape[0]) * (B @ A)


@CASES.add(WEIGHT, "failed", "subtracted the update")
def weight_minus(W, A, B, alpha):
    return W - (alpha / A.shape[0]) * (B @ A)


@CASES.add(WEIGHT, "failed", "only the update")
def weight_update_only(W, A, B, alpha):
    return (alpha / A.shape[0]) * (B @ A)


@CASES.add(WEIGHT, "failed", "returned W unchanged")
def weight_unchanged(W, A, B, alpha):
    return W.clone()


@CASES.add(WEIGHT, "failed", "transpose of B A", "W of shape (4, 4)")
def weight_transposed(W, A, B, alpha):
    return W + (alpha / A.shape[0]) * (A.T @ B.T)  # runs on the square weight only


@CASES.add(WEIGHT, "failed", "your function raised RuntimeError", "W of shape (4, 4)", "B @ A is (out, in)")
def weight_a_times_b(W, A, B, alpha):
    return W + (alpha / A.shape[0]) * (A @ B)


@CASES.add(WEIGHT, "failed", "transpose of B A", "W of shape (4, 4)")
def weight_update_transposed(W, A, B, alpha):
    return W + (alpha / A.shape[0]) * (B @ A).T  # (in, out): fits the square weight only


@CASES.add(WEIGHT, "failed", "your function raised RuntimeError", "W of shape (4, 4)", "B @ A is (out, in)")
def weight_bt_at(W, A, B, alpha):
    return W + (alpha / A.shape[0]) * (B.T @ A.T)  # (r, out) @ (in, r): (r, r) when out = in


@CASES.add(WEIGHT, "failed", "changed W, A or B in place", "not W +=")
def weight_in_place(W, A, B, alpha):
    W += (alpha / A.shape[0]) * (B @ A)
    return W


@CASES.add(WEIGHT, "failed", "dtype torch.float32")
def weight_float32(W, A, B, alpha):
    return weight_model_answer(W, A, B, alpha).float()


@CASES.add(WEIGHT, "failed", "returned a list")
def weight_list(W, A, B, alpha):
    return weight_model_answer(W, A, B, alpha).tolist()


# ---------------------------------------------------------------- ex-15-2: the loss mask


@CASES.add(MASK, "passed")
def mask_model_answer(n_prompt, n_tokens, context_len):
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[n_prompt - 1 : n_tokens - 1] = True
    return mask


@CASES.add(MASK, "passed")
def mask_arange(n_prompt, n_tokens, context_len):
    k = torch.arange(context_len)
    return (k >= n_prompt - 1) & (k <= n_tokens - 2)


@CASES.add(MASK, "failed", "first token is never learned", "started at n_prompt")
def mask_starts_at_n_prompt(n_prompt, n_tokens, context_len):
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[n_prompt : n_tokens - 1] = True
    return mask


@CASES.add(MASK, "failed", "end token is never learned", "stopped one early")
def mask_ends_early(n_prompt, n_tokens, context_len):
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[n_prompt - 1 : n_tokens - 2] = True
    return mask


@CASES.add(MASK, "failed", "positions in ids", "targets ids[1:]")
def mask_positions_in_ids(n_prompt, n_tokens, context_len):
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[n_prompt:n_tokens] = True
    return mask


@CASES.add(MASK, "failed", "included the prompt's targets", "given, not predicted")
def mask_with_prompt(n_prompt, n_tokens, context_len):
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[: n_tokens - 1] = True
    return mask


@CASES.add(MASK, "failed", "included the padding", "pad ids as targets")
def mask_with_padding(n_prompt, n_tokens, context_len):
    mask = torch.zeros(context_len, dtype=torch.bool)
    mask[n_prompt - 1 :] = True
    return mask


@CASES.add(MASK, "failed", "included the prompt and the padding")
def mask_all_true(n_prompt, n_tokens, context_len):
    return torch.ones(context_len, dtype=torch.bool)


@CASES.add(MASK, "failed", "dtype torch.int64", "expected torch.bool", "dtype=torch.bool")
def mask_long(n_prompt, n_tokens, context_len):
    return mask_model_answer(n_prompt, n_tokens, context_len).long()


@CASES.add(MASK, "failed", "dtype torch.float32", "expected torch.bool")
def mask_float(n_prompt, n_tokens, context_len):
    return mask_model_answer(n_prompt, n_tokens, context_len).float()


@CASES.add(MASK, "failed", "shape (6,)", "(context_len,)", "n_tokens = 7, context_len = 10")
def mask_unpadded(n_prompt, n_tokens, context_len):
    return mask_model_answer(n_prompt, n_tokens, context_len)[: n_tokens - 1]


@CASES.add(MASK, "failed", "shape (1, 10)")
def mask_batched(n_prompt, n_tokens, context_len):
    return mask_model_answer(n_prompt, n_tokens, context_len)[None]


@CASES.add(MASK, "failed", "for n_prompt = 3, n_tokens = 7, context_len = 10, your function raised IndexError")
def mask_crash(n_prompt, n_tokens, context_len):
    mask = [False] * (n_tokens - 1)  # forgets the padding's positions
    for k in range(n_prompt - 1, context_len):
        mask[k] = True
    return torch.tensor(mask)


# ---------------------------------------------------------------- ex-15-3: the parameter count


@CASES.add(COUNT, "passed")
def count_model_answer(shapes, rank):
    return sum(rank * (n_out + n_in) for n_out, n_in in shapes)


@CASES.add(COUNT, "passed")
def count_as_tensor(shapes, rank):
    return torch.tensor([rank * (o + i) for o, i in shapes], dtype=torch.long).sum()


@CASES.add(COUNT, "failed", "r * out * in")
def count_full_matrices(shapes, rank):
    return sum(rank * o * i for o, i in shapes)


@CASES.add(COUNT, "failed", "only A (r x in)")
def count_only_a(shapes, rank):
    return sum(rank * i for o, i in shapes)


@CASES.add(COUNT, "failed", "only B (out x r)")
def count_only_b(shapes, rank):
    return sum(rank * o for o, i in shapes)


@CASES.add(COUNT, "failed", "the larger side each")
def count_max_side(shapes, rank):
    return sum(2 * rank * max(o, i) for o, i in shapes)


@CASES.add(COUNT, "failed", "left out the rank")
def count_no_rank(shapes, rank):
    return sum(o + i for o, i in shapes)


@CASES.add(COUNT, "failed", "frozen weights W too")
def count_with_frozen(shapes, rank):
    return sum(o * i + rank * (o + i) for o, i in shapes)


@CASES.add(COUNT, "failed", "only the first weight", "lora_parameter_count([(6, 4), (3, 8)], 3)")
def count_first_only(shapes, rank):
    return rank * (shapes[0][0] + shapes[0][1]) if shapes else 0


@CASES.add(COUNT, "failed", "returned 20.0, a float", "as an int")
def count_float(shapes, rank):
    return float(count_model_answer(shapes, rank))


@CASES.add(COUNT, "failed", "lora_parameter_count([], 4), your function raised ValueError")
def count_unzipped(shapes, rank):
    outs, ins = zip(*shapes, strict=True)  # no shapes: nothing to unpack
    return rank * (sum(outs) + sum(ins))


# ---------------------------------------------------------------- the references against the library


def test_the_references_pass_their_checks():
    assert WEIGHT(fine_tuning.reference_lora_weight, verbose=False)
    assert MASK(fine_tuning.reference_response_mask, verbose=False)
    assert COUNT(fine_tuning.reference_lora_parameter_count, verbose=False)


@pytest.mark.parametrize(("n_out", "n_in", "rank", "alpha"), [(5, 3, 2, 4.0), (4, 4, 1, 3.0), (3, 7, 3, 7.0)])
def test_the_lora_weight_reference_is_the_library_s_lora(n_out, n_in, rank, alpha):
    g = torch.Generator().manual_seed(n_out * n_in)
    W = torch.randn(n_out, n_in, generator=g, dtype=torch.float64)
    lora = tl.lora.LoRA(W, rank, alpha, generator=g)
    with torch.no_grad():
        lora.B.copy_(torch.randn(n_out, rank, generator=g, dtype=torch.float64))
    before = W.clone()
    want = fine_tuning.reference_lora_weight(W, lora.A.detach(), lora.B.detach(), alpha)
    torch.testing.assert_close(want, lora(W).detach(), rtol=0, atol=1e-12)
    assert torch.equal(W, before)


def test_the_response_mask_reference_is_instruction_batches_rule():
    rng = random.Random(15)
    for _ in range(300):
        context_len = rng.randint(2, 24)
        n_tokens = rng.randint(3, context_len + 1)
        n_prompt = rng.randint(1, n_tokens - 2)  # a response of at least one token, then the end token
        ids = [rng.randrange(1, 50) for _ in range(n_tokens)]
        pairs = [(ids, n_prompt)]
        _, _, mask = InstructionBatches(pairs, pairs, context_len, 1, pad_id=0).rows["train"]
        assert torch.equal(fine_tuning.reference_response_mask(n_prompt, n_tokens, context_len), mask[0]), (
            n_prompt,
            n_tokens,
            context_len,
        )
    # and two of the wrong answers are the class's own switches for showing mistakes
    pairs = [(list(range(1, 8)), 3)]
    for switch, wrong in (("mask_prompt", mask_with_prompt), ("mask_padding", mask_with_padding)):
        _, _, mask = InstructionBatches(pairs, pairs, 10, 1, pad_id=0, **{switch: False}).rows["train"]
        assert torch.equal(wrong(3, 7, 10), mask[0])


TARGETS = ["*.self_attn.in_proj_weight", "*.self_attn.out_proj.weight", "*.ff.net.*.weight"]


@pytest.mark.parametrize("rank", [1, 2, 4])
@pytest.mark.parametrize("targets", [TARGETS, ["*.ff.net.0.weight"]])
def test_the_count_reference_is_what_add_lora_trains(rank, targets):
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(vocab_size=31, context_len=16, n_layers=2, d_model=32, n_heads=4))
    params = dict(model.named_parameters())
    names = tl.add_lora(model, targets, rank=rank, alpha=2.0 * rank)
    shapes = [tuple(params[name].shape) for name in names]
    assert tl.count_parameters(model) == fine_tuning.reference_lora_parameter_count(shapes, rank)
    assert tl.count_parameters(model, trainable=False) == sum(p.numel() for p in params.values()) + (
        fine_tuning.reference_lora_parameter_count(shapes, rank)
    )


STUB_CASES = [case(check, stub, "not implemented") for check in (WEIGHT, MASK, COUNT)]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)
