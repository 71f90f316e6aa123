"""Shared by the model tests: a thread limit and an output comparison."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def two_threads():
    """The machine running the suite is small; never oversubscribe it."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> bool:
    """Equal up to float reordering, relative to the output's scale (logits can be large)."""
    return bool((a - b).abs().max() <= rel * max(b.abs().max().item(), 1.0))


def marked(values, mark, which) -> list:
    """Parametrize `values` with those in `which` carrying `mark` (same ids): e.g. the big networks
    marked slow, so that the quick tier keeps the small ones."""
    return [pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=mark)
            if not hasattr(v, "marks") and v in which else v for v in values]  # one already a pytest.param: as it is
