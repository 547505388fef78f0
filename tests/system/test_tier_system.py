"""The SDRAM hot tier end to end on the Verilator-built top (``ringkv sim --sdram``:
``RingKVTop(tier={})``, the demo device's 2 regions, so 2 slots), driven by
:class:`~ringkv.host.device.fpga.FpgaDevice` over TCP beside a
:class:`~ringkv.host.device.software.SoftwareDevice` with the same tier given the same
requests: ``STORAGE_INFO``'s residents after each export, a QUERY imported from SDRAM, a
forgotten record's copy dropped, ``ringkv storage info --link`` naming the tier, and after a
power cut (the SDRAM lost) the same record imported from the card, the tier empty."""

import pytest
from conftest import requires_verilator
from device_sessions import RandomSession

from ringkv.defs.config import DEMO_CONFIG
from ringkv.defs.record import RecordLayout

pytestmark = [requires_verilator, pytest.mark.slow]


def _compute_soft(session, soft):
    """``RandomSession.compute`` on the software device (its rings are its backend)."""
    soft.attention.reset()
    soft.write_tokens(session.tokens)
    for layer, (q, k, v) in enumerate(session.qkv):
        soft.attention.prefill(layer, q, k, v)


def test_hot_tier_on_the_simulated_device(tmp_path, capsys):
    from ringkv.cli import main
    from ringkv.host.device.fpga import FpgaDevice
    from ringkv.host.device.link import Link
    from ringkv.host.device.software import SoftwareDevice
    from ringkv.host.model.transformer import FixedBackend
    from ringkv.sim.harness import SimDevice, build_top
    from ringkv.sim.system_demo import LANES, MACS, REGIONS
    kwargs = {"regions": REGIONS, "lanes": LANES, "macs": MACS, "tier": {}}
    build_top(DEMO_CONFIG, **kwargs)
    image = tmp_path / "card.img"
    soft = SoftwareDevice(DEMO_CONFIG, attention=FixedBackend(DEMO_CONFIG, lanes=LANES),
                          regions=REGIONS, tier={})
    a, b = RandomSession(DEMO_CONFIG, 5, 6), RandomSession(DEMO_CONFIG, 6, 9)
    lay = RecordLayout(DEMO_CONFIG)
    shape = dict(hot_slots=2, hot_slot_sectors=lay.sectors_per_region,
                 hot_slot_tokens=lay.token_sectors_max)

    def tier(dev):
        return {k: v for k, v in dev.hot_tier().items() if k != "resident_regions"}

    with SimDevice(image, config=DEMO_CONFIG, prebuilt=True, log=tmp_path / "sim.log",
                   **kwargs) as sim:
        dev = FpgaDevice(Link(sim.url, timeout=120), DEMO_CONFIG)
        dev.wait_ready()
        assert tier(dev) == tier(soft) == dict(shape, hot_residents=0)
        keys = []
        for s in (a, b):
            s.compute(dev, len(s.tokens))
            keys.append(dev.export(s.tokens)[0])
            _compute_soft(s, soft)
            assert soft.export(s.tokens)[0] == keys[-1]
        assert tier(dev) == tier(soft) == dict(shape, hot_residents=2)
        dev.reset()
        before = dev.counters["device_cycles"]
        assert dev.query(a.tokens).hit and soft.query(a.tokens).hit
        assert soft.counters["imports_sdram"] == 1
        sdram_cycles = dev.counters["device_cycles"] - before
        assert dev.forget(keys[0]) and soft.forget(keys[0])
        assert tier(dev) == tier(soft) == dict(shape, hot_residents=1)
        dev.link.close()                         # the simulator serves one connection
        assert main(["storage", "info", "--link", sim.url, "--config", "demo"]) == 0
        out = capsys.readouterr().out
        assert ("SDRAM hot tier: 1 of 2 slots hold a record "
                f"({lay.sectors_per_region} sectors a slot") in out, out
        sim.kill()                               # a power cut: the SDRAM's copies are lost
    with SimDevice(image, config=DEMO_CONFIG, prebuilt=True, log=tmp_path / "sim2.log",
                   **kwargs) as sim:
        dev = FpgaDevice(Link(sim.url, timeout=120), DEMO_CONFIG)
        dev.wait_ready()
        assert tier(dev) == dict(shape, hot_residents=0)
        before = dev.counters["device_cycles"]
        assert dev.query(b.tokens).hit           # from the card: imports fill nothing
        assert tier(dev)["hot_residents"] == 0
        print(f"QUERY of A from SDRAM {sdram_cycles} clocks; of B from the card (the same "
              f"byte per clock here) {dev.counters['device_cycles'] - before}")


def test_short_demo_with_the_hot_tier(tmp_path, capsys):
    """``ringkv demo --sdram``'s scenario, short form: every generated token and decision as
    without the tier (the software twin with the same tier), and at the end the tier's
    residents equal to the software device's (its SDRAM lost at the power cut as the
    simulator's)."""
    from ringkv.defs.config import TRAINED_DEMO_CONFIG
    from ringkv.sim.system_demo import run_system_demo, short_scenario
    assert run_system_demo(workdir=tmp_path, steps=short_scenario(), verbose=True,
                           config=TRAINED_DEMO_CONFIG, sdram="") == 0
    out = capsys.readouterr().out
    assert "SDRAM hot tier: " in out and "the software device's twin: " in out, out
    assert "identical to the software-only run" in out
    print(out[out.index("SDRAM hot tier: "):][:200])
