"""Smoke tests of benchmarks/: each benchmark's core function at a tiny size, checking the structure
of what it returns and the properties that make its comparison fair. No timing is asserted."""

import math
import os
import sys
from pathlib import Path

import pytest
import torch

import transformer_lib as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # benchmarks/ is a folder of the repository, not an installed package

from benchmarks import attention, common, cpu_throughput, generation, gpu_training, quality, tokenizer  # noqa: E402

TINY_GPT = dict(n_layers=1, n_heads=2, d_model=32, context_len=16)


pytestmark = pytest.mark.usefixtures("one_thread")


def test_results_rows_have_every_column(tmp_path):
    path = tmp_path / "RESULTS.md"
    common.append_result("demo", {"a": 1, "b": "x|y"}, {"speed": "3.0"}, path)
    common.append_result("demo", {"a": 2}, {"speed": "4.0"}, path)
    lines = path.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| date"))
    rows = [line for line in lines if line.startswith("| 20")]
    assert len(rows) == 2
    assert all(row.count("|") == header.count("|") for row in rows)  # a pipe in a value must not add a column
    assert "a=1" in rows[0] and "speed=3.0" in rows[0] and "load=" in rows[0]
    assert "cores" in common.machine_info()["machine"]


@pytest.mark.parametrize(
    ("peers", "bias"), [(("nano", "torch"), True), (("nano", "torch", "hf"), True), (("nano", "torch"), False)]
)
def test_cpu_throughput_compares_equal_models(peers, bias):
    if "hf" in peers:
        pytest.importorskip("transformers")
    r = cpu_throughput.run_throughput(
        **TINY_GPT, batch_size=2, warmup=1, steps=2, rounds=3, threads=1, peers=peers, bias=bias
    )
    assert set(r) >= {"settings", "ours", "ours_median", "params", "max_logit_diff", "final_loss"}
    for p in peers:
        assert len(r["ours"]) == len(r[p]) == 3 and min(r["ours"] + r[p]) > 0
        assert r[f"ratio_{p}"] == pytest.approx([a / b for a, b in zip(r["ours"], r[p], strict=True)])
        assert min(r[f"ratio_{p}"]) <= r[f"ratio_{p}_median"] <= max(r[f"ratio_{p}"])
        assert r["params"]["ours"] == r["params"][p]
        assert r["final_loss"]["ours"] == pytest.approx(r["final_loss"][p], abs=1e-3)  # same start, same batches
    assert r["max_logit_diff"] < 1e-4  # every peer computes the same function
    assert r["settings"]["threads"] == 1
    assert all(f"ratio ours / {p}" in cpu_throughput.report(r) for p in peers)


def test_cpu_throughput_profile_puts_the_models_side_by_side():
    r = cpu_throughput.run_throughput(
        **TINY_GPT, batch_size=2, warmup=1, steps=2, rounds=1, threads=1, peers=("nano",), bias=False, profile=True
    )
    ours, nano = r["profile"]["ours"], r["profile"]["nano"]
    # one step of each: the same matrix products (4 linear layers + the head, forward and backward)
    assert ours["aten::mm"][1] == nano["aten::mm"][1] > 0
    assert all(ms >= 0 and calls > 0 for ms, calls in ours.values())
    text = cpu_throughput.report(r)
    assert "where a training step's time goes" in text and "aten::mm" in text and "total self time" in text
    without = cpu_throughput.run_throughput(**TINY_GPT, batch_size=2, warmup=0, steps=1, rounds=1, threads=1, peers=())
    assert without["profile"] is None and "time goes" not in cpu_throughput.report(without)


def test_gpt2_peer_refuses_no_bias():
    with pytest.raises(ValueError, match="always has biases"):
        cpu_throughput.run_throughput(**TINY_GPT, batch_size=2, warmup=0, steps=1, rounds=1, peers=("hf",), bias=False)


def test_transformers_is_installed_so_the_peer_benchmark_is_not_skipped():
    assert cpu_throughput.hf_available()


def test_cpu_throughput_reads_a_text_file(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 20)
    batches, vocab_size, source = cpu_throughput.make_batches(3, 2, 8, seed=0, data=text)
    assert vocab_size == len(set(text.read_text())) and source == "text text.txt"
    x, y = batches[0]
    assert x.shape == y.shape == (2, 8) and torch.equal(x[:, 1:], y[:, :-1])


def test_attention_variants_compute_the_same_function():
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(16, 2)
    x = torch.randn(2, 8, 16)
    outs = [attention.attention_fn(v, mha)(x) for v in attention.VARIANTS]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)


