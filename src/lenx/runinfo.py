"""What a run records about where it ran: commit, versions, device, command."""

import os
import platform
import subprocess
import sys
from pathlib import Path

import torch


def git_commit(cwd: Path | None = None) -> str:
    """HEAD of this checkout (+dirty), or $LENX_GIT_COMMIT where the tree has no .git (the device copy)."""
    if os.environ.get("LENX_GIT_COMMIT"):
        return os.environ["LENX_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=cwd or Path(__file__).parent)
        commit = out.stdout.strip() if out.returncode == 0 else "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10, cwd=cwd or Path(__file__).parent).stdout.strip()
        return commit + ("+dirty" if dirty and commit != "unknown" else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def environment(device: torch.device | None = None) -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "command": " ".join(sys.argv),
        "git_commit": git_commit(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if device is not None and device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    else:
        info["cpu"] = platform.processor() or platform.machine()
    return info


def kernel_sources_hash() -> str:
    """SHA-256 over lenx.ops's kernel files: which kernels a GPU test run or a benchmark measured
    (results/gpu-tests/summary.json records it for the last device run). Kernel files are every
    module of lenx.ops but the references, the CPU emulation and the package docstrings
    (reference.py, emulate.py, __init__.py), each hashed as its syntax tree without docstrings, so
    that a comment, a docstring or the layout of a line does not ask for a new GPU run."""
    import ast
    import hashlib

    def code(tree):
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                    and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
        return ast.dump(tree).encode()

    ops = Path(__file__).parent / "ops"
    h = hashlib.sha256()
    for path in sorted(ops.rglob("*.py")):
        if path.name in ("reference.py", "emulate.py", "__init__.py"):
            continue
        h.update(path.relative_to(ops).as_posix().encode() + b"\0" + code(ast.parse(path.read_text())) + b"\0")
    return h.hexdigest()
