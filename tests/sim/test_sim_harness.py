"""The simulated device's build parameters (:mod:`ringkv.sim.harness`), without building:
``sealed`` folded into the top's parameters and the build key."""

import pytest

from ringkv.defs.config import DEMO_CONFIG
from ringkv.sim.harness import DEMO_TOP, build_key, top_parameters


def test_sealed_is_part_of_the_build_key():
    """``sealed=True`` and ``{"sealed": True}`` name one build, another than the open top's;
    ``sealed=False`` and an explicit ``"sealed": False`` name the open top's build."""
    open_key = build_key(DEMO_CONFIG, top_parameters(DEMO_TOP))
    sealed_key = build_key(DEMO_CONFIG, top_parameters(DEMO_TOP, sealed=True))
    assert sealed_key != open_key
    assert build_key(DEMO_CONFIG, top_parameters({**DEMO_TOP, "sealed": True})) == sealed_key
    assert build_key(DEMO_CONFIG, top_parameters({**DEMO_TOP, "sealed": True},
                                                 sealed=True)) == sealed_key
    assert build_key(DEMO_CONFIG, top_parameters({**DEMO_TOP, "sealed": False})) == open_key
    assert top_parameters(DEMO_TOP) == DEMO_TOP
    assert top_parameters(DEMO_TOP, sealed=True) == {**DEMO_TOP, "sealed": True}


def test_top_parameters_refusals():
    with pytest.raises(ValueError, match=r'^sealed=True contradicts top_kwargs\["sealed"\]'
                                         r'=False$'):
        top_parameters({"sealed": False}, sealed=True)
    with pytest.raises(TypeError, match=r"^sealed must be a bool, not 1$"):
        top_parameters({}, sealed=1)
    with pytest.raises(TypeError, match=r"^top_kwargs' sealed must be a bool, not 'yes'$"):
        top_parameters({"sealed": "yes"})


def test_board_simulation_has_no_sealed_build(tmp_path):
    """The pin-level board simulation is an open build: refused before anything starts."""
    from ringkv.sim.board_harness import BoardDevice
    with pytest.raises(ValueError, match=r"^BoardDevice has no sealed build \(sealed=True is "
                                         r"RingKVTop's simulation: SimDevice\)$"):
        BoardDevice(tmp_path / "card.img", sealed=True)
    assert not (tmp_path / "card.img").exists()


def test_sdram_tier_is_a_build_of_its_own(tmp_path):
    """``--sdram`` (``tier`` in the top's parameters) names another build; its SDRAM is the
    tier's slots (the demo top: 2 regions, so 2 whole-region slots of 13 sectors); a bad part
    or tier is refused before anything is built."""
    from ringkv.defs.record import RecordLayout
    from ringkv.host.errors import UsageError
    from ringkv.sim.harness import main, sdram_sectors
    tiered = {**DEMO_TOP, "tier": {}}
    assert build_key(DEMO_CONFIG, tiered) != build_key(DEMO_CONFIG, DEMO_TOP)
    assert sdram_sectors(DEMO_CONFIG, DEMO_TOP) == 0
    assert sdram_sectors(DEMO_CONFIG, tiered) == 2 * RecordLayout(DEMO_CONFIG).sectors_per_region
    image = tmp_path / "card.img"
    with pytest.raises(UsageError, match=r"^bad --top: Unknown SDRAM chip 'NOPE'"):
        main(["--config", "demo", "--sdram", "NOPE", "--image", str(image)])
    with pytest.raises(UsageError, match=r"^bad --top: slots must be between 2 and 1024"):
        main(["--config", "demo", "--sdram", "--top", '{"regions": 2, "tier": {"slots": 1}}',
              "--image", str(image)])
    assert not image.exists()
