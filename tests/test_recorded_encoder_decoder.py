"""The record of chapter "Encoder-decoder and cross-attention" (``transformer_lib.experiments.encoder_decoder``): it
holds every part and seed at the current settings, the shipped dates model is its seed 0, the chapter's Bahdanau model
is the experiment's, and seed 0, re-run, reproduces the record (slow)."""

import ast
import inspect
import json
from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib.experiments import encoder_decoder, recorded

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "chapters" / "08_encoder_decoder.ipynb"


def test_chapter_8s_record_holds_every_part_and_seed_at_the_current_settings():
    sweep = recorded("encoder_decoder")
    assert sweep["settings"] == {
        "reverse": encoder_decoder.REVERSE,
        "copy": encoder_decoder.COPY,
        "dates": encoder_decoder.DATES,
    }
    for part in encoder_decoder.EXPERIMENT.parts:
        assert [r["seed"] for r in sweep[part]["runs"]] == encoder_decoder.SEEDS, part
    for r in sweep["reverse"]["runs"]:
        assert 0 <= r["on_mirror"] <= 1
    for r in sweep["copy"]["runs"] + sweep["dates"]["runs"]:
        assert 0 <= r["exact_match"] <= 1
    for r in sweep["dates"]["runs"]:
        assert len(r["step_loss"]) == encoder_decoder.DATES["steps"]
        assert r["params"] == sweep["dates"]["runs"][0]["params"]


def test_the_shipped_dates_model_is_the_recorded_seed_0():
    model, _, ckpt = tl.load_checkpoint(encoder_decoder.CHECKPOINT)
    seed0 = recorded("encoder_decoder")["dates"]["runs"][0]
    assert ckpt["meta"]["settings"] == encoder_decoder.DATES and ckpt["step"] == encoder_decoder.DATES["steps"]
    assert encoder_decoder.weights_sha256(model) == ckpt["meta"]["weights_sha256"] == seed0["weights_sha256"]
    assert sum(p.numel() for p in model.parameters()) == seed0["params"]
    assert encoder_decoder.CHECKPOINT.stat().st_size < 1_000_000


def _class_without_docstring(node: ast.ClassDef) -> str:
    for f in [node, *[n for n in node.body if isinstance(n, ast.FunctionDef)]]:
        if f.body and isinstance(f.body[0], ast.Expr) and isinstance(f.body[0].value, ast.Constant):
            f.body = f.body[1:]
    return ast.dump(node)


def test_the_chapters_bahdanau_model_is_the_experiments():
    # the chapter writes the class for the reader; the experiment trains the same one
    cells = json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]
    source = next("".join(c["source"]) for c in cells if "".join(c["source"]).startswith("class BahdanauSeq2Seq"))
    in_chapter = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    in_library = ast.parse(inspect.getsource(encoder_decoder.BahdanauSeq2Seq)).body[0]
    assert _class_without_docstring(in_chapter) == _class_without_docstring(in_library)


@pytest.mark.slow
@pytest.mark.cpu_rounding
def test_a_re_run_of_seed_0_reproduces_chapter_8s_record(one_thread):
    """Seed 0 of each part, trained again in float32 on one thread, as recorded. On the machine
    that made the record the numbers are equal. Another CPU rounds float32 sums in other last bits,
    and a few hundred steps of training carry the difference on: PyTorch's portable kernels
    (``ATEN_CPU_CAPABILITY=default``) moved seed 0's mirrored share by half a point and its dates'
    exact match by 2.6 points (93.6 % to 96.2 %), as far as another seed moves it. The tolerances
    (5 points of mirrored share and of the dates' exact match, one copied sequence in 100, 0.05 of
    the last loss) allow for that and stay clear of what would change a claim of the chapter
    (more than 90 % mirrored, 100 % copied, at least 90 % of the dates)."""
    old = recorded("encoder_decoder")
    fresh = encoder_decoder.reverse([0])["reverse"]["runs"][0]
    assert fresh["on_mirror"] == pytest.approx(old["reverse"]["runs"][0]["on_mirror"], abs=0.05)
    fresh = encoder_decoder.copy([0])["copy"]["runs"][0]
    assert fresh["exact_match"] == pytest.approx(old["copy"]["runs"][0]["exact_match"], abs=0.01)
    fresh = encoder_decoder.dates([0])["dates"]["runs"][0]
    seed0 = old["dates"]["runs"][0]
    assert fresh["exact_match"] == pytest.approx(seed0["exact_match"], abs=0.05)
    assert fresh["step_loss"][-1] == pytest.approx(seed0["step_loss"][-1], abs=0.05)
    assert torch.get_num_threads() == 1
