"""Write the interface tables of the docs from their definitions in ``ringkv.defs``.

The opcode, status and payload-layout tables of ``docs/blocks/link.md`` come from
:mod:`ringkv.defs.protocol` (``Op``, ``Status``, ``REQUESTS``, ``RESPONSES``, ``TAILS``,
``LENGTH``, ``IDEMPOTENT_OPS``, ``SEALED_REQUESTS``, ``KEY_OPS``, ``SDRAM_OPS`` and the shared
response layouts), the header table of
``docs/blocks/record-format.md`` from :mod:`ringkv.defs.record` (``HEADER_FIELDS``). Each table
sits between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->`` in its doc.

Names, codes, offsets, sizes and layouts are written from the definitions; the last column of a
table (what a field holds, what an opcode does) is prose that only the doc has, so it is kept
from the checked-in table, matched by the row's name. A row the definitions gain appears with an
empty prose cell, and ``--check`` reports it until someone describes it; a row they lose
disappears with its prose.

Usage::

    python tools/doc_tables.py            # rewrite the tables in the docs
    python tools/doc_tables.py --check    # exit 1 and name the table if a doc is out of date

``tests/repo/test_doc_tables.py`` runs the check. Standard library and ``ringkv.defs`` only.
"""

import argparse
import re
import sys
from pathlib import Path

from ringkv.defs import protocol as P
from ringkv.defs import record as R

ROOT = Path(__file__).resolve().parent.parent
LINK_DOC = Path("docs/blocks/link.md")
RECORD_DOC = Path("docs/blocks/record-format.md")

_INT = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}
#: The response layouts that several opcodes share: one table each, named in the opcode table.
SHARED = {"DIR_RESPONSE": P.DIR_RESPONSE, "SNAPSHOT_RESPONSE": P.SNAPSHOT_RESPONSE,
          "PREFIX_RESPONSE": P.PREFIX_RESPONSE, "RECOVERY_STATUS": P.RECOVERY_STATUS,
          "STORAGE_INFO": P.STORAGE_INFO}


def _field(f) -> str:
    name, size = f[0], f[1]
    return f"`{name}` {size} B" if len(f) > 2 else f"`{name}` {_INT.get(size, f'{size} B')}"


def _layout(layout, tail: str = "") -> str:
    for name, shared in SHARED.items():
        if layout is shared:
            text = f"[`{name}`](#{name.lower()})"
            break
    else:
        text = ", ".join(_field(f) for f in layout.fields)
    if tail:
        text = f"{text}; then {tail}" if text else tail
    return text or "—"


def _hex(value: int) -> str:
    return f"0x{value:02X}"


def opcode_rows():
    """``(name, cells)`` of every opcode, in code order (the prose cell is added later)."""
    for op in P.Op:
        if op not in P.REQUESTS:
            yield op.name, [f"`{op.name}`", _hex(op.value), "not executed: `UNKNOWN_OP`",
                            "—", "—", ""]
            continue
        req_tail, resp_tail = P.TAILS.get(op, ("", ""))
        request = _layout(P.REQUESTS[op], req_tail)
        if op in P.SEALED_REQUESTS:
            extra = P.SEALED_REQUESTS[op].fields[len(P.REQUESTS[op].fields):]
            request += f"; sealed builds: then {', '.join(_field(f) for f in extra)}"
        if op in P.KEY_OPS:
            request += " (sealed builds only)"
        if op in P.SDRAM_OPS:
            request += " (builds with an SDRAM only)"
        yield op.name, [f"`{op.name}`", _hex(op.value), request,
                        _layout(P.RESPONSES[op], resp_tail), P.LENGTH[op].value,
                        "yes" if op in P.IDEMPOTENT_OPS else ""]


def status_rows():
    for st in P.Status:
        yield st.name, [f"`{st.name}`", _hex(st.value)]


def shared_rows(layout):
    off = 0
    for f in layout.fields:
        yield f[0], [str(off), str(f[1]), f"`{f[0]}`"]
        off += f[1]


def header_rows():
    """Header fields by offset, with the zero-filled gaps between them as rows named ``—``."""
    pos = 0
    for name, off, size in sorted(R.HEADER_FIELDS, key=lambda f: f[1]):
        if off > pos:
            yield f"gap@{pos}", [str(pos), str(off - pos), "—"]
        yield name, [str(off), str(size), f"`{name}`"]
        pos = off + size
    if pos < R.SECTOR:
        yield f"gap@{pos}", [str(pos), str(R.SECTOR - pos), "—"]


#: table name -> (doc, header cells, alignment row, rows, prose column title)
def tables():
    out = {
        "opcodes": (LINK_DOC, ["op", "code", "request payload", "response payload", "length",
                               "repeatable", "what it does"],
                    ["---", "---:", "---", "---", "---", "---", "---"], opcode_rows),
        "statuses": (LINK_DOC, ["status", "code", "meaning"], ["---", "---:", "---"],
                     status_rows),
        "header": (RECORD_DOC, ["offset", "size", "field", "value"],
                   ["---:", "---:", "---", "---"], header_rows),
    }
    for name, layout in SHARED.items():
        out[name.lower()] = (LINK_DOC, ["offset", "size", "field", "meaning"],
                             ["---:", "---:", "---", "---"],
                             lambda layout=layout: shared_rows(layout))
    return out


_ROW_SPLIT = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _ROW_SPLIT.split(line.strip().strip("|"))]


def _row_key(cells: list[str]) -> str:
    """The name of a table row as the generators name it: its name cell without backticks,
    the gaps of the header table by offset."""
    for cell in cells:
        m = re.fullmatch(r"`(\w+)`", cell)
        if m:
            return m.group(1)
    if len(cells) >= 3 and cells[2] == "—":
        return f"gap@{cells[0]}"
    return ""


def _span(text: str, name: str) -> tuple[int, int]:
    begin, end = f"<!-- table:{name} -->", f"<!-- /table:{name} -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        raise SystemExit(f"doc_tables: markers of table {name!r} missing or out of order")
    return i + len(begin), j


def render(text: str, name: str, header, align, rows) -> str:
    """``text`` with table ``name`` rewritten; the prose column kept by row name."""
    i, j = _span(text, name)
    prose = {}
    for line in text[i:j].splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            cells = _cells(line)
            prose[_row_key(cells)] = cells[-1]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for key, cells in rows():
        lines.append("| " + " | ".join([*cells, prose.get(key, "")]) + " |")
    return text[:i] + "\n" + "\n".join(lines) + "\n" + text[j:]


def generate(root: Path = ROOT) -> dict[Path, str]:
    """``{doc path: new text}`` of every doc that holds a table."""
    texts = {}
    for name, (doc, header, align, rows) in tables().items():
        path = root / doc
        text = texts.get(path) or path.read_text(encoding="utf-8")
        texts[path] = render(text, name, header, align, rows)
    return texts


def problems(root: Path = ROOT) -> list[str]:
    """What ``--check`` reports: docs out of date, rows without prose."""
    out = []
    for path, new in generate(root).items():
        if path.read_text(encoding="utf-8") != new:
            out.append(f"{path.relative_to(root)}: a table differs from the definitions "
                       "(run `python tools/doc_tables.py`)")
        for line in new.splitlines():
            if line.startswith("| ") and line.rstrip().endswith("|  |"):
                out.append(f"{path.relative_to(root)}: no description for row {line.strip()}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="only check that the docs are up to date (exit 1 if not)")
    args = ap.parse_args(argv)
    if args.check:
        found = problems()
        for p in found:
            print(p, file=sys.stderr)
        return 1 if found else 0
    for path, text in generate().items():
        if path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
