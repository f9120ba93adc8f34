"""Fixtures of the corpus builder's tests: offline stand-ins for the registry clients."""

import sys
from pathlib import Path

import pytest

from lenx.data.build import fetch as fetch_mod


FAKE_CLIENT = """#!PYTHON
# A stand-in for npm, apt-cache, apt-get and pip (by its own name) serving files from
# $FAKE_REGISTRY. Like the real clients, it resolves a relative destination against its
# own working directory.
import os, shutil, sys
from pathlib import Path

store, tool, args = Path(os.environ["FAKE_REGISTRY"]), Path(sys.argv[0]).name, sys.argv[1:]
if tool == "apt-cache":  # apt-cache policy PKG
    print("  Candidate: 1.0-1")
    sys.exit(0)
if tool == "npm":  # npm pack SPEC --pack-destination DIR
    name = args[1].lstrip("@").replace("/", "-") + "-1.0.0.tgz"
    dest = args[args.index("--pack-destination") + 1]
elif tool == "apt-get":  # apt-get download PKG: into the working directory
    name, dest = args[1] + "_1.0-1_all.deb", "."
else:  # pip download ... NAME==VERSION -d DIR
    name = next(a for a in args if "==" in a).replace("==", "-") + ".tar.gz"
    dest = args[args.index("-d") + 1]
if not (store / name).is_file():
    sys.exit(f"npm error 404 {name} is not in the registry")
Path(dest).mkdir(parents=True, exist_ok=True)
shutil.copy(store / name, Path(dest) / name)
print(name)
"""


@pytest.fixture
def fake_registry(tmp_path, monkeypatch) -> Path:
    """Offline npm, apt and pip clients (the only programs on PATH); returns their file store."""
    store, bin_dir = tmp_path / "registry", tmp_path / "bin"
    store.mkdir()
    bin_dir.mkdir()
    for tool in ("npm", "apt-cache", "apt-get", "pip"):
        exe = bin_dir / tool
        exe.write_text(FAKE_CLIENT.replace("PYTHON", sys.executable))
        exe.chmod(0o755)
    monkeypatch.setenv("FAKE_REGISTRY", str(store))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(fetch_mod, "PIP", [str(bin_dir / "pip")])
    return store
