"""``docs/architecture.svg`` is what ``tools/draw_architecture.py`` draws, and its boxes match
the repository: every package a box names exists, and every subsystem (a subpackage of ``hw/``
or ``host/``) has a box. The numbered legend in ``docs/ARCHITECTURE.md`` is the tool's.
"""

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The packages whose subpackages are subsystems, each of which needs a box.
SUBSYSTEM_PARENTS = ("ringkv.hw", "ringkv.host")


def _load_tool():
    spec = importlib.util.spec_from_file_location("draw_architecture",
                                                  ROOT / "tools" / "draw_architecture.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tool():
    return _load_tool()


def _package_dirs(root: Path) -> dict[str, str]:
    """``[tool.setuptools] package-dir`` of ``root/pyproject.toml``: package -> folder."""
    with open(root / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def _source(package: str, dirs: dict[str, str]) -> Path:
    """The folder (or the module without ``.py``) of ``package``, by the longest package-dir
    entry it starts with: ``ringkv.hw.store`` -> ``hw/store``, ``ringkv.cli`` -> ``ringkv/cli``."""
    base = max((name for name in dirs if package == name or package.startswith(name + ".")),
               key=len, default=None)
    if base is None:
        raise KeyError(f"{package} is under no package-dir entry")
    rest = package[len(base):].lstrip(".")
    return Path(dirs[base], *rest.split(".")) if rest else Path(dirs[base])


def missing_packages(tool, root: Path) -> list[str]:
    """The packages a box names that are neither a folder nor a module under ``root``."""
    dirs = _package_dirs(root)
    missing = []
    for box in tool.BOXES:
        for package in box.packages:
            path = root / _source(package, dirs)
            if not (path.is_dir() or path.with_suffix(".py").is_file()):
                missing.append(package)
    return missing


def subsystems(root: Path) -> list[str]:
    """Every subpackage of ``hw/`` and ``host/`` (a folder with ``__init__.py``), as a package
    name."""
    dirs = _package_dirs(root)
    found = []
    for parent in SUBSYSTEM_PARENTS:
        for init in sorted((root / _source(parent, dirs)).glob("*/__init__.py")):
            found.append(f"{parent}.{init.parent.name}")
    return found


def without_box(tool, root: Path) -> list[str]:
    named = {package for box in tool.BOXES for package in box.packages}
    return [package for package in subsystems(root) if package not in named]


def test_committed_svg_is_what_the_tool_draws(tool):
    """Byte for byte: change a box or an arrow and `make docs-picture` must be run."""
    assert (ROOT / tool.SVG).read_bytes() == tool.render_svg(), \
        f"{tool.SVG} is out of date: run `make docs-picture`"


def test_check_flag_fails_on_a_stale_picture(tool, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    (tmp_path / tool.SVG).parent.mkdir(parents=True)
    assert tool.main([]) == 0
    assert tool.main(["--check"]) == 0
    (tmp_path / tool.SVG).write_bytes((tmp_path / tool.SVG).read_bytes().replace(
        b"ringkv.hw.store", b"ringkv.hw.stor"))
    assert tool.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err


def test_every_package_a_box_names_exists(tool):
    assert missing_packages(tool, ROOT) == []


def test_every_subsystem_has_a_box(tool):
    assert subsystems(ROOT), "hw/ and host/ have no subpackages: not the subsystem layout"
    assert without_box(tool, ROOT) == []


def _fake_tree(root: Path, tool, extra: str = "", drop: str = "") -> None:
    """The folders and modules the boxes name, in the layout of ``pyproject.toml``, plus the
    subpackage ``extra`` (a folder path) and without the package ``drop``."""
    root.mkdir()
    (root / "pyproject.toml").write_bytes((ROOT / "pyproject.toml").read_bytes())
    dirs = _package_dirs(ROOT)
    for box in tool.BOXES:
        for package in box.packages:
            if package != drop:
                folder = root / _source(package, dirs)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "__init__.py").touch()
    if extra:
        (root / extra).mkdir(parents=True)
        (root / extra / "__init__.py").touch()


def test_the_checks_catch_a_missing_box_and_a_missing_package(tool, tmp_path):
    """The two layout checks on a tree built from the boxes: clean, then each broken."""
    _fake_tree(tmp_path / "good", tool)
    assert missing_packages(tool, tmp_path / "good") == []
    assert "ringkv.hw.store" in subsystems(tmp_path / "good")
    assert without_box(tool, tmp_path / "good") == []
    _fake_tree(tmp_path / "new", tool, extra="hw/newcore")
    assert without_box(tool, tmp_path / "new") == ["ringkv.hw.newcore"]
    _fake_tree(tmp_path / "gone", tool, drop="ringkv.hw.seal")
    assert missing_packages(tool, tmp_path / "gone") == ["ringkv.hw.seal"]


def test_every_step_has_an_arrow_and_a_legend_line(tool):
    steps = {arrow.step for arrow in tool.ARROWS}
    assert steps == set(tool.STEPS) == set(range(1, len(tool.STEPS) + 1))
    boxes = {box.key for box in tool.BOXES}
    assert {arrow.src for arrow in tool.ARROWS} | {arrow.dst for arrow in tool.ARROWS} <= boxes


def test_architecture_opens_with_the_picture_and_its_legend(tool):
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    opening = text[:text.index("\n## Blocks")]
    assert "](architecture.svg)" in opening
    assert tool.legend_markdown() in opening, \
        "the legend in docs/ARCHITECTURE.md differs from `tools/draw_architecture.py --legend`"
