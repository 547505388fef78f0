"""The ULX3S board top at its pins on Verilator (``ringkv.sim.board_harness``): cocotbext-uart
as the line partner, the LEDs, and ``ringkv board check`` over the socket bridge. The top is
the bitstream's default (the 60 MHz system clock, so the SDRAM controller takes read data an
edge later, ``read_delay`` 1; SD native 4-bit: the strict 4-bit card model on the platform's
``BB`` pads, split by :func:`~ringkv.sim.board_harness.expose_bidir_pads`); a slow test runs
the board check on the 40 MHz fallback.

One Verilator build of the board top (a small configuration, cached in ``build/board``) serves
every test here; each test starts its own simulator process on it (fresh power-up).
"""

import json
import sys
import time

import pytest
from conftest import requires_verilator

from ringkv.defs.record import RecordLayout
from ringkv.sim.gatesim import SMOKE_CONFIG, SMOKE_TOP

#: The board top's configuration in these tests: every block of the bitstream's top, small,
#: in its numerics (ringkv-fx1c); the same as the gate-level smoke's.
CFG, TOP = SMOKE_CONFIG, SMOKE_TOP
#: The SDRAM step on the simulated board: the full pattern over 4096 words (the whole 32 MB
#: would take 34 million clocks, half an hour here) and a 1 ms pause (60,000 clocks)
SDRAM_ARGS = ["--sdram-words", "4096", "--sdram-pause", "1"]


@pytest.fixture(scope="module")
def board_build():
    from ringkv.sim.board_harness import build_board
    build = build_board(CFG, **TOP)
    # the bitstream's default top: 60 MHz (the SDRAM's read data an edge later), SD native
    # 4-bit
    assert build[1]["storage"] == "sd4" and build[1]["sys_hz"] == 60e6
    assert build[1]["sdram"]["read_delay"] == 1
    return build


def test_clock_seam_is_checked():
    from ringkv.boards.ulx3s import ULX3STop
    with pytest.raises(ValueError, match=r"clock must be one of \('pll', 'sim'\), not 'x'"):
        ULX3STop(CFG, clock="x", regions=4)


@requires_verilator
@pytest.mark.slow       # the board's pins again, driven by cocotbext-uart (the board check is
                        # the pin-level end-to-end path of make test)
@pytest.mark.parametrize("testcase", ["ping_version_attention_bad_crc",
                                      "framing_error_lights_the_error_led"])
def test_board_pins_with_cocotbext_uart(board_build, tmp_path, testcase):
    from ringkv.sim.board_harness import serve_board
    from ringkv.sim.cocotb_run import TESTS_DIR
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    # a failing cocotb test raises here (the runner checks the results)
    serve_board(tmp_path / "card.img", config=CFG, prebuilt=True,
                test_module="cocotb_board_pins", testcase=testcase, **TOP)


