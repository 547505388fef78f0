"""The ``ringkv`` commands run as a user runs them (subprocesses), over a table of misuse.

For every case: the exit status, one ``ringkv: ...`` line on standard error (and at most one
``hint:`` line), no traceback, no child process left behind, and no file changed (each file
handed to the command is hashed before and after). The cases that need a simulated device share
one Verilator build (the demo's device, ``ringkv sim --config demo``: the build ``make demo``
makes) and one running simulator for the module.
"""

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import CFG, assert_clean_failure, cli_env, mentioning, ringkv

from ringkv.defs.record import SECTOR, RecordLayout
from ringkv.host.errors import ExitCode
from ringkv.host.record import encode_header, encode_record

ROOT = Path(__file__).resolve().parents[2]


def _have_sim() -> bool:
    from ringkv.sim.toolchain import have_verilator
    return have_verilator()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _digest(path: Path) -> str | None:
    if path.is_dir():
        return "dir"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def _demo_image(path: Path):
    """A card image as the demo's device writes it: two records, one superseded."""
    lay = RecordLayout(CFG)
    img = bytearray(4 * lay.sectors_per_region * SECTOR)
    rings = np.zeros((CFG.layers, CFG.kv_heads, 2, CFG.window, CFG.head_dim), np.uint8)
    for region, (seq, h) in enumerate([(1, 5), (2, 5)]):
        for off, data in encode_record(CFG, list(range(10)), rings, count=10, ring_head=9,
                                       prefix_hash=h, commit_seq=seq):
            at = (region * lay.sectors_per_region + off) * SECTOR
            img[at:at + len(data)] = data
    path.write_bytes(img)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("files")
    f = {"demo": _demo_image(tmp / "demo.img"), "empty": tmp / "empty.img",
         "text": tmp / "notes.txt", "random": tmp / "random.img", "trunc": tmp / "trunc.img",
         "hostile": tmp / "hostile.img", "dir": tmp / "a-directory",
         "missing": tmp / "no-such.img", "nodir": tmp / "no-such-folder"}
    f["empty"].write_bytes(b"")
    f["text"].write_text("RingKV notes\n" * 100)
    f["random"].write_bytes(np.random.default_rng(1).bytes(64 * SECTOR))
    f["trunc"].write_bytes(f["demo"].read_bytes()[:3000])
    f["dir"].mkdir()
    # hostile: a header with a good CRC whose fields claim a huge record, and one whose
    # config fields are absurd (65535 layers)
    header = bytearray(encode_header(CFG, count=10, ring_head=9, prefix_hash=1, commit_seq=1,
                                     payload_crc=0))
    header[56:60] = (0xFFFFFFFF).to_bytes(4, "little")
    import zlib
    header[508:512] = zlib.crc32(bytes(header[:508])).to_bytes(4, "little")
    img = bytearray(f["demo"].read_bytes())
    img[:SECTOR] = header
    f["hostile"].write_bytes(img)
    return f


# -- without a simulator: bad values, wrong and hostile files, unreachable links ---------------

