"""Every command that README.md, intro.md, CONTRIBUTING.md and the instructors' guide tell a user to
run, taken from the documents themselves and tried in a fresh copy of the repository.

Commands are read from the ``bash`` code blocks and from inline code that starts like a command
(``.venv/bin/...``, ``bash ...``, ``python ...``, ``ruff ...``). Each one must match a rule of
``RULES``, which says how it is checked: run as written (in the copy, offline), run with a few
flags that keep it cheap, run with ``--help`` (the program exists and accepts the arguments), or
skipped with the reason. A command that no rule knows fails the test, so a new command in a
document gets a decision. Every path a command names must exist in the copy. The test prints
the table of commands and what was done with each at the end.

The copy holds the repository's tracked and untracked-but-not-ignored files, as a fresh clone of
this working tree would, and its ``.venv`` is a link to the environment running the tests (in CI,
the one ``scripts/setup.sh`` made from ``requirements.txt`` on a fresh clone)."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", "intro.md", "CONTRIBUTING.md", "instructors.ipynb"]
# inline code that reads as a command a user types
_COMMAND = re.compile(
    r"^(\.\./)?\.venv[-\w]*/bin/|^(bash|python3?|torchrun|ruff|nbgrader|jupyter|pip|cd)\s|^[A-Z_]+=\S+\s"
)
_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)

pytestmark = pytest.mark.slow


def _document_text(name: str) -> str:
    text = (ROOT / name).read_text(encoding="utf-8")
    if name.endswith(".ipynb"):
        cells = json.loads(text)["cells"]
        text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return text


def documented_commands() -> list[tuple[str, str]]:
    """(document, command) for every command in the documents, in order of appearance."""
    found = []
    for name in DOCUMENTS:
        text = _document_text(name)
        for block in _FENCE.finditer(text):
            if block.group(2) not in ("bash", "sh", "console"):
                continue
            body = re.sub(r"\\\n\s*", " ", block.group(3))  # continued lines
            for line in body.splitlines():
                line = re.sub(r"(^|\s)#.*$", "", line).strip()  # comments
                if line:
                    found.append((name, re.sub(r"\s+", " ", line)))
        for span in re.finditer(r"`([^`\n]+)`", _FENCE.sub("", text)):
            if _COMMAND.match(span.group(1).strip()):
                found.append((name, span.group(1).strip()))
    return found


@dataclass
class Rule:
    pattern: str  # a regular expression the whole command matches
    action: str  # "run": as written; "cheap": with extra flags; "help": with --help; "skip"
    why: str  # what is run instead, or why the command is skipped
    extra: str = ""  # "cheap": flags appended; "help": the command run instead (default: command + --help)
    expect: str = ""  # a regular expression the output must contain


TINY = "--max-iters 2 --eval-interval 1 --eval-iters 1 --batch-size 4"
NBGRADER_TEST = "tests/test_nbgrader.py runs nbgrader's generate_assignment, autograde and generate_feedback"

RULES = [
    Rule(r"bash scripts/setup\.sh", "skip", "the set-up itself: scripts/test.sh runs it first on every CI run"),
    Rule(r"bash scripts/test\.sh", "skip", "the test command itself (.ci/run runs it)"),
    Rule(
        r"\.venv/bin/python -m pytest -n 2 -m .not slow. tests --ignore=tests/browser --ignore=tests/pdf",
        "skip",
        "the library's tests themselves, a subset of what the test command runs",
    ),
    Rule(r"bash scripts/build_book\.sh", "skip", "builds the whole book (minutes): .ci/run runs it"),
    Rule(r"bash scripts/browser_test\.sh", "skip", "needs the built book: .ci/run runs it after the build"),
    Rule(
        r"bash scripts/test_lower_bounds\.sh",
        "skip",
        "installs the lower bounds in a second environment (minutes): .ci/run runs it",
    ),
    Rule(r"bash scripts/test_other_kernels\.sh", "skip", "every notebook a second time (minutes): .ci/run runs it"),
    Rule(r"bash \.ci/run", "skip", "all of CI (the test command, the book, the browser, the PDF): it is what CI runs"),
    Rule(r"bash scripts/build_pdf\.sh", "skip", "TeX and the whole PDF (minutes): .ci/run runs it"),
    Rule(
        r"python scripts/api_pages\.py",
        "skip",
        "tests/test_book_apparatus.py checks that the pages it writes are current",
    ),
    Rule(r"TORCH_INDEX_URL=https://\S+ bash scripts/test\.sh", "skip", "fetches PyTorch from its own index (network)"),
    Rule(
        r"\.venv/bin/python -m jupyter lab chapters/\w+\.ipynb",
        "help",
        "JupyterLab is there (with a notebook, --help would start it: tests/browser/test_jupyterlab.py opens it)",
        ".venv/bin/python -m jupyter lab --help",
        r"JupyterLab",
    ),
    Rule(r"jupyter lab", "help", "JupyterLab is in the environment", ".venv/bin/python -m jupyter lab --help"),
    Rule(
        r"\.venv/bin/python -m pytest --nbval .* chapters/\d\d_\w+\.ipynb",
        "cheap",
        "collected only (the test command runs every notebook under nbval)",
        "--collect-only -q -p no:cacheprovider",
        r"\d+ tests? collected",
    ),
    Rule(
        r"\.venv/bin/jupyter execute --inplace chapters/\d\d_\w+\.ipynb",
        "help",
        "the command is there (the test command runs every chapter with the same nbclient, under nbval)",
        ".venv/bin/jupyter execute --help",
        r"--inplace",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib\.experiments todays_block --parts lr --seeds 0 --dry-run",
        "cheap",
        "two steps of each run of the part, a dry run: nothing is written",
        "--steps 2",
        r"nothing written",
    ),
    Rule(r".*chapters/NN_name\.ipynb", "skip", "a pattern (NN_name), not a file; the same command is checked above"),
    Rule(
        r"\.venv/bin/python -m transformer_lib train --preset cpu --out-dir out/cpu",
        "cheap",
        "2 steps of a small batch, offline (flags override the preset, as the README says)",
        TINY,
        r"checkpoint in out/cpu",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib train --preset cpu --max-iters 200 --out-dir out/first",
        "cheap",
        "the README's first run: 2 steps of a small batch instead of 200, offline",
        TINY,
        r"checkpoint in out/first",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib sample --ckpt out/first --prompt .ROMEO:.",
        "cheap",
        "samples 40 characters from the first run above",
        "--max-new-tokens 40",
        r"ROMEO:",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib train --out-dir out/cpu --resume",
        "run",
        "continues the 2-step run above, which is finished",
        expect=r"after 2 steps",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib sample --ckpt out/cpu .*",
        "cheap",
        "samples 40 characters from the checkpoint above",
        "--max-new-tokens 40",
        r"ROMEO:",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib train --preset cpu --tokenizer bpe --vocab-size 512 --out-dir out/bpe",
        "cheap",
        "2 steps of a small batch with a BPE of 512 tokens, offline; its tokenizer file beside the checkpoint",
        TINY,
        r"checkpoint in out/bpe",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib train --preset llama-cpu --out-dir out/llama",
        "cheap",
        "2 steps of a small batch of the Llama-style preset, offline",
        TINY,
        r"checkpoint in out/llama",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib train --preset gpu( --out-dir out/gpu)?",
        "help",
        "the flags are accepted (a real run needs a GPU and hours)",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib train --preset cpu --max-iters 500 --batch-size 32",
        "help",
        "the flags are accepted (a real run takes minutes)",
    ),
    Rule(
        r"\.venv/bin/python -c .import transformer_lib as tl; "
        r"tl\.write_pairs\(tl\.date_pairs\(2000, formats=\[.dd\.mm\.yyyy., .yyyy\.mm\.dd., .mm/dd/yyyy.\]\), "
        r".out/pairs\.jsonl.\).",
        "run",
        "writes the 2,000 pairs the next command fine-tunes on",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib finetune --ckpt out/bpe --data out/pairs\.jsonl --out-dir out/lora "
        r"--lora-rank 8",
        "cheap",
        "2 steps of LoRA on the BPE checkpoint and the pairs above",
        TINY,
        r"adapter",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib finetune --ckpt transformer_lib/data/ch15/pretrained\.pt "
        r"--data out/pairs\.jsonl --out-dir out/dates --lora-rank 4 --new-token-rows --lr 5e-3 --max-iters 600",
        "cheap",
        "2 steps of LoRA and the new token rows on the shipped 6,000-step base and the pairs above "
        "(tests/test_recipes_compose.py runs the whole recipe)",
        TINY,
        r"adapter",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib sample --ckpt transformer_lib/data/ch15/pretrained\.pt "
        r"--adapter out/dates/adapter\.pt --prompt .21\.11\.2026. --greedy",
        "run",
        "answers with the 2-step adapter above (the whole recipe's answer is tested elsewhere)",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib evaluate --ckpt transformer_lib/data/ch15/pretrained\.pt "
        r"--compare transformer_lib/data/ch12/shakespeare_ckpt\.pt",
        "cheap",
        "the two shipped models on the held-out text, 5 items of each task (tests/test_cli_evaluate.py: the rest)",
        "--items 5",
        r"told apart",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib evaluate --ckpt transformer_lib/data/ch15/pretrained\.pt "
        r"--quantize int8,nf4 --items 50",
        "cheap",
        "the shipped base and its quantised copies on the held-out text, 5 items of each task",
        "--items 5",
        r"pretrained nf4: the weights take",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib evaluate --ckpt transformer_lib/data/ch15/pretrained\.pt "
        r"--adapter out/dates/adapter\.pt --samples 8 --json out/dates/card\.json",
        "cheap",
        "the 2-step adapter above: 5 items of each task, 5 dates, 2 samples each",
        "--items 5 --dates 5 --samples 2",
        r"wrote the cards to out/dates/card\.json",
    ),
    Rule(
        r"\.venv/bin/python -c .import transformer_lib as tl; tl\.data\.write_preferences\(tl\.data\."
        r"preference_triples\(tl\.read_pairs\(.out/pairs\.jsonl.\)\), .out/prefs\.jsonl.\).",
        "run",
        "writes the preference pairs the dpo command tunes on, from the pairs above",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib dpo --ckpt transformer_lib/data/ch15/pretrained\.pt "
        r"--adapter transformer_lib/data/ch16/dates_lora\.pt --data out/prefs\.jsonl --lora-rank 4 --out-dir out/dpo",
        "cheap",
        "2 steps of DPO from the shipped dates model (tests/test_cli_tune.py: resume, refusals)",
        TINY,
        r"checkpoint in out/dpo",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib grpo --ckpt transformer_lib/data/ch15/pretrained\.pt "
        r"--adapter transformer_lib/data/ch16/dates_lora\.pt --data out/pairs\.jsonl --lora-rank 4 --temperature 0\.3 "
        r"--out-dir out/grpo",
        "cheap",
        "2 steps of GRPO from the shipped dates model, 4 prompts of 8 answers",
        TINY,
        r"checkpoint in out/grpo",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib evaluate --ckpt out/grpo --compare out/dpo --dates 100 --samples 8 "
        r"--temperature 0\.3",
        "cheap",
        "the two 2-step runs above: 5 items of each task, 5 dates, 2 samples each",
        "--items 5 --dates 5 --samples 2",
        r"told apart",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib export --ckpt out/bpe --out-dir out/hf/bpe",
        "run",
        "writes the 2-step BPE run above in Hugging Face's format (transformers, offline)",
        expect=r"AutoModelForCausalLM\.from_pretrained",
    ),
    Rule(
        r"python -m transformer_lib",
        "help",
        "lists the commands and exits 0 (with no arguments the same list, exit 2: tests/test_cli.py)",
        ".venv/bin/python -m transformer_lib --help",
        r"commands:\n  train ",
    ),
    Rule(
        r"python -m transformer_lib (train|sample|finetune|export|evaluate|dpo|grpo)",
        "help",
        "the command exists",
        ".venv/bin/python -m transformer_lib {0} --help",
    ),
    Rule(
        r"torchrun .* -m transformer_lib train --preset gpu --out-dir out/ddp",
        "help",
        (
            "torchrun is in the environment (several GPUs or machines are needed; "
            'chapter "A GPT from scratch" runs two CPU processes)'
        ),
        ".venv/bin/torchrun --help",
        r"nproc[_-]per[_-]node",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib\.student student_edition/",
        "run",
        "writes the student edition",
        expect=r"student_edition",
    ),
    Rule(
        r"python -m transformer_lib\.student",
        "help",
        "the command exists",
        ".venv/bin/python -m transformer_lib.student --help",
    ),
    Rule(
        r"\.venv/bin/python -m transformer_lib\.student course/ --nbgrader",
        "run",
        "writes the nbgrader course (nbgrader itself is not needed for this)",
        expect=r"course",
    ),
    Rule(
        r"python3 -m http\.server --directory _build/html 8000",
        "help",
        "the server takes --directory (the built book is not in a fresh clone)",
        "python3 -m http.server --help",
        r"--directory",
    ),
    Rule(r"python3 -m venv \.venv-instructors", "skip", "scripts/test.sh creates it on every CI run"),
    Rule(
        r"\.venv-instructors/bin/python -m pip install -r requirements-instructors\.txt",
        "skip",
        "installs nbgrader from the package registry: scripts/test.sh does it on every CI run",
    ),
    Rule(
        r"\.venv/bin/python -m ipykernel install --prefix \.venv-instructors --name python3",
        "run",
        "registers the book's Python as a kernel under .venv-instructors in the copy",
        expect=r"Installed kernelspec python3",
    ),
    Rule(r"pip install -e \.", "skip", "installs into whatever environment is active; requirements.txt does it"),
    Rule(r"cd course", "skip", "changes folder"),
    Rule(r"(\.\./\.venv-instructors/bin/)?nbgrader \w+.*", "skip", NBGRADER_TEST + " with real nbgrader"),
    Rule(r"ruff format chapters/", "run", "the chapters are formatted (the environment's ruff)", expect=r"unchanged"),
    Rule(r"ruff (check|format)", "skip", "names the tool; scripts/test.sh runs both over the library and tests"),
]

_ENV_PROGRAMS = ("ruff", "jupyter", "torchrun", "nbgrader")  # bare names mean the environment's program
_PATH_ARG = re.compile(r"^(chapters|scripts|tests|binder|requirements)[\w./-]*$|\.(ipynb|sh|cfg|txt)$")


def _rule(command: str) -> tuple[Rule, re.Match] | None:
    for rule in RULES:
        match = re.fullmatch(rule.pattern, command)
        if match:
            return rule, match
    return None


def _to_run(rule: Rule, match: re.Match, command: str) -> str:
    if rule.action == "help":
        return rule.extra.format(*match.groups()) if rule.extra else f"{command} --help"
    run = f"{command} {rule.extra}" if rule.action == "cheap" else command
    first = run.split()[0]
    return f".venv/bin/{run}" if first in _ENV_PROGRAMS else run


def _run(command: str, cwd: Path, env: dict, timeout: float = 600) -> tuple[int, str]:
    """Run a shell command; on timeout, stop it and everything it started."""
    proc = subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -1, f"{output}\n(stopped after {timeout} s)"
    return proc.returncode, output


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory):
    """The repository's files as a fresh clone of this working tree has them, with .venv linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    copy = tmp_path_factory.mktemp("fresh") / "repo"
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file() and not source.is_symlink():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    (copy / ".venv").symlink_to(Path(sys.prefix))
    return copy