@requires_verilator
def test_board_check_on_the_pin_level_board(board_build, tmp_path, capsys):
    """``ringkv board check`` passes every step against the simulated board; a second run on
    the same card keeps the first run's record (region 0) and uses region 1; a host with
    another configuration fails the identity step and exits 1."""
    from ringkv.cli import main
    from ringkv.host.record import scan_image
    from ringkv.sim.board_harness import BoardDevice
    image = tmp_path / "card.img"
    # no --timeout: the check adapts its timeouts to the simulated link (and says so)
    args = ["--config", json.dumps(CFG.__dict__), "--ping-sizes", "0,1,16,255", *SDRAM_ARGS]
    with BoardDevice(image, config=CFG, prebuilt=True, log=tmp_path / "sim.log", **TOP) as dev:
        assert main(["board", "check", "--link", dev.url, *args]) == 0
        first = capsys.readouterr().out
        # the second run needs no more than the scratch choice: shorter pings and records
        assert main(["board", "check", "--link", dev.url, *args[:2], "--ping-sizes", "0",
                     "--tokens", "3", "--timeout", "120", *SDRAM_ARGS]) == 0
        second = capsys.readouterr().out
        other = dict(CFG.__dict__, window=16)
        assert main(["board", "check", "--link", dev.url, "--config", json.dumps(other),
                     "--ping-sizes", "0", "--timeout", "120", *SDRAM_ARGS]) == 1
        third = capsys.readouterr().out
        log = tmp_path / "sim.log"
        for _ in range(600):                # the simulator logs the third connection's end
            if log.read_text().count("RINGKV-SIM uart line") == 3:
                break
            time.sleep(0.1)
    # the line model received every byte the device's transmitter sent, cleanly; the strict
    # 4-bit card and the strict SDRAM model saw no violation (the simulator would have stopped)
    log = log.read_text()
    assert "SD protocol violation" not in log and "SDRAM violation" not in log, log
    counts = [line for line in log.splitlines() if "RINGKV-SIM uart line" in line]
    assert len(counts) == 3 and all(" 0 framing errors, 0 glitches" in c for c in counts), log
    assert " 0 B received" not in counts[0], counts
    for step in ("link", "identity", "storage", "scratch region", "attention",
                 "write/read/verify", "export/import", "sdram"):
        assert f"[PASS] {step}" in first, first
        assert f"[PASS] {step}" in second, second
    assert "board check: 8/8 steps passed" in first
    # the SDRAM step: the whole self-test on the board's 32 MB part (the strict model)
    assert ("32.0 MiB part (16777216 words): data lines DQ0-15, 21 address bits, 4 banks, "
            "full pattern over 4096 words (8.0 KiB), the same read back after a 1 ms pause: "
            "no word wrong;") in first, first
    assert "timeouts: " in first and "us per byte; --timeout sets them)" in first
    # STORAGE_INFO in the storage step: the bitstream's SD mode and clock, the card model's
    # type (OCR) and capacity (its CSD: the image rounded up to 1024 sectors)
    card = 1024 * -(-TOP["regions"] * RecordLayout(CFG).sectors_per_region // 1024)
    assert (f"SD card, native 4-bit bus at 15 MHz: SDHC/SDXC, {card // 2:.1f} KiB "
            f"({card} sectors), initialised;") in first, first
    assert "region 0 holds no record" in first, first
    assert "region 1 holds no record (kept: region 0: a valid record)" in second, second
    assert "[FAIL] identity" in third and "window" in third, third
    assert "[SKIP] attention" in third, third
    # both scratch records are on the card, valid, of the check's token count
    data = image.read_bytes()
    infos = scan_image(CFG, lambda lba, n: data[lba * 512:(lba + n) * 512], TOP["regions"])
    assert [i.valid for i in infos] == [True, True, False, False], infos
    assert [i.count for i in infos[:2]] == [CFG.window + CFG.window // 4 + 1, 3]


@requires_verilator
def test_board_check_names_an_sdsc_card(board_build, tmp_path, capsys):
    """An SDSC card (the card model with CCS = 0 in its OCR and a version 1.0 CSD) in the
    native-mode board: its controller refuses it, the recovery scan fails, and the storage step
    says so naming the card type (STORAGE_INFO) and what to do; exit status 1."""
    from ringkv.cli import main
    from ringkv.sim.board_harness import BoardDevice
    with BoardDevice(tmp_path / "card.img", config=CFG, prebuilt=True, card={"sdhc": False},
                     log=tmp_path / "sim.log", **TOP) as dev:
        assert main(["board", "check", "--link", dev.url, "--config", json.dumps(CFG.__dict__),
                     "--ping-sizes", "0", "--timeout", "120", *SDRAM_ARGS]) == 1
    out = capsys.readouterr().out
    assert "[PASS] identity" in out and "[FAIL] storage" in out, out
    assert "[PASS] sdram" in out, out      # the memory test needs no card
    assert "native 4-bit bus at 15 MHz: SDSC" in out and "NOT initialised" in out, out
    assert "storage errors, the last NOT_READY" in out, out
    assert "native mode supports SDHC/SDXC only" in out and "--storage spi" in out, out


@requires_verilator
@pytest.mark.parametrize("faults, line", [
    ({"dq_stuck": [5, 0]}, "data test: word 0x5 (bank 0, row 0, column 5) read 0x0000, "
                           "expected 0x0020 (differ: DQ5); 4224 words wrong"),
    ({"a_short": [11, 12]}, "address test: word 0x0 (bank 0, row 0, column 0) read 0xa5a8, "
                            "expected 0xa500 (differ: DQ3, DQ5, DQ7); 16 words wrong"),
])
def test_the_sdram_step_finds_a_broken_sdram(board_build, tmp_path, faults, line):
    """The board check's SDRAM step on a simulated board whose SDRAM has a fault at its pins
    (the pin-level model's: DQ5 stuck low; A11 and A12 shorted): it fails, naming the test,
    the first wrong word where it lies, the lines that differ, and what to try."""
    from ringkv.host.device.board_check import BoardCheck
    from ringkv.host.device.link import Link
    from ringkv.sim.board_harness import BoardDevice
    said = []
    with BoardDevice(tmp_path / "card.img", config=CFG, prebuilt=True, sdram_faults=faults,
                     log=tmp_path / "sim.log", **TOP) as dev:
        with Link(dev.url, timeout=120) as link:
            check = BoardCheck(link, CFG, say=said.append, sdram_words=4096, sdram_pause_ms=0,
                               recovery_timeout=600)
            check.step_identity()
            with pytest.raises(Exception) as failed:
                check.step_sdram()
    assert str(failed.value) == f"32.0 MiB part: {line}", failed.value
    assert "SDRAM violation" not in (tmp_path / "sim.log").read_text()


@requires_verilator
@pytest.mark.slow
def test_board_check_on_the_spi_variant(tmp_path, capsys):
    """The SPI-mode board option (``storage="spi"``: the ``sd_card_spi_0`` pins, the SPI-mode
    card model) at its pins: ``ringkv board check`` passes every step (its own build)."""
    from ringkv.cli import main
    from ringkv.sim.board_harness import BoardDevice, build_board
    top = dict(TOP, storage="spi")
    assert build_board(CFG, **top)[1]["storage"] == "spi"
    with BoardDevice(tmp_path / "card.img", config=CFG, prebuilt=True,
                     log=tmp_path / "sim.log", **top) as dev:
        assert main(["board", "check", "--link", dev.url, "--config", json.dumps(CFG.__dict__),
                     "--ping-sizes", "0,16", "--timeout", "120", *SDRAM_ARGS]) == 0
    out = capsys.readouterr().out
    assert "board check: 8/8 steps passed" in out
    assert ("SD card, SPI mode (1-bit) at 10 MHz: SDHC/SDXC, size unknown (SPI mode does not "
            "read the CSD), initialised;") in out, out


@requires_verilator
@pytest.mark.slow
def test_board_check_at_the_40_mhz_fallback(tmp_path, capsys):
    """The board at the system clock it falls back to (``ringkv build --sys-mhz 40``: the
    SDRAM's read data taken ``CL`` edges after the READ, ``read_delay`` 0; SD CLK 20 MHz):
    ``ringkv board check`` passes every step (its own build)."""
    from ringkv.cli import main
    from ringkv.sim.board_harness import BoardDevice, build_board
    top = dict(TOP, sys_mhz=40)
    info = build_board(CFG, **top)[1]
    assert info["sys_hz"] == 40e6 and info["sdram"]["read_delay"] == 0
    with BoardDevice(tmp_path / "card.img", config=CFG, prebuilt=True,
                     log=tmp_path / "sim.log", **top) as dev:
        assert main(["board", "check", "--link", dev.url, "--config", json.dumps(CFG.__dict__),
                     "--ping-sizes", "0,16", *SDRAM_ARGS]) == 0
    out = capsys.readouterr().out
    assert "board check: 8/8 steps passed" in out, out
    assert "SD card, native 4-bit bus at 20 MHz: SDHC/SDXC" in out, out
    log = (tmp_path / "sim.log").read_text()
    assert "SD protocol violation" not in log and "SDRAM violation" not in log, log


def test_board_check_without_a_device(capsys):
    """No device behind the URL: one line, exit status 4 (the link), no traceback."""
    import socket

    from ringkv.cli import main
    with socket.socket() as s:          # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["board", "check", "--link", f"socket://127.0.0.1:{port}"]) == 4
    err = capsys.readouterr().err
    assert err.startswith(f"ringkv: cannot open socket://127.0.0.1:{port}: "), err
    assert main(["board"]) == 2


_NETLIST = """module top(a, b, c);
  inout a;
  inout [1:0] b;
  input c;
  \\top.pad  \\buf  (
    .a(a),
    .b(b)
  );
endmodule

module \\top.pad (a, b);
  inout a;
  inout [1:0] b;
  BB buf0 (
    .B(a),
    .I(x),
    .O(y),
    .T(t)
  );
  BB buf1 (
    .B(b[1]),
    .I(x),
    .O(y),
    .T(t)
  );
  BB buf2 (
    .B(b[0]),
    .I(x),
    .O(y),
    .T(t)
  );
endmodule
"""


def test_expose_bidir_pads():
    """Each inout pin gets its BBs' drive as two ports; a pin bit without a BB (or with two)
    is an error, not a silently undriven line."""
    from ringkv.sim.board_harness import expose_bidir_pads
    out = expose_bidir_pads(_NETLIST, "top")
    assert out.startswith("module top(a, b, c, a__fpga_oe, a__fpga_o, b__fpga_oe, b__fpga_o);")
    for line in ("  output [1:0] b__fpga_oe;", "  assign a__fpga_oe = ~\\buf .buf0.T;",
                 "  assign a__fpga_o = \\buf .buf0.I;", "  assign b__fpga_oe[1] = ~\\buf .buf1.T;",
                 "  assign b__fpga_o[0] = \\buf .buf2.I;"):
        assert line in out.splitlines(), out
    with pytest.raises(ValueError, match=r"^pin a\[0\] has two BB pads$"):
        expose_bidir_pads(_NETLIST.replace(".B(b[0])", ".B(a)"), "top")
    with pytest.raises(ValueError, match=r"buf2: pad 'c' is not an inout pin of top$"):
        expose_bidir_pads(_NETLIST.replace(".B(b[0])", ".B(c)"), "top")
    with pytest.raises(ValueError, match=r"^pin b: bits \[0\] have no BB pad$"):
        expose_bidir_pads(_NETLIST.replace("BB buf2", "OBZ buf2"), "top")


_GATE_NETLIST = """module top(a, b, c, d);
  inout a;
  wire a;
  inout [1:0] b;
  input c;
  output d;
  RINGKV_GATE_PAD #(
    .DIR("BIDIR")
  ) \\pin_a.buf0  (
    .B(a),
    .I(\\x.y ),
    .O(o0),
    .T(1'h0)
  );
  RINGKV_GATE_PAD #(
    .DIR("BIDIR")
  ) \\pin_b.buf0  (
    .B(b[0]),
    .I(i0),
    .O(o1),
    .T(t0)
  );
  LUT4 #(
    .INIT(16'h8000)
  ) \\lut  (
    .A(c),
    .Z(z)
  );
  RINGKV_GATE_PAD #(
    .DIR("BIDIR")
  ) \\pin_b.buf1  (
    .B(b[1]),
    .I(i1),
    .O(o2),
    .T(t1)
  );
  RINGKV_GATE_PAD #(
    .DIR("INPUT")
  ) \\pin_c.buf0  (
    .B(c),
    .O(c1)
  );
  RINGKV_GATE_PAD #(
    .DIR("OUTPUT")
  ) \\pin_d.buf0  (
    .B(\\pin_d.d__io ),
    .I(z),
    .T(1'h0)
  );
endmodule
"""


def test_expose_bidir_pads_of_the_gate_netlist():
    """The gate-level netlist's pads (yosys' flat ``write_verilog``: parameter blocks, escaped
    names; input and output pads on other nets are left alone): the same two ports per pin."""
    from ringkv.sim.board_harness import expose_bidir_pads
    out = expose_bidir_pads(_GATE_NETLIST, "top", pad="RINGKV_GATE_PAD")
    assert out.startswith("module top(a, b, c, d, a__fpga_oe, a__fpga_o, b__fpga_oe, "
                          "b__fpga_o);")
    for line in ("  assign a__fpga_oe = ~\\pin_a.buf0 .T;", "  assign a__fpga_o = \\pin_a.buf0 .I;",
                 "  assign b__fpga_oe[1] = ~\\pin_b.buf1 .T;",
                 "  assign b__fpga_o[0] = \\pin_b.buf0 .I;"):
        assert line in out.splitlines(), out
    with pytest.raises(ValueError, match=r"^pin b: bits \[1\] have no RINGKV_GATE_PAD pad$"):
        expose_bidir_pads(_GATE_NETLIST.replace(".B(b[1])", ".B(e)"), "top",
                          pad="RINGKV_GATE_PAD")


def test_cached_board_build_is_reused_without_elaborating(tmp_path, monkeypatch):
    """A build whose recipe is unchanged is returned as it is (the test workers' board
    fixtures then cost no elaboration); any change of the recipe elaborates again."""
    from ringkv.sim import board_harness as bh
    monkeypatch.setattr(bh, "BUILD_ROOT", tmp_path)
    monkeypatch.setattr(bh, "setup_environ", lambda: None)
    elaborated = []

    def board_top(*args, **kwargs):
        elaborated.append(kwargs)
        raise RuntimeError("elaborated")
    monkeypatch.setattr(bh, "board_top", board_top)
    build_dir = bh._build_dir(CFG, TOP)
    build_dir.mkdir(parents=True)
    facts = {"sectors": 64, "reset_cycles": 10}
    (build_dir / bh.BOARD_TOP).write_text("")
    (build_dir / "info.json").write_text(json.dumps(facts))
    (build_dir / "recipe.key").write_text(bh._recipe(CFG, TOP))
    assert bh.build_board(CFG, **TOP) == (build_dir, facts)
    assert elaborated == []
    # a stale recipe, a missing binary, the other storage kind: elaborated again
    (build_dir / "recipe.key").write_text(bh._recipe(CFG, TOP).replace("sources", "s"))
    with pytest.raises(RuntimeError, match="elaborated"):
        bh.build_board(CFG, **TOP)
    (build_dir / "recipe.key").write_text(bh._recipe(CFG, TOP))
    (build_dir / bh.BOARD_TOP).unlink()
    with pytest.raises(RuntimeError, match="elaborated"):
        bh.build_board(CFG, **TOP)
    assert bh._recipe(CFG, {**TOP, "storage": "spi"}) != bh._recipe(CFG, TOP)
    assert len(elaborated) == 2


@requires_verilator
@pytest.mark.slow       # its own Verilator build (a few minutes) and the whole check
def test_board_check_at_half_rate(tmp_path, capsys):
    """The board with its SDRAM at half rate (``sdram_rate=2``: the system clock at 60 MHz, the
    SDRAM and the PHY's I/O registers at 120 MHz on the seam's second clock, the strict model
    on the fast clock; the four-byte import, ``storage_width`` 4): ``ringkv board check``
    passes every step, the SDRAM self-test and the hot tier's imports included."""
    from ringkv.boards.ulx3s import ULX3STop
    from ringkv.cli import main
    from ringkv.sim.board_harness import BoardDevice, build_board
    top = dict(TOP, sys_mhz=60, sdram_rate=2)
    # the four-byte import: the DMA, the tier and the store on 32-bit words (the board
    # check's export/import step reads the record back from the SDRAM slot)
    assert ULX3STop(CFG, **top).storage_width == 4
    info = build_board(CFG, **top)[1]
    assert info["sdram"]["rate"] == 2 and abs(info["sdram"]["tck_ns"] - 1000 / 120) < 1e-9
    with BoardDevice(tmp_path / "card.img", config=CFG, prebuilt=True,
                     log=tmp_path / "sim.log", **top) as dev:
        assert main(["board", "check", "--link", dev.url, "--config", json.dumps(CFG.__dict__),
                     "--ping-sizes", "0,16", "--timeout", "120", *SDRAM_ARGS]) == 0
    out = capsys.readouterr().out
    assert "[PASS] sdram" in out, out
    assert "SDRAM violation" not in (tmp_path / "sim.log").read_text()
