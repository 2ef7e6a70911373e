"""Tests for transformer_lib/train.py: the loss goes down (GPT and Transformer), resuming is exact,
checkpoints are atomic, Ctrl-C saves one, the learning-rate schedule and weight-decay groups are
right, and the MFU arithmetic; CUDA tests skip without a GPU."""

import math
import signal

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _gpu import requires_cuda

import transformer_lib as tl
from transformer_lib.data import CharTokenizer, LMBatches, Seq2SeqBatches, sequence_task, split_tokens

pytestmark = pytest.mark.usefixtures("one_thread")


TEXT = "the cat sat on the mat. the dog sat on the log. " * 40


def gpt_setup(dropout=0.0, seed=0, batch_size=8, rank=0, world_size=1):
    tok = CharTokenizer.from_text(TEXT)
    train, val = split_tokens(torch.tensor(tok.encode(TEXT)))
    torch.manual_seed(seed)
    model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=16, n_layers=2, n_heads=2, d_model=32,
                                dropout=dropout))  # fmt: skip
    batches = LMBatches(train, val, context_len=16, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size)
    return model, batches, tok


def config(tmp_path=None, **kw):
    base = dict(max_iters=8, lr=3e-3, min_lr=3e-4, warmup_iters=2, eval_interval=4, eval_iters=2, log_interval=2,
                device="cpu", progress=False, verbose=False, out_dir=str(tmp_path) if tmp_path else None)  # fmt: skip
    base.update(kw)
    return tl.TrainConfig(**base)


def params_equal(a, b):
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_gpt_loss_goes_down():
    model, batches, _ = gpt_setup()
    h = tl.train(model, batches, config(max_iters=40, eval_interval=20, log_interval=5))
    assert len(h.step_loss) == len(h.lr) == 40 and h.eval_step == [0, 20, 40]
    assert h.val_loss[-1] < h.val_loss[0] - 1.0 and h.step_loss[-1] < h.step_loss[0] - 1.0


def test_transformer_loss_goes_down():
    data = sequence_task("copy", n_train=500, n_val=50, n_symbols=5, max_len=6)
    torch.manual_seed(0)
    sizes = dict(src_vocab_size=8, tgt_vocab_size=8, d_model=32, n_heads=2, dropout=0.0, norm_first=True)
    model = tl.Transformer(tl.TransformerConfig(**sizes, context_len=data.context_len))
    h = tl.train(model, Seq2SeqBatches(data, batch_size=32), config(max_iters=40, eval_interval=40))
    assert h.val_loss[-1] < 0.8 * h.val_loss[0]


def test_resume_is_exact(tmp_path):
    """8 steps in one go == 4 steps, stop, a fresh process resumes and does 4 more (dropout on)."""
    model, batches, tok = gpt_setup(dropout=0.1)
    tl.set_seed(123)
    straight = tl.train(model, batches, config())

    model2, batches2, _ = gpt_setup(dropout=0.1)
    tl.set_seed(123)
    tl.train(model2, batches2, config(tmp_path), tokenizer=tok, until=4)
    tl.set_seed(999)  # whatever the new process's generators hold, the checkpoint's states win
    model3, batches3, _ = gpt_setup(dropout=0.1, seed=5)
    resumed = tl.train(model3, batches3, config(tmp_path), resume=True)
    assert params_equal(model, model3)
    assert resumed.step_loss == straight.step_loss and resumed.val_loss == straight.val_loss


# Draws of "train" batches: 2 for the evaluation at step 0, steps 1-4, 2 for the evaluation at
# step 4, steps 5-8. Draw 11 is step 7 (training), draw 7 is inside the evaluation at step 4. A
# Ctrl-C lets the step (or the evaluation) it lands in finish, then saves it.
@pytest.mark.parametrize(("interrupt_at", "saved_step"), [(11, 7), (7, 4)])
def test_ctrl_c_saves_a_checkpoint_that_resumes_exactly(tmp_path, interrupt_at, saved_step):
    model, batches, _ = gpt_setup(dropout=0.1)
    tl.set_seed(1)
    straight = tl.train(model, batches, config())

    model2, batches2, _ = gpt_setup(dropout=0.1)
    calls = {"train": 0}

    def interrupted(split):
        if split == "train":
            calls["train"] += 1
            if calls["train"] == interrupt_at:
                signal.raise_signal(signal.SIGINT)
        return batches2(split)

    interrupted.state_dict, interrupted.load_state_dict = batches2.state_dict, batches2.load_state_dict
    tl.set_seed(1)
    with pytest.raises(KeyboardInterrupt):
        tl.train(model2, interrupted, config(tmp_path))
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == saved_step and len(ckpt["history"]["step_loss"]) == saved_step

    model3, batches3, _ = gpt_setup(dropout=0.1)
    resumed = tl.train(model3, batches3, config(tmp_path), resume=True)
    assert params_equal(model, model3) and resumed == straight


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    tl.save_checkpoint({"step": 1}, path)
    real_save = torch.save

    def crash(obj, f):
        real_save({"half": "written"}, f)
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        tl.save_checkpoint({"step": 2}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]  # no temporary file left
    assert tl.read_checkpoint(path)["step"] == 1  # the old checkpoint is intact


