"""Which module may import which: plotting reads files only, and only what really trains imports
the trainer."""

import ast
from pathlib import Path
import subprocess
import sys

import pytest

import lenx

PACKAGE = Path(lenx.__file__).parent


def imports(module: str) -> list[tuple[str, str | None]]:
    """(imported module, outermost function it is imported in or None at module level) for every
    import in src/lenx/<module>.py. `from . import x` counts as importing lenx.x (and `from a import
    b` as importing both a and a.b: b may be a module)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative to lenx (modules here sit at the package's top)
                    base = "lenx" + ("." + base if base else "")
                found.append((base, function))
                found.extend((f"{base}.{alias.name}", function) for alias in child.names)
            visit(child, function)

    visit(tree, None)
    return found


def is_within(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def test_plot_does_not_load_checkpoints_or_models():
    forbidden = ("lenx.checkpoint", "lenx.evaluate", "lenx.model", "lenx.runtime", "lenx.train", "torch")
    assert [i for i in imports("plot") if is_within(i[0], forbidden)] == []


def training_commands() -> set[str]:
    """The functions behind `lenx train`, `lenx sweep` and `lenx demo`: they really train."""
    from lenx.cli import app

    return {c.callback.__name__ for c in app.registered_commands
            if (c.name or c.callback.__name__) in ("train", "sweep", "demo")}


@pytest.mark.parametrize("module", ["evaluate", "plot", "cli", "bench", "che"])
def test_only_training_imports_the_trainer(module):
    """lenx.train (and lenx.sweep, which trains) is imported by none of these modules, except inside
    the CLI's train, sweep and demo commands."""
    allowed = training_commands() if module == "cli" else set()
    assert len(allowed) == (3 if module == "cli" else 0)
    wrong = [(name, function) for name, function in imports(module)
             if is_within(name, ("lenx.train", "lenx.sweep")) and function not in allowed]
    assert wrong == [], f"{module}.py imports the trainer outside the training commands: {wrong}"


def test_importing_evaluation_plotting_and_the_cli_loads_no_trainer():
    code = ("import sys, lenx.evaluate, lenx.plot, lenx.cli, lenx.che, lenx.runtime\n"
            "print(sorted(m for m in sys.modules if m in ('lenx.train', 'lenx.sweep')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
