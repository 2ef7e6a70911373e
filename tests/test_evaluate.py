"""Tests of the measurements of chapter "Measuring a model" (transformer_lib/evaluate.py,
transformer_lib/data/mc_tasks.py): multiple choice scored exactly as lm-eval scores it (its acc, acc_norm and every
log-likelihood, on the same task file and the book's GPT through its transformers converter), pass@k against brute
force, the intervals, the judge's position bias and the report card."""

import itertools
import json
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from transformer_lib.data.mc_tasks import MCItem, cloze_task, held_out_text, speaker_choice_task, write_lm_eval_task
from transformer_lib.evaluate import (
    bootstrap_interval,
    choice_loglikelihoods,
    format_cards,
    items_needed,
    loss_units,
    mean_interval,
    paired_difference,
    pass_at_k,
    position_bias,
    report_card,
    sample_answers,
    score_multiple_choice,
)

TEXT = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")
CHAR_CKPT = Path(tl.__file__).parent / "data" / "ch12" / "shakespeare_ckpt.pt"


@pytest.fixture(scope="module")
def bpe_model():
    model, tokenizer, _ = tl.load_checkpoint(tl.PRETRAINED_PATH)
    return model.double().eval(), tokenizer


@pytest.fixture(scope="module")
def char_model():
    model, tokenizer, _ = tl.load_checkpoint(CHAR_CKPT)
    return model.double().eval(), tokenizer


# lm-eval parity -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.cpu_rounding
@pytest.mark.parametrize("which", ["bpe", "char"])
def test_acc_and_acc_norm_equal_lm_evals_on_the_same_task_and_model(which, bpe_model, char_model, tmp_path):
    lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is in requirements-eval.txt")
    from lm_eval.tasks import TaskManager

    model, tokenizer = bpe_model if which == "bpe" else char_model
    tl.export_hf(tl.PRETRAINED_PATH if which == "bpe" else CHAR_CKPT, tmp_path / "hf")
    tasks = {"book_speaker": speaker_choice_task(TEXT, 24, seed=3), "book_cloze": cloze_task(TEXT, 24, seed=3)}
    for name, items in tasks.items():
        write_lm_eval_task(items, tmp_path / "tasks", name)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    out = lm_eval.simple_evaluate(
        model="hf",
        # lm-eval reads a start or end token's id; the character tokenizer has neither, so one is
        # named (it is used only for an empty context, which these tasks do not have)
        model_args=f"pretrained={tmp_path / 'hf'},dtype=float64" + (",prefix_token_id=0" if which == "char" else ""),
        tasks=list(tasks),
        task_manager=TaskManager(include_path=str(tmp_path / "tasks")),
        log_samples=True,
        device="cpu",
        batch_size=8,
    )
    for name, items in tasks.items():
        ours = score_multiple_choice(model, tokenizer, items)
        theirs = out["results"][name]
        assert ours["acc"] == theirs["acc,none"] and ours["acc_norm"] == theirs["acc_norm,none"]
        for sample in out["samples"][name]:
            lls = [r[0] for r in sample["filtered_resps"]]
            np.testing.assert_allclose(ours["loglikelihoods"][sample["doc_id"]], lls, rtol=0, atol=1e-9)
            assert ours["correct"][sample["doc_id"]] == sample["acc"]
            assert ours["correct_norm"][sample["doc_id"]] == sample["acc_norm"]


# Multiple choice ----------------------------------------------------------------------------------


def test_a_choices_log_likelihood_is_the_sum_over_its_tokens_after_the_context(bpe_model):
    model, tokenizer = bpe_model
    context, choice = "ROMEO:\nBut soft, what light", " through yonder window"
    ids = tokenizer.encode(context + choice)
    n = len(tokenizer.encode(context))
    logits, _ = model(torch.tensor([ids[:-1]]))
    logp = torch.log_softmax(logits[0].double(), -1)
    want = sum(logp[k - 1, ids[k]].item() for k in range(n, len(ids)))
    assert choice_loglikelihoods(model, tokenizer, context, [choice])[0] == pytest.approx(want, abs=1e-10)


