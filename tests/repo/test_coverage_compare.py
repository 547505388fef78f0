"""tools/coverage_compare.py: lines covered before and by none of the new runs, with line
numbers carried across edits."""

import importlib.util
from pathlib import Path

from coverage import CoverageData

_SPEC = importlib.util.spec_from_file_location(
    "coverage_compare", Path(__file__).resolve().parents[2] / "tools" / "coverage_compare.py")
coverage_compare = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(coverage_compare)


def _data(path, root, lines):
    data = CoverageData(str(path))
    data.add_lines({str(root / rel): set(ns) for rel, ns in lines.items()})
    data.write()
    return path


def test_lost_moved_and_changed_lines(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    for root in (old, new):
        (root / "hw").mkdir(parents=True)
    (old / "hw" / "a.py").write_text("a = 1\nb = 2\nc = 3\nd = 4\n")
    # one line inserted at the top, "c = 3" rewritten
    (new / "hw" / "a.py").write_text("x = 0\na = 1\nb = 2\nc = 30\nd = 4\n")
    (old / "hw" / "gone.py").write_text("z = 1\n")
    before = _data(tmp_path / "before", old, {"hw/a.py": [1, 2, 3, 4], "hw/gone.py": [1]})
    fast = _data(tmp_path / "fast", new, {"hw/a.py": [2]})          # a = 1
    slow = _data(tmp_path / "slow", new, {"hw/a.py": [5]})          # d = 4
    code = coverage_compare.main(["--before", str(before), "--before-root", str(old),
                                  "--after", str(fast), str(slow), "--after-root", str(new)])
    assert code == 1
    lost, changed = coverage_compare.compare(
        coverage_compare.covered(before, old), old,
        [(coverage_compare.covered(f, new), new) for f in (fast, slow)])
    assert lost == {"hw/a.py": [(2, "b = 2")]}
    assert changed == {"hw/a.py": [(3, "c = 3")], "hw/gone.py": [(1, "z = 1")]}
    # a run in another checkout (here: the old one) is matched in its own version of the file
    other = _data(tmp_path / "other", old, {"hw/a.py": [2, 3], "hw/gone.py": [1]})
    assert coverage_compare.compare(
        coverage_compare.covered(before, old), old,
        [(coverage_compare.covered(fast, new), new), (coverage_compare.covered(other, old), old)]
    ) == ({"hw/a.py": [(4, "d = 4")]}, {})
    assert coverage_compare.main(["--before", str(before), "--before-root", str(old),
                                  "--after", str(slow), f"{other}@{old}", str(fast),
                                  "--after-root", str(new)]) == 0
    both = _data(tmp_path / "both", new, {"hw/a.py": [2, 3, 5]})
    assert coverage_compare.main(["--before", str(before), "--before-root", str(old),
                                  "--after", str(both), "--after-root", str(new)]) == 0
