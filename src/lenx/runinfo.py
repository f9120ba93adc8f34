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
    (reference.py, emulate*.py, __init__.py), plus the code named in HASHED_CODE (the host tables
    and the kernel routing), each hashed as its syntax tree without docstrings, so
    that a comment, a docstring or the layout of a line does not ask for a new GPU run. The tree is
    written out by _tree_text, not ast.dump, whose text differs between Python versions."""
    import ast
    import hashlib

    ops = Path(__file__).parent / "ops"
    h = hashlib.sha256()
    for path in sorted(ops.rglob("*.py")):
        if path.name in ("reference.py", "__init__.py") or path.name.startswith("emulate"):
            continue
        tree = _tree_text(ast.parse(path.read_text())).encode()
        h.update(path.relative_to(ops).as_posix().encode() + b"\0" + tree + b"\0")
    # Code outside those files that changes what runs on the GPU: the host tables the fused
    # DAPE V2 kernels read, and the routing that picks a kernel (names None: the whole file).
    for rel, names in HASHED_CODE:
        tree = ast.parse((Path(__file__).parent / rel).read_text())
        found = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        for node in [tree] if names is None else [found[name] for name in names]:
            h.update(rel.encode() + b"\0" + _tree_text(node).encode() + b"\0")
    return h.hexdigest()


# (file under src/lenx, its top-level functions hashed, or None: all of it) added to the kernel hash
HASHED_CODE = (
    ("ops/dape_v2/reference.py", ("dape_v2_tables", "residual_table")),
    ("attention/backends/fused.py", None),
    ("attention/backends/skewed_memory.py", None),
)


def _tree_text(node) -> str:
    """A syntax tree as text: node types and the fields every supported Python version has (empty
    ones left out, so a field added by a later version does not change it), docstrings dropped."""
    import ast

    if isinstance(node, list):
        return "[" + ",".join(_tree_text(x) for x in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = []
    for name in node._fields:
        value = getattr(node, name, None)
        if name in ("type_params", "type_comment", "ctx") or value is None or value == []:
            continue
        if name == "body" and isinstance(value, list) and isinstance(value[0], ast.Expr) \
                and isinstance(value[0].value, ast.Constant) and isinstance(value[0].value.value, str):
            value = value[1:]  # a docstring
        fields.append(f"{name}={_tree_text(value)}")
    return f"{type(node).__name__}({','.join(fields)})"
