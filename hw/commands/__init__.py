"""``ringkv.hw.commands``: the command processor -- the dispatcher that takes a decoded request,
hands it to the unit of its opcode family and frames the answer, and one unit per family
(link and identity, tokens, directory, snapshots, prefixes, attention, storage, recovery, keys,
the SDRAM self-test).

With ``ringkv.hw.top``, the one part of the gateware that sees every subsystem: it may import
Amaranth, the standard library, ``ringkv.defs`` and all of ``ringkv.hw``
(``tests/repo/test_layers.py``).
"""

from .attention import AttentionUnit
from .directory import DirectoryUnit
from .dispatch import CommandUnit, Dispatcher
from .keys import KeyUnit, MacArbiter
from .link import LinkUnit
from .prefix import PrefixUnit
from .recovery import RecoveryUnit
from .sdram import SdramTestUnit
from .snapshot import SnapshotUnit
from .storage import StorageUnit
from .tokens import TokenUnit

__all__ = ["Dispatcher", "CommandUnit", "LinkUnit", "TokenUnit", "DirectoryUnit",
           "SnapshotUnit", "PrefixUnit", "AttentionUnit", "StorageUnit", "RecoveryUnit",
           "KeyUnit", "MacArbiter", "SdramTestUnit"]
