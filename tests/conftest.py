import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture
def gen():
    """A seeded generator so every random test input is reproducible."""
    return torch.Generator().manual_seed(0)


@pytest.fixture
def one_thread():
    """One thread for tiny models: they gain nothing from more, and on a busy machine several
    threads stall each other."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# the exercise tests' shared assertions (tests/_exercise_cases.py) get pytest's detailed failure messages
pytest.register_assert_rewrite("_exercise_cases")


def pytest_terminal_summary(terminalreporter):
    """After the run, the time each test file and notebook took (set-up, calls and tear-down
    summed), slowest first: where the suite's time goes, beside pytest's ``--durations``."""
    from collections import defaultdict

    totals: dict[str, float] = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                totals[report.nodeid.split("::")[0]] += report.duration
    if not totals:
        return
    terminalreporter.write_sep("=", f"slowest files, of {len(totals)} ({sum(totals.values()):.0f} s in all)")
    for path, seconds in sorted(totals.items(), key=lambda item: -item[1])[:20]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