CASES = [
    # (id, args, exit status, part of the message)
    ("unknown command", ["frobnicate"], ExitCode.USAGE, "invalid choice"),
    ("chunk not a number", ["demo", "--software", "--chunk", "x"], ExitCode.USAGE, "--chunk"),
    ("chunk zero", ["demo", "--software", "--chunk", "0"], ExitCode.USAGE, "positive"),
    ("demo sdram software", ["demo", "--software", "--sdram"], ExitCode.USAGE,
     "--sdram goes with the simulated demo"),
    ("demo sdram board", ["demo", "--board", "ulx3s-85f", "--sdram"], ExitCode.USAGE,
     "--sdram is not available with --board"),
    ("chat tokens zero", ["chat", "--tokens", "0"], ExitCode.USAGE, "--tokens"),
    ("chat timeout negative", ["chat", "--timeout", "-1"], ExitCode.USAGE, "--timeout"),
    ("demo image without software", ["demo", "--image", "{demo}"], ExitCode.USAGE, "--image"),
    ("tokenizer unknown option", ["tokenizer", "--bogus"], ExitCode.USAGE, "--bogus"),
    ("storage without image", ["storage", "fsck"], ExitCode.USAGE, "IMAGE"),
    ("storage ls --repair", ["storage", "ls", "{demo}", "--repair"], ExitCode.USAGE,
     "--repair"),
    ("storage bad regions", ["storage", "ls", "{demo}", "--regions", "0"], ExitCode.USAGE,
     "--regions"),
    ("storage bad config", ["storage", "ls", "{demo}", "--config", "[1"], ExitCode.USAGE,
     "--config"),
    ("sim bad port", ["sim", "--port", "70000", "--image", "{missing}"], ExitCode.USAGE,
     "--port"),
    ("sim bad top", ["sim", "--top", "[1]", "--image", "{missing}"], ExitCode.USAGE, "--top"),
    ("sim sealed contradicts top", ["sim", "--sealed", "--top", '{{"sealed": false}}', "--image",
                                    "{missing}"], ExitCode.USAGE, "--sealed contradicts"),
    ("sim top sealed not a bool", ["sim", "--top", '{{"sealed": 1}}', "--image", "{missing}"],
     ExitCode.USAGE, '"sealed" is true or false'),
    ("sim sealed board", ["sim", "--board", "ulx3s-85f", "--sealed", "--image", "{missing}"],
     ExitCode.USAGE, "--sealed is not available with --board"),
    ("sim unknown sdram part", ["sim", "--sdram", "NOPE", "--image", "{missing}"],
     ExitCode.USAGE, "Unknown SDRAM chip 'NOPE'"),
    ("storage info of an image", ["storage", "info", "{demo}"], ExitCode.USAGE,
     "info needs --link"),
    ("board without check", ["board"], ExitCode.USAGE, "board check"),
    ("board check bad pings", ["board", "check", "--link", "loop://", "--ping-sizes", "x"],
     ExitCode.USAGE, "--ping-sizes"),
    ("storage missing file", ["storage", "ls", "{missing}"], ExitCode.USAGE, "cannot read"),
    ("storage directory", ["storage", "fsck", "{dir}"], ExitCode.USAGE, "directory"),
    ("storage empty file", ["storage", "fsck", "{empty}"], ExitCode.NOT_A_CARD, "empty"),
    ("storage text file", ["storage", "fsck", "{text}"], ExitCode.NOT_A_CARD,
     "not a whole number"),
    ("storage random file", ["storage", "ls", "{random}"], ExitCode.NOT_A_CARD,
     "not a RingKV card image"),
    ("storage truncated", ["storage", "fsck", "{trunc}"], ExitCode.NOT_A_CARD, "truncated"),
    ("storage other layout", ["storage", "ls", "{demo}", "--config", "default"],
     ExitCode.CONFIG, "another region layout"),
    ("weights missing", ["chat", "--weights", "{missing}"], ExitCode.USAGE, "cannot read"),
    ("weights text file", ["chat", "--weights", "{text}"], ExitCode.CONFIG, "do not fit"),
    ("sim on a text file", ["sim", "--image", "{text}", "--config", "demo"],
     ExitCode.NOT_A_CARD, "not a RingKV card image"),
    ("sim on a random file", ["sim", "--image", "{random}", "--config", "demo"],
     ExitCode.NOT_A_CARD, "not a RingKV card image"),
    ("sim on another config's image", ["sim", "--image", "{demo}"], ExitCode.CONFIG,
     "another configuration"),
    ("sim on a directory", ["sim", "--image", "{dir}"], ExitCode.USAGE, "directory"),
    ("chat unreachable link", ["chat", "--config", "demo", "--link", "socket://127.0.0.1:{port}"],
     ExitCode.LINK, "Connection refused"),
    ("chat no such serial port", ["chat", "--link", "/dev/ttyRINGKV-NONE"], ExitCode.LINK,
     "No such file"),
    ("fsck unreachable link", ["storage", "fsck", "--link", "socket://127.0.0.1:{port}"],
     ExitCode.LINK, "cannot open"),
    ("storage info unreachable link", ["storage", "info", "--link",
                                       "socket://127.0.0.1:{port}"], ExitCode.LINK,
     "cannot open"),
    ("board check unreachable", ["board", "check", "--link", "socket://127.0.0.1:{port}"],
     ExitCode.LINK, "cannot open"),
]


