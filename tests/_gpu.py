"""Marks shared by the tests that need a GPU. A module of its own, not ``conftest``: under
``python -m pytest`` from the repository root, ``from conftest import ...`` may find
``tests/browser/conftest.py`` instead of ``tests/conftest.py``."""

import pytest
import torch

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
