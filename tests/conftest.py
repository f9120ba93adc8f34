import os

import pytest
import torch

if not torch.cuda.is_available():
    # Without CUDA the Triton kernels run under Triton's interpreter. It must be chosen before a
    # kernel module is imported (a kernel binds to it when decorated), so here, before collection.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    """Every kernel output that the launchers would allocate with torch.empty starts as NaN, so an
    element a kernel forgets to write fails the comparison."""
    from lenx.ops import _launch

    monkeypatch.setattr(_launch, "POISON", True)


@pytest.fixture(autouse=True)
def exact_reference():
    """The references must be fp32: cuDNN convolutions default to TF32 on Ampere+ GPUs, which
    once made the dense DAPE V2 reference itself off by ~1e-3."""
    if not torch.cuda.is_available():
        yield
        return
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def one_thread():
    """For tests of the CPU schedule emulations (tests/ops), which run hundreds of tiny ops per call:
    on a busy 2-core machine OpenMP's fork-join per op costs more than the op (7x slower with 2 threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def _work_once(tmp_path_factory):
    """test_nothing_lost.make_work's folder (a prepared corpus, a tiny run trained and evaluated through
    the CLI), made once a session: five modules use it, and making it is three CLI calls."""
    from test_nothing_lost import make_work

    return make_work(tmp_path_factory.mktemp("work_once"))


@pytest.fixture(scope="module")
def work(_work_once, tmp_path_factory):
    """A module's own copy of _work_once (its run reads the copy's corpus), as if made for the module."""
    from test_nothing_lost import copy_work

    return copy_work(_work_once, tmp_path_factory.mktemp("work") / "work")
