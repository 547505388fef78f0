"""One commit, one netlist: the board top's RTLIL is the same text in every Python process.

A set iterated in hash order (``Op`` is a plain ``Enum``, hashed by its name, and string hashes
change with ``PYTHONHASHSEED``) once gave the dispatcher's recovery gate a different RTLIL text
in each process, so ``ringkv build --seed N`` of one commit did not rebuild the same netlist
and ``make gatesim`` synthesized again on most runs. Each process here elaborates the board top
(the half-rate SDRAM and the sealed device: the most logic a small shape has) through the
ULX3S platform, as ``ringkv build`` does, and prints its RTLIL's digest.
"""

import os
import subprocess
import sys

SCRIPT = """
import hashlib
from amaranth_boards.ulx3s import ULX3S_85F_Platform
from ringkv.boards.ulx3s import ULX3STop
from ringkv.defs.config import RingKVConfig
cfg = RingKVConfig(layers=1, q_heads=1, kv_heads=1, head_dim=4, window=4, token_width=8,
                   max_tokens=16)
top = ULX3STop(cfg, lanes=1, macs=2, regions=4, sdram_rate=2, sealed=True)
plan = ULX3S_85F_Platform().prepare(top, name="t")
print(hashlib.sha256(plan.files["t.il"].encode()).hexdigest())
"""


def test_board_rtlil_does_not_depend_on_the_hash_seed():
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed})
             for seed in ("1", "2")]
    digests = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=300)
            assert p.returncode == 0, err
            digests.append(out.strip())
    finally:                    # a failure or a timeout leaves no child behind
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert len(digests[0]) == 64 and digests[0] == digests[1]
