"""``ringkv.host.device``: the devices the scheduler drives, and how it reaches them -- the
device protocol (:mod:`.interface`), the software device (:mod:`.software`, golden models in the
FPGA's place), the FPGA driver (:mod:`.fpga`) over the byte link (:mod:`.link`, frames in
:mod:`.frames`, per-opcode payloads in :mod:`.ops`), and the board's bring-up self-test
(:mod:`.board_check`).

It may import the standard library, numpy, pyserial, ``ringkv.defs`` and the rest of
``ringkv.host`` except the scheduler (which imports it): golden models, records, keys, errors,
and the model's attention backends (``tests/repo/test_layers.py``). Nothing is re-exported: the
modules are imported by name (``from ringkv.host.device.fpga import FpgaDevice``), so importing
the link does not load the software device.
"""

__all__ = []
