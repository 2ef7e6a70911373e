"""Shared by the browser tests: skipping (or failing, when the test is required) without a
browser, and reading and moving the book's widgets (``tl.viz.frame_widget``) in a page."""

import os

import pytest


def skip_or_fail(reason):
    if os.environ.get("REQUIRE_BROWSER_TEST"):
        pytest.fail(reason)
    pytest.skip(reason)


# The visible frame of a widget and each control's caption and shown value, read from the page.
STATE_JS = """root => {
    const visible = Array.from(root.querySelectorAll('img')).filter(i => i.checkVisibility());
    const row = root.querySelector('.widget-hbox');
    const controls = Array.from(row ? row.children : []).map(c => {
            const label = c.querySelector('.widget-label');
            const select = c.querySelector('select');
            const readout = c.querySelector('.widget-readout');
            const active = c.querySelector('button.mod-active');
            const value = select ? select.options[select.selectedIndex].text
                : readout ? readout.textContent : active ? active.textContent : null;
            const clean = t => t && t.replace(/\u00a0/g, ' ').trim();
            return [clean(label ? label.textContent : ''), clean(value)];
        });
    return {frames: visible.map(i => [i.title, i.src.length, i.src.slice(-80)]), controls};
}"""


def move(control, kind, step):
    """Move one control to its next option (a slider with the arrow keys; a menu or buttons by choice)."""
    if kind == "slider":
        control.locator(".noUi-handle").focus()
        control.locator(".noUi-handle").press("ArrowRight" if step > 0 else "ArrowLeft")
    elif kind == "select":
        select = control.locator("select")
        n = select.locator("option").count()
        current = select.evaluate("s => s.selectedIndex")
        select.select_option(index=(current + step) % n)
    else:
        buttons = control.locator("button")
        current = [buttons.nth(i).get_attribute("class") or "" for i in range(buttons.count())]
        active = next(i for i, c in enumerate(current) if "mod-active" in c)
        buttons.nth((active + step) % buttons.count()).click()


def check_frame(state, where):
    """The one visible frame's title names the value shown by every control."""
    problems = []
    if len(state["frames"]) != 1:
        return [f"{where}: {len(state['frames'])} frames visible, expected 1"]
    title = state["frames"][0][0]
    for label, value in state["controls"]:
        if f"{label} = {value}" not in title:
            problems.append(f"{where}: control {label!r} shows {value!r} but the figure is {title!r}")
    return problems


def exercise_control(page, widget, control, kind, where):
    """Move a control through its options; the figure must change each time and match the control."""
    problems, moved = [], 0
    moves = 3
    for step in [1] * moves + [-1] * moves:
        before = widget.evaluate(STATE_JS)
        move(control, kind, step)
        page.wait_for_timeout(60)
        after = widget.evaluate(STATE_JS)
        if after["controls"] == before["controls"]:
            continue  # the control was at its end already
        moved += 1
        if after["frames"][:1] == before["frames"][:1]:
            problems.append(f"{where}: moving the control to {after['controls']} left the figure unchanged")
        problems += check_frame(after, where)
    if not moved:
        problems.append(f"{where}: the control could not be moved")
    return not problems, problems