# (what is called, given the BPE model and its tokenizer; what the ValueError says)
BAD_INPUT = {
    "no choices": (lambda m, t: choice_loglikelihoods(m, t, "ROMEO:", []), r"one or more strings, got \[\]"),
    "no choices, a tuple": (lambda m, t: choice_loglikelihoods(m, t, "ROMEO:", ()), r"one or more strings, got \(\)"),
    "one string as the choices": (
        lambda m, t: choice_loglikelihoods(m, t, "ROMEO:", " soft"),  # not the choices " ", "s", "o", ...
        "continuations must be a list of one or more strings, got ' soft'",
    ),
    "a choice of no tokens": (lambda m, t: choice_loglikelihoods(m, t, "ROMEO:", [""]), "adds no token"),
    "no items": (lambda m, t: score_multiple_choice(m, t, []), "items is empty: give at least one MCItem"),
    "a text too short": (lambda m, t: report_card(m, t, text="ROMEO:"), "too short for an interval over windows"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_is_refused_by_name(bpe_model, case):
    call, match = BAD_INPUT[case]
    with pytest.raises(ValueError, match=match):
        call(*bpe_model)


def test_a_long_context_is_cropped_on_the_left_as_lm_eval_crops_it(bpe_model):
    model, tokenizer = bpe_model
    T = model.config.context_len
    context = held_out_text(TEXT)[:2000]
    head = tokenizer.encode(context)
    assert len(head) > 2 * T
    ll = choice_loglikelihoods(model, tokenizer, context, [" king"])[0]
    cropped = tokenizer.decode(head[-(T + 5) :])  # a shorter context that still fills the window
    cut = tokenizer.encode(cropped)
    if cut == head[-len(cut) :]:
        assert choice_loglikelihoods(model, tokenizer, cropped, [" king"])[0] == pytest.approx(ll, abs=1e-10)


def test_trailing_spaces_of_the_context_join_the_continuation(bpe_model):
    model, tokenizer = bpe_model
    a = choice_loglikelihoods(model, tokenizer, "My lord ", ["the king"])
    b = choice_loglikelihoods(model, tokenizer, "My lord", [" the king"])
    assert a == b


def test_summed_and_normalised_scores_pick_differently_and_ties_go_first(monkeypatch):
    import transformer_lib.evaluate as ev

    scores = {("a", "bbbbbbbb"): [-2.0, -8.0], ("c", "d"): [-1.0, -1.0]}
    monkeypatch.setattr(ev, "_item_loglikelihoods", lambda m, t, items, d: [scores[it.choices] for it in items])
    # the short choice wins on the sum, the long one per character (-1 per character against -2)
    s = score_multiple_choice(None, None, [MCItem("x", ("a", "bbbbbbbb"), 1), MCItem("x", ("c", "d"), 0)])
    assert s["correct"] == [0, 1] and s["correct_norm"] == [1, 1]  # a tie goes to the first choice
    assert s["acc"] == 0.5 and s["acc_norm"] == 1.0


def test_the_recorded_lm_eval_scores_are_the_books(bpe_model, char_model):
    """Chapter "Measuring a model" compares the book's scores with lm-eval's recorded ones; here without lm-eval."""
    from transformer_lib.experiments import measuring_a_model, recorded

    ref = recorded("measuring_a_model")["lm_eval"]
    n = ref["items"]
    tasks = {"book_speaker": speaker_choice_task(TEXT, n), "book_cloze": cloze_task(TEXT, n)}
    for name, model in (("bpe", bpe_model), ("char", char_model)):
        assert name in measuring_a_model.SHIPPED
        for task, items in tasks.items():
            ours, theirs = score_multiple_choice(*model, items), ref["models"][name][task]
            assert (ours["acc"], ours["acc_norm"]) == (theirs["acc"], theirs["acc_norm"])
            np.testing.assert_allclose(ours["loglikelihoods"], theirs["loglikelihoods"], rtol=0, atol=1e-9)


def test_the_tasks_are_repeatable_and_well_formed():
    for make in (speaker_choice_task, cloze_task):
        a, b = make(TEXT, 50, seed=1), make(TEXT, 50, seed=1)
        assert a == b and a != make(TEXT, 50, seed=2)
        assert len({it.answer for it in a}) > 1  # the answer's place varies
    held = held_out_text(TEXT)
    for it in speaker_choice_task(TEXT, 50):
        names = [c.split(":\n")[0] for c in it.choices]
        assert all(n.isupper() for n in names) and len({c.split(":\n")[1] for c in it.choices}) == 1
        assert it.context.strip() in held
    for it in cloze_task(TEXT, 50):
        right = it.choices[it.answer]
        assert all(len(c) != len(right) for i, c in enumerate(it.choices) if i != it.answer)
        assert (it.context + " " + right) in held


def test_an_lm_eval_task_file_is_not_overwritten(tmp_path):
    items = cloze_task(TEXT, 3)
    spec = write_lm_eval_task(items, tmp_path, "cloze")
    assert "output_type: multiple_choice" in spec.read_text()
    docs = [json.loads(line) for line in (tmp_path / "cloze.jsonl").read_text().splitlines()]
    assert [MCItem(d["context"], tuple(d["choices"]), d["answer"]) for d in docs] == items
    with pytest.raises(FileExistsError, match="force=True"):
        write_lm_eval_task(items, tmp_path, "cloze")
    with pytest.raises(ValueError, match="letters"):
        write_lm_eval_task(items, tmp_path, "my task")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("", ("a", "b"), 0), "context"),
        (("x", ("a",), 0), "at least 2"),
        (("x", ("a", "a"), 0), "distinct"),
        (("x", ("a", "b"), 2), "answer"),
        (("x", "yes", 0), "one string 'yes'"),  # not the choices y, e and s
        (("x", ("a", "b"), True), "answer"),
        (("x", ("a", "b"), 1.0), "answer"),
    ],
)
def test_a_bad_item_is_refused(args, match):
    with pytest.raises(ValueError, match=match):
        MCItem(*args)


