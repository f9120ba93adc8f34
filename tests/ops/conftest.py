import pytest
import torch


@pytest.fixture
def one_thread():
    """For tests of the CPU schedule emulations, which run hundreds of tiny ops per call: on a busy
    2-core machine OpenMP's fork-join per op costs more than the op (7x slower with 2 threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
