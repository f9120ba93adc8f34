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


def test_atomic_path_gives_a_new_files_mode_whatever_wrote_it(tmp_path):
    old = os.umask(0o027)
    try:
        with atomic_path(tmp_path / "w.bin") as tmp:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600)  # as safetensors creates its file
            os.close(fd)
    finally:
        os.umask(old)
    assert (tmp_path / "w.bin").stat().st_mode & 0o777 == 0o640
