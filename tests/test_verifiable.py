"""Tests for chapter "Preferences and rewards"'s verifiable task (transformer_lib/data/verifiable.py) and its batches
(transformer_lib/preference_runs.py): every reward in [0, 1] and 1 only where it should be, a
scratchpad's steps checked one by one, wrong answers that are never right, and the batches'
first-step invariants on chapter "Fine-tuning"'s shipped model."""

import datetime
import math

import numpy as np
import pytest
import torch

import transformer_lib as tl
from transformer_lib.data import verifiable as V
from transformer_lib.data.tasks import DATE_FORMATS


def test_every_reward_is_one_for_the_right_answer_and_only_format_for_a_wrong_one():
    pairs = tl.date_pairs(200, seed=3)
    rng = np.random.default_rng(0)
    for _, target in pairs:
        wrong = V.wrong_date(target, rng)
        assert wrong != target and V.format_reward(wrong, target) == 1.0
        assert V.exact_reward(target, target) == V.char_reward(target, target) == 1.0
        assert V.exact_reward(wrong, target) == 0.0 and 0.0 <= V.char_reward(wrong, target) < 1.0
    for junk in ("", "2003-02-30", "2003-4-17", "17/04/2003", "2003-04-17 and more"):
        assert V.format_reward(junk, "2003-04-17") == 0.0 and V.exact_reward(junk, "2003-04-17") == 0.0


def test_a_wrong_date_moves_one_field_and_stays_a_real_date():
    rng = np.random.default_rng(1)
    for target in ("2004-03-31", "2000-02-29", "1969-01-01", "2068-12-31"):
        for _ in range(50):
            a, b = (datetime.date.fromisoformat(x) for x in (target, V.wrong_date(target, rng)))
            moved = (a.year != b.year) + (a.month != b.month) + (a.day != b.day)
            assert 1 <= moved <= 3 and abs((a - b).days) <= 3 or (a.year == b.year or a.month == b.month)


def test_the_scratchpad_is_checked_step_by_step():
    for fmt in DATE_FORMATS:
        date = datetime.date(2003, 4, 7)
        answer = V.scratchpad_response(date, fmt)
        assert V.check_scratchpad(answer, "2003-04-07") == dict.fromkeys(("year", "month", "day", "date"), True)
        assert V.exact_reward(answer, "2003-04-07") == V.step_reward(answer, "2003-04-07") == 1.0
    right = "year 2003, month april = 04, day 7 = 2003-04-07"
    assert V.check_scratchpad(right.replace("2003,", "2013,"), "2003-04-07")["year"] is False
    assert V.check_scratchpad(right.replace("april", "march"), "2003-04-07")["month"] is False
    assert V.step_reward(right.replace("day 7", "day 8"), "2003-04-07") == 0.75
    assert V.step_reward("2003-04-07", "2003-04-07") == 0.0  # no steps written: the layout is the task
    prompts = [p for p, _ in V.scratchpad_pairs(20, seed=0)]
    assert prompts == [p for p, _ in tl.date_pairs(20, seed=0)]


def test_preference_triples_pair_the_verifiers_answer_with_a_wrong_one():
    pairs = tl.date_pairs(50, seed=2)
    triples = V.preference_triples(pairs, seed=0)
    assert [(p, c) for p, c, _ in triples] == pairs
    assert all(V.exact_reward(c, c) == 1 and V.exact_reward(r, c) == 0 for _, c, r in triples)
    assert triples == V.preference_triples(pairs, seed=0) != V.preference_triples(pairs, seed=1)


def load_dates_model():
    """Chapter "Measuring a model"'s shipped dates model (chapter "Fine-tuning"'s base and a LoRA adapter), in
    float64."""
    model, tokenizer, _ = tl.load_checkpoint(tl.PRETRAINED_PATH)
    tl.load_adapter(model, tl.DATES_ADAPTER_PATH)
    return model.double(), tokenizer


@pytest.fixture
def dates_model():
    return load_dates_model()


