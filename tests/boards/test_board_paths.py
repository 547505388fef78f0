"""``ringkv.boards.paths``: the latest endpoints of a routed build, from nextpnr's detailed
timing report (a real out-of-context place and route of a small core, seconds; and a report
written here for the folding and the command line's errors)."""

import json

import pytest

from ringkv.boards.build import SLACK_TARGET_PCT, late_endpoints
from ringkv.boards.paths import endpoints, group_name, groups, main
from ringkv.boards.synth import synth_core
from ringkv.hw.store.hash_engine import HashEngine


def _report(ends, event="posedge $glbnet$clk"):
    """A report in nextpnr's shape: one net per endpoint."""
    return {"fmax": {"$glbnet$clk": {"achieved": 70.0, "constraint": 60.0}},
            "detailed_net_timings": [
                {"driver": "d", "port": "F", "event": event, "net": f"n{i}", "sources": [],
                 "endpoints": [{"cell": cell, "port": port, "event": ev or event,
                                "delay": [t / 3, t]}]}
                for i, (t, cell, port, ev) in enumerate(ends)]}


ENDS = [
    (15.9, "top.dma.pay_left_TRELLIS_FF_Q_18", "DI", None),
    (15.2, "top.dma.pay_left_TRELLIS_FF_Q", "DI", None),
    (14.1, "top.dma.pay_left_TRELLIS_FF_Q_3", "CE", None),
    (15.5, "top.attention.lane1.kv_mem.0.13", "WEA", None),
    (15.6, "top.attention.lane1.kv_mem.0.12", "DIA12", None),
    (3.0, "top.attention.lane1.kv_mem.1.0", "DIA3", None),
    (20.0, "sd_in_TRELLIS_FF_Q", "DI", "<async>"),
    (9.0, "sdram.phy.q_TRELLIS_FF_Q", "DI", "posedge $glbnet$sdram_clk"),
]


def test_group_names_fold_bits_and_tiles():
    assert group_name("top.dma.pay_left_TRELLIS_FF_Q_18", "DI") == ("top.dma.pay_left", "DI")
    assert group_name("top.dma.pay_left_TRELLIS_FF_Q", "CE") == ("top.dma.pay_left", "CE")
    assert group_name("top.attention.lane1.kv_mem.0.13", "DIA12") == (
        "top.attention.lane1.kv_mem", "DIA")
    assert group_name("top.directory.lists.prev$45.0.3", "ADA2") == (
        "top.directory.lists.prev", "ADA")
    assert group_name("plain", "Q") == ("plain", "Q")


def test_endpoints_pick_the_busiest_clock_and_rank_latest_first():
    event, ends = endpoints(_report(ENDS))
    assert event == "posedge $glbnet$clk"
    assert [t for t, _, _ in ends] == [15.9, 15.6, 15.5, 15.2, 14.1, 3.0]
    event, ends = endpoints(_report(ENDS), clock="sdram_clk")
    assert event == "posedge $glbnet$sdram_clk" and len(ends) == 1
    with pytest.raises(ValueError, match="no endpoint on clock 'nope'"):
        endpoints(_report(ENDS), clock="nope")
    with pytest.raises(ValueError, match="--detailed-timing-report"):
        endpoints({"fmax": {}})


def test_groups_count_late_bits_against_the_limit():
    _, ends = endpoints(_report(ENDS))
    got = {(g["name"], g["pin"]): (g["worst_ns"], g["late"], g["bits"])
           for g in groups(ends, 15.0)}
    assert got == {("top.dma.pay_left", "DI"): (15.9, 2, 2),
                   ("top.attention.lane1.kv_mem", "DIA"): (15.6, 1, 2),
                   ("top.attention.lane1.kv_mem", "WEA"): (15.5, 1, 1),
                   ("top.dma.pay_left", "CE"): (14.1, 0, 1)}
    assert [g["worst_ns"] for g in groups(ends, 15.0)] == [15.9, 15.6, 15.5, 14.1]


def test_late_endpoints_of_a_build():
    late = late_endpoints(_report(ENDS), 60.0)
    limit = 1000 / 60 * (1 - SLACK_TARGET_PCT / 100)
    assert late["limit_ns"] == pytest.approx(limit, abs=1e-3)
    assert (late["endpoints"], late["late"]) == (6, 4)
    assert late["groups"][0]["name"] == "top.dma.pay_left"
    assert late_endpoints({"fmax": {}}, 60.0) is None


def test_command_line(tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(_report(ENDS)))
    assert main([str(path), "--mhz", "60", "--top", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "6 endpoints" in out[0] and "4 arrive later than 15.00 ns" in out[0]
    assert len(out) == 4 and out[2].split() == ["15.90", "2", "2", "top.dma.pay_left.DI"]
    # the target from the figures.json beside the report
    (tmp_path / "figures.json").write_text(json.dumps({"target_mhz": 50.0}))
    assert main([str(path)]) == 0
    assert "against 50 MHz (20.00 ns)" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["missing.json"], "no such report"),
    (["bad.json"], "is not JSON"),
    (["plain.json"], "--detailed-timing-report"),
    (["report.json", "--mhz", "0"], "--mhz must be positive"),
    (["report.json", "--margin-pct", "100"], "--margin-pct"),
    (["report.json", "--clock", "nope"], "no endpoint on clock"),
    (["report.json", "--top", "x"], "invalid int value"),
])
def test_command_line_errors(tmp_path, monkeypatch, argv, message):
    from ringkv.host.errors import UsageError
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.json").write_text(json.dumps(_report(ENDS)))
    (tmp_path / "bad.json").write_text("{")
    (tmp_path / "plain.json").write_text(json.dumps({"fmax": {}}))
    with pytest.raises(UsageError, match=message):
        main(argv)


def test_a_real_report_s_latest_endpoint_is_its_critical_path(tmp_path):
    """nextpnr's own output: the latest endpoint is where the reported critical path ends, and
    its arrival is that path's delay without the setup segment."""
    result = synth_core(HashEngine(), "hash_engine", freq_mhz=100.0, workdir=tmp_path,
                        detailed_timing=True)
    report = json.loads((tmp_path / "report.json").read_text())
    event, ends = endpoints(report)
    assert event == "posedge clk" and len(ends) > 100
    path = report["critical_paths"][0]["path"]
    assert (ends[0][1], ends[0][2]) == (path[-1]["to"]["cell"], path[-1]["to"]["port"])
    arrival = sum(s["delay"] for s in path if s["type"] != "setup")
    assert ends[0][0] == pytest.approx(arrival, abs=0.01)
    assert 1000 / ends[0][0] >= result["fmax_mhz"] * 0.98
