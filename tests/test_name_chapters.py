"""scripts/name_chapters.py, which rewrites chapters named by number into chapters named by name:
prose, exercises, modules and records, in Python strings and comments that still parse."""

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def names():
    spec = importlib.util.spec_from_file_location("name_chapters", ROOT / "scripts" / "name_chapters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("(chapter 14).", '(chapter "Today\'s block").'),
        ("chapters 2-3", 'chapters "Queries, keys and values" and "Why divide by sqrt(d_k)"'),
        ("chapters 8-10", 'chapters "Encoder-decoder and cross-attention" to "Generation"'),
        (
            "chapters 8, 9 and 10",
            'chapters "Encoder-decoder and cross-attention", "A GPT from scratch" and "Generation"',
        ),
        ("chapter 16, 2 seeds", 'chapter "Measuring a model", 2 seeds'),
        ("Chapter 4, exercise 4.2: check", 'Chapter "Masking", exercise 2: check'),
        ("see exercise 13.1", 'see exercise 1 of chapter "Tokens"'),
        ("(chapter 13's split: the", '(the split of chapter "Tokens": the'),
        ("on chapter 15's 200 dates", 'on chapter "Fine-tuning"\'s 200 dates'),
        ('chapter 12 ("What attention learns")', 'chapter "What attention learns"'),
        ("--chapter 04_masking", "--chapter 04_masking"),  # a notebook's file name is not a chapter number
        ("tl.exercises.ch04.check_causal_mask", "tl.exercises.masking.check_causal_mask"),
        ('recorded("ch14")', 'recorded("todays_block")'),
        (
            "python -m transformer_lib.experiments ch14 --dry-run",
            "python -m transformer_lib.experiments todays_block --dry-run",
        ),
        ("transformer_lib/experiments/ch15_diagnosis.py", "transformer_lib/experiments/fine_tuning_diagnosis.py"),
        ("chapter 99", "chapter 99"),  # no such chapter: left as it is
    ],
)
def test_a_reference_by_number_becomes_one_by_name(names, text, expected):
    assert names.convert(text) == expected
    assert names.convert(expected) == expected  # a second run changes nothing


def test_python_stays_python_and_keeps_data_folders_and_directives(names):
    source = (
        '"""Checks for chapter 14 (chapter 15\'s base)."""\n'
        "from transformer_lib.experiments import ch15\n"
        "\n"
        "PATH = DATA / \"ch15\" / 'pretrained.pt'  # chapter 15's checkpoint\n"
        "MESSAGE = 'see chapter 14'\n"
        'OTHER = "see chapter 14"\n'
        'FORMATTED = f"{ch15.SETTINGS} of chapter 15"\n'
        "x = ch15.SETTINGS  # noqa: E501\n"
    )
    out = names.convert_python(source)
    ast.parse(out)
    assert '"""Checks for chapter "Today\'s block" (the base of chapter "Fine-tuning")."""' in out
    assert "from transformer_lib.experiments import fine_tuning\n" in out
    assert "DATA / \"ch15\" / 'pretrained.pt'" in out  # a data folder keeps its name
    assert "MESSAGE = 'see chapter \"Today\\'s block\"'" in out
    assert 'OTHER = "see chapter \\"Today\'s block\\""' in out
    assert 'f"{fine_tuning.SETTINGS} of chapter \\"Fine-tuning\\""' in out
    assert "x = fine_tuning.SETTINGS  # noqa: E501" in out


def test_a_long_docstring_line_is_filled_again(names):
    source = (
        '"""' + "word " * 20 + "(chapter 18) and more words to carry on\nthe next line of the paragraph.\n" + '"""\n'
    )
    out = names.convert_python(source, width=60)
    assert all(len(line) <= 60 for line in out.splitlines())
    assert " ".join(out.split()) == " ".join(names.convert(source).split())


def test_the_command_reports_what_it_would_change(names, tmp_path, capsys):
    path = tmp_path / "doc.py"
    path.write_text('"""See chapter 14."""\n')
    assert names.main(["--check", str(path)]) == 1 and "would change" in capsys.readouterr().out
    assert names.main([str(path)]) == 0 and path.read_text() == '"""See chapter "Today\'s block"."""\n'
    assert names.main(["--check", str(path)]) == 0


def test_a_result_that_would_not_parse_is_left_as_it_was(names, tmp_path, capsys):
    path = tmp_path / "doc.py"
    path.write_text('"""See chapter 14"""\n')  # the title's closing quote would meet the docstring's
    assert names.main([str(path)]) == 1 and path.read_text() == '"""See chapter 14"""\n'
    assert "would not parse" in capsys.readouterr().err
