"""The layering rule of the package, checked on every module's imports (docs/ARCHITECTURE.md).

::

    ringkv.cli    ── may use everything (ringkv/cli/: one module per command)
      │
      ├── serve/   defs, host, sim + its web stack (the OpenAI-compatible server)
      ├── sim/     defs, hw, host (simulation harness, device models, test helpers)
      ├── boards/  defs, hw, sim's toolchain helpers (toolchain, verilog), host.errors
      ├── hw/      defs + Amaranth: a core never sees host, sim or boards
      └── host/    defs + numpy + pyserial: the host knows the device only through the protocol
            │
    ringkv.defs   the standard library only: configuration, protocol, record format,
                  numerics, hash and directory definitions shared by both sides

Every ``import`` and ``from ... import`` of every module counts, also those inside functions;
relative imports are resolved first. A violation fails with the file, the line and the rule.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: folder -> package name (pyproject.toml's package-dir mapping)
FOLDERS = {"ringkv/defs": "ringkv.defs", "hw": "ringkv.hw", "host": "ringkv.host",
           "sim": "ringkv.sim", "boards": "ringkv.boards", "serve": "ringkv.serve",
           "ringkv/cli": "ringkv.cli", "ringkv": "ringkv"}
#: layer -> (project packages it may import, third-party top-level modules it may import)
RULES = {
    "ringkv.defs": ({"ringkv.defs"}, set()),
    "ringkv.hw": ({"ringkv.defs", "ringkv.hw"}, {"amaranth"}),
    "ringkv.host": ({"ringkv.defs", "ringkv.host"}, {"numpy", "serial"}),
    "ringkv.sim": ({"ringkv.defs", "ringkv.hw", "ringkv.host", "ringkv.sim"}, None),
    "ringkv.boards": ({"ringkv.defs", "ringkv.hw", "ringkv.boards", "ringkv.sim.toolchain",
                       "ringkv.sim.verilog", "ringkv.host.errors"}, None),
    # the server: the host's scheduler and devices, the simulator harness for `--device sim`,
    # and its web stack; never the gateware (it knows a device through the host's driver)
    "ringkv.serve": ({"ringkv.defs", "ringkv.host", "ringkv.sim", "ringkv.serve"},
                     {"starlette", "uvicorn", "prometheus_client", "platformdirs", "numpy"}),
    # the command line (ringkv/cli/: one module per command) may use everything
    "ringkv.cli": (None, None),
    "ringkv": (None, None),
}
#: module -> project packages it may import besides its layer's: the pin-level harness of the
#: board top is the one simulation module that elaborates a board top (docs/BOARD.md).
EXCEPTIONS = {"ringkv.sim.board_harness": {"ringkv.boards"}}
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def _allowed(target: str, prefixes) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    for folder, package in sorted(FOLDERS.items(), key=lambda f: -len(f[0])):
        if rel.parts[:len(Path(folder).parts)] == Path(folder).parts:
            rest = rel.parts[len(Path(folder).parts):]
            stem = [] if rest[-1] == "__init__.py" else [rest[-1][:-3]]
            return ".".join([package, *rest[:-1], *stem])
    raise ValueError(f"{rel} is in no package folder")


def imports_of(source: str, module: str, is_package: bool):
    """``(line, imported module)`` of every import in ``source``, relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            # "from pkg import name" may import a submodule: check the dotted name
            out += [(node.lineno, f"{target}.{alias.name}") for alias in node.names]
    return out


def layer_of(module: str) -> str:
    return max((layer for layer in RULES if _allowed(module, {layer})), key=len)


def violations(path: Path, source: str | None = None) -> list[str]:
    """Every import of ``path`` (or of ``source`` as if it were ``path``) that breaks the rule."""
    module = module_name(path)
    layer = layer_of(module)
    project, third_party = RULES[layer]
    if project is not None:
        project = project | EXCEPTIONS.get(module, set())
    source = path.read_text() if source is None else source
    found = []
    for line, target in imports_of(source, module, path.name == "__init__.py"):
        top = target.split(".")[0]
        where = f"{path.relative_to(ROOT)}:{line} imports {target}"
        if top == "ringkv":
            if project is not None and not _allowed(target, project):
                found.append(f"{where}: {layer} may import only {sorted(project)} of ringkv")
        elif top == "bench":
            found.append(f"{where}: the package never imports the benchmarks")
        elif top not in STDLIB and third_party is not None and top not in third_party:
            found.append(f"{where}: {layer} may import only the standard library"
                         + (f" and {sorted(third_party)}" if third_party else ""))
    return found


def package_files():
    for folder in FOLDERS:
        yield from sorted((ROOT / folder).glob("*.py"))


