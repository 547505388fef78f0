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
