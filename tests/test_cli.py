"""The ringkv command line: the software demo checks itself; missing parts fail clearly."""

import pytest

from ringkv.cli import main


def test_demo_runs_and_matches_plain_run(capsys):
    assert main(["demo", "--software"]) == 0
    out = capsys.readouterr().out
    assert "identical to the plain run" in out
    for path in ("first", "continue", "hit", "miss"):
        assert f" {path} " in out


def test_missing_module_message(monkeypatch):
    import importlib
    real = importlib.import_module

    def fake(name, *a):
        if name == "ringkv.sim.harness":
            raise ModuleNotFoundError(f"No module named '{name}'", name=name)
        return real(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake)
    with pytest.raises(SystemExit, match=r"the simulator server is not available yet"):
        main(["sim"])