def test_every_module_follows_the_layering_rule():
    found = [v for path in package_files() for v in violations(path)]
    assert not found, "layering violations:\n" + "\n".join(found)


def test_the_command_line_package_is_checked():
    """``ringkv/cli/`` is a package of its own: its modules are checked too (package_files
    globs each folder, not its subfolders)."""
    files = set(package_files())
    assert {ROOT / "ringkv/cli/__init__.py", ROOT / "ringkv/cli/entry.py",
            ROOT / "ringkv/cli/chat.py"} <= files
    assert layer_of(module_name(ROOT / "ringkv/cli/chat.py")) == "ringkv.cli"


def test_every_package_states_what_it_is_and_may_import():
    for folder in FOLDERS:
        doc = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text())) or ""
        assert "placeholder" not in doc and "import" in doc, \
            f"{folder}/__init__.py must say what the package is and what it may import"


@pytest.mark.parametrize("path, source, needle", [
    ("hw/top.py", "from ringkv.host.record import crc32\n", "ringkv.defs"),
    ("hw/top.py", "from ..host import ops\n", "ringkv.host.ops"),
    ("hw/dma.py", "def f():\n    import numpy\n", "standard library"),
    ("host/link.py", "from ringkv.hw.protocol import Op\n", "ringkv.hw.protocol"),
    ("host/record.py", "from amaranth.lib import crc\n", "numpy"),
    ("ringkv/defs/record.py", "import numpy as np\n", "standard library"),
    ("ringkv/defs/record.py", "from ..hw import enums\n", "ringkv.hw.enums"),
    ("boards/ulx3s.py", "from ringkv.sim.harness import build_top\n", "ringkv.sim.harness"),
    ("sim/harness.py", "from ringkv.boards.ulx3s import ULX3STop\n", "ringkv.boards"),
    ("serve/engine.py", "from ringkv.hw.top import RingKVTop\n", "ringkv.hw.top"),
    ("serve/app.py", "import aiohttp\n", "starlette"),
    ("host/scheduler.py", "from ringkv.serve.engine import Engine\n", "ringkv.serve"),
])
def test_the_check_catches_a_violation(path, source, needle):
    found = violations(ROOT / path, source)
    assert len(found) == 1 and needle in found[0], found


@pytest.mark.parametrize("path, source", [
    ("hw/top.py", "from amaranth import Module\nfrom ringkv.defs.protocol import Op\n"
                  "from .dma import DmaEngine\n"),
    ("host/link.py", "import serial\nimport numpy as np\nfrom .protocol import Decoder\n"),
    ("boards/build.py", "from ..sim.toolchain import setup_environ\n"),
    ("ringkv/cli/sim.py", "from ringkv.sim.harness import build_top\n"),
    ("ringkv/cli/build.py", "from ringkv.boards.build import main\nimport numpy\n"),
    ("sim/board_harness.py", "from ringkv.boards.ulx3s import ULX3STop\n"),
    ("serve/devices.py", "from ringkv.sim.harness import SimDevice\nimport platformdirs\n"),
])
def test_the_check_allows_what_the_rule_allows(path, source):
    assert violations(ROOT / path, source) == []


#: the test folders: a test module (``test_*.py``) imports shared code from a plain helper
#: module beside it (``top_helpers.py``, ``cli_helpers.py``, ...), never from another test
#: module (pytest would collect the imported module's tests under two names, and a change to
#: one test file would silently change another)
TEST_FOLDERS = ("tests", "tests/cocotb")


def imports_of_test_modules(source: str) -> list[str]:
    """The test modules ``source`` imports (top-level names beginning ``test_``)."""
    found = []
    for line, target in imports_of(source, "tests.x", False):
        parts = target.split(".")
        if any(p.startswith("test_") for p in parts[:2] if p != "tests"):
            found.append(f"line {line}: {target}")
    return found


def test_no_test_module_imports_another():
    found = [f"{path.relative_to(ROOT)} {hit}"
             for folder in TEST_FOLDERS for path in sorted((ROOT / folder).glob("*.py"))
             for hit in imports_of_test_modules(path.read_text())]
    assert not found, "a test module imports another:\n" + "\n".join(found)


@pytest.mark.parametrize("source, bad", [
    ("from test_software_device import SMALL\n", True),
    ("import test_golden_mac\n", True),
    ("def f():\n    from test_cli_misuse import ringkv\n", True),
    ("from softdev_helpers import SMALL\nfrom ringkv.host import test_vectors\n", False),
    ("import pytest\nfrom conftest import requires_yices\n", False),
])
def test_the_test_import_check_catches_one(source, bad):
    assert bool(imports_of_test_modules(source)) is bad
