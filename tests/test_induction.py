"""Tests for transformer_lib/induction.py and transformer_lib/data/repeats.py: the repeated
sequences, the attention-only model, OV circuits, and the training run in which a two-layer model
forms induction heads and a one-layer model cannot."""

import math
import statistics

import pytest
import torch

import transformer_lib as tl

# --- repeat_batch ----------------------------------------------------------------------------


def test_repeat_batch_holds_the_repeat_and_the_mask_covers_exactly_its_predictable_tokens():
    B, T, V, L = 200, 30, 10, 5
    g = torch.Generator().manual_seed(1)
    idx, targets, mask, dist = tl.repeat_batch(B, T, V, L, generator=g, return_distance=True)
    assert idx.shape == targets.shape == mask.shape == (B, T) and dist.shape == (B,)
    assert idx.dtype == targets.dtype == torch.int64 and mask.dtype == torch.bool
    assert torch.equal(idx[:, 1:], targets[:, :-1])  # targets are the next tokens
    assert int(idx.min()) >= 0 and int(idx.max()) < V
    assert (mask.sum(1) == L - 1).all()
    for b in range(B):
        d = int(dist[b])
        where = mask[b].nonzero().flatten().tolist()
        first = where[0]
        assert where == list(range(first, first + L - 1))  # one contiguous run
        start = first - d  # the earlier occurrence
        assert start >= 0 and first + L <= T and L <= d <= T - L
        assert torch.equal(idx[b, first : first + L], idx[b, start : start + L])  # the segment reappears
        for t in where:  # each masked target is the token after the earlier occurrence
            assert targets[b, t] == idx[b, t - d + 1]


def test_repeat_batch_varies_the_distance_and_can_fix_it():
    g = torch.Generator().manual_seed(0)
    *_, dist = tl.repeat_batch(500, 48, 48, 8, generator=g, return_distance=True)
    assert int(dist.min()) == 8 and int(dist.max()) == 40 and len(set(dist.tolist())) == 33
    *_, fixed = tl.repeat_batch(50, 48, 48, 8, min_distance=20, max_distance=20, generator=g, return_distance=True)
    assert (fixed == 20).all()


def test_repeat_batch_is_seeded_by_its_generator():
    a = tl.repeat_batch(4, 20, 7, 3, generator=torch.Generator().manual_seed(5))
    b = tl.repeat_batch(4, 20, 7, 3, generator=torch.Generator().manual_seed(5))
    c = tl.repeat_batch(4, 20, 7, 3, generator=torch.Generator().manual_seed(6))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_repeat_batch_errors_name_the_value():
    with pytest.raises(ValueError, match="repeat_len must be an int >= 2, got 1"):
        tl.repeat_batch(2, 10, 5, 1)
    with pytest.raises(ValueError, match="min_distance must be an int >= 4, got 2"):
        tl.repeat_batch(2, 10, 5, 4, min_distance=2)
    with pytest.raises(ValueError, match="max_distance=8 plus repeat_len=4 is longer than seq_len=10"):
        tl.repeat_batch(2, 10, 5, 4, max_distance=8)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        tl.repeat_batch(2.0, 10, 5, 4)
    with pytest.raises(TypeError, match="generator"):
        tl.repeat_batch(2, 10, 5, 4, generator=0)


# --- AttentionOnly ---------------------------------------------------------------------------


def small(n_layers=2, dtype=torch.float64, seed=0, **options):
    torch.manual_seed(seed)
    return tl.AttentionOnly(13, 16, n_layers, 4, 16, **options).to(dtype)


def test_attention_only_shapes_and_layers(gen):
    model = small()
    assert list(tl.inspect_heads.attention_layers(model)) == ["layers.0", "layers.1"]
    assert not any(isinstance(m, tl.FeedForward) for m in model.modules())
    idx = torch.randint(0, 13, (3, 16), generator=gen)
    logits, loss = model(idx)
    assert logits.shape == (3, 16, 13) and logits.dtype == torch.float64 and loss is None
    _, loss = model(idx, idx)
    assert loss.dim() == 0 and math.isfinite(loss.item())


