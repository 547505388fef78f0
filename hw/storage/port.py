"""The storage port: sector reads and writes with multi-sector bursts.

Every storage backend sits behind :class:`StoragePortSignature` -- the SD card controller on the
board, in native 4-bit mode (``hw/storage/sdnative.py``, the default) or in SPI mode
(``hw/storage/sdspi.py``), and in simulation the sector-level model of
``sim/sector_model.py`` (a Python coroutine over an image file) -- so the DMA engine
(``hw/storage/dma.py``) does not know which one it talks to.

Protocol, seen from the initiator (the DMA):

1. one transfer on ``cmd``: ``{op, lba, count}`` (``count`` >= 1 sectors of 512 bytes);
2. data: for a write the initiator sends ``count * 512`` bytes on ``wdata``; for a read the
   target sends ``count * 512`` bytes on ``rdata``; both streams obey the ``lib.stream`` rules
   and may stall at any time;
3. one transfer on ``status``: ``{error}``, after the last data byte (for a write: after the
   data is durable, e.g. when the SD card's busy phase has ended).

On an error the target may stop the data phase early and send the status at once (a card that
stops answering ends in a timeout error, never a hang), so an initiator keeps ``status.ready``
high during the data phase and aborts the transfer when an error status arrives. (An
initiator that holds data of its own a few clocks behind the port, the wide DMA's unpacker
or a ``StorageWidener``'s packer, may hold an ``OK`` status until that data is out; an error
status is taken at once by the DMA, after at most one word by the widener.) A command with
``count == 0`` or outside the medium gets ``RANGE`` without a data phase.

Peak bandwidth of the port: one transfer per clock on ``wdata``/``rdata``: a byte (8-bit data
streams, chosen to match the SD card's byte-serial bus and the DMA's element-wide ring port),
or four bytes on a wide port (``width=4``: the SDRAM tier at half rate, for the four-byte
import).
"""

from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs import protocol
from ringkv.defs.record import SECTOR

from ..enums import shaped

__all__ = ["SECTOR_BYTES", "STORAGE_WIDTHS", "StorageOp", "StorageError", "StorageCommand",
           "StorageStatus",
           "StoragePortSignature", "StorageInfoSignature", "CardType"]

#: Bytes per sector (the record format's sector, :data:`ringkv.defs.record.SECTOR`).
SECTOR_BYTES = SECTOR
#: The data transfer widths of a storage port, in bytes.
STORAGE_WIDTHS = (1, 4)


class StorageOp(enum.Enum, shape=1):
    READ = 0
    WRITE = 1


#: :class:`ringkv.defs.protocol.StorageError` as a 3-bit shape: OK, TIMEOUT (no response, no
#: data token, or busy for too long: card gone or hung), CRC (CRC7 rejected by the card, CRC16
#: of read data wrong, or write CRC error), CARD (the card answered with an error: R1 error
#: bits, error token, write error), RANGE (count 0, or sectors outside the medium), NOT_READY
#: (initialisation failed: no card, unusable card).
StorageError = shaped(protocol.StorageError, 3, module=__name__)


StorageCommand = data.StructLayout({"op": StorageOp, "lba": 32, "count": 16})
StorageStatus = data.StructLayout({"error": StorageError})


class StoragePortSignature(wiring.Signature):
    """A sector storage port, initiator side (``.flip()`` for the target).

    Members: ``cmd`` (Out, stream of :data:`StorageCommand`), ``wdata`` (Out, stream of
    ``8 * width`` bits), ``rdata`` (In, the same), ``status`` (In, stream of
    :data:`StorageStatus`). ``width``: bytes a data transfer, 1 (every controller of the SD
    card) or 4 (the wide port of the SDRAM sector store and the tiered storage: a sector is
    128 transfers, byte ``4 * i + k`` of it in bits ``8 k .. 8 k + 7`` of transfer ``i``);
    :class:`~ringkv.hw.storage.port_width.StorageWidener` puts a port of bytes behind a wide
    one.
    """

    def __init__(self, width: int = 1):
        if width not in STORAGE_WIDTHS:
            raise ValueError(f"width must be one of {STORAGE_WIDTHS} bytes, not {width!r}")
        self._width = width
        super().__init__({
            "cmd": Out(stream.Signature(StorageCommand)),
            "wdata": Out(stream.Signature(8 * width)),
            "rdata": In(stream.Signature(8 * width)),
            "status": In(stream.Signature(StorageStatus)),
        })

    @property
    def width(self) -> int:
        """Bytes a data transfer."""
        return self._width

    def __eq__(self, other):
        return type(other) is StoragePortSignature and other._width == self._width

    def __hash__(self):
        return hash((StoragePortSignature, self._width))

    def __repr__(self):
        return ("StoragePortSignature()" if self._width == 1 else
                f"StoragePortSignature(width={self._width})")


#: :class:`ringkv.defs.protocol.CardType` as a 2-bit shape (the controllers' ``card_type``).
CardType = shaped(protocol.CardType, 2, module=__name__)


class StorageInfoSignature(wiring.Signature):
    """What a storage controller knows about its medium, controller side (``.flip()`` for the
    top that reports it: ``STORAGE_INFO``).

    Members (all Out): ``ready`` (the card is initialised), ``card_type`` (:class:`CardType`,
    from the card's last answer to ``ACMD41``/``CMD58``: the OCR's CCS bit), ``high_speed``
    (the card runs in high-speed mode), ``sectors`` (33 bits: capacity in 512-byte sectors
    from the CSD, 0 when unknown).
    """

    def __init__(self):
        super().__init__({"ready": Out(1), "card_type": Out(CardType), "high_speed": Out(1),
                          "sectors": Out(33)})

    def __eq__(self, other):
        return type(other) is StorageInfoSignature

    def __hash__(self):
        return hash(StorageInfoSignature)

    def __repr__(self):
        return "StorageInfoSignature()"