def test_an_item_takes_numpy_integers_and_the_task_writer_takes_dicts_but_not_nothing(tmp_path):
    item = MCItem("x", ("a", "b"), np.int64(1))
    assert item.answer == 1 and type(item.answer) is int
    written = write_lm_eval_task([{"context": "x", "choices": ["a", "b"], "answer": 1}], tmp_path, "dicts")
    assert written.exists() and json.loads((tmp_path / "dicts.jsonl").read_text()) == {
        "context": "x", "choices": ["a", "b"], "answer": 1}  # fmt: skip
    with pytest.raises(ValueError, match="one or more MCItem.*got nothing"):
        write_lm_eval_task([], tmp_path, "empty")
    with pytest.raises(ValueError, match="got str"):
        write_lm_eval_task(["x"], tmp_path, "strings")
    assert not (tmp_path / "empty.jsonl").exists() and not (tmp_path / "strings.yaml").exists()


# pass@k -------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_is_the_share_of_k_subsets_that_hold_a_right_answer(nck):
    n, c, k = nck
    answers = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(answers, k))
    exact = Fraction(sum(any(s) for s in subsets), len(subsets))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)


def test_pass_at_1_is_the_share_right_and_the_naive_formula_is_biased():
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 0, 5) == 0.0 and pass_at_k(10, 6, 5) == 1.0
    naive = 1 - (1 - 3 / 10) ** 5  # with replacement: not what k distinct samples give
    assert abs(pass_at_k(10, 3, 5) - naive) > 0.05


def test_the_estimator_agrees_with_drawing_k_answers_at_random():
    rng = np.random.default_rng(0)
    n, c, k = 20, 4, 5
    answers = np.array([1] * c + [0] * (n - c))
    draws = [answers[rng.choice(n, k, replace=False)].any() for _ in range(20000)]
    assert abs(np.mean(draws) - pass_at_k(n, c, k)) < 0.01


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (5, 6, 1), (5, 1, 6), (5, -1, 1), (5, 1, 0), (5.0, 1, 1)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises((ValueError, TypeError)):
        pass_at_k(n, c, k)