def test_attention_sweep(tmp_path):
    r = attention.sweep([8, 16], d_model=16, n_heads=2, budget_s=0.01, max_reps=2, skip_handwritten_backward_above=8)
    rows = r["rows"]
    assert len(rows) == 2 * len(attention.PASSES) * len(attention.VARIANTS)
    for row in rows:
        assert row["score_bytes"] == 1 * 2 * row["T"] ** 2 * 4
        if row["skipped"]:
            assert row["time_s"] is None and row["peak_bytes"] is None
        else:
            assert row["time_s"] > 0 and row["reps"] >= 1 and row["peak_bytes"] > 0
    skipped = [(row["T"], row["variant"], row["pass"]) for row in rows if row["skipped"]]
    assert skipped == [(16, "handwritten", "forward+backward")]
    hand = attention._find(rows, T=16, variant="handwritten", **{"pass": "forward"})
    assert hand["peak_bytes"] >= hand["score_bytes"]  # the hand-written path holds the score matrix
    assert "fused/direct" in attention.report(r)
    assert set(attention.summary(r)) >= {"fused/direct_fwd", "within5%_fwd", "fused/direct_fwdbwd"}
    saved = attention.save_json(r, tmp_path / "scaling.json")
    assert saved.read_text().startswith("{") and '"cpu"' in saved.read_text()
    assert attention.plot(r, tmp_path / "scaling.png").stat().st_size > 0


def test_gpu_training_measures_and_computes_mfu():
    shape = dict(TINY_GPT, batch_size=2, vocab_size=50, dropout=0.0)
    r = gpu_training.measure(shape, compile=False, device="cpu", dtype=torch.float32, warmup=1, steps=2, rounds=2,
                             peak=1e12)  # fmt: skip
    assert len(r["tokens_per_s"]) == 2 and r["median_tokens_per_s"] > 0 and math.isfinite(r["loss"])
    model = tl.GPT(tl.GPTConfig(vocab_size=50, **TINY_GPT))
    assert r["flops_per_token"] == 6 * model.num_params() + 12 * 1 * 32 * 16
    assert r["mfu"] == pytest.approx(r["flops_per_token"] * r["median_tokens_per_s"] / 1e12)
    assert tl.gpu_peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert tl.gpu_peak_flops("NVIDIA H200") == 989.4e12
    assert tl.gpu_peak_flops("a GPU nobody knows") is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown without a GPU")
def test_gpu_training_without_a_gpu_exits_cleanly(capsys):
    assert gpu_training.main(["--no-record"]) == 0
    assert "needs a CUDA GPU" in capsys.readouterr().out


