"""The recorder of the chapters' experiments (``transformer_lib.experiments``): one smoke-run
policy, merging by key, atomic writes, the command line's refusals, and the loader the chapters
read their records with. Fast: no test here trains a recorded model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_lib import chapters, experiments

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = list(experiments.RECORDS)
REAL = experiments.experiment  # before any test replaces it


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_recorded_reads_the_shipped_record(chapter):
    path = chapters.data_folder(chapter) / experiments.RECORDS[chapter]
    assert path.parent.parent == ROOT / "transformer_lib" / "data"
    assert experiments.record_path(chapter) == path
    assert experiments.recorded(chapter) == json.loads(path.read_text())


def test_recorded_names_the_chapters_it_knows():
    with pytest.raises(ValueError, match="'why_attention'.*" + ", ".join(CHAPTERS)):
        experiments.recorded("why_attention")
    with pytest.raises(ValueError, match="'no_such_chapter'.*" + ", ".join(CHAPTERS)):
        experiments.recorded("no_such_chapter")


def test_a_record_and_an_experiment_answer_to_their_chapters_old_name():
    # the names by number the library had before its chapters were named: the same record and module
    assert experiments.record_path("ch14") == experiments.record_path("todays_block")
    assert experiments.recorded("ch14") == experiments.recorded("todays_block")
    assert experiments.experiment("todays_block") is experiments.experiment("ch14")
    from transformer_lib.experiments import ch15_diagnosis, fine_tuning_diagnosis

    assert ch15_diagnosis is fine_tuning_diagnosis and fine_tuning_diagnosis.__spec__.name.endswith("diagnosis")


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_record_written_again_is_the_same_bytes(chapter, tmp_path):
    # the records were written as the recorder writes them: merging nothing into one and writing it
    # gives the same file, byte for byte
    text = experiments.record_path(chapter).read_text()
    record = json.loads(text)
    assert experiments.merge(record, {}) == record
    experiments.write_record(tmp_path / "record.json", record)
    assert (tmp_path / "record.json").read_text() == text


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_its_experiment_with_parts_and_seeds(chapter):
    found = experiments.experiment(chapter)
    assert found.chapter == chapter and found.path == experiments.record_path(chapter)
    assert found.parts and all(part.seeds and callable(part.run) for part in found.parts.values())


def fake(chapter: str, calls: list) -> experiments.Experiment:
    """``chapter``'s experiment with each part replaced by one that trains nothing and returns runs
    unlike the recorded ones."""

    def run(name):
        def part(seeds, steps):
            calls.append((name, list(seeds), steps))
            return {name: {"runs": [{"seed": s, "smoke": True} for s in seeds]}}

        return part

    real = REAL(chapter)
    return experiments.Experiment(
        chapter, {name: experiments.Part(run(name), part.seeds) for name, part in real.parts.items()}
    )


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_a_smoke_run_leaves_the_record_byte_for_byte(chapter, monkeypatch, capsys):
    path = experiments.record_path(chapter)
    before, stat = path.read_bytes(), path.stat()
    n_parts, calls = len(REAL(chapter).parts), []
    monkeypatch.setattr(experiments, "experiment", lambda name: fake(name, calls))
    assert experiments.main([chapter, "--seeds", "0", "--steps", "2", "--dry-run"]) == 0
    assert experiments.main([chapter, "--dry-run"]) == 0
    assert len(calls) == 2 * n_parts  # every part ran, twice
    assert all(steps in (2, None) for _, _, steps in calls)
    assert path.read_bytes() == before and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert not list(path.parent.glob("*.tmp"))
    assert "nothing written" in capsys.readouterr().out


def test_a_real_smoke_run_on_the_command_line_writes_nothing():
    # chapter "What attention learns"'s cheapest part, two steps: it trains, prints, and leaves the record alone
    path = experiments.record_path("what_attention_learns")
    before = path.read_bytes()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "transformer_lib.experiments",
            "what_attention_learns",
            "--parts",
            "fixed",
            "--seeds",
            "0",
        ]
        + ["--steps", "2", "--dry-run"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert "fixed distance seed 0" in done.stdout and "nothing written" in done.stdout
    assert path.read_bytes() == before


BAD = [
    (["todays_block", "--steps", "2"], "--steps changes the recorded result"),
    (["todays_block", "--parts", "lr", "wd"], "todays_block has no part 'wd'; its parts are ablation, lr"),
    (["todays_block", "--seeds", "-1", "--dry-run"], "seeds must be whole numbers from 0"),
    (["todays_block", "--steps", "0", "--dry-run"], "--steps must be at least 1"),
    (["ch9"], "no recorded experiment for 'ch9'"),
    (["todays_block", "--seeds", "one"], "invalid int value"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_requests_are_refused_before_any_training(argv, message, monkeypatch, capsys):
    calls = []
    path = experiments.record_path("todays_block")
    before = path.read_bytes()
    monkeypatch.setattr(experiments, "experiment", lambda name: fake(name, calls))
    with pytest.raises(SystemExit) as stop:
        experiments.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and message in err, err
    assert calls == [] and path.read_bytes() == before


def test_the_command_line_refuses_in_one_line_on_stderr():
    done = subprocess.run(
        [sys.executable, "-m", "transformer_lib.experiments", "todays_block", "--steps", "5"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert "needs --dry-run" in done.stderr


def test_a_failure_half_way_through_the_write_leaves_the_old_record(tmp_path):
    path = tmp_path / "record.json"
    experiments.write_record(path, {"lr": {"runs": [{"seed": 0, "loss": 1.5}]}})
    before = path.read_bytes()
    with pytest.raises(TypeError):  # json.dump has written part of the file when it meets this
        experiments.write_record(path, {"lr": {"runs": [{"seed": 0, "loss": 1.5}, {"seed": 1, "loss": object()}]}})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temporary file left


def test_runs_are_merged_by_their_key_in_the_order_of_a_full_run():
    old = {
        "threshold": 0.3,
        "repeats": {"steps": 1000, "runs": [{"seed": s, "n_layers": n, "x": 0} for s in (0, 1) for n in (1, 2)]},
        "shakespeare": {"runs": [{"seed": s, "x": 0} for s in (1337, 1, 2)]},
        "lr": {"runs": [{"qk_norm": q, "seed": s, "x": 0} for q in (False, True) for s in (0, 1)]},
        "ablation": {"rows": [{"name": n, "options": {}, "runs": [{"seed": 0, "x": 0}]} for n in ("a", "b")]},
    }
    new = {
        "repeats": {"steps": 1000, "runs": [{"seed": 1, "n_layers": 2, "x": 1}, {"seed": 2, "n_layers": 2, "x": 1}]},
        "shakespeare": {"runs": [{"seed": 1, "x": 1}, {"seed": 3, "x": 1}]},
        "lr": {"runs": [{"qk_norm": q, "seed": 2, "x": 1} for q in (False, True)]},
        "ablation": {"rows": [{"name": "b", "options": {"bias": False}, "runs": [{"seed": 1, "x": 1}]}]},
    }
    merged = experiments.merge(old, new)
    assert merged["threshold"] == 0.3  # an entry no new run touches is kept
    keys = [(r["seed"], r["n_layers"], r["x"]) for r in merged["repeats"]["runs"]]
    assert keys == [(0, 1, 0), (0, 2, 0), (1, 1, 0), (1, 2, 1), (2, 2, 1)]  # replaced in place, added in order
    assert [(r["seed"], r["x"]) for r in merged["shakespeare"]["runs"]] == [(1337, 0), (1, 1), (2, 0), (3, 1)]
    keys = [(r["qk_norm"], r["seed"]) for r in merged["lr"]["runs"]]
    assert keys == [(False, 0), (False, 1), (False, 2), (True, 0), (True, 1), (True, 2)]
    rows = merged["ablation"]["rows"]
    assert [r["name"] for r in rows] == ["a", "b"] and rows[1]["options"] == {"bias": False}
    assert [(r["seed"], r["x"]) for r in rows[1]["runs"]] == [(0, 0), (1, 1)]  # a row's runs merge by seed
    assert old["repeats"]["runs"][3]["x"] == 0  # the inputs are not changed


def test_a_run_replaces_the_recorded_one_whole():
    old = [{"seed": 0, "loss": 1.0, "ablation": {"none": 2.0}}]
    assert experiments.merge(old, [{"seed": 0, "loss": 0.9}]) == [{"seed": 0, "loss": 0.9}]
    assert experiments.merge([1, 2, 3], [4]) == [4]  # a list of numbers is a value, not runs


def test_a_written_run_is_merged_and_stamped(tmp_path, monkeypatch):
    path = tmp_path / "block_sweep.json"
    path.write_text(experiments.record_path("todays_block").read_text())
    calls = []
    monkeypatch.setattr(experiments, "experiment", lambda name: fake(name, calls))
    experiments.main(["todays_block", "--parts", "lr", "--seeds", "7", "--out", str(path)])
    old, new = experiments.recorded("todays_block"), json.loads(path.read_text())
    assert "torch" not in new and "threads" not in new  # the stamp before "versions", dropped on writing
    stamp = new["versions"]
    assert set(stamp) == {"python", "torch", "transformer_lib", "threads"} and stamp["threads"] == 1
    assert new["ablation"] == old["ablation"] and new["settings"] == old["settings"]
    assert new["lr"]["runs"][:-1] == old["lr"]["runs"] and new["lr"]["runs"][-1] == {"seed": 7, "smoke": True}


def test_the_scripts_are_the_package_under_their_old_names():
    scripts = {
        "induction_sweep": "what_attention_learns",
        "token_sweep": "tokens",
        "block_sweep": "todays_block",
        "finetune_sweep": "fine_tuning",
    }
    for script, chapter in scripts.items():
        text = (ROOT / "scripts" / f"{script}.py").read_text()
        assert f'main(["{chapter}", *sys.argv[1:]])' in text
        assert len(text.splitlines()) < 20
    done = subprocess.run(
        [sys.executable, "scripts/block_sweep.py", "--steps", "2"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and "needs --dry-run" in done.stderr


@pytest.mark.parametrize(
    "content", ['{"my": "notes"}', "not json at all", "[1, 2]", '{"settings": {"lr": 0.1}, "runs": []}']
)
def test_an_out_file_that_is_not_a_record_is_kept_and_refused_before_any_training(
    content, tmp_path, monkeypatch, capsys
):
    calls = []
    mine = tmp_path / "mine.json"
    mine.write_text(content)
    monkeypatch.setattr(experiments, "experiment", lambda name: fake(name, calls))
    with pytest.raises(SystemExit) as stop:
        experiments.main(["todays_block", "--out", str(mine)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "something other than a record of todays_block" in err, err
    assert calls == [] and mine.read_text() == content


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_shipped_record_is_taken_as_a_record_to_merge_into(chapter):
    experiments.recorder.check_out(REAL(chapter), None)  # raises for a file that is not a record