# Intervals ----------------------------------------------------------------------------------------


def test_the_interval_of_a_mean_narrows_as_one_over_root_n():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 2, 6400).astype(float)
    widths = [mean_interval(scores[:n])[2] - mean_interval(scores[:n])[1] for n in (100, 400, 1600, 6400)]
    for a, b in itertools.pairwise(widths):
        assert b / a == pytest.approx(0.5, rel=0.15)


def test_the_interval_covers_the_true_mean_about_95_times_in_100():
    rng = np.random.default_rng(1)
    hits = 0
    for _ in range(400):
        _, low, high = mean_interval(rng.normal(3.0, 2.0, 200))
        hits += low <= 3.0 <= high
    assert 0.92 <= hits / 400 <= 0.98


def test_a_paired_difference_tells_apart_a_shift_and_not_noise():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 2, 500).astype(float)
    same = paired_difference(a, a)
    assert same["difference"] == 0 and not same["apart"] and same["items_needed"] is None
    b = a.copy()
    b[rng.choice(500, 100, replace=False)] = 1.0  # b is right wherever a is, and on more items
    d = paired_difference(b, a)
    assert d["apart"] and d["low"] > 0 and d["items_needed"] <= 500
    noisy = paired_difference(rng.integers(0, 2, 60), rng.integers(0, 2, 60))
    assert noisy["low"] < noisy["difference"] < noisy["high"]


@settings(max_examples=50, deadline=None)
@given(st.floats(0.05, 5.0), st.floats(0.001, 1.0))
def test_items_needed_is_the_smallest_count_whose_interval_is_narrower_than_the_difference(sd, diff):
    n = items_needed(sd, diff)
    assert 1.96 * sd / math.sqrt(n) <= diff * 1.0001
    assert n == 2 or 1.96 * sd / math.sqrt(n - 1) > diff * 0.9999


def test_the_bootstrap_is_repeatable_and_holds_its_estimate():
    rng = np.random.default_rng(3)
    bits, nbytes = rng.uniform(100, 200, 80), rng.uniform(60, 90, 80)
    est, low, high = bootstrap_interval(bits, nbytes, seed=5)
    assert (est, low, high) == bootstrap_interval(bits, nbytes, seed=5)
    assert est == pytest.approx(bits.sum() / nbytes.sum()) and low < est < high


def test_loss_units_are_one_quantity():
    u = loss_units(2.0, bytes_per_token=2.5)
    assert u["perplexity"] == pytest.approx(math.e**2)
    assert u["bits_per_byte"] * 2.5 * math.log(2) == pytest.approx(2.0)
    for bad in (float("nan"), -1.0, "2"):
        with pytest.raises(ValueError, match="nats_per_token"):
            loss_units(bad)
    assert loss_units(np.float32(2.0), np.float64(2.5)) == u  # NumPy's numbers, as Python's
    with pytest.raises(ValueError, match="bytes_per_token"):
        loss_units(2.0, float("inf"))


@pytest.mark.parametrize("args, name", [((math.nan, 0.1), "sd"), ((-1.0, 0.1), "sd"), ((0.5, math.inf), "difference"),
                                        ((0.5, 0.1, math.nan), "z")])  # fmt: skip
def test_items_needed_refuses_a_spread_or_difference_that_is_not_a_finite_number(args, name):
    with pytest.raises(ValueError, match=f"{name} must be a finite number"):
        items_needed(*args)


def test_the_windows_of_bits_per_byte_add_up_to_its_totals(bpe_model):
    model, tokenizer = bpe_model
    ids = torch.tensor(tokenizer.encode(held_out_text(TEXT)[:5000]))
    r = tl.bits_per_byte(model, ids, tokenizer, windows=True)
    nats, tokens, nbytes = (sum(c) for c in zip(*r["windows"], strict=True))
    assert tokens == r["tokens"] and nbytes == r["bytes"]
    assert nats / tokens == pytest.approx(r["nats_per_token"], rel=1e-12)


# A judge ------------------------------------------------------------------------------------------