@pytest.mark.parametrize("layer_norm", [True, False])
def test_attention_only_is_causal(gen, layer_norm):
    model = small(layer_norm=layer_norm)
    idx = torch.randint(0, 13, (2, 12), generator=gen)
    logits = model(idx)[0]
    for t in range(1, 12):
        changed = idx.clone()
        changed[:, t:] = (changed[:, t:] + 1) % 13  # every token from t on
        other = model(changed)[0]
        assert torch.equal(other[:, :t], logits[:, :t]), t
        assert not torch.equal(other[:, t], logits[:, t])


def test_attention_only_is_determined_by_the_seed_and_runs_in_float32_and_float64(gen):
    a, b, c = small(seed=3), small(seed=3), small(seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.tok_embed.weight, c.tok_embed.weight)
    idx = torch.randint(0, 13, (2, 9), generator=gen)
    assert torch.equal(a(idx)[0], b(idx)[0])
    low = small(seed=3, dtype=torch.float32)
    assert low(idx)[0].dtype == torch.float32
    torch.testing.assert_close(low(idx)[0].double(), a(idx)[0], rtol=1e-4, atol=1e-5)


def test_attention_only_loss_is_taken_on_the_mask_only(gen):
    model = small()
    idx, targets, mask = tl.repeat_batch(3, 16, 13, 4, generator=gen)
    logits, loss = model(idx, targets, mask)
    each = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
    torch.testing.assert_close(loss, each[mask].mean(), rtol=1e-14, atol=0)
    torch.testing.assert_close(model(idx, targets)[1], each.mean(), rtol=1e-14, atol=0)


