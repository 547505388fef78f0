"""The layering rule of the package, checked on every module's imports (docs/ARCHITECTURE.md).

::

    ringkv (CLI)  ── may use everything
      │
      ├── serve/   defs, host, sim + its web stack (the OpenAI-compatible server)
      ├── sim/     defs, hw, host (simulation harness, device models, test helpers)
      ├── boards/  defs, hw, sim's toolchain helpers (toolchain, verilog), host.errors
      ├── hw/      defs + Amaranth: a core never sees host, sim or boards
      │     ├── link/, store/, attention/, seal/, sdram/  defs (+ shared hw.enums, hw.protocol;
      │     │               sdram/ and storage/ also link.skid, the register slice)
      │     ├── storage/    + the ports its DMA drives (ring port, token memory, MAC), the
      │     │               SDRAM user port (sdram.arbiter) of its SDRAM sector store and the
      │     │               hot tier (store.hot_tier) its tiered storage decides by
      │     └── commands/, top.py                  every subsystem
      └── host/    defs + numpy + pyserial: the host knows the device only through the protocol
            ├── golden/     defs only: independent models
            ├── record/     + golden.mac, keys, errors
            ├── model/      + golden, errors
            ├── device/     + golden, record, model, keys, errors (never the scheduler)
            └── scheduler   + device, model, errors
            │
    ringkv.defs   the standard library only: configuration, protocol, record format,
                  numerics, hash and directory definitions shared by both sides

Every ``import`` and ``from ... import`` of every module counts, also those inside functions;
relative imports are resolved first. A violation fails with the file, the line and the rule.
The import graph of the whole package has no cycle (:func:`test_no_import_cycles`).
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: folder -> package name (pyproject.toml's package-dir mapping)
FOLDERS = {"ringkv/defs": "ringkv.defs", "hw": "ringkv.hw", "host": "ringkv.host",
           "sim": "ringkv.sim", "boards": "ringkv.boards", "serve": "ringkv.serve",
           "ringkv": "ringkv"}
AMARANTH, HOST_3P = {"amaranth"}, {"numpy", "serial"}
#: layer -> (project packages it may import, third-party top-level modules it may import); a
#: module's layer is the longest layer name it falls under
RULES = {
    "ringkv.defs": ({"ringkv.defs"}, set()),
    # the gateware: the top (and the package's re-exports) sees every subsystem ...
    "ringkv.hw": ({"ringkv.defs", "ringkv.hw"}, AMARANTH),
    # ... the shared shapes see none
    "ringkv.hw.enums": ({"ringkv.defs"}, AMARANTH),
    "ringkv.hw.protocol": ({"ringkv.defs", "ringkv.hw.enums"}, AMARANTH),
    "ringkv.hw.link": ({"ringkv.defs", "ringkv.hw.link", "ringkv.hw.enums",
                        "ringkv.hw.protocol"}, AMARANTH),
    "ringkv.hw.store": ({"ringkv.defs", "ringkv.hw.store", "ringkv.hw.enums"}, AMARANTH),
    "ringkv.hw.attention": ({"ringkv.defs", "ringkv.hw.attention"}, AMARANTH),
    "ringkv.hw.seal": ({"ringkv.defs", "ringkv.hw.seal"}, AMARANTH),
    # the SDRAM controller: its own pieces and the definitions (chip table) only; the
    # self-test's command register slice is the link's (a module of Amaranth alone)
    "ringkv.hw.sdram": ({"ringkv.defs", "ringkv.hw.sdram", "ringkv.hw.enums",
                         "ringkv.hw.link.skid"}, AMARANTH),
    # the DMA drives the ring port, the token memory's read port and the MAC, the SDRAM
    # sector store an SDRAM controller's user port: their ports only; the tiered storage
    # holds the hot tier (card region -> SDRAM slot), the one block it routes by, and the
    # link's register slice on its read data (a module of Amaranth alone)
    "ringkv.hw.storage": ({"ringkv.defs", "ringkv.hw.storage", "ringkv.hw.enums",
                           "ringkv.hw.attention.ring_port", "ringkv.hw.store.token_memory",
                           "ringkv.hw.seal.mac", "ringkv.hw.sdram.arbiter",
                           "ringkv.hw.store.hot_tier", "ringkv.hw.link.skid"}, AMARANTH),
    "ringkv.hw.commands": ({"ringkv.defs", "ringkv.hw"}, AMARANTH),
    # the host: the package (scheduler) sees all of it; the rest in the order of the docstring
    "ringkv.host": ({"ringkv.defs", "ringkv.host"}, HOST_3P),
    "ringkv.host.errors": ({"ringkv.defs", "ringkv.host.errors"}, HOST_3P),
    "ringkv.host.keys": ({"ringkv.defs", "ringkv.host.errors"}, HOST_3P),
    "ringkv.host.golden": ({"ringkv.defs", "ringkv.host.golden"}, HOST_3P),
    "ringkv.host.record": ({"ringkv.defs", "ringkv.host.record", "ringkv.host.golden.mac",
                            "ringkv.host.keys", "ringkv.host.errors"}, HOST_3P),
    "ringkv.host.model": ({"ringkv.defs", "ringkv.host.model", "ringkv.host.golden",
                           "ringkv.host.errors"}, HOST_3P),
    "ringkv.host.device": ({"ringkv.defs", "ringkv.host.device", "ringkv.host.golden",
                            "ringkv.host.record", "ringkv.host.model", "ringkv.host.keys",
                            "ringkv.host.errors"}, HOST_3P),
    "ringkv.sim": ({"ringkv.defs", "ringkv.hw", "ringkv.host", "ringkv.sim"}, None),
    "ringkv.boards": ({"ringkv.defs", "ringkv.hw", "ringkv.boards", "ringkv.sim.toolchain",
                       "ringkv.sim.verilog", "ringkv.host.errors"}, None),
    # the server: the host's scheduler and devices, the simulator harness for `--device sim`,
    # and its web stack; never the gateware (it knows a device through the host's driver)
    "ringkv.serve": ({"ringkv.defs", "ringkv.host", "ringkv.sim", "ringkv.serve"},
                     {"starlette", "uvicorn", "prometheus_client", "platformdirs", "numpy",
                      # starlette's own async layer (its task group imported at start)
                      "anyio",
                      # --valkey: the shared index's client, the forwarding HTTP client
                      "valkey", "httpx",
                      # --kv-events: vLLM's wire (ZMQ, msgpack through msgspec)
                      "zmq", "msgspec"}),
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
    """Every module of the package: each folder of :data:`FOLDERS` and its subpackages (a
    folder that is another entry of :data:`FOLDERS` is that entry's)."""
    others = {ROOT / f for f in FOLDERS}
    for folder in FOLDERS:
        yield from _package_files(ROOT / folder, others)


def _package_files(folder: Path, others):
    yield from sorted(folder.glob("*.py"))
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if sub not in others and (sub / "__init__.py").exists():
            yield from _package_files(sub, others)


def subpackages():
    """Every package folder under the :data:`FOLDERS` (the folders themselves included)."""
    return sorted({p.parent for p in package_files() if p.name == "__init__.py"})


def test_every_module_follows_the_layering_rule():
    found = [v for path in package_files() for v in violations(path)]
    assert not found, "layering violations:\n" + "\n".join(found)


def test_subpackages_are_checked():
    """The modules of subpackages (``hw/storage/``, ``host/device/``, ``ringkv/cli/``, ...) are
    checked too, each under its own layer."""
    files = set(package_files())
    assert {ROOT / "ringkv/cli/__init__.py", ROOT / "ringkv/cli/entry.py",
            ROOT / "hw/storage/dma.py", ROOT / "host/device/fpga.py",
            ROOT / "host/record/codec.py"} <= files
    assert layer_of(module_name(ROOT / "ringkv/cli/chat.py")) == "ringkv.cli"
    assert layer_of(module_name(ROOT / "hw/storage/dma.py")) == "ringkv.hw.storage"


def test_every_package_states_what_it_is_and_may_import():
    for folder in subpackages():
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        assert "placeholder" not in doc and "import" in doc, \
            f"{folder.relative_to(ROOT)}/__init__.py must say what the package is and what it " \
            "may import"


def test_every_subpackage_has_a_rule():
    """A new subpackage of ``hw/`` or ``host/`` states its place in :data:`RULES`."""
    missing = [module_name(f / "__init__.py") for f in subpackages()
               if f.parent in (ROOT / "hw", ROOT / "host")
               and module_name(f / "__init__.py") not in RULES]
    assert not missing, f"subpackages without a layering rule: {missing}"


# --- no import cycles ------------------------------------------------------------------------

def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """``{module: {project modules it imports}}`` for ``sources`` (``{module: (source,
    is_package)}``); an imported name resolves to the longest module of ``sources`` it names
    (``from ringkv.hw.storage.port import StorageOp`` -> ``ringkv.hw.storage.port``)."""
    graph = {}
    for module, (source, is_package) in sources.items():
        edges = set()
        for _, target in imports_of(source, module, is_package):
            parts = target.split(".")
            for i in range(len(parts), 0, -1):
                name = ".".join(parts[:i])
                if name in sources:
                    if name != module:
                        edges.add(name)
                    break
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None``."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def package_sources():
    return {module_name(p): (p.read_text(), p.name == "__init__.py") for p in package_files()}


def test_no_import_cycles():
    """No module imports itself through others, counting every import (also those inside
    functions: a lazy import that breaks a cycle at run time still ties the two modules)."""
    cycle = find_cycle(import_graph(package_sources()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_check_catches_one():
    sources = package_sources()
    source, is_package = sources["ringkv.host.device.interface"]
    sources["ringkv.host.device.interface"] = (
        source + "\nfrom ringkv.host.scheduler import Scheduler\n", is_package)
    cycle = find_cycle(import_graph(sources))
    assert cycle and "ringkv.host.scheduler" in cycle and "ringkv.host.device.interface" in cycle


@pytest.mark.parametrize("path, source, needle", [
    ("hw/top.py", "from ringkv.host.record import crc32\n", "ringkv.defs"),
    ("hw/top.py", "from ..host import ops\n", "ringkv.host.ops"),
    ("hw/storage/dma.py", "def f():\n    import numpy\n", "standard library"),
    ("host/device/link.py", "from ringkv.hw.protocol import Op\n", "ringkv.hw.protocol"),
    ("host/golden/hash.py", "from amaranth.lib import crc\n", "numpy"),
    ("ringkv/defs/record.py", "import numpy as np\n", "standard library"),
    ("ringkv/defs/record.py", "from ..hw import enums\n", "ringkv.hw.enums"),
    ("boards/ulx3s.py", "from ringkv.sim.harness import build_top\n", "ringkv.sim.harness"),
    ("sim/harness.py", "from ringkv.boards.ulx3s import ULX3STop\n", "ringkv.boards"),
    ("serve/engine.py", "from ringkv.hw.top import RingKVTop\n", "ringkv.hw.top"),
    ("serve/app.py", "import aiohttp\n", "starlette"),
    ("host/scheduler.py", "from ringkv.serve.engine import Engine\n", "ringkv.serve"),
    # between the gateware's subsystems
    ("hw/attention/core.py", "from ..storage.dma import DmaEngine\n", "ringkv.hw.storage.dma"),
    ("hw/attention/lane.py", "from ringkv.hw.enums import shaped\n", "ringkv.hw.enums"),
    ("hw/link/framing.py", "from ..store.hash_engine import HashEngine\n", "ringkv.hw.store"),
    ("hw/store/directory.py", "from ..seal.mac import MacCore\n", "ringkv.hw.seal.mac"),
    ("hw/seal/mac.py", "from ..storage.port import StorageOp\n", "ringkv.hw.storage.port"),
    ("hw/storage/dma.py", "from ..attention.core import AttentionCore\n",
     "ringkv.hw.attention.core"),
    ("hw/storage/dma.py", "from ..commands.dispatch import Dispatcher\n", "ringkv.hw.commands"),
    ("hw/storage/sdphy.py", "from ..store import HashEngine\n", "ringkv.hw.store.HashEngine"),
    ("hw/storage/tiered.py", "from ..store.directory import CacheDirectory\n",
     "ringkv.hw.store.directory"),
    ("hw/enums.py", "from .top import RingKVTop\n", "ringkv.hw.top"),
    # between the host's parts
    ("host/golden/fixed.py", "from ..model.transformer import Model\n", "ringkv.host.model"),
    ("host/golden/mac.py", "from ..errors import UsageError\n", "ringkv.host.errors"),
    ("host/device/software.py", "from ..scheduler import Scheduler\n",
     "ringkv.host.scheduler"),
    ("host/model/transformer.py", "from ..device.ops import pack_attn\n",
     "ringkv.host.device.ops"),
    ("host/keys.py", "from .golden.mac import mac\n", "ringkv.host.golden.mac"),
])
def test_the_check_catches_a_violation(path, source, needle):
    found = violations(ROOT / path, source)
    assert len(found) == 1 and needle in found[0], found


@pytest.mark.parametrize("path, source", [
    ("hw/top.py", "from amaranth import Module\nfrom ringkv.defs.protocol import Op\n"
                  "from .storage.dma import DmaEngine\n"),
    ("hw/storage/dma.py", "from ..attention.ring_port import RingPortSignature\n"
                          "from ..store.token_memory import TokenReadSignature\n"
                          "from ..seal.mac import MacPortSignature\nfrom ..enums import shaped\n"),
    ("hw/commands/recovery.py", "from ..storage.dma import DmaOp\nfrom ..store import Op\n"),
    ("hw/storage/tiered.py", "from ..store.hot_tier import HotTier, Op\n"),
    ("hw/link/framing.py", "from ..protocol import CRC16\n"),
    ("host/device/link.py", "import serial\nimport numpy as np\nfrom .frames import Decoder\n"),
    ("host/device/software.py", "from ..record import encode_record\n"
                                "from ..golden.hash import prefix_hashes\n"
                                "from ..model.transformer import Float64Backend\n"),
    ("host/scheduler.py", "from .device.software import SoftwareDevice\n"),
    ("boards/build.py", "from ..sim.toolchain import setup_environ\n"),
    ("ringkv/cli/sim.py", "from ringkv.sim.harness import build_top\n"),
    ("ringkv/cli/build.py", "from ringkv.boards.build import main\nimport numpy\n"),
    ("sim/board_harness.py", "from ringkv.boards.ulx3s import ULX3STop\n"),
    ("serve/devices.py", "from ringkv.sim.harness import SimDevice\nimport platformdirs\n"),
])
def test_the_check_allows_what_the_rule_allows(path, source):
    assert violations(ROOT / path, source) == []


#: the test tree: a test module (``test_*.py``) imports shared code from a plain helper
#: module in tests/ (``top_helpers.py``, ``cli_helpers.py``, ...), never from another test
#: module (pytest would collect the imported module's tests under two names, and a change to
#: one test file would silently change another)
def _test_tree_files():
    return sorted((ROOT / "tests").rglob("*.py"))


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
             for path in _test_tree_files() for hit in imports_of_test_modules(path.read_text())]
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
