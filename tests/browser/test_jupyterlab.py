"""The student's path in a live JupyterLab, in headless Chromium, offline.

A JupyterLab server from the book's environment starts on a free local port with a token, in a
temporary folder that holds a copy of chapter "Masking" and the student edition of chapter "Masking" (written
by ``python -m transformer_lib.student``), so nothing is ever written into the book's own
notebooks. Then, as a student would:

1. open the chapter, run all cells (menu Run, Run All Cells) and check that no cell shows an error;
2. move every control of every widget of the chapter: the visible figure must change and its
   title must name the control's value;
3. open the student edition, run all cells: the check of exercise 1 of chapter "Masking" says it is not done yet;
4. type a right answer into the stub through the page, run it and the check: "Correct";
5. type a known wrong answer (the causal mask without its diagonal), run both: the check names
   the mistake.

The server is always stopped (a fixture finaliser). Each step is timed; the timings are printed
in the test summary and written to ``_build/screenshots/jupyterlab_timings.json``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from _browser import STATE_JS, check_frame, exercise_control, skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = "04_masking"
SHOTS = ROOT / "_build" / "screenshots"
TIMINGS: dict[str, float] = {}
RIGHT = "def my_causal_mask(T): return torch.tril(torch.ones(T, T, dtype=torch.bool))"
WRONG = "def my_causal_mask(T): return torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=-1)"
RUN_ALL_TIMEOUT_MS = 600_000  # the whole chapter, on a busy 2-core machine

pytestmark = pytest.mark.slow


class timed:
    """Record how long a step takes under its name in TIMINGS."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        TIMINGS[self.name] = round(time.perf_counter() - self.start, 1)


