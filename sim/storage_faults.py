"""What storage can hold after power cuts and wear: the cases every recovery must survive.

The directory rebuild after a power cut (host-driven :meth:`ringkv.host.device.fpga.FpgaDevice.
rebuild` over :func:`ringkv.host.record.plan_rebuild`, and any device-side recovery) treats every
byte read from the medium as untrusted. These helpers make the bytes of the cases it is tested
on (``tests/host/record/test_record_recovery.py`` with the golden model,
``tests/system/test_recovery_system.py`` on the Verilator top), so that another recovery can be run
through the same cases:

* :func:`torn_header` -- an export whose power failed ``k`` bytes into its header sector (the
  header is written last): the first ``k`` bytes of the new header, the rest as the medium was;
  :data:`MEDIA` the two media that matter, an erased card (reads ``0xFF`` where nothing was
  written: a torn ``commit_seq`` then reads ``0xFFFFFFFF``) and a zeroed one;
  :data:`TORN_OFFSETS` a representative set of ``k`` (field boundaries, ``commit_seq`` and the
  header CRC partly written);
* :func:`random_header` -- a header sector of random bytes that carries a valid magic and
  version (``BAD_HEADER``), optionally with a valid header CRC (then ``FOREIGN_CONFIG``), or
  with this configuration's constant bytes and a valid CRC but random variable fields
  (absurd counts, heads and lengths: ``BAD_HEADER``, nothing read beyond the header).
"""

from ringkv.defs.record import (
    HEADER_OFFSETS,
    MAGIC,
    SECTOR,
    VERSION,
    header_template,
    put_field,
)
from ringkv.host.record import crc32

__all__ = ["MEDIA", "TORN_OFFSETS", "torn_header", "random_header", "RANDOM_KINDS"]

#: ``{name: the byte an unwritten sector reads}``.
MEDIA = {"erased": 0xFF, "zeroed": 0x00}

#: Header byte offsets at which a power cut is tested in ``make test``: none written, one
#: byte, magic complete, version complete, ``commit_seq`` 0/1/3 bytes in and complete, inside
#: the config fields, CRC not started, CRC partly written, all but the last byte.
TORN_OFFSETS = (0, 1, 8, 12, 13, 15, 16, 100, 507, 508, 511)


def torn_header(header: bytes, k: int, medium: int) -> bytes:
    """The header sector after a power cut ``k`` bytes into writing ``header`` over an
    unwritten sector of ``medium`` (0 <= k < 512)."""
    if len(header) != SECTOR or not 0 <= k < SECTOR:
        raise ValueError(f"a {SECTOR}-byte header and 0 <= k < {SECTOR} (k = {k})")
    return bytes(header[:k]) + bytes([medium]) * (SECTOR - k)


#: Kinds of :func:`random_header`.
RANDOM_KINDS = ("random", "random_crc", "template_crc")


def random_header(rng, kind: str = "random", config=None) -> bytes:
    """A 512-byte header sector of random bytes with a valid magic and version.

    ``kind``: ``"random"`` (header CRC almost surely wrong), ``"random_crc"`` (valid header
    CRC: the random config fields decide), ``"template_crc"`` (``config``'s constant header
    bytes, random commit sequence, hash, count, head, lengths and payload CRC, valid header
    CRC: only the field consistency checks stand between these bytes and a read of the
    payload). ``rng`` is a :class:`random.Random`.
    """
    if kind not in RANDOM_KINDS:
        raise ValueError(f"kind must be one of {', '.join(RANDOM_KINDS)}, not {kind!r}")
    buf = bytearray(rng.randbytes(SECTOR))
    if kind == "template_crc":
        template = header_template(config)
        for lo, hi in ((0, 12), (16, 48), (80, 508)):
            buf[lo:hi] = template[lo:hi]
        if rng.random() < 0.5:           # absurd numbers, or merely inconsistent ones
            for name in ("count", "ring_head", "token_bytes", "k_bytes", "v_bytes"):
                off, size = HEADER_OFFSETS[name]
                buf[off:off + size] = rng.choice([b"\xff" * size, rng.randbytes(size)])
    put_field(buf, "magic", MAGIC)
    put_field(buf, "version", VERSION)
    put_field(buf, "header_bytes", SECTOR)
    if kind != "random":
        put_field(buf, "header_crc", crc32(buf[:508]))
    return bytes(buf)
