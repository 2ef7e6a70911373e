"""Chapter "Fine-tuning"'s fine-tuning pieces, as properties: the masked loss counts exactly the marked
targets, a classifier's padding changes nothing, each method trains exactly its parameters,
the labelled tasks are what they say, prompt/response files are read or refused by line, and
the shipped pretrained model loads and reaches its recorded loss."""

import json

import pytest
import torch

import transformer_lib as tl
from transformer_lib.data.speeches import _shuffle_words

pytestmark = pytest.mark.usefixtures("one_thread")
TEXT = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")


def small_gpt(seed=0, vocab_size=40, context_len=24):
    torch.manual_seed(seed)
    return tl.GPT(tl.GPTConfig(vocab_size=vocab_size, context_len=context_len, n_layers=2, d_model=32)).double()


@pytest.mark.parametrize("seed", range(5))
def test_the_masked_loss_is_the_mean_over_the_marked_targets_only(seed):
    g = torch.Generator().manual_seed(seed)
    model = small_gpt(seed)
    x = torch.randint(0, 40, (3, 24), generator=g)
    y = torch.randint(0, 40, (3, 24), generator=g)
    mask = torch.rand(3, 24, generator=g) < 0.4
    mask[0, 0] = True
    logits, loss = model(x, y, loss_mask=mask)
    each = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), y.reshape(-1), reduction="none")
    torch.testing.assert_close(loss, each[mask.reshape(-1)].mean(), rtol=0, atol=1e-12)
    # the unmarked targets can be anything: the loss is the same, bitwise
    y2 = torch.where(mask, y, torch.randint(0, 40, y.shape, generator=g))
    assert torch.equal(model(x, y2, loss_mask=mask)[1], loss)
    # and no gradient flows from them: the logits at unmarked positions get none
    logits = logits.detach().requires_grad_(True)
    sel = torch.nn.functional.cross_entropy(logits.reshape(-1, 40), y.reshape(-1), reduction="none")
    sel[mask.reshape(-1)].mean().backward()
    assert torch.count_nonzero(logits.grad[~mask]) == 0


@pytest.mark.parametrize(
    ("mask", "error", "words"),
    [
        (torch.ones(2, 8), TypeError, ["bool tensor", "torch.float32"]),
        (torch.ones(2, 7, dtype=torch.bool), ValueError, ["(2, 7)", "(2, 8)"]),
        (torch.zeros(2, 8, dtype=torch.bool), ValueError, ["marks no target"]),
    ],
)
def test_a_bad_loss_mask_is_named(mask, error, words):
    x = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(error) as e:
        small_gpt()(x, x, loss_mask=mask)
    assert all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(ValueError, match="without targets"):
        small_gpt()(x, loss_mask=torch.ones(2, 8, dtype=torch.bool))


def test_instruction_rows_mark_the_response_and_end_token_and_the_switches_add_the_rest():
    tok = tl.train_bpe(TEXT[:20000], 300, specials=("<|endoftext|>",))
    pairs = [("21.11.2026", "2026-11-21"), ("a much longer prompt than the other", "ok")]
    rows = [tl.encode_pair(tok, p, r) for p, r in pairs]
    right = tl.InstructionBatches(rows, rows, 32, 2, tok.eos_id)
    x, y, m = right.rows["train"]
    for i, (ids, n_prompt) in enumerate(rows):
        assert ids[-1] == tok.eos_id and tok.decode(ids[n_prompt:-1]) == pairs[i][1]
        marked = y[i][m[i]].tolist()
        assert marked == ids[n_prompt:]  # the response's ids and the end token, nothing else
        assert x[i, : len(ids) - 1].tolist() == ids[:-1]
    _, _, m_prompt = tl.InstructionBatches(rows, rows, 32, 2, tok.eos_id, mask_prompt=False).rows["train"]
    _, _, m_pad = tl.InstructionBatches(rows, rows, 32, 2, tok.eos_id, mask_padding=False).rows["train"]
    for i, (ids, _) in enumerate(rows):
        assert m_prompt[i].sum() == len(ids) - 1 and m_pad[i, len(ids) - 1 :].all()
    batch = right("train")
    assert set(batch) == {"idx", "targets", "loss_mask"} and batch["idx"].shape == (2, 32)
    assert tl.encode_pair(tok, "q", "a", end=False)[0][-1] != tok.eos_id
    with pytest.raises(ValueError, match="has 36 tokens; the model reads 16"):
        tl.InstructionBatches([(list(range(36)), 3)], rows, 16, 2, 0)
    with pytest.raises(ValueError, match="no end token"):
        tl.encode_pair(tl.CharTokenizer.from_text("abc"), "a", "b")