def test_every_command_has_a_rule():
    commands = documented_commands()
    assert len(commands) >= 20, f"only {len(commands)} commands found in {DOCUMENTS}: is the extraction broken?"
    unknown = [f"{doc}: {cmd}" for doc, cmd in commands if _rule(cmd) is None]
    assert not unknown, "commands in the documents that no rule of RULES checks:\n" + "\n".join(unknown)


REPORT: list[str] = []
DONE: set[str] = set()  # a command in two documents runs once


@pytest.fixture(scope="module", autouse=True)
def print_report(request):
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if REPORT and reporter:
        with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            reporter.write_line("\ncommands from the documents:\n" + "\n".join(REPORT))


@pytest.mark.parametrize(
    "doc, command", documented_commands(), ids=[f"{d}:{i}" for i, (d, _) in enumerate(documented_commands())]
)
def test_documented_command_works_in_a_fresh_copy(fresh_copy, doc, command):
    env = {**os.environ, "PYTHONPATH": str(fresh_copy), "ATTENTION_EXECUTED_OFFLINE": "1", "PYTHONHASHSEED": "0"}
    env.pop("TINY_SHAKESPEARE", None)  # offline, the training command's own fallback text
    found = _rule(command)
    assert found, f"{doc}: no rule of RULES checks {command!r}: add one"
    rule, match = found
    missing = [
        arg
        for arg in shlex.split(command)
        if _PATH_ARG.search(arg) and "NN_name" not in arg and not (fresh_copy / arg).exists()
    ]
    assert not missing, f"{doc}: {command}: no such file: {missing}"
    if rule.action == "skip":
        REPORT.append(f"skip  {doc}: {command}  ({rule.why})")
        pytest.skip(rule.why)
    run = _to_run(rule, match, command)
    if run in DONE:
        REPORT.append(f"again {doc}: {command}  (ran above)")
        return
    DONE.add(run)
    start = time.perf_counter()
    returncode, output = _run(run, fresh_copy, env)
    seconds = time.perf_counter() - start
    verb = {"run": "ran", "cheap": "ran", "help": "help"}[rule.action]
    note = f" [{run}]" if run != command else ""
    REPORT.append(f"{verb:5} {doc}: {command}{note}  {seconds:.1f} s, exit {returncode}  ({rule.why})")
    assert returncode == 0, f"{doc}: {command}: `{run}` exited {returncode}:\n{output[-1500:]}"
    if rule.expect:
        assert re.search(rule.expect, output), f"`{run}` did not print {rule.expect!r}:\n{output[-1500:]}"


def test_the_student_edition_and_course_were_written(fresh_copy):
    """What the documents' commands above wrote in the copy (they run first: this test reads their output)."""
    edition = sorted(p.name for p in (fresh_copy / "student_edition").glob("*.ipynb"))
    chapters = sorted(p.name for p in (fresh_copy / "chapters").glob("*.ipynb"))
    assert edition == chapters
    assert (fresh_copy / "course" / "nbgrader_config.py").exists()
    kernel = fresh_copy / ".venv-instructors" / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
    assert Path(json.loads(kernel.read_text())["argv"][0]).name.startswith("python")
