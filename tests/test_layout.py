"""The house rules, checked: kernels on the ground floor, a reference beside every kernel, each floor
imports only what the map allows (docs/design.md), the lab bench out of the product, plotting and
reports read files only, the CLI builds no tables, only what trains imports the trainer, one training
step, no side effects on import, tests mirror the source, every package says what it owns, no module
over 450 lines."""

import ast
import fnmatch
import re
from pathlib import Path
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "lenx"
OPS = SRC / "ops"
TRAINER = ("lenx.training.loop", "lenx.training.sweep")  # the modules that train a model
EVALUATION_FILES = ("lenx.evaluation.files",)  # the evaluation files' names and keeping: what a report may read


def imported_modules(path: Path) -> list[tuple[str, int, str | None]]:
    """Every module a file imports, at any depth, as absolute dotted names: (module, line, the
    outermost function it is imported in or None at module level). `from a import b` counts as
    importing both a and a.b (b may be a module)."""
    package = ".".join(path.relative_to(SRC.parent).with_suffix("").parts)
    if path.name != "__init__.py":
        package = package.rsplit(".", 1)[0]
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                parts = package.split(".")
                base = parts[: len(parts) - (child.level - 1)] if child.level else []
                mod = ".".join(base + ([child.module] if child.module else []))
                found.append((mod, child.lineno, function))
                found.extend((f"{mod}.{alias.name}", child.lineno, function) for alias in child.names)
            visit(child, function)

    visit(ast.parse(path.read_text()), None)
    return found


def python_files(where: str) -> list[Path]:
    """The source files of a module or package of src/lenx (`where`: relative to it)."""
    path = SRC / where
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def is_within(name: str, modules: tuple[str, ...]) -> bool:
    return any(name == m or name.startswith(m + ".") for m in modules)


def test_ops_import_nothing_from_above():
    """lenx.ops imports neither lenx.attention nor anything built on it; the one exception is the
    lazy re-export of lenx.functional's two functions in ops/__init__.py's __getattr__."""
    bad = []
    for path in sorted(OPS.rglob("*.py")):
        for mod, line, _ in imported_modules(path):
            if not mod.startswith("lenx.") or mod.startswith("lenx.ops"):
                continue
            if path == OPS / "__init__.py" and mod in ("lenx", "lenx.functional"):
                continue
            bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, bad