@pytest.mark.parametrize("args,code,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_misuse(args, code, message, files, tmp_path):
    port = _closed_port()
    args = [a.format(port=port, **files) for a in args]
    before = {k: _digest(p) for k, p in files.items()}
    r = ringkv(args, tmp_path)
    assert_clean_failure(r, code, tmp_path, message=message)
    assert {k: _digest(p) for k, p in files.items()} == before, "a file was changed"
    assert not files["missing"].exists()


# -- refused before anything is built, started or written ---------------------------------------

BEFORE_ANYTHING = [
    # (id, args, exit status, part of the message); {build}: the build folder of the test
    # (RINGKV_BUILD, and --build-dir below it), which must not come into being
    ("build clock zero", ["build", "--sys-mhz", "0", "--build-dir", "{build}/b"],
     ExitCode.USAGE, "--sys-mhz must be positive, not 0"),
    ("build clock negative", ["build", "--sys-mhz", "-40", "--build-dir", "{build}/b"],
     ExitCode.USAGE, "--sys-mhz must be positive"),
    ("build regions not a power of two", ["build", "--regions", "3", "--build-dir", "{build}/b"],
     ExitCode.USAGE, "--regions must be a power of two"),
    ("build constraint below the clock", ["build", "--sys-mhz", "40", "--constrain-mhz", "30",
                                          "--build-dir", "{build}/b"],
     ExitCode.USAGE, "--constrain-mhz 30 is below the system clock"),
    ("build nextpnr option the build sets", ["build", "--nextpnr-opt", "--seed 3",
                                             "--build-dir", "{build}/b"],
     ExitCode.USAGE, "the build sets --seed itself"),
    ("build nextpnr option not an option", ["build", "--nextpnr-opt", "router2",
                                            "--build-dir", "{build}/b"],
     ExitCode.USAGE, "give a nextpnr option starting with --"),
    ("sim top unknown key", ["sim", "--config", "demo", "--top", '{{"regoins": 2}}', "--image",
                             "{missing}"], ExitCode.USAGE, "regoins"),
    ("sim top bad value", ["sim", "--config", "demo", "--top", '{{"regions": 3}}', "--image",
                           "{missing}"], ExitCode.USAGE, "regions must be a power of two"),
    ("sim board top unknown key", ["sim", "--board", "ulx3s-85f", "--config", "demo", "--top",
                                   '{{"regoins": 2}}', "--image", "{missing}"],
     ExitCode.USAGE, "regoins"),
    ("sim cut-after negative", ["sim", "--config", "demo", "--cut-after", "-1", "--image",
                                "{missing}"], ExitCode.USAGE, "--cut-after"),
    ("sim board cut-after negative", ["sim", "--board", "ulx3s-85f", "--config", "demo",
                                      "--cut-after", "-1", "--image", "{missing}"],
     ExitCode.USAGE, "--cut-after"),
    ("sim image in a missing folder", ["sim", "--config", "demo", "--image",
                                       "{nodir}/card.img"], ExitCode.USAGE, "no folder"),
    ("sim create in a missing folder", ["sim", "--config", "demo", "--create", "--image",
                                        "{nodir}/card.img"], ExitCode.USAGE, "no folder"),
    ("sim board image in a missing folder", ["sim", "--board", "ulx3s-85f", "--config", "demo",
                                             "--image", "{nodir}/card.img"],
     ExitCode.USAGE, "no folder"),
    ("demo seed negative", ["demo", "--seed", "-1"], ExitCode.USAGE, "--seed"),
    ("demo software seed negative", ["demo", "--software", "--random", "--seed", "-1"],
     ExitCode.USAGE, "--seed"),
    ("chat random seed negative", ["chat", "--random", "--random-seed", "-1"], ExitCode.USAGE,
     "--random-seed"),
    ("demo weights missing", ["demo", "--weights", "{missing}"], ExitCode.USAGE,
     "cannot read the weights"),
    ("demo weights a directory", ["demo", "--weights", "{dir}"], ExitCode.USAGE,
     "cannot read the weights"),
    # the simulated demo reads none of the software demo's model and store options: one given
    # is refused rather than silently ignored
    ("demo weights without software", ["demo", "--weights", "{text}"], ExitCode.USAGE,
     "--weights goes with --software"),
    ("demo chunk and capacity without software", ["demo", "--chunk", "8", "--capacity", "3"],
     ExitCode.USAGE, "--chunk, --capacity go with --software"),
    ("demo seed without software", ["demo", "--seed", "3"], ExitCode.USAGE,
     "--seed goes with --software"),
    ("demo backend without software", ["demo", "--backend", "fixed"], ExitCode.USAGE,
     "--backend goes with --software"),
]


@pytest.mark.parametrize("args,code,message", [c[1:] for c in BEFORE_ANYTHING],
                         ids=[c[0] for c in BEFORE_ANYTHING])
def test_refused_before_anything(args, code, message, files, tmp_path):
    """Bad options end the command before it builds, starts or writes anything: the error
    (and a hint) alone on standard error, nothing on standard output, no build folder, no
    temporary file, no file changed. (Unchecked, each of these elaborated or verilated first,
    or failed with a traceback; the timeout keeps such a run short.)"""
    build = tmp_path / "build"
    args = [a.format(build=build, **files) for a in args]
    before = {k: _digest(p) for k, p in files.items()}
    r = ringkv(args, tmp_path, env={"RINGKV_BUILD": str(build)}, timeout=120)
    assert_clean_failure(r, code, tmp_path, message=message)
    assert r.stdout == "" and all(x.startswith(("ringkv: ", "  hint: "))
                                  for x in r.stderr.splitlines() if x.strip()), r.stderr
    assert not build.exists(), "a build was started"
    assert list((tmp_path / "tmp").iterdir()) == [], "a temporary file was left"
    assert {k: _digest(p) for k, p in files.items()} == before, "a file was changed"
    assert not files["nodir"].exists()


def test_storage_options_anywhere(files, tmp_path):
    """``storage``'s options go before, between or after its positionals, as argparse users
    expect: each order lists the same."""
    image = str(files["demo"])
    outs = []
    for args in (["storage", "ls", "--config", "demo", image],
                 ["storage", "--config", "demo", "ls", image],
                 ["storage", "ls", image, "--config", "demo"],
                 ["storage", "ls", "--all", "--config", "demo", image]):
        r = ringkv(args, tmp_path)
        assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
        assert " live " in r.stdout and " superseded " in r.stdout, r.stdout
        outs.append([x for x in r.stdout.splitlines() if not x.startswith("scanned in ")])
    assert outs[0] == outs[1] == outs[2] != outs[3]        # --all: the empty regions too
    assert "configuration as given (--config)" in outs[0][0], outs[0]
    r = ringkv(["storage", "fsck", "--regions", "2", image], tmp_path)
    assert r.returncode == 0 and "clean" in r.stdout, r.stdout + r.stderr
    r = ringkv(["storage", "ls", "--config", "demo", image, "extra"], tmp_path)
    assert_clean_failure(r, ExitCode.USAGE, tmp_path, message="unrecognized arguments: extra")


def test_board_help(tmp_path):
    """``ringkv board --help`` prints its help (the ``check`` action) and exits 0, as
    ``board check --help`` does."""
    for args in (["board", "--help"], ["board", "-h"]):
        r = ringkv(args, tmp_path)
        assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
        assert r.stdout.startswith("usage: ringkv board") and "check" in r.stdout, r.stdout
    r = ringkv(["board", "check", "--help"], tmp_path)
    assert r.returncode == 0 and "--link" in r.stdout, r.stdout + r.stderr


def test_storage_tells_the_truth(files, tmp_path):
    """The demo's image: clean (a superseded record is normal); a hostile header: repairable,
    and fsck changes nothing without --repair; with it, the header is erased and fsck is
    clean."""
    r = ringkv(["storage", "fsck", str(files["demo"])], tmp_path)
    assert r.returncode == 0 and "clean" in r.stdout and "superseded" in r.stdout, r.stdout
    assert "from its records" in r.stdout
    r = ringkv(["storage", "ls", str(files["demo"])], tmp_path)
    assert r.returncode == 0 and " live " in r.stdout and " superseded " in r.stdout
    hostile = tmp_path / "hostile.img"
    hostile.write_bytes(files["hostile"].read_bytes())
    before = _digest(hostile)
    r = ringkv(["storage", "fsck", str(hostile)], tmp_path)
    assert r.returncode == 1 and "repairable: 1 corrupt" in r.stdout, r.stdout + r.stderr
    assert _digest(hostile) == before
    r = ringkv(["storage", "fsck", str(hostile), "--repair"], tmp_path)
    assert r.returncode == 0 and "repaired" in r.stdout, r.stdout + r.stderr
    assert ringkv(["storage", "fsck", str(hostile)], tmp_path).returncode == 0


def test_interrupted_software_chat_keeps_nothing_running(tmp_path):
    """SIGTERM to a waiting chat: exit 130, one line."""
    (tmp_path / "tmp").mkdir()
    p = subprocess.Popen([sys.executable, "-m", "ringkv", "chat", "--config", "demo"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path, env=cli_env(tmp_path))
    p.stdin.write("In the beginning\n")
    p.stdin.flush()
    assert "[default first" in _read_until(p, "[default")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert_clean_failure(r, ExitCode.INTERRUPTED, tmp_path, message="interrupted")


def _read_until(p, marker: str, timeout: float = 300.0) -> str:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen += line
        if marker in line:
            return line
    raise AssertionError(f"no {marker!r} in {seen!r}")


# -- with the simulated device: port in use, a killed simulator, Ctrl-C -----------------------

needs_sim = pytest.mark.skipif(not _have_sim(), reason="Verilator (the tools extra) missing")


@pytest.fixture(scope="module")
def built():
    """The demo's device, built once (the same build as ``make demo``)."""
    from ringkv.sim.harness import DEMO_TOP, build_top
    build_top(CFG, **DEMO_TOP)
    return True


def _as_at_a_terminal():
    """``preexec_fn``: Ctrl-C and SIGTERM at their defaults, as in a terminal's foreground job.
    A child inherits an ignored SIGINT (Python then keeps it ignored), and a pytest-xdist
    worker may run with SIGINT ignored: the command under test would never see the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _start_sim(tmp: Path, image: Path, *extra):
    (tmp / "tmp").mkdir(exist_ok=True)
    p = subprocess.Popen([sys.executable, "-m", "ringkv", "sim", "--config", "demo",
                          "--image", str(image), *extra], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp, env=cli_env(tmp),
                         start_new_session=True, preexec_fn=_as_at_a_terminal)
    line = _read_until(p, "RINGKV-SIM listening on ")
    return p, line.split()[-1]


@needs_sim
def test_sim_port_in_use(built, tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        image = tmp_path / "card.img"
        r = ringkv(["sim", "--config", "demo", "--port", str(port), "--image", str(image)],
                   tmp_path)
    assert_clean_failure(r, ExitCode.LINK, tmp_path, message="cannot listen")
    assert not image.exists()


@needs_sim
def test_sim_interrupted_and_terminated(built, tmp_path):
    """SIGINT to ``ringkv sim`` alone, Ctrl-C at a terminal (SIGINT to its whole process
    group, the simulator included) and SIGTERM: exit 130, one line, its simulator gone; it
    printed the image path; the image is reused each time."""
    image = tmp_path / "card.img"
    for sig, kill in ((signal.SIGINT, os.kill), (signal.SIGINT, os.killpg),
                      (signal.SIGTERM, os.kill)):
        p, url = _start_sim(tmp_path, image)
        assert url.startswith("socket://127.0.0.1:")
        kill(p.pid, sig)
        out, err = p.communicate(timeout=60)
        r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
        assert f"image {image}" in err
        assert "building" not in err            # the demo's build, reused without elaborating
        err = "\n".join(x for x in err.splitlines() if not x.startswith("ringkv sim: image"))
        assert_clean_failure(subprocess.CompletedProcess(p.args, p.returncode, out, err),
                             ExitCode.INTERRUPTED, tmp_path, message="interrupted")
        assert r.returncode == ExitCode.INTERRUPTED


@needs_sim
def test_chat_survives_a_killed_simulator(built, tmp_path):
    """chat over the link: the simulator is killed mid-conversation; the request ends
    cleanly, chat keeps the conversation and reconnects by itself to the simulator started
    again on the same image, which resumes the session from storage (a hit); chat started
    again later resumes it too, without extra flags."""
    image = tmp_path / "card.img"
    sim, url = _start_sim(tmp_path, image)
    port = url.rsplit(":", 1)[1]
    chat = subprocess.Popen([sys.executable, "-m", "ringkv", "chat", "--config", "demo",
                             "--link", url, "--tokens", "3", "--timeout", "30"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=cli_env(tmp_path))
    try:
        chat.stdin.write("/session\n/bogus\nAnd God said\n")
        chat.stdin.flush()
        assert "[default first" in _read_until(chat, "[default first")
        os.killpg(sim.pid, signal.SIGKILL)                 # the simulator dies
        sim.wait()
        chat.stdin.write("Let there be light\n")
        chat.stdin.flush()
        assert "link dropped" in _read_until(chat, "link dropped")
        sim, url2 = _start_sim(tmp_path, image, "--port", port)
        chat.stdin.write("/retry\n")
        chat.stdin.flush()
        assert "[reconnected" in _read_until(chat, "[reconnected")
        line = _read_until(chat, "[default ")
        assert line.startswith("[default hit "), line
        chat.stdin.write("/quit\n")
        out, err = chat.communicate(timeout=120)
        assert chat.returncode == 0 and "Traceback" not in out + err, out + err
        # started again: the conversation resumes (the state is in XDG_STATE_HOME)
        r = ringkv(["chat", "--config", "demo", "--link", url2, "--tokens", "2"], tmp_path,
                   stdin="and there was light\n")
        assert r.returncode == 0, r.stdout + r.stderr
        assert "Resumed sessions: default." in r.stdout
        assert "[default hit " in r.stdout, r.stdout
    finally:
        if chat.poll() is None:
            chat.kill()
        os.killpg(sim.pid, signal.SIGTERM)
        sim.communicate(timeout=60)
    assert not mentioning(str(tmp_path))
    r = ringkv(["storage", "fsck", str(image)], tmp_path)
    assert r.returncode in (0, 1) and "from its records" in r.stdout, r.stdout + r.stderr


@needs_sim
def test_demo_interrupted_leaves_nothing(built, tmp_path):
    """Ctrl-C during ``ringkv demo``: exit 130, no simulator left, its temp dir removed."""
    (tmp_path / "tmp").mkdir()
    p = subprocess.Popen([sys.executable, "-m", "ringkv", "demo"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=cli_env(tmp_path),
                         start_new_session=True, preexec_fn=_as_at_a_terminal)
    _read_until(p, "device A up")
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    r = subprocess.CompletedProcess(p.args, p.returncode, "", err.splitlines()[-1] + "\n")
    assert_clean_failure(r, ExitCode.INTERRUPTED, tmp_path, message="interrupted")
    assert "Traceback" not in out + err
    assert list((tmp_path / "tmp").iterdir()) == []


def test_help_documents_exit_codes(tmp_path):
    r = ringkv(["--help"], tmp_path)
    assert r.returncode == 0 and "exit status:" in r.stdout and "130" in r.stdout
    r = ringkv(["--version"], tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("ringkv ")


def test_sim_image_check(files, tmp_path):
    """What ``ringkv sim`` accepts as its image, and what it refuses (changing nothing):
    images its own device writes after a power cut at any point are accepted."""
    from ringkv.host.errors import ConfigError, NotACardImage, UsageError
    from ringkv.sim.harness import DEMO_TOP, _sectors, check_image
    from ringkv.sim.storage_faults import torn_header
    sectors = _sectors(CFG, DEMO_TOP)
    lay = RecordLayout(CFG)
    demo = files["demo"].read_bytes()
    writes = encode_record(CFG, list(range(10)), np.zeros(
        (CFG.layers, CFG.kv_heads, 2, CFG.window, CFG.head_dim), np.uint8), count=10,
        ring_head=9, prefix_hash=3, commit_seq=7)
    payload_only = bytearray(2 * lay.sectors_per_region * SECTOR)
    for off, data in writes[:-1]:                         # cut before the header
        payload_only[off * SECTOR:off * SECTOR + len(data)] = data
    torn = bytearray(payload_only)
    torn[:SECTOR] = torn_header(writes[-1][1], 5, 0)      # cut 5 bytes into the header
    accepted = {"missing": None, "empty": b"", "blank": bytes(sectors * SECTOR),
                "erased": b"\xff" * (4 * SECTOR), "demo": demo[:sectors * SECTOR],
                "payload only": bytes(payload_only), "torn header": bytes(torn)}
    for name, content in accepted.items():
        path = tmp_path / f"{name}.img"
        if content is not None:
            path.write_bytes(content)
        assert check_image(path, CFG, sectors), name
        assert (path.read_bytes() == content) if content is not None else not path.exists()
    refused = {"text": (files["text"], NotACardImage), "random": (files["random"],
                                                                   NotACardImage),
               "directory": (files["dir"], UsageError)}
    bigger = tmp_path / "bigger.img"
    bigger.write_bytes(demo[:sectors * SECTOR] + bytes(lay.sectors_per_region * SECTOR))
    refused["larger than the device's storage"] = (bigger, NotACardImage)
    for name, (path, error) in refused.items():
        before = _digest(path)
        with pytest.raises(error):
            check_image(path, CFG, sectors)
        assert _digest(path) == before, name
    from ringkv.defs.config import TRAINED_CONFIG
    with pytest.raises(ConfigError, match="another configuration"):
        check_image(files["demo"], TRAINED_CONFIG, 10 ** 6)


def test_sim_demo_uses_the_demos_build():
    """``ringkv sim --config demo`` builds the demo's device: one cache key for both."""
    from ringkv.defs.config import named_config
    from ringkv.sim import system_demo
    from ringkv.sim.harness import DEMO_TOP, build_key
    assert DEMO_TOP == {"regions": system_demo.REGIONS, "lanes": system_demo.LANES,
                        "macs": system_demo.MACS}
    assert named_config("demo") == CFG
    assert build_key(CFG, DEMO_TOP) == build_key(named_config("demo"), dict(DEMO_TOP))
    assert build_key(CFG, DEMO_TOP) != build_key(CFG, {**DEMO_TOP, "regions": 4})


def test_debug_shows_the_traceback(files, tmp_path):
    for args in (["--debug", "storage", "fsck", str(files["random"])],
                 ["storage", "fsck", str(files["random"]), "--debug"]):
        r = ringkv(args, tmp_path)
        assert r.returncode != 0 and "Traceback" in r.stderr and "NotACardImage" in r.stderr