def test_position_bias_of_a_judge_that_always_picks_the_first_and_of_a_fair_one():
    cases = [("q", f"right{i}", f"wrong{i}") for i in range(10)]
    first = position_bias(lambda q, a, b: 0, cases)
    assert first == {"n": 10, "right_when_first": 1.0, "right_when_second": 0.0, "picks_first": 1.0,
                     "consistent": 0.0}  # fmt: skip
    fair = position_bias(lambda q, a, b: 0 if a.startswith("right") else 1, cases)
    assert fair["picks_first"] == 0.5 and fair["consistent"] == 1.0
    with pytest.raises(ValueError, match="0 \\(first\\) or 1"):
        position_bias(lambda q, a, b: "A", cases)


# The report card ----------------------------------------------------------------------------------


def test_sampled_answers_are_repeatable_and_pass_at_1_is_their_share_right(bpe_model):
    model, tokenizer = bpe_model
    pairs = tl.date_pairs(6, seed=9)
    prompts = [p for p, _ in pairs]
    a = sample_answers(model, tokenizer, prompts, 4, temperature=0.7, max_new_tokens=6, seed=1)
    assert a == sample_answers(model, tokenizer, prompts, 4, temperature=0.7, max_new_tokens=6, seed=1)
    assert [len(row) for row in a] == [4] * 6
    card = report_card(model, tokenizer, pairs=pairs, samples=4, temperature=0.7, k=2, max_new_tokens=6, seed=1)
    hits = [sum(x == r for x in row) for row, (_, r) in zip(a, pairs, strict=True)]
    assert card["exact"]["pass@1"] == pytest.approx(sum(hits) / (4 * 6))
    assert card["exact"]["pass@2"] >= card["exact"]["pass@1"]
    for key in ("pass@1", "pass@2"):  # a bootstrap over the prompts, around the score
        low, high = card["exact"][key + "_interval"]
        assert low <= card["exact"][key] <= high
    assert " [" in next(line for line in format_cards({"a": card}).splitlines() if line.startswith("| pass@2"))
    assert len(card["items"]["exact_match"]) == 6


def test_a_card_compares_two_models_item_by_item(bpe_model, char_model):
    tasks = {"speaker": speaker_choice_task(TEXT, 30)}
    text = held_out_text(TEXT)[:3000]
    cards = {n: report_card(*m, text=text, tasks=tasks) for n, m in (("bpe", bpe_model), ("char", char_model))}
    table = format_cards(cards)
    lines = table.splitlines()
    assert lines[0].startswith("|  | better | bpe | char | difference | told apart |")
    acc = next(line for line in lines if line.startswith("| speaker acc |"))
    d = paired_difference(cards["bpe"]["items"]["speaker acc"], cards["char"]["items"]["speaker acc"])
    assert f"{d['difference']:+.3f}" in acc and acc.endswith("yes |" if d["apart"] else "no |")
    per_token = next(line for line in lines if line.startswith("| loss (nats/token) |"))
    assert "none: a token of one tokenizer is not one of the other" in per_token  # compare bits per byte instead
    bpb = next(line for line in lines if line.startswith("| bits per byte | lower |"))
    assert " unpaired | " in bpb and bpb.endswith(("yes |", "no |"))  # two tokenizers: other windows, one text
    diff = cards["bpe"]["text"]["bits_per_byte"] - cards["char"]["text"]["bits_per_byte"]
    assert f"{diff:+.3f} [" in bpb
    assert all(" | higher | " in line for line in lines if line.startswith("| speaker"))
    same = format_cards({"a": cards["bpe"], "b": cards["bpe"]})
    assert "+0.000 [+0.000, +0.000] | no |" in same
    assert json.loads(json.dumps(cards["bpe"], default=list))["speaker"]["n"] == 30


def test_exact_match_needs_an_end_token(char_model):
    with pytest.raises(ValueError, match="end token"):
        report_card(*char_model, pairs=[("1.2.2000", "2000-02-01")])