@pytest.mark.parametrize("pool", ["mean", "last"])
def test_a_classifiers_padding_changes_nothing_and_its_pooling_is_what_it_says(pool):
    model = tl.GPTClassifier(small_gpt(), 3, pool=pool).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 40, (4, 24), generator=g)
    lengths = torch.tensor([24, 5, 1, 17])
    a = model(ids, lengths=lengths)[0]
    noisy = torch.where(torch.arange(24) < lengths[:, None], ids, torch.randint(0, 40, ids.shape, generator=g))
    assert torch.equal(model(noisy, lengths=lengths)[0], a)  # causal: real tokens never read the padding
    for i, n in enumerate(lengths.tolist()):
        h = model.gpt.hidden(ids[i : i + 1, :n])[0]
        feature = h.mean(0) if pool == "mean" else h[-1]
        torch.testing.assert_close(a[i], model.head(feature), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="lengths must be"):
        model(ids, lengths=torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match=r"labels must be \(B,\) = \(4,\) classes in \[0, 3\)"):
        model(ids, torch.tensor([0, 1, 2, 3]))


@pytest.mark.parametrize("method", ["head", "lora", "full"])
def test_each_method_trains_exactly_its_parameters(method):
    model = tl.GPTClassifier(small_gpt(), 2)
    n = tl.prepare_finetune(model, method, rank=2, alpha=4)
    ids = torch.randint(0, 40, (4, 24), generator=torch.Generator().manual_seed(1))
    model(ids, torch.tensor([0, 1, 0, 1]))[1].backward()
    got = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert got <= trainable and n == sum(p.numel() for p in model.parameters() if p.requires_grad)
    if method == "head":
        assert trainable == {"head.weight", "head.bias"}
    elif method == "lora":
        assert trainable == {"head.weight", "head.bias"} | {n for n in trainable if n.endswith((".A", ".B"))}
        # at the first step B is zero, so only B (and the head) gets a gradient; A's is B^T times it
        assert any(n.endswith(".A") for n in trainable) and got == {n for n in trainable if not n.endswith(".A")}
    else:
        assert trainable == {name for name, _ in model.named_parameters()}
    with pytest.raises(ValueError, match="method must be one of"):
        tl.prepare_finetune(tl.GPTClassifier(small_gpt(), 2), "adapters")


def test_speeches_and_the_two_tasks():
    all_speeches = tl.split_speeches(TEXT)
    assert len(all_speeches) > 7000 and all_speeches[0].speaker == "First Citizen"
    assert TEXT[all_speeches[0].start :].startswith("First Citizen:\n" + all_speeches[0].text)
    cut = int(len(TEXT) * 0.9)
    task = tl.speaker_task(TEXT)
    assert task.classes[0] == "PETRUCHIO" and len(task.classes) == 5
    assert not set(task.train) & set(task.test) and sorted(task.train + task.test) == list(range(len(task.texts)))
    held = {s.text for s in all_speeches if s.start >= cut}
    assert set(task.texts) <= held  # every speech from the part the training command holds out
    for c in range(5):  # stratified: each speaker 40 % in the test set, to rounding
        n_c = task.labels.count(c)
        assert abs(sum(task.labels[i] == c for i in task.test) - 0.4 * n_c) <= 0.5
    order = tl.word_order_task(TEXT)
    assert sorted(set(order.labels)) == [0, 1] and order.labels.count(1) == 200
    for t, y in zip(order.texts, order.labels, strict=True):
        if y == 1:
            assert t in held
        else:
            assert t not in held
    rng = __import__("numpy").random.default_rng(0)
    line = "to be or not to be that is"
    shuffled = _shuffle_words(line, rng)
    assert shuffled != line and sorted(shuffled.split()) == sorted(line.split())
    with pytest.raises(ValueError, match="fewer than 999"):
        tl.speaker_task(TEXT, 999)


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        (['{"prompt": "a", "response": "b"}', "not json"], ["line 2", "not JSON"]),
        (['{"prompt": "a"}'], ["line 1", "expected", "['prompt']"]),
        (['["a", "b"]'], ["line 1", "got list"]),
        (['{"prompt": "a", "response": ""}'], ["line 1", "not empty"]),
        (['{"prompt": 3, "response": "b"}'], ["line 1", "must be text"]),
        (["", "  "], ["holds no prompt/response pair"]),
    ],
)
def test_prompt_response_files_are_read_or_refused_by_line(tmp_path, lines, words):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError) as e:
        tl.read_pairs(path)
    assert all(w in str(e.value) for w in words) and "pairs.jsonl" in str(e.value), str(e.value)


