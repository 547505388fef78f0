"""End to end through the Verilator-built top: host scheduler and model, TCP link, simulated
storage image, power cut and move to a second device (the short form of ``make demo``)."""

from conftest import requires_verilator

from ringkv.host.system_demo import run_system_demo, short_scenario


@requires_verilator
def test_short_end_to_end_scenario(tmp_path, capsys):
    assert run_system_demo(workdir=tmp_path, steps=short_scenario(), verbose=True) == 0
    out = capsys.readouterr().out
    for path in (" first ", " hit ", " miss ", "power cut", "rebuild found 1 record"):
        assert path in out, out
    assert "identical to the software-only run" in out