def test_attention_only_errors():
    with pytest.raises(ValueError, match="n_layers must be positive"):
        tl.AttentionOnly(10, 8, 0)
    with pytest.raises(ValueError, match="d_model"):
        tl.AttentionOnly(10, 8, 1, 3, 16)
    model = small()
    idx = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="context_len"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="pass targets too"):
        model(idx, loss_mask=torch.ones(1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"loss_mask must be a bool tensor of the shape of idx \(1, 4\)"):
        model(idx, idx, torch.ones(1, 4))
    with pytest.raises(ValueError, match="False everywhere"):
        model(idx, idx, torch.zeros(1, 4, dtype=torch.bool))


# --- OV circuits -----------------------------------------------------------------------------


def test_ov_circuit_is_what_a_head_adds_to_the_logits():
    # without LayerNorm, biases and positions, position 0 attends only to itself, so its logits are
    # the direct path W_U E_b plus every head's OV circuit column b
    model = small(n_layers=1, layer_norm=False, bias=False)
    with torch.no_grad():
        model.pos_embed.weight.zero_()
        model.layers[0].in_proj_weight.normal_(0, 0.3)  # weights large enough to matter
        model.layers[0].out_proj.weight.normal_(0, 0.3)
    logits = model(torch.arange(13)[:, None])[0][:, 0]  # (V, V): row b, the logits after token b
    direct = model.tok_embed.weight @ model.unembed.weight.T  # (V, V)
    heads = sum(tl.ov_circuit(model, 0, i) for i in range(4))  # (V, V), column b
    torch.testing.assert_close(logits, direct + heads.T, rtol=1e-12, atol=1e-12)
    assert tl.ov_circuit(model, 0, 2).shape == (13, 13)
    with pytest.raises(ValueError, match="layer 1 is out of range for a model with n_layers=1"):
        tl.ov_circuit(model, 1, 0)
    with pytest.raises(ValueError, match="head 4 is out of range for layer 0, which has n_heads=4"):
        tl.ov_circuit(model, 0, 4)
    with pytest.raises(TypeError, match="AttentionOnly"):
        tl.ov_circuit(tl.GPT(tl.GPTConfig(5, 4, 1, 1, 4)), 0, 0)


def test_head_scores_are_the_scores_of_the_captured_patterns_and_keep_the_mode(gen):
    model = small().train()
    idx, _, mask, dist = tl.repeat_batch(5, 16, 13, 4, generator=gen, return_distance=True)
    scores = tl.head_scores(model, idx, mask, dist)
    assert model.training  # the mode it came in with
    with torch.no_grad(), tl.capture_attention(model.eval()) as w:
        model(idx)
    assert list(scores["induction"]) == list(scores["previous_token"]) == list(w) == ["layers.0", "layers.1"]
    for name, pattern in w.items():  # (B, h, T, T)
        ind = tl.induction_score(pattern, dist[:, None], mask[:, None, :]).mean(0)  # (h,)
        assert scores["induction"][name] == pytest.approx(ind.tolist(), abs=1e-12)
        assert scores["previous_token"][name] == pytest.approx(tl.previous_token_score(pattern).mean(0).tolist())
        assert all(0 <= x <= 1 for x in scores["induction"][name] + scores["previous_token"][name])


# --- training on repeats ---------------------------------------------------------------------


def test_train_on_repeats_history_and_determinism(one_thread):
    runs = []
    for _ in range(2):
        model = small(seed=1)
        runs.append(tl.train_on_repeats(model, 5, batch_size=8, repeat_len=4, log_every=2, seed=3, eval_size=16))
    history = runs[0]
    assert runs[0] == runs[1]
    assert [e["step"] for e in history] == [0, 2, 4, 5]
    assert history[0]["train_loss"] is None and all(isinstance(e["train_loss"], float) for e in history[1:])
    for e in history:
        assert set(e) == {"step", "loss", "train_loss", "induction", "previous_token"}
        assert list(e["induction"]) == ["layers.0", "layers.1"]
        assert all(len(v) == 4 and all(0 <= s <= 1 for s in v) for v in e["induction"].values())
        assert all(len(v) == 4 for v in e["previous_token"].values())
    assert history[-1]["loss"] < history[0]["loss"]
    with pytest.raises(ValueError, match="lr must be a finite number > 0, got 0"):
        tl.train_on_repeats(small(), 1, lr=0)
    with pytest.raises(ValueError, match="steps must be an int >= 0, got -1"):
        tl.train_on_repeats(small(), -1)


def induction_run(n_layers, steps, seed):
    """The chapter's setting: width 64, 4 heads, vocabulary and context 48, batch 64, AdamW 3e-3.
    Returns the model, the best last-layer head's induction score and the held-out loss on the repeat."""
    torch.manual_seed(seed)
    model = tl.AttentionOnly(48, 48, n_layers, 4, 64)
    history = tl.train_on_repeats(model, steps, batch_size=64, lr=3e-3, seed=seed, log_every=steps, eval_size=128)
    last = history[-1]
    return model, max(last["induction"][f"layers.{n_layers - 1}"]), last["loss"]


@pytest.mark.slow
@pytest.mark.cpu_rounding
def test_two_layers_form_induction_heads_and_one_layer_cannot(one_thread):
    # measured (float32, seeds 0-2, repeat_len 8): the best layer-2 head scores 0.03-0.04 at step
    # 100, 0.3-0.4 at step 200 and 0.63-0.65 at step 300; a one-layer model stays near 0.05
    model, two, two_loss = induction_run(2, 300, seed=0)
    _, one, one_loss = induction_run(1, 300, seed=0)
    assert two > 0.3 > 0.15 > one, (two, one)
    assert two_loss < one_loss - 1.0, (two_loss, one_loss)  # the repeat becomes predictable
    # zeroing layer 2's heads breaks the in-context copying: the loss on the repeat rises again
    idx, targets, mask = tl.repeat_batch(128, 48, 48, 8, generator=torch.Generator().manual_seed(99))
    with torch.no_grad(), tl.intervene_heads(model, {"layers.1": range(4)}):
        ablated = model(idx, targets, mask)[1].item()
    assert ablated > two_loss + 1.0, (ablated, two_loss)


@pytest.mark.slow
@pytest.mark.cpu_rounding
def test_induction_heads_over_three_seeds(one_thread):
    two = [induction_run(2, 500, seed)[1:] for seed in range(3)]
    one = [induction_run(1, 500, seed)[1:] for seed in range(3)]
    assert min(s for s, _ in two) > 0.4 and max(s for s, _ in one) < 0.15, (two, one)
    assert statistics.median(loss for _, loss in two) < math.log(48) / 2 < statistics.median(loss for _, loss in one)


# --- the chapter's probes: phase change, loss by position, agreement --------------------------


def fake_history(best_per_step):
    """A history as train_on_repeats returns it, the best head's score at each logged step."""
    return [
        {"step": 10 * i, "induction": {"layers.0": [0.01, s / 2], "layers.1": [s, 0.0]}, "previous_token": {}}
        for i, s in enumerate(best_per_step)
    ]


def test_phase_change_step_is_the_first_step_any_head_reaches_the_threshold():
    history = fake_history([0.02, 0.1, 0.29, 0.31, 0.9, 0.2])
    assert tl.phase_change_step(history) == 30
    assert tl.phase_change_step(history, threshold=0.5) == 40
    assert tl.phase_change_step(history, threshold=0.95) is None
    assert tl.phase_change_step([]) is None
    for bad in (0, 1, -0.1, "0.3"):
        with pytest.raises(ValueError, match="threshold must be a number in"):
            tl.phase_change_step(history, threshold=bad)
    with pytest.raises(TypeError, match="history must be the list"):
        tl.phase_change_step({"step": 0})


def test_train_on_repeats_calls_on_log_at_every_record_and_takes_a_fixed_distance(one_thread):
    seen = []
    history = tl.train_on_repeats(
        small(), 4, batch_size=4, repeat_len=4, log_every=2, eval_size=8,
        min_distance=5, max_distance=5, on_log=lambda step, model, held: seen.append((step, held[3])),
    )  # fmt: skip
    assert [s for s, _ in seen] == [e["step"] for e in history] == [0, 2, 4]
    assert all(bool((d == 5).all()) for _, d in seen)  # the held-out batch has the fixed distance
    with pytest.raises(TypeError, match="on_log must be a function"):
        tl.train_on_repeats(small(), 1, on_log=3)


def test_loss_by_position_averages_the_cross_entropy_over_the_batch(gen):
    model = small().eval()
    idx = torch.randint(13, (5, 16), generator=gen)
    targets = torch.randint(13, (5, 16), generator=gen)
    by_pos = tl.loss_by_position(model, idx, targets)
    assert by_pos.shape == (16,)
    logits, loss = model(idx, targets)
    assert torch.allclose(by_pos.mean(), loss)  # the mean over positions is the usual loss
    one = -logits[:, 3].log_softmax(-1).gather(-1, targets[:, 3:4]).mean()
    assert torch.allclose(by_pos[3], one)
    model.train()
    tl.loss_by_position(model, idx, targets)
    assert model.training  # the mode is restored
    with pytest.raises(ValueError, match="idx and targets must be"):
        tl.loss_by_position(model, idx, targets[:, :3])


def test_agreement_text_follows_the_grammar_and_is_seeded():
    text = tl.agreement_text(200, seed=3)
    assert text == tl.agreement_text(200, seed=3) != tl.agreement_text(200, seed=4)
    lines = text.splitlines()
    assert len(lines) == 200 and all(line.endswith(".") for line in lines)
    singular = {"cat", "dog", "bird", "fox", "child", "mouse", "king", "horse"}
    verbs_s = {"sleeps", "runs", "sings", "waits", "sees", "chases", "likes", "follows"}
    for line in lines:
        words = line[:-1].split()
        noun = next(w for w in words[1:] if w not in {"small", "red", "quiet", "big", "lazy"})
        verb = words[words.index(noun) + 1]
        assert (noun in singular) == (verb in verbs_s), line  # the verb agrees with its subject
    with pytest.raises(ValueError, match="n_sentences"):
        tl.agreement_text(0)


def test_agreement_prompts_pair_a_singular_and_a_plural_subject_of_one_length():
    pairs = tl.agreement_prompts(50, length=24, seed=2)
    assert pairs == tl.agreement_prompts(50, length=24, seed=2)
    for singular, plural in pairs:
        assert len(singular) == len(plural) == 24
        stem = plural.split()[-1]
        assert singular.endswith(" " + stem) and not stem.endswith("s")
        head_s, head_p = singular.rsplit(" ", 2)[-2], plural.rsplit(" ", 2)[-2]
        assert head_p == head_s + "s"  # the subject: "cat" and "cats"
    with pytest.raises(ValueError, match="length"):
        tl.agreement_prompts(3, length=10)


def test_agreement_probability_reads_the_probability_of_s_by_number():
    class Fixed(torch.nn.Module):
        # a "model" whose next-token distribution is the same everywhere: p("s") = 0.8
        def forward(self, idx):
            logits = torch.log(torch.tensor([0.8, 0.2])).expand(*idx.shape, 2)
            return logits, None

    idx = torch.zeros(4, 3, dtype=torch.long)
    singular = torch.tensor([True, False, True, False])
    p = tl.agreement_probability(Fixed(), idx, singular, s_token=0)
    assert torch.allclose(p, torch.tensor([0.8, 0.2, 0.8, 0.2]))
    with pytest.raises(ValueError, match="singular must be a bool tensor"):
        tl.agreement_probability(Fixed(), idx, singular.long(), 0)