def test_pairs_written_are_read_back_with_a_bom_and_blank_lines(tmp_path):
    pairs = [("ROMEO:", "But soft"), ("ünïcödé ✓", "line\nbreak")]
    path = tl.write_pairs(pairs, tmp_path / "p.jsonl")
    assert tl.write_pairs(pairs, path) == path  # the same pairs again: nothing to lose
    with pytest.raises(FileExistsError, match="p.jsonl exists"):
        tl.write_pairs(pairs[:1], path)
    assert tl.read_pairs(path) == pairs
    path.write_text("\ufeff" + path.read_text(encoding="utf-8") + "\n\n", encoding="utf-8")
    assert tl.read_pairs(path) == pairs


@pytest.mark.parametrize(("correct", "n"), [(0, 10), (5, 10), (10, 10), (120, 200), (1, 1000)])
def test_the_wilson_interval_holds_the_estimate_and_shrinks_with_n(correct, n):
    low, high = tl.wilson_interval(correct, n)
    assert 0 <= low <= correct / n <= high <= 1
    low4, high4 = tl.wilson_interval(4 * correct, 4 * n)
    assert high4 - low4 < high - low
    # the Wilson bounds solve |p - p_hat| = z sqrt(p (1 - p) / n)
    for p in (low, high):
        if 0 < p < 1:
            assert abs(abs(p - correct / n) - 1.96 * (p * (1 - p) / n) ** 0.5) < 1e-12
    with pytest.raises(ValueError, match="cannot exceed"):
        tl.wilson_interval(n + 1, n)


def test_answers_stop_at_the_end_token_and_say_when_it_never_came():
    tok = tl.train_bpe(TEXT[:5000], 270, specials=("<|endoftext|>",))
    model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=16, n_layers=1, d_model=16)).eval()
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8]]
    with torch.no_grad():  # every position's features become c: the head's scores are its rows . c
        model.decoder.norm.weight.zero_()
        model.decoder.norm.bias.fill_(1.0)
        model.lm_head.weight = torch.nn.Parameter(torch.zeros(tok.vocab_size, 16))
        model.lm_head.weight[7] = 1.0  # token 7 wins every step: no end token ever
    got = tl.answers(model, tok, prompts, 4)
    assert got == [([7, 7, 7, 7], False)] * 3
    with torch.no_grad():
        model.lm_head.weight[tok.eos_id] = 2.0  # now the end token wins at once
    assert tl.answers(model, tok, prompts, 4) == [([], True)] * 3


def test_the_shipped_pretrained_model_loads_and_reaches_its_recorded_loss():
    record = json.loads((tl.PRETRAINED_PATH.parent / "pretrained.json").read_text())
    assert tl.PRETRAINED_PATH.stat().st_size < 5e6
    model, tok, ckpt = tl.load_checkpoint(tl.PRETRAINED_PATH)
    assert tok.eos_id == tok.vocab_size - 1 and ckpt["step"] == record["steps"] == 6000
    assert sum(p.numel() for p in model.parameters()) == record["params"]
    assert record["command"].startswith("python -m transformer_lib train --preset cpu --tokenizer bpe")
    val = torch.tensor(tok.encode(TEXT[int(len(TEXT) * 0.9) :]))
    # the windows the record was measured on (scripts/pretrain_ch15.py)
    assert abs(tl.window_loss(model, val, batches=50) - record["val_loss"]) < 1e-4
