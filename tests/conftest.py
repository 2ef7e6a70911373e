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
