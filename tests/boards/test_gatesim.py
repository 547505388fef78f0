"""``make gatesim`` as a test (slow: only in ``make test-all``).

The smoke scenario on the ``synth_ecp5`` netlist of the ULX3S top at its pins
(:func:`ringkv.sim.gatesim.smoke`, the reduced :data:`~ringkv.sim.gatesim.SMOKE_CONFIG`):
``ringkv board check`` (link, identity, storage, scratch region, attention known answer,
EXPORT/QUERY round trip), a QUERY miss, a power cut, the restart on the same card image and a
QUERY hit with the rings byte-identical to the golden core's. On this 2-core machine the
netlist build takes 10-18 minutes and the scenario (1.7 M board cycles) 30-45 (the netlist runs
at 600-1,400 board cycles/s, with and without a second job on the cores), which is why
``make test`` runs only the cell models' equivalence test (``tests/boards/test_gate_models.py``) and
not this.
"""

import json

import pytest
from conftest import requires_verilator, requires_yowasp


@pytest.mark.slow
@requires_verilator
@requires_yowasp
def test_gatesim_smoke(tmp_path):
    from ringkv.sim.gatesim import main

    assert main(["smoke", "--workdir", str(tmp_path)]) == 0     # the step lines: stdout
    fig = json.loads((tmp_path / "figures.json").read_text())
    assert fig["ok"] and fig["cycles"] > 0
    from ringkv.boards.ulx3s import SYS_MHZ
    assert fig["sys_mhz"] == SYS_MHZ and fig["sys_hz"] == SYS_MHZ * 1e6  # the board's clock


def test_gatesim_runs_the_top_at_the_clock_asked_for(monkeypatch, tmp_path):
    """The smoke passes its system clock to the top it builds: the board's default
    (``SYS_MHZ``) unless ``--sys-mhz`` or ``--top``'s ``sys_mhz`` names another, so the
    gate-level build directory names the clock. (The build is stopped at once.)"""
    from ringkv.boards.ulx3s import SYS_MHZ
    from ringkv.sim import gatesim

    built = []

    def build_board(config, *, gate, **top):
        built.append(top)
        raise RuntimeError("stop")
    monkeypatch.setattr(gatesim, "build_board", build_board)
    for argv, mhz in ((["smoke"], SYS_MHZ), (["smoke", "--sys-mhz", "40"], 40.0),
                      (["smoke", "--sys-mhz", "60"], 60.0),
                      (["smoke", "--top", '{"regions": 4, "sys_mhz": 40}'], 40.0),
                      (["smoke", "--sys-mhz", "40", "--top", '{"sys_mhz": 40}'], 40.0)):
        with pytest.raises(RuntimeError, match="^stop$"):
            gatesim.main([*argv, "--workdir", str(tmp_path)])
        assert built[-1]["sys_mhz"] == mhz, argv
    assert {k: v for k, v in built[0].items() if k != "sys_mhz"} == gatesim.SMOKE_TOP


@pytest.mark.parametrize("argv, message", [
    (["--sys-mhz", "1000"], "bad system clock (--sys-mhz, or --top's sys_mhz): no EHXPLLL "
                            "setting gives 1000.0 MHz from 25.0 MHz"),
    (["--sys-mhz", "0"], "bad system clock (--sys-mhz, or --top's sys_mhz): the system clock "
                         "must be a positive number of MHz, not 0.0"),
    (["--top", '{"sys_mhz": "60"}'], "bad system clock (--sys-mhz, or --top's sys_mhz): the "
                                     "system clock must be a positive number of MHz, not '60'"),
    (["--sys-mhz", "40", "--top", '{"sys_mhz": 60}'], "--sys-mhz 40 and --top's sys_mhz 60 "
                                                      "disagree"),
    (["--top", "[4]"], "bad --config or --top: --top is a JSON object"),
])
def test_gatesim_refuses_a_bad_clock_in_one_line(argv, message, tmp_path):
    """A clock the PLL cannot make, or two that disagree: a usage error (one line, exit
    status 2 from ``python -m ringkv.sim.gatesim``), before anything is built."""
    import subprocess
    import sys

    from ringkv.host.errors import UsageError
    from ringkv.sim.gatesim import main
    with pytest.raises(UsageError) as e:
        main(["smoke", "--workdir", str(tmp_path), *argv])
    assert str(e.value) == message
    r = subprocess.run([sys.executable, "-m", "ringkv.sim.gatesim", "smoke", "--workdir",
                        str(tmp_path), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(f"ringkv: {message}\n"), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "figures.json").exists()
