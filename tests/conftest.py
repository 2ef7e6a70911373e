import pytest
import torch

torch.set_num_threads(min(2, torch.get_num_threads()))

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def gen():
    """A seeded generator so every random test input is reproducible."""
    return torch.Generator().manual_seed(0)