@pytest.mark.parametrize("method", tl.PREFERENCE_METHODS)
def test_the_batches_start_at_ln2_and_0_and_the_reference_is_the_start(method, dates_model):
    model, tokenizer = dates_model
    policy = load_dates_model()[0]
    reference = tl.make_policy(policy, method, rank=4, alpha=8.0, seed=0)
    ids = torch.tensor([tokenizer.encode("12 april 2003\n=> 2003-04-12")])
    assert torch.allclose(reference.token_logprobs(ids), tl.token_logprobs(model, ids), atol=1e-12)
    pairs = tl.date_pairs(40, seed=5)
    triples = V.preference_triples(pairs)
    for average in (False, True):
        dpo = tl.DPOBatches(tokenizer, triples[:30], triples[30:], 4, reference=reference, average=average)
        loss = dpo.loss(policy.train(), dpo("train"))
        assert float(loss) == pytest.approx(math.log(2), abs=1e-12)
        loss.backward()  # the gradient of the first step is not 0
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.parameters() if p.requires_grad)
        policy.zero_grad()
    grpo = tl.GRPOBatches(policy, tokenizer, pairs[:30], pairs[30:], 4, reward="chars", reference=reference,
                          group_size=4, temperature=0.7, max_new_tokens=12, seed=0)  # fmt: skip
    batch = grpo("train")
    assert batch["ids"].shape[0] == 16 and batch["advantages"].shape == (16,)
    assert abs(float(grpo.loss(policy.train(), batch))) < 1e-12
    assert float(grpo.loss(policy.eval(), batch)) == pytest.approx(1 - float(batch["rewards"].mean()))
    again = tl.GRPOBatches(policy, tokenizer, pairs[:30], pairs[30:], 4, reward="chars", reference=reference,
                           group_size=4, temperature=0.7, max_new_tokens=12, seed=0)("train")  # fmt: skip
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # seeded: the same answers


def test_bad_settings_are_refused_by_name(dates_model):
    model, tokenizer = dates_model
    pairs = tl.date_pairs(4)
    with pytest.raises(ValueError, match="reward must be one of"):
        tl.GRPOBatches(model, tokenizer, pairs, pairs, 2, reward="nope", beta=0)
    with pytest.raises(ValueError, match="needs a reference"):
        tl.GRPOBatches(model, tokenizer, pairs, pairs, 2, reward="exact", beta=0.04)
    with pytest.raises(ValueError, match="exceed the model's context"):
        tl.GRPOBatches(model, tokenizer, pairs, pairs, 2, reward="exact", beta=0, max_new_tokens=10_000)
    with pytest.raises(ValueError, match="method must be one of"):
        tl.make_policy(model, "head")
    for returned in (None, float("nan"), "1", True):
        grpo = tl.GRPOBatches(model, tokenizer, pairs, pairs, 2, reward=lambda answer, target, r=returned: r, beta=0,
                              group_size=2, max_new_tokens=4)  # fmt: skip
        with pytest.raises(ValueError, match=r"the reward <lambda>\(.*\) must return a finite number, got"):
            grpo("train")


def test_a_target_that_is_no_date_is_refused_by_name():
    for bad in ("2003-02-30", "2003-4-17", "", 20030417):
        with pytest.raises(ValueError, match=f"wrong_date needs a real date written yyyy-mm-dd, got {bad!r}"):
            V.wrong_date(bad, np.random.default_rng(0))
    with pytest.raises(ValueError, match="char_reward needs a target date"):
        V.char_reward("", "")
    assert V.char_reward("", "2003-04-17") == 0.0  # an empty answer scores nothing


def test_preference_files_round_trip_and_bad_ones_are_refused_by_line(tmp_path):
    triples = V.preference_triples(tl.date_pairs(5, seed=1))
    path = V.write_preferences(triples, tmp_path / "prefs.jsonl")
    assert V.read_preferences(path) == triples
    assert V.write_preferences(triples, path) == path  # the same content: nothing to protect
    with pytest.raises(FileExistsError, match="holds something else"):
        V.write_preferences(triples[:2], path)
    with pytest.raises(ValueError, match=r"triples\[1\] holds the same answer"):
        V.write_preferences([triples[0], ("a", "b", "b")], tmp_path / "x.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": oops\n')
    with pytest.raises(ValueError, match="bad.jsonl, line 2: not JSON"):
        V.read_preferences(tmp_path / "bad.jsonl")
    (tmp_path / "one.jsonl").write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n')
    with pytest.raises(ValueError, match="holds 1 preference pair"):
        V.read_preferences(tmp_path / "one.jsonl")
    good = b'{"prompt": "a", "chosen": "b", "rejected": "c"}\n'
    for bad, message in [
        (b"\xff\xfe\n", r"line 2: not UTF-8 text \(byte 0xff at 0\)"),
        (b'["a", "b", "c"]\n', "line 2: needs an object with the keys 'prompt', 'chosen', 'rejected', got a JSON list"),
        (b'{"prompt": "a", "chosen": "b<|endoftext|>", "rejected": "c"}\n', "line 2: .*spells the special token"),
        (b'{"prompt": "a", "chosen": "b", "rejected": "\\ud800"}\n', "line 2: .*a lone surrogate"),
    ]:
        (tmp_path / "bad.jsonl").write_bytes(good + bad)
        with pytest.raises(ValueError, match="bad.jsonl, " + message):
            V.read_preferences(tmp_path / "bad.jsonl")
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + good + good.replace(b'"c"', b'"d"'))
    assert V.read_preferences(tmp_path / "bom.jsonl") == [("a", "b", "c"), ("a", "b", "d")]  # a byte-order mark