def test_ops_import_with_attention_blocked():
    """Importing every ops module works with lenx.attention and lenx.functional unimportable."""
    mods = sorted(".".join(p.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
                  for p in OPS.rglob("*.py"))
    code = f"""
import importlib, importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.startswith(("lenx.attention", "lenx.functional")):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
try:
    import triton  # noqa: F401
    have_triton = True
except ImportError:
    have_triton = False
for m in {mods!r}:
    if m.endswith(".triton") or m.endswith((".tiles", ".fastmath")):
        if not have_triton:
            continue
    importlib.import_module(m)
assert not any(n.startswith(("lenx.attention", "lenx.functional")) for n in sys.modules)
print("ok")
"""
    env = {"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_every_op_folder_has_its_reference():
    folders = [p for p in OPS.iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert {p.name for p in folders} == {"biased_softmax", "dape_v2", "forgetting", "head_dot", "mta", "rope",
                                          "stickbreaking"}
    for folder in folders:
        assert (folder / "reference.py").is_file(), folder
        assert (ROOT / "tests" / "ops" / f"test_{folder.name}.py").is_file(), f"no tests/ops/test_{folder.name}.py"


def test_results_hold_data_only():
    code = [str(p.relative_to(ROOT)) for p in (ROOT / "results").rglob("*") if p.suffix in (".py", ".sh")]
    assert not code, f"scripts belong in scripts/, not results/: {code}"


def test_bench_reaches_no_kernel_module():
    """lenx bench times the backends as a user runs them: it imports no kernel module, so it can
    change no kernel's settings (tuning lives in scripts/tune and passes settings as arguments)."""
    mods = [m for path in sorted((SRC / "bench").glob("*.py")) for m, _, _ in imported_modules(path)]
    assert mods and not [m for m in mods if m.startswith("lenx.ops")], mods


def test_importing_lenx_has_no_side_effects():
    code = "import sys, lenx; print(sorted(m for m in sys.modules if m.startswith(('lenx', 'torch', 'ctypes'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(SRC.parent)})
    assert out.returncode == 0, out.stderr
    assert eval(out.stdout) == ["lenx"]


@pytest.mark.parametrize("path", ["src/lenx", "tests", "scripts"])
def test_no_session_history_in_code(path):
    """History (which session did what) belongs in notes/, not in code comments."""
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / path).rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\bsession \d", line, re.I)
            and p.name != "test_layout.py"]
    assert not hits, hits


def test_plot_does_not_load_checkpoints_or_models():
    forbidden = ("lenx.evaluation", "lenx.model", "lenx.runs", *TRAINER, "torch")
    assert [i for i in imported_modules(SRC / "report" / "plot.py") if is_within(i[0], forbidden)
            and not is_within(i[0], EVALUATION_FILES)] == []


# lenx.report's statistics and figures: they compute from result files with numpy, scipy and matplotlib
STATS_AND_FIGURES = ("compare.py", "stats.py", "plot.py", "positions.py", "effective.py")


def test_report_reads_results_only():
    """lenx.report renders results: it loads no model, checkpoint, corpus or trainer (of evaluation it
    reads the files only). Its tables import nothing heavy when imported (torch and the attention
    registry only inside lenx list's function); its statistics and figures never import torch."""
    forbidden = ("lenx.data", "lenx.evaluation", "lenx.model", "lenx.runs", *TRAINER)
    for path in sorted((SRC / "report").glob("*.py")):
        found = imported_modules(path)
        assert [i for i in found if is_within(i[0], forbidden) and not is_within(i[0], EVALUATION_FILES)] == [], path.name
        at_import = [m for m, _, function in found if function is None]
        if path.name in STATS_AND_FIGURES:
            assert [m for m in at_import if is_within(m, ("torch",))] == [], path.name
        else:
            assert [m for m in at_import if not is_within(m, ("lenx.report", "dataclasses", "json", "statistics"))] == [], \
                path.name


def test_cli_builds_no_tables():
    assert [i for path in python_files("cli") for i in imported_modules(path) if is_within(i[0], ("rich",))] == []


def training_commands() -> set[str]:
    """The functions behind `lenx train`, `lenx sweep` and `lenx demo`: they really train."""
    from lenx.cli import app

    return {c.callback.__name__ for c in app.registered_commands
            if (c.name or c.callback.__name__) in ("train", "sweep", "demo")}


@pytest.mark.parametrize("where", ["evaluation", "report", "cli", "bench", "che"])
def test_only_training_imports_the_trainer(where):
    """The trainer (lenx.training.loop, and lenx.training.sweep, which trains) is imported by none of
    these, except inside the CLI's train, sweep and demo commands."""
    allowed = training_commands() if where == "cli" else set()
    assert len(allowed) == (3 if where == "cli" else 0)
    wrong = [(path.name, name, function) for path in python_files(where) for name, _, function in imported_modules(path)
             if is_within(name, TRAINER) and function not in allowed]
    assert wrong == [], f"{where} imports the trainer outside the training commands: {wrong}"


def test_importing_evaluation_plotting_and_the_cli_loads_no_trainer():
    code = ("import sys, lenx.evaluation.evaluate, lenx.evaluation.attention_maps, lenx.evaluation.retrieval, "
            "lenx.report.plot, lenx.cli, lenx.che.protocol, lenx.runs\n"
            "print(sorted(m for m in sys.modules if m in ('lenx.training.loop', 'lenx.training.sweep')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# The corpus builder's only callers: `lenx prepare`, and the synthetic corpus generated on first use.
BUILDER_CALLERS = {("cli/data.py", "prepare"), ("runs.py", "open_training_corpus")}


def test_only_prepare_imports_the_corpus_builder():
    """lenx.data (the reader) never imports lenx.data.build (the builder); outside lenx.data, training,
    evaluation and every other module open corpora through the reader only, except the callers above."""
    build = SRC / "data" / "build"
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        if path.is_relative_to(build):
            continue
        where = path.relative_to(SRC).as_posix()
        wrong += [f"{where}:{line} imports {name} in {function}" for name, line, function in imported_modules(path)
                  if is_within(name, ("lenx.data.build",)) and (where, function) not in BUILDER_CALLERS]
    assert wrong == [], wrong


def test_pytest_collects_every_test_folder(pytestconfig):
    """pytest does not enter a folder that matches norecursedirs (its default list has `build`): no
    folder of tests may match, or its tests would silently never run."""
    patterns = pytestconfig.getini("norecursedirs")
    folders = {p.parent.relative_to(ROOT / "tests") for p in (ROOT / "tests").rglob("test_*.py")}
    skipped = [str(f) for f in folders if any(fnmatch.fnmatch(part, pattern) for part in f.parts for pattern in patterns)]
    assert skipped == []


def test_tests_mirror_the_source():
    """A folder of tests is named after the package of src/lenx it tests (tests/data/build for
    lenx.data.build); tests of top-level modules, and end-to-end tests, stay in tests/."""
    folders = {p.parent.relative_to(ROOT / "tests") for p in (ROOT / "tests").rglob("test_*.py")} - {Path(".")}
    assert folders and [str(f) for f in folders if not (SRC / f / "__init__.py").is_file()] == []


def test_every_package_says_what_it_owns():
    """Every package of src/lenx opens with a docstring: what it owns (and, above the kernels, what it
    may import; docs/design.md draws the whole map)."""
    packages = sorted({p.parent for p in SRC.rglob("*.py")})
    missing = [str(p.relative_to(SRC.parent)) for p in packages
               if not (p / "__init__.py").is_file() or not ast.get_docstring(ast.parse((p / "__init__.py").read_text()))]
    assert missing == []


MAX_LINES = 450  # above it, a module does more than one thing; the kernels and the task generators excepted


def test_no_module_is_over_the_size_bar():
    long = {str(p.relative_to(SRC)): n for p in sorted(SRC.rglob("*.py"))
            if not p.is_relative_to(OPS) and not p.is_relative_to(SRC / "tasks")
            and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"split these along their responsibilities: {long}"


# What each floor of src/lenx may import from lenx (docs/design.md); a folder's own modules aside, and
# lenx.cli, at the top, imports anything. lenx.ops has its own rule above.
MAY_IMPORT = {
    "_memory": set(), "config": set(), "fileio": set(), "runinfo": set(), "tasks": set(),
    "attention": {"ops", "config", "_memory"},
    "functional": {"attention"},
    "data": {"fileio"},
    "model": {"attention", "config", "fileio"},
    "runs": {"config", "data", "model"},
    "evaluation": {"attention", "config", "data", "fileio", "model", "runs"},
    "export": {"config", "data", "fileio", "model", "runs"},
    "training": {"config", "data", "fileio", "model", "runinfo", "runs"},
    "che": {"attention", "config", "model", "report", "runinfo", "tasks", "training"},
    "report": {"attention", "evaluation", "fileio", "tasks"},
    "bench": {"attention", "config", "fileio", "model", "runinfo", "training"},
}
# The reaches above a floor: generating from a run opens the run (inside generate_from_run), a sweep
# evaluates and tabulates its runs, `lenx plot FOLDER` re-draws a CHE result with CHE's own figure
# (inside redraw_file), and `lenx eval --hf` reads a lenx export with lenx's own classes (inside
# lenx_classes).
REACHES_UP = {("model/generate.py", "runs"), ("training/sweep.py", "evaluation"), ("training/sweep.py", "report"),
              ("report/plot.py", "che"), ("evaluation/hf.py", "export")}


def test_each_floor_imports_only_what_the_map_allows():
    wrong = []
    for path in sorted(SRC.rglob("*.py")):
        where = path.relative_to(SRC)
        floor = where.parts[0].removesuffix(".py")
        if floor in ("ops", "cli", "__init__", "__main__"):
            continue
        for name, line, _ in imported_modules(path):
            parts = name.split(".")
            if parts[0] != "lenx" or len(parts) < 2 or parts[1] == floor:
                continue
            if parts[1] not in MAY_IMPORT[floor] and (where.as_posix(), parts[1]) not in REACHES_UP:
                wrong.append(f"src/lenx/{where.as_posix()}:{line} imports {name}")
    assert set(MAY_IMPORT) | {"ops", "cli", "__init__", "__main__"} == {p.name.removesuffix(".py") for p in SRC.iterdir()
                                                                         if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert wrong == [], wrong


def lenx_imports(path: Path) -> list[tuple[str, int]]:
    return [(m, line) for m, line, _ in imported_modules(path) if m == "lenx" or m.startswith("lenx.")]


def module_file(name: str) -> Path:
    """The file of the lenx module `name`, or of the module that holds it when it names a function or class."""
    while "." in name:
        path = SRC.parent.joinpath(*name.split("."))
        for file in (path / "__init__.py", path.with_suffix(".py")):
            if file.is_file():
                return file
        name = name.rsplit(".", 1)[0]
    return SRC / "__init__.py"


def test_config_is_a_leaf():
    """lenx.config imports nothing from lenx, at any depth, but leaf utilities (modules that import
    nothing from lenx themselves): the [model] section is checked next to the model
    (lenx.model.check_config), so anything can read a config without loading the model."""
    wrong = []
    for name, line in lenx_imports(SRC / "config.py"):
        if lenx_imports(module_file(name)):
            wrong.append(f"src/lenx/config.py:{line} imports {name}")
    assert wrong == [], wrong


def backward_calls() -> set[tuple[str, str]]:
    """(file, outermost function) of every call of .backward() or torch.autograd.backward in src/lenx
    outside the kernels (ops/)."""
    found = set()

    def visit(node, path, function):
        for child in ast.iter_child_nodes(node):
            inner = function
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = function or child.name
            elif isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "backward":
                found.add((str(path.relative_to(SRC)), function))
            visit(child, path, inner)

    for path in sorted(SRC.rglob("*.py")):
        if not path.is_relative_to(OPS):
            visit(ast.parse(path.read_text()), path, None)
    return found


def test_one_training_step():
    """lenx train, lenx bench --train-step and lenx che take their optimizer steps in one function, the
    one function in lenx that calls backward() (the kernel benchmark takes its gradients with
    torch.autograd.grad)."""
    assert backward_calls() == {("training/step.py", "train_step")}


def test_the_training_step_imports_nothing_from_lenx():
    """So that every command that trains can share it: it knows no run, no config and no model."""
    assert [m for m, _, _ in imported_modules(SRC / "training" / "step.py") if m.startswith("lenx")] == []


def _redefined(stmts) -> list[str]:
    """Functions and classes defined twice in one block (module level, or inside an if / try there):
    the second silently replaces the first for every caller."""
    seen, twice = set(), []
    for node in stmts:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name in seen:
                twice.append(node.name)
            seen.add(node.name)
        for block in ("body", "orelse", "finalbody"):
            if isinstance(node, (ast.If, ast.Try)) and getattr(node, block, None):
                twice += _redefined(getattr(node, block))
    return twice


def test_no_function_is_defined_twice_in_a_module():
    """A test helper defined again further down a test file once fed GPU tests CPU tensors; CI, which
    has no GPU, could not see it."""
    hits = [f"{p.relative_to(ROOT)}: {name}" for folder in ("src", "tests", "scripts")
            for p in sorted((ROOT / folder).rglob("*.py")) for name in _redefined(ast.parse(p.read_text()).body)]
    assert not hits, hits
