"""The interface tables of the docs equal what ``tools/doc_tables.py`` writes from ``ringkv.defs``.

The opcode, status and payload tables of ``docs/blocks/link.md`` and the header table of
``docs/blocks/record-format.md`` are generated; this test fails when a definition changed and
the doc was not regenerated, or when a row has no description.
"""

import importlib.util
import shutil
from pathlib import Path

import pytest

from ringkv.defs import protocol as P
from ringkv.defs import record as R

ROOT = Path(__file__).resolve().parents[2]


def _load_tool():
    spec = importlib.util.spec_from_file_location("doc_tables", ROOT / "tools" / "doc_tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tool():
    return _load_tool()


@pytest.fixture
def copy(tool, tmp_path):
    """A copy of the docs that hold tables, for the tool to run on."""
    for doc in (tool.LINK_DOC, tool.RECORD_DOC):
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    return tmp_path


def test_checked_in_tables_are_up_to_date(tool):
    assert tool.problems() == []


def test_every_opcode_status_and_header_field_has_a_row(tool):
    link = (ROOT / tool.LINK_DOC).read_text(encoding="utf-8")
    for op in P.Op:
        assert f"| `{op.name}` | 0x{op.value:02X} |" in link
    for st in P.Status:
        assert f"| `{st.name}` | 0x{st.value:02X} |" in link
    rec = (ROOT / tool.RECORD_DOC).read_text(encoding="utf-8")
    for name, off, size in R.HEADER_FIELDS:
        assert f"| {off} | {size} | `{name}` |" in rec


def test_a_stale_number_is_reported_and_regenerated(tool, copy):
    path = copy / tool.RECORD_DOC
    text = path.read_text(encoding="utf-8")
    stale = text.replace("| 56 | 4 | `count` |", "| 56 | 2 | `count` |")
    assert stale != text
    path.write_text(stale, encoding="utf-8")
    found = tool.problems(copy)
    assert len(found) == 1 and "record-format.md" in found[0]
    assert tool.generate(copy)[path] == text        # the prose of the row is kept


def test_a_row_without_description_is_reported(tool, copy):
    path = copy / tool.LINK_DOC
    text = path.read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("| `HASH_QUERY` |")]
    path.write_text("".join(lines), encoding="utf-8")
    new = tool.generate(copy)[path]
    assert "| `HASH_QUERY` | 0x14 | `n` u32 | `hash` u64 | exact | yes |  |" in new
    path.write_text(new, encoding="utf-8")
    found = tool.problems(copy)
    assert len(found) == 1 and "no description" in found[0] and "HASH_QUERY" in found[0]


def test_missing_markers_are_an_error(tool, copy):
    path = copy / tool.RECORD_DOC
    path.write_text(path.read_text(encoding="utf-8").replace("<!-- /table:header -->", ""),
                    encoding="utf-8")
    with pytest.raises(SystemExit, match="header"):
        tool.generate(copy)