def test_more_choices_than_the_text_can_offer_are_refused_by_name():
    speakers = len({s.speaker for s in tl.data.split_speeches(held_out_text(TEXT)) if s.speaker.isupper()})
    assert len(speaker_choice_task(TEXT, 5, n_choices=speakers - 1)[0].choices) == speakers - 1
    # with as many choices as speakers, the one before the answer would be needed as a wrong one
    with pytest.raises(ValueError, match=f"has {speakers} speakers: n_choices={speakers} needs {speakers + 1}"):
        speaker_choice_task(TEXT, 5, n_choices=speakers)
    with pytest.raises(ValueError, match="too few words for n_choices=100000"):
        cloze_task(TEXT, 5, n_choices=100_000)


# Batching ----------------------------------------------------------------------------------------


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**16), st.lists(st.integers(1, 12), min_size=2, max_size=7))
def test_choices_scored_in_batches_equal_those_scored_one_at_a_time(bpe_model, seed, lengths):
    """A random float64 model whose context (24 tokens) crops some rows: every item's choices, of other
    lengths, scored together equal each choice scored alone in a batch of one."""
    import transformer_lib.evaluate as ev

    _, tokenizer = bpe_model
    torch.manual_seed(seed)
    config = tl.GPTConfig(vocab_size=tokenizer.vocab_size, context_len=24, n_layers=2, n_heads=2, d_model=16)
    model = tl.GPT(config).double().eval()
    rng = np.random.default_rng(seed)
    words = held_out_text(TEXT).split()
    items = [MCItem(" ".join(rng.choice(words, 3 + n)), tuple(f"{w}{'!' * i}" for i, w in
                    enumerate(rng.choice(words, 3, replace=False))), 0) for n in lengths]  # fmt: skip
    batched = ev._item_loglikelihoods(model, tokenizer, items, " ")
    alone = [[ev._loglikelihoods(model, [ev._choice_request(tokenizer, it.context, " " + c, 24)])[0]
              for c in it.choices] for it in items]  # fmt: skip
    np.testing.assert_allclose(batched, alone, rtol=0, atol=1e-10)
    for it, row in zip(items, batched, strict=True):  # the public call, an item at a time
        np.testing.assert_allclose(choice_loglikelihoods(model, tokenizer, it.context, [" " + c for c in it.choices]),
                                   row, rtol=0, atol=1e-10)  # fmt: skip


def test_answers_sampled_in_batches_are_one_at_a_times_near_temperature_0(bpe_model):
    """Prompts of other lengths, batched by length with their samples: at a temperature near 0
    every answer is the greedy one, as when each sample is drawn alone."""
    model, tokenizer = bpe_model
    pairs = tl.date_pairs(6, seed=3)
    prompts = [p for p, _ in pairs]
    got = sample_answers(model, tokenizer, prompts, 3, temperature=1e-6, max_new_tokens=8, seed=0)
    for prompt, row in zip(prompts, got, strict=True):
        for seed in range(3):  # each sample alone, from its own generator
            assert sample_answers(model, tokenizer, [prompt], 1, temperature=1e-6, max_new_tokens=8, seed=seed)[0] == [
                row[seed]]  # fmt: skip
    assert len({len(tl.data.instructions.encode_pair(tokenizer, p, "", end=False)[0]) for p in prompts}) > 1


def test_the_text_rows_of_one_tokenizer_get_a_paired_interval_from_the_windows(bpe_model):
    model, tokenizer = bpe_model
    text = held_out_text(TEXT)[:3000]
    card = report_card(model, tokenizer, text=text)
    noisy = json.loads(json.dumps(card))
    rng = np.random.default_rng(0)
    for w in noisy["text"]["windows"]:
        w[0] += float(rng.normal(0.5, 0.1))  # every window a bit worse
    lines = format_cards({"a": card, "b": noisy}).splitlines()
    bpb = next(line for line in lines if line.startswith("| bits per byte |"))
    assert " paired | yes |" in bpb and "| -0." in bpb
    same = format_cards({"a": card, "b": card}).splitlines()
    assert all(line.endswith("paired | no |") for line in same if line.startswith(("| loss", "| perplexity", "| bits")))