@pytest.fixture(scope="module", autouse=True)
def report_timings(request):
    yield
    if not TIMINGS:
        return
    lines = [f"  {seconds:7.1f} s  {step}" for step, seconds in TIMINGS.items()]
    lines.append(f"  {sum(TIMINGS.values()):7.1f} s  in all")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        with request.config.pluginmanager.get_plugin("capturemanager").global_and_fixture_disabled():
            reporter.write_line("\nJupyterLab, step by step:\n" + "\n".join(lines))
    SHOTS.mkdir(parents=True, exist_ok=True)
    (SHOTS / "jupyterlab_timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a temporary copy of the chapter and its student edition; yields its URL
    and token, and stops it (and its kernels) at the end, whatever happened."""
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        skip_or_fail("JupyterLab is not installed (requirements.txt)")
    work = tmp_path_factory.mktemp("lab")
    home = work / "notebooks"
    (home / "chapters").mkdir(parents=True)
    source = ROOT / "chapters" / f"{CHAPTER}.ipynb"
    book_copy = source.read_bytes()  # the book's notebook must be the same after the test
    (home / "chapters" / source.name).write_bytes(book_copy)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0", "OMP_WAIT_POLICY": "PASSIVE"}
    with timed('write the student edition of chapter "Masking"'):
        done = subprocess.run(
            [sys.executable, "-m", "transformer_lib.student", str(home / "student"), "--chapter", CHAPTER],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    # Jupyter's own folders in the temporary folder: no user configuration is read or written.
    # All cells stay in the page (no windowing), so each one can be read; no news is fetched.
    settings = work / "settings" / "@jupyterlab"
    (settings / "notebook-extension").mkdir(parents=True)
    (settings / "notebook-extension" / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
    (settings / "apputils-extension").mkdir(parents=True)
    (settings / "apputils-extension" / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    env.update(
        JUPYTER_CONFIG_DIR=str(work / "config"),
        JUPYTER_DATA_DIR=str(work / "data"),
        JUPYTER_RUNTIME_DIR=str(work / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(work / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"),
        IPYTHONDIR=str(work / "ipython"),
        MPLBACKEND="module://matplotlib_inline.backend_inline",
    )
    port, token = _free_port(), os.urandom(16).hex()
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}"]
    command += ["--port-retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={home}"]
    command += ["--LabApp.expose_app_in_browser=True"] + (["--allow-root"] if os.geteuid() == 0 else [])
    log = (work / "server.log").open("w")
    server = subprocess.Popen(command, cwd=home, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        with timed("start JupyterLab"):
            deadline = time.monotonic() + 180
            while True:
                assert server.poll() is None, "JupyterLab stopped:\n" + (work / "server.log").read_text()[-3000:]
                try:
                    with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "JupyterLab did not answer in 180 s"
                time.sleep(0.5)
        yield url, token, home
    finally:
        # the server's process group: JupyterLab and the kernels it started
        try:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        except ProcessLookupError:
            pass
        log.close()
        assert source.read_bytes() == book_copy, f"the test changed the book's {source}"


@pytest.fixture(autouse=True)
def screenshot_on_failure(request):
    """The page as it was when a test failed, for the report."""
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and "page" in request.fixturenames:
        SHOTS.mkdir(parents=True, exist_ok=True)
        request.getfixturevalue("page").screenshot(path=str(SHOTS / f"jupyterlab_failed_{request.node.name}.png"))


@pytest.fixture(scope="module")
def page(lab, browser):
    url, token, _ = lab
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, service_workers="block")
    blocked = []

    def route(r):
        if r.request.url.startswith(url) or urlsplit(r.request.url).hostname is None:
            r.continue_()
        else:
            blocked.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.blocked = blocked
    page.set_default_timeout(120_000)
    yield page
    context.close()


# The open notebook's code cells, from JupyterLab's own model: index, source, execution count,
# errors and text of its outputs.
_CELLS_JS = """() => {
    const nb = window.jupyterapp.shell.currentWidget.content;
    const cells = [];
    for (let i = 0; i < nb.model.cells.length; i++) {
        const cell = nb.model.cells.get(i);
        if (cell.type !== 'code') continue;
        const outputs = [];
        for (let j = 0; j < cell.outputs.length; j++) outputs.push(cell.outputs.get(j).toJSON());
        cells.push({
            index: i,
            source: cell.sharedModel.getSource(),
            count: cell.executionCount,
            errors: outputs.filter(o => o.output_type === 'error').map(o => `${o.ename}: ${o.evalue}`),
            text: outputs.map(o => [].concat(o.text || (o.data && o.data['text/plain']) || []).join('')).join(''),
        });
    }
    return cells;
}"""

_IDLE_JS = """() => {
    const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
    const session = panel && panel.sessionContext && panel.sessionContext.session;
    return !!(session && session.kernel && panel.sessionContext.kernelDisplayStatus === 'idle');
}"""


def _open_notebook(page, lab, path, workspace):
    """Open one notebook in a workspace of its own (so no other notebook is restored beside it)."""
    url, token, _ = lab
    page.goto(f"{url}/lab/workspaces/{workspace}/tree/{path}?token={token}", wait_until="load")
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-Cell", timeout=180_000)
    page.wait_for_function(_IDLE_JS, timeout=180_000, polling=250)


def _run_all(page):
    """Run every cell through the menu (Run, Run All Cells) and wait until each has run."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    # the saved execution counts are cleared as the cells are queued; then each gets its new one
    page.wait_for_function(f"() => ({_CELLS_JS})().some(c => c.count === null)", timeout=60_000, polling=100)
    # done when every cell has run, or when one shows an error (Run All stops there)
    page.wait_for_function(
        f"""() => {{ const cells = ({_CELLS_JS})();
                    return (cells.every(c => c.count !== null) || cells.some(c => c.errors.length))
                           && ({_IDLE_JS})(); }}""",
        timeout=RUN_ALL_TIMEOUT_MS,
        polling=500,
    )


def _cell(page, index):
    return page.locator(".jp-NotebookPanel:visible .jp-Notebook .jp-Cell").nth(index)


def _rerun(page, index, before):
    """Run cell ``index`` (Shift+Enter in its editor) and wait for its new execution count."""
    cell = _cell(page, index)
    cell.locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    page.wait_for_function(
        f"""() => {{ const c = ({_CELLS_JS})().find(c => c.index === {index});
                    return c.count !== null && c.count > {before} && ({_IDLE_JS})(); }}""",
        timeout=120_000,
        polling=250,
    )


def _type_into(page, index, text):
    """Replace the text of cell ``index`` by typing ``text`` into its editor, as a student does."""
    cell = _cell(page, index)
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.press("Delete")
    page.keyboard.type(text)
    page.keyboard.press("Escape")  # leave the editor (command mode), as after typing


def _check_output(page, stub, check):
    cells = {c["index"]: c for c in page.evaluate(_CELLS_JS)}
    count = max(c["count"] or 0 for c in cells.values())
    _rerun(page, stub, count)
    _rerun(page, check, count + 1)
    cells = {c["index"]: c for c in page.evaluate(_CELLS_JS)}
    assert not cells[stub]["errors"], cells[stub]["errors"]
    return cells[check]["text"], cells[check]["errors"]


def test_chapter_runs_and_its_widgets_move_in_jupyterlab(lab, page):
    with timed('open chapter "Masking" (kernel ready)'):
        _open_notebook(page, lab, f"chapters/{CHAPTER}.ipynb", "chapter")
    with timed('run all cells of chapter "Masking"'):
        _run_all(page)
    cells = page.evaluate(_CELLS_JS)
    errors = [f"cell {c['index']}: {c['errors']}" for c in cells if c["errors"]]
    assert not errors, f"cells that show an error: {errors}"
    shown = page.locator(".jp-OutputArea-output:has-text('Traceback')").count()
    assert not shown, f"{shown} outputs show a traceback"
    assert len(cells) > 20 and all(c["count"] for c in cells), "not every code cell ran"

    with timed('move every widget control of chapter "Masking"'):
        page.wait_for_selector(".jp-OutputArea-output .widget-vbox", timeout=60_000)
        widgets = page.locator(".jp-OutputArea-output .widget-vbox")
        roots = [widgets.nth(i) for i in range(widgets.count())]
        roots = [w for w in roots if w.evaluate("el => !el.parentElement.closest('.widget-vbox')")]
        n_frame_widgets = sum("frame_widget(" in c["source"] for c in cells)
        assert len(roots) == n_frame_widgets, f"{n_frame_widgets} widget cells, {len(roots)} widgets shown"
        problems, moved = [], 0
        for w, widget in enumerate(roots):
            widget.scroll_into_view_if_needed()
            where = f'chapter "Masking", widget {w + 1}'
            problems += check_frame(widget.evaluate(STATE_JS), where)
            controls = widget.locator(".widget-hbox").first.locator(":scope > *")
            assert controls.count(), f"{where}: no controls"
            for i in range(controls.count()):
                control = controls.nth(i)
                kind = (
                    "slider"
                    if control.locator(".noUi-handle").count()
                    else "select"
                    if control.locator("select").count()
                    else "buttons"
                )
                ok, found = exercise_control(page, widget, control, kind, f"{where}, control {i + 1} ({kind})")
                moved += ok
                problems += found
            if w == 0:
                SHOTS.mkdir(parents=True, exist_ok=True)
                widget.screenshot(path=str(SHOTS / "jupyterlab_widget.png"))
    assert not problems, "\n".join(problems[:10])
    assert moved >= 2, f"only {moved} controls moved"  # chapter "Masking": a query slider and a method menu
    assert not page.blocked, f"JupyterLab asked for external resources: {page.blocked[:5]}"


def test_student_edition_in_jupyterlab(lab, page):
    with timed('open the student edition of chapter "Masking" (kernel ready)'):
        _open_notebook(page, lab, f"student/{CHAPTER}.ipynb", "student")
    with timed("run all cells of the student edition"):
        _run_all(page)
    cells = page.evaluate(_CELLS_JS)
    errors = [f"cell {c['index']}: {c['errors']}" for c in cells if c["errors"]]
    assert not errors, f"cells of the student edition that show an error: {errors}"
    check = next(c for c in cells if "check_causal_mask(my_causal_mask)" in c["source"])
    stub = max(c["index"] for c in cells if c["index"] < check["index"] and "def my_causal_mask" in c["source"])
    assert "NotImplementedError" in next(c["source"] for c in cells if c["index"] == stub)
    assert "not implemented yet" in check["text"], f"the check before any answer says: {check['text']!r}"

    with timed("type a right answer into the stub, run it and the check"):
        _type_into(page, stub, RIGHT)
        text, errors = _check_output(page, stub, check["index"])
    assert not errors and text.startswith("Correct"), f"the check of a right answer says: {text!r} {errors}"

    with timed("type a wrong answer (no diagonal), run it and the check"):
        _type_into(page, stub, WRONG)
        text, errors = _check_output(page, stub, check["index"])
    assert not errors, errors
    assert text.startswith("Not yet") and "may not attend to itself" in text and "diagonal" in text, (
        f"the check of a mask without its diagonal says: {text!r}"
    )
    SHOTS.mkdir(parents=True, exist_ok=True)
    _cell(page, check["index"]).screenshot(path=str(SHOTS / "jupyterlab_check.png"))
    assert not page.blocked, f"JupyterLab asked for external resources: {page.blocked[:5]}"
