"""``ringkv.hw.sdram``: an SDR SDRAM controller of our own -- the PHY at the pins, the power-up
sequence, the refresher, one bank machine per bank with its open row, the command multiplexer
and the arbiter between stream-shaped burst ports (``docs/blocks/sdram.md``; at the SDRAM's
clock or at half rate, the PHY's registers at twice the controller's clock), a 16-bit port on
a half-rate controller's 32-bit one (``widener.py``), and the memory self-test on a port
(``bist.py``, ``docs/BOARD.md``).

It may import Amaranth, the standard library, ``ringkv.defs``, the shared shapes of
``ringkv.hw.enums`` and the register slice of ``ringkv.hw.link.skid`` (a module of Amaranth
alone: the self-test's commands go through one): it knows none of the other subsystems
(``tests/repo/test_layers.py``).
Inside the package, modules import each other, never these re-exports.
"""

from .arbiter import PortArbiter, UserPortSignature
from .bank import BankMachine
from .bist import BistSignature, SdramBist
from .controller import SdramController
from .init import SdramInit
from .multiplexer import Multiplexer
from .phy import DfiSignature, SdramPhy, SdramPinsSignature
from .refresher import Refresher
from .widener import PortWidener

__all__ = ["SdramController", "SdramPhy", "SdramInit", "Refresher", "BankMachine",
           "Multiplexer", "PortArbiter", "UserPortSignature", "SdramPinsSignature",
           "DfiSignature", "SdramBist", "BistSignature", "PortWidener"]
