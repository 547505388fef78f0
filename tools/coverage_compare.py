"""Lines one coverage run covered that none of the others does: what moving tests lost.

Compares coverage.py data files. ``--before`` is the data of the old suite (its checkout's root
with ``--before-root``); ``--after`` one or more data files of the new tiers (``make test`` and
the slow tests of ``make test-all``; checkout root ``--after-root``, default this repository,
or ``DATA@ROOT`` for a run in another checkout of the same tree).
Files are matched by their path inside the checkout (``hw/attention/core.py``). Where a file's text
differs between the two checkouts, the old line numbers are carried to the new ones with
:mod:`difflib`; a covered line whose text was changed or deleted is listed apart (not a loss:
it is not in the new code).

Prints every line covered before and by no ``--after`` file, grouped by file, with its old
line number and text, and exits 1 when there is one. coverage.py reads the data (``coverage
combine`` first when a run wrote parallel files); nothing else is needed.

    python tools/coverage_compare.py --before build/coverage-before/.coverage \\
        --before-root build/baseline-src \\
        --after build/coverage/test/.coverage build/coverage/slow/.coverage
"""

import argparse
import difflib
import sys
from pathlib import Path

from coverage import CoverageData

REPO = Path(__file__).resolve().parent.parent


def covered(data_file: Path, root: Path) -> dict[str, set[int]]:
    """``{path inside the checkout: covered line numbers}`` of one data file."""
    data = CoverageData(str(data_file))
    data.read()
    out: dict[str, set[int]] = {}
    root = root.resolve()
    for name in data.measured_files():
        path = Path(name).resolve()
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            continue                    # a file outside the checkout (a tool's, a temporary)
        lines = data.lines(name) or []
        if lines:
            out.setdefault(rel, set()).update(lines)
    return out


def line_map(old: list[str], new: list[str]) -> dict[int, int]:
    """Old line number -> new line number for the lines the two texts share (1-based)."""
    out = {}
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for i in range(size):
            out[a + i + 1] = b + i + 1
    return out


def _read(path: Path) -> list[str] | None:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return None


def compare(before, before_root: Path, afters):
    """``(lost, changed)`` for ``before`` (:func:`covered` of the old run in ``before_root``)
    against ``afters``, a list of ``(covered, root)`` of the new runs: ``{file: [(old line,
    text)]}`` covered before and by no new run, and ``{file: [(old line, text)]}`` covered
    before in code that no new run's checkout still has (changed or deleted). Each new run's
    lines are matched in its own checkout's version of the file."""
    lost: dict[str, list] = {}
    changed: dict[str, list] = {}
    for rel, lines in sorted(before.items()):
        old = _read(before_root / rel)
        present, hit = set(), set()
        for data, root in afters:
            new = _read(root / rel)
            if new is None:
                continue
            mapping = {n: n for n in lines} if old is None or old == new else line_map(old, new)
            got = data.get(rel, set())
            for n in lines:
                m = mapping.get(n)
                if m is not None:
                    present.add(n)
                    if m in got:
                        hit.add(n)
        for n in sorted(lines):
            text = old[n - 1] if old and n <= len(old) else ""
            if n not in present:
                changed.setdefault(rel, []).append((n, text))
            elif n not in hit:
                lost.setdefault(rel, []).append((n, text))
    return lost, changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the old suite's data file")
    parser.add_argument("--before-root", type=Path, default=REPO,
                        help="the checkout the old suite ran in")
    parser.add_argument("--after", nargs="+", required=True,
                        help="the new tiers' data files; DATA@ROOT for one that ran in "
                             "another checkout of the same tree than --after-root")
    parser.add_argument("--after-root", type=Path, default=REPO,
                        help="the checkout the new tiers ran in")
    args = parser.parse_args(argv)
    after = [(Path(a), Path(r)) if r else (Path(a), args.after_root)
             for a, _, r in (x.partition("@") for x in args.after)]
    for f in [args.before, *(a for a, _ in after)]:
        if not f.exists():
            parser.error(f"no coverage data at {f} (run `coverage combine` in its folder?)")
    before = covered(args.before, args.before_root)
    afters = [(covered(f, root), root) for f, root in after]
    lost, changed = compare(before, args.before_root, afters)
    n_before = sum(map(len, before.values()))
    n_after = sum(len(ls) for a, _ in afters for ls in a.values())
    print(f"covered before: {n_before} lines in {len(before)} files; after: {n_after} "
          f"lines in {len(afters)} runs (a line covered by several runs counts in each)")
    for rel, rows in changed.items():
        print(f"\n{rel}: {len(rows)} line(s) covered before in code changed or deleted since")
    n_lost = sum(map(len, lost.values()))
    print(f"\nlines covered before and by none of the tiers now: {n_lost}")
    for rel, rows in lost.items():
        print(f"\n{rel}")
        for n, text in rows:
            print(f"  {n:5d}  {text}")
    return 1 if n_lost else 0


if __name__ == "__main__":
    sys.exit(main())
