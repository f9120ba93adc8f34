"""lenx.fileio's writes."""

import os

import pytest

from lenx.fileio import atomic_path


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("killed")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["x.bin"]