def test_load_checkpoint_rebuilds_the_model(tmp_path):
    model, batches, tok = gpt_setup()
    tl.train(model, batches, config(tmp_path, max_iters=2), tokenizer=tok, meta={"note": "x"})
    loaded, tok2, ckpt = tl.load_checkpoint(tmp_path)
    assert isinstance(loaded, tl.GPT) and tok2 == tok and ckpt["meta"] == {"note": "x"} and ckpt["step"] == 2
    assert params_equal(model, loaded) and not loaded.training
    with pytest.raises(FileNotFoundError):
        tl.load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="resume"):
        tl.train(model, batches, config(tmp_path / "empty"), resume=True)


def test_lr_schedule_shape():
    c = tl.TrainConfig(max_iters=1000, lr=1e-3, min_lr=1e-4, warmup_iters=100, lr_decay_iters=800)
    lrs = [tl.lr_at(s, c) for s in range(1000)]
    assert lrs[0] == pytest.approx(1e-5) and lrs[99] == pytest.approx(1e-3)
    assert all(a < b for a, b in zip(lrs[:99], lrs[1:100], strict=True))  # linear warm-up
    assert all(a >= b for a, b in zip(lrs[100:800], lrs[101:801], strict=True))  # cosine decay
    assert lrs[450] == pytest.approx(0.5 * (1e-3 + 1e-4))  # half-way: the mean of lr and min_lr
    assert lrs[800:] == [1e-4] * 200
    model = torch.nn.Linear(2, 2)
    opt = tl.configure_optimizer(model, c)
    sched = tl.make_scheduler(opt, c)
    for s in range(300):
        assert opt.param_groups[0]["lr"] == pytest.approx(lrs[s])
        opt.step()
        sched.step()


def test_weight_decay_only_on_matrices():
    model, _, _ = gpt_setup()
    decay, no_decay = tl.configure_optimizer(model, tl.TrainConfig(weight_decay=0.1)).param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))  # tied weights once
    assert any(p is model.tok_embed.weight for p in decay["params"])


def test_estimate_loss_restores_the_mode():
    model, batches, tok = gpt_setup()
    model.train()
    losses = tl.estimate_loss(model, batches, eval_iters=2)
    assert model.training and set(losses) == {"train", "val"}
    assert losses["val"] == pytest.approx(math.log(tok.vocab_size), rel=0.1)  # untrained: near uniform


def test_exact_match_counts_whole_rows(monkeypatch):
    data = sequence_task("copy", n_train=10, n_val=4, seed=0)
    model = tl.Transformer(tl.TransformerConfig(src_vocab_size=13, tgt_vocab_size=13, d_model=16, n_heads=2,
                                                context_len=data.context_len))  # fmt: skip
    answers = data.val_tgt[:, 1:].clone()
    answers[1, 0] = 3 if answers[1, 0] != 3 else 4  # one wrong token in row 1
    trimmed = answers[:, : int((answers != 0).sum(1).max())]  # a decoder stops when every row has ended
    monkeypatch.setattr(model, "greedy_decode", lambda src, max_new_tokens: trimmed[: len(src)])
    assert tl.exact_match(model, data.val_src, data.val_tgt) == 0.75


def test_mfu_arithmetic():
    model, _, _ = gpt_setup()
    c = model.config
    assert tl.flops_per_token(model, 16) == 6 * model.num_params() + 12 * c.n_layers * c.d_model * 16
    assert tl.gpu_peak_flops("NVIDIA H100 80GB HBM3") == tl.gpu_peak_flops("NVIDIA H200") == 989.4e12
    assert tl.gpu_peak_flops("NVIDIA H100 PCIe") < 989.4e12 and tl.gpu_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert tl.gpu_peak_flops("Some Future GPU") is None
    tokens_per_second = 1e15 / tl.flops_per_token(model, 16)  # exactly 1 PFLOP/s of work
    assert tl.estimate_mfu(model, tokens_per_second, 16, 1e15) == pytest.approx(1.0)


def _ddp_worker(rank, world_size, init_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        model, batches, _ = gpt_setup(batch_size=4, rank=rank, world_size=world_size)
        h = tl.train(model, batches, config(max_iters=3, eval_interval=3))
        torch.save({"model": model.state_dict(), "val_loss": h.val_loss}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.cpu_rounding
def test_data_parallel_equals_one_process_on_the_combined_batch(tmp_path):
    """Two CPU processes (gloo), 4 sequences each, hold identical parameters equal to one process with 8."""
    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    model, batches, _ = gpt_setup(batch_size=8)
    h = tl.train(model, batches, config(max_iters=3, eval_interval=3))
    for name, p in model.state_dict().items():
        assert torch.equal(ranks[0]["model"][name], ranks[1]["model"][name])
        torch.testing.assert_close(ranks[0]["model"][name], p, atol=1e-5, rtol=1e-4)
    assert ranks[0]["val_loss"] == ranks[1]["val_loss"] == pytest.approx(h.val_loss, rel=1e-5)


@requires_cuda
def test_trains_on_cuda_with_mixed_precision(tmp_path):
    model, batches, tok = gpt_setup()
    batches.device = torch.device("cuda")
    h = tl.train(model, batches, config(tmp_path, max_iters=20, eval_interval=20, device="cuda"), tokenizer=tok)
    assert next(model.parameters()).is_cuda and h.val_loss[-1] < h.val_loss[0]
    assert h.mfu is None or 0 < h.mfu < 1
    loaded, _, _ = tl.load_checkpoint(tmp_path, "cuda")
    assert params_equal(model, loaded)