def test_quality_runs_the_training_command_line(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("First Citizen:\nBefore we proceed any further, hear me speak.\n" * 40)
    tiny = ["--n-layers", "1", "--n-heads", "2", "--d-model", "16", "--context-len", "8", "--batch-size", "2"]
    tiny += ["--eval-iters", "1", "--eval-interval", "2", "--warmup-iters", "1", "--lr-decay-iters", "2"]
    r = quality.run_quality("cpu", steps=2, data=text, device="cpu", threads=1, extra_args=tiny, echo=False)
    assert r["eval_step"] == 2 and math.isfinite(r["val_loss"]) and r["wall_s"] > 0
    assert r["corpus"] == "text.txt" and r["reference_loss"] is None  # not Tiny Shakespeare: no reference
    assert r["command"][1:4] == ["-m", "transformer_lib", "train"]
    assert r["best_val_loss"] <= r["val_loss"] and r["best_step"] in (0, 2)


def test_quality_reports_the_best_validation_loss_beside_the_final_one():
    # nanoGPT's reference is its best loss: an overfitting run's best comes before its end
    log = "step 0: train loss 4.2, val loss 4.3\nstep 250: train loss 1.1, val loss 1.48\n"
    log += "step 500: train loss 0.6, val loss 1.71\nfinal val loss 1.71 after 500 steps\n"
    r = quality._final_from_output(log)
    assert (r["val_loss"], r["step"], r["best_val_loss"], r["best_step"]) == (1.71, 500, 1.48, 250)


def test_attention_timing_drops_a_call_that_runs_out_of_memory():
    def too_big():
        raise RuntimeError("CPU out of memory")

    calls = {"small": lambda: None, "big": too_big}
    medians, reps, failed = attention.time_in_turns(calls, torch.device("cpu"), budget_s=0.001, max_reps=3)
    assert set(medians) == {"small"} and 1 <= reps["small"] <= 3 and failed == {"big": "out of memory"}


def test_generation_benchmark_times_both_paths_on_the_same_tokens():
    r = generation.run_generation((4, 9), shape=dict(TINY_GPT), batch_size=2, rounds=2, threads=1)
    assert [row["T"] for row in r["rows"]] == [4, 9] and r["settings"]["threads"] == 1
    for row in r["rows"]:
        assert row["same_tokens"] and row["new_tokens"] == row["T"] - 1  # a one-token prompt
        assert len(row["speedup"]) == len(row["cpu_speedup"]) == 2
        assert min(row["tok_s"]["cached"] + row["tok_s"]["uncached"]) > 0 and row["step_ms"] > 0
        assert min(row["at_T_ms"].values()) > 0
    assert "CPU-time ratio" in generation.report(r)
    with pytest.raises(ValueError, match="context_len"):
        generation.run_generation((32,), shape=dict(TINY_GPT), rounds=1, threads=1)


def test_generation_against_transformers_same_tokens_and_a_limit():
    pytest.importorskip("transformers")
    r = generation.run_peer_generation(
        (1, 2), shape=dict(TINY_GPT), prompt_len=4, new_tokens=4, rounds=2, threads=1, profile=True
    )
    assert [row["B"] for row in r["rows"]] == [1, 2] and r["bandwidth_gb_s"] > 0
    for row in r["rows"]:
        assert row["same_tokens"] == 1.0  # the same weights, greedy: the same continuation
        assert len(row["ratio"]) == 2 and min(row["tok_s"]["ours"] + row["tok_s"]["hf"]) > 0
        assert 0 < row["limit_ms"] and 0 < row["step_ms"]
        assert set(row["profile"]) == {"ours", "hf"} and row["profile"]["ours"]["aten::linear"][1] > 0
    text = generation.report_peer(r)
    assert "step / limit" in text and "where a generated token's time goes" in text
    with pytest.raises(ValueError, match="context_len"):
        generation.run_peer_generation((1,), shape=dict(TINY_GPT), prompt_len=10, new_tokens=10, threads=1)


def test_tokenizer_benchmark_runs_every_trainer_and_checks_them(tmp_path, capsys):
    for package in ("tokenizers", "rustbpe", "tiktoken"):
        pytest.importorskip(package)
    text = tmp_path / "small.txt"
    text.write_text(tl.data.SHIPPED_PATH.read_text(encoding="utf-8")[:30_000], encoding="utf-8")
    results = tmp_path / "RESULTS.md"
    before = os.sched_getaffinity(0) if tokenizer.can_pin() else None
    args = ["--data", str(text), "--merges", "200", "--repeat", "1", "--results", str(results)]
    assert tokenizer.main(args) == 0
    out = capsys.readouterr().out
    for label in tokenizer.LABELS.values():
        assert label in out
    assert "naive reference == ours: the same 200 merges in the same order" in out
    assert "rustbpe ranks == ours: equal" in out
    assert "the same merge at the same index" in out and "the same pairs as a set" in out
    assert "first difference at merge" in out and ": a tie." in out  # Hugging Face breaks a tie otherwise
    for encoder in ("ours cold", "ours warm", "tiktoken"):
        assert encoder in out
    assert " NO" not in out  # every encoder gave the same ids
    row = results.read_text().splitlines()[-1]
    assert "| tokenizer |" in row and "naive_same=200" in row and "hf_same_set@200=" in row
    if tokenizer.can_pin():
        assert "pinned to core" in out and os.sched_getaffinity(0) == before  # the pin is undone


def test_tokenizer_benchmark_checks_fail_loudly():
    with pytest.raises(ValueError, match="must be positive"):
        tokenizer.run_benchmark("abc", (0,))
    with pytest.raises(ValueError, match="cannot pin to core"):
        tokenizer.run_benchmark("abc", (1,), core=10_000)


def test_the_recurrence_benchmark_times_every_kind_and_counts_the_memory():
    from benchmarks import recurrence

    r = recurrence.run([16, 32], [8, 24], heads=2, d=4, chunk_size=8, repeats=1)
    assert set(r["forward_ms"]) == set(recurrence.KINDS)
    assert all(len(v) == 2 and min(v) > 0 for v in r["forward_ms"].values())
    assert all(len(v) == 2 and min(v) > 0 for v in r["decode_ms"].values())
    assert r["cache_bytes"] == [2 * 2 * 4 * 4 * n for n in (8, 24)] and r["state_bytes"] == 2 * 4 * 4 * 4
    assert recurrence.crossover([1, 2, 3], [5, 1, 5], [4, 2, 4]) == 3  # it must stay faster
    assert recurrence.crossover([1, 2], [1, 1], [2, 2]) is None
    assert "crossover" in recurrence.report(r)
