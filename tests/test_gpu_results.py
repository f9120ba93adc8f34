"""CI has no GPU: the kernels' GPU evidence is the last device run's test results, committed under
results/gpu-tests/. They must be for the kernel sources as they are now, and all green."""

import json
from pathlib import Path
import xml.etree.ElementTree as ET

from lenx.runinfo import kernel_sources_hash

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu-tests"


def test_last_gpu_run_matches_the_kernel_sources():
    summary = json.loads((RESULTS / "summary.json").read_text())
    assert summary["kernel_sources_hash"] == kernel_sources_hash(), (
        "src/lenx/ops changed since the last committed GPU test run: run scripts/device/gpu_check.sh on the "
        "device and commit its gpu-tests/ output to results/gpu-tests/")
    assert summary["failures"] == 0 and summary["errors"] == 0 and not summary["failed_tests"], summary["failed_tests"]
    assert summary["passed"] > 0 and "gpu" in summary["environment"]
    assert not summary.get("interrupted"), "the last GPU run was cut off at its time limit: not every test ran"


def test_summary_agrees_with_the_junit_xml():
    summary = json.loads((RESULTS / "summary.json").read_text())
    root = ET.parse(RESULTS / "junit.xml").getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    assert sum(int(s.get("tests", 0)) for s in suites) == summary["tests"]
    assert sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites) == 0


def hashed_copy(tmp_path, monkeypatch):
    """lenx.runinfo hashing a copy of the sources under tmp_path (to be changed by the test)."""
    import shutil

    import lenx.runinfo as runinfo

    src = Path(runinfo.__file__).parent
    shutil.copytree(src / "ops", tmp_path / "ops")
    shutil.copytree(src / "attention", tmp_path / "attention")
    shutil.copy(src / "runinfo.py", tmp_path / "runinfo.py")
    monkeypatch.setattr(runinfo, "__file__", str(tmp_path / "runinfo.py"))
    return runinfo


def test_kernel_hash_covers_kernel_code_only(tmp_path, monkeypatch):
    """Comments, docstrings and the references do not change the hash; a kernel's code does."""
    runinfo = hashed_copy(tmp_path, monkeypatch)
    before = runinfo.kernel_sources_hash()
    kernel = tmp_path / "ops" / "dape_v2" / "skewed.py"
    text = kernel.read_text()
    kernel.write_text(text.replace('"""', '"""Reworded. ', 1) + "\n# a comment\n")
    reference = tmp_path / "ops" / "dape_v2" / "reference.py"
    ref_text = reference.read_text()
    reference.write_text(ref_text.replace("def dape_v2_tables", "def unrelated_helper():\n    return 1\n\n\ndef dape_v2_tables", 1))
    assert runinfo.kernel_sources_hash() == before
    reference.write_text(ref_text)
    kernel.write_text(text.replace("0.01 * y", "0.02 * y", 1))
    assert runinfo.kernel_sources_hash() != before
    kernel.write_text(text)


def test_kernel_hash_covers_host_tables_and_routing(tmp_path, monkeypatch):
    """dape_v2_tables and residual_table (what the fused kernels read), the routing in fused.py and the
    skewed kernels' memory plan decide what runs on the GPU: changing their code changes the hash;
    other reference code does not."""
    runinfo = hashed_copy(tmp_path, monkeypatch)
    before = runinfo.kernel_sources_hash()
    reference = tmp_path / "ops" / "dape_v2" / "reference.py"
    text = reference.read_text()
    head, tables = text.split("def dape_v2_tables", 1)
    reference.write_text(head + "def dape_v2_tables" + tables.replace("\n", "\n    _ = 0\n", 1))
    assert runinfo.kernel_sources_hash() != before
    reference.write_text(text)
    assert runinfo.kernel_sources_hash() == before
    head, resid = text.split("def residual_table", 1)  # g, which the skewed and Gluon kernels read through t2
    reference.write_text(head + "def residual_table" + resid.replace("t1.float(), 0.01", "t1.float(), 0.02", 1))
    assert runinfo.kernel_sources_hash() != before
    reference.write_text(text)
    for name in ("fused.py", "skewed_memory.py"):  # the routing, and the skewed kernels' memory plan
        routing = tmp_path / "attention" / "backends" / name
        text = routing.read_text()
        routing.write_text(text + "\nROUTE_CHANGED = 1\n")
        assert runinfo.kernel_sources_hash() != before, name
        routing.write_text(text)


def test_kernel_hash_text_ignores_fields_newer_pythons_add():
    """Python 3.12 added FunctionDef.type_params (empty for plain functions): the hashed text of a
    tree must not depend on such fields, or CI and the device would disagree."""
    import ast

    from lenx.runinfo import _tree_text

    tree = ast.parse("def f(x):\n    '''doc'''\n    return x + 1\n")
    plain = _tree_text(tree)
    tree.body[0].type_params = []
    assert _tree_text(tree) == plain and "doc" not in plain
    assert _tree_text(ast.parse("def f(x):\n    return x + 2\n")) != plain


def test_kernel_hash_leaves_out_every_emulation(tmp_path, monkeypatch):
    """The CPU emulations (emulate*.py) decide nothing that runs on the GPU: changing one keeps the hash;
    the forward chain's kernel file is covered."""
    import shutil

    import lenx.runinfo as runinfo

    src = Path(runinfo.__file__).parent
    shutil.copytree(src / "ops", tmp_path / "ops")
    shutil.copytree(src / "attention", tmp_path / "attention")
    shutil.copy(src / "runinfo.py", tmp_path / "runinfo.py")
    monkeypatch.setattr(runinfo, "__file__", str(tmp_path / "runinfo.py"))
    before = runinfo.kernel_sources_hash()
    emul = tmp_path / "ops" / "dape_v2" / "emulate_chain.py"
    emul.write_text(emul.read_text().replace("0.01)", "0.02)"))
    assert runinfo.kernel_sources_hash() == before
    chain = tmp_path / "ops" / "dape_v2" / "chain.py"
    chain.write_text(chain.read_text().replace("MAX_HEADS = 12", "MAX_HEADS = 11"))
    assert runinfo.kernel_sources_hash() != before


def test_kernel_hash_covers_the_fox_kernel_and_the_band(tmp_path, monkeypatch):
    """The FoX kernel's entry (ops/forgetting/triton.py) and the biased-softmax band and tiles
    (ops/biased_softmax/band.py) are kernel files; FoX's reference is not."""
    runinfo = hashed_copy(tmp_path, monkeypatch)
    before = runinfo.kernel_sources_hash()
    for rel, changes in (("forgetting/triton.py", True), ("biased_softmax/band.py", True),
                         ("forgetting/reference.py", False)):
        path = tmp_path / "ops" / rel
        text = path.read_text()
        path.write_text(text + "\nCHANGED = 1\n")
        assert (runinfo.kernel_sources_hash() != before) == changes, rel
        path.write_text(text)
