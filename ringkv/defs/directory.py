"""The cache directory's interface, defined once for the gateware and its golden model.

Opcodes (:class:`Op`), statuses (:class:`Status`), field widths, the command and response
fields (:func:`command_fields`, :func:`response_fields`) and the parameter rules
(:func:`check_directory_params`) of :class:`ringkv.hw.store.directory.CacheDirectory`; the golden
model :class:`ringkv.host.golden.directory.GoldenDirectory` depends on these, not on the RTL.
"""

import enum

from .checks import check_int, check_pow2

__all__ = ["Op", "Status", "OP_BITS", "STATUS_BITS", "LINK_FIELD_WIDTH", "REGION_FIELD_WIDTH",
           "PROBES_FIELD_WIDTH", "NIL", "command_fields", "response_fields", "probe_fields",
           "check_directory_params"]

#: Width of the ``link``/``prev``/``next``/``victim`` fields; ``NIL`` (all ones) means "none".
LINK_FIELD_WIDTH = 16
#: Width of the ``region`` fields: up to 2**24 regions.
REGION_FIELD_WIDTH = 24
NIL = (1 << LINK_FIELD_WIDTH) - 1
#: Width of the ``probes`` response field (PROBE: links compared in the whole run).
PROBES_FIELD_WIDTH = 32

#: Bits of the ``op`` and ``status`` fields.
OP_BITS = 4
STATUS_BITS = 4


class Op(enum.Enum):
    """Command opcodes (``command_layout().op``)."""
    LOOKUP = 0
    INSERT = 1
    DELETE = 2
    TOUCH = 3
    EXPIRE = 4
    READ = 5
    INSERT_EXISTING = 6
    CLEAR = 7
    #: A probe run: the keys follow on the ``probe`` stream (:func:`probe_fields`), one
    #: response after the key marked ``last`` (the last key that hit; stamps unchanged).
    PROBE = 8


class Status(enum.Enum):
    """Response status (``response_layout().status``). A lookup hit is ``OK``."""
    OK = 0
    MISS = 1
    FULL = 2
    BAD_COUNT = 3
    BAD_LINK = 4
    NOT_LIVE = 5
    BAD_REGION = 6
    BAD_OP = 7


def command_fields(count_width=24, hash_width=64, stamp_width=32) -> dict:
    """The command payload's fields from the LSB: ``{name: width}`` (``op`` is an :class:`Op`).

    Fields an operation does not use are ignored.
    """
    return {
        "op": OP_BITS,
        "evict": 1,                       # INSERT: evict the LRU link when full
        "link": LINK_FIELD_WIDTH,         # DELETE, TOUCH, READ
        "count": count_width,             # LOOKUP, INSERT, INSERT_EXISTING (token count)
        "hash": hash_width,               # LOOKUP, INSERT, INSERT_EXISTING (prefix hash)
        "region": REGION_FIELD_WIDTH,     # INSERT_EXISTING
        "now": stamp_width,               # LOOKUP (hit), INSERT, INSERT_EXISTING, TOUCH, EXPIRE
        "max_age": stamp_width,           # EXPIRE
    }


def response_fields(count_width=24, hash_width=64, stamp_width=32) -> dict:
    """The response payload's fields from the LSB: ``{name: width}`` (``status`` is a
    :class:`Status`, ``op`` an :class:`Op`). Fields an operation does not report are zero."""
    return {
        "status": STATUS_BITS,
        "op": OP_BITS,                    # the command's opcode, echoed
        "evicted": 1,                     # INSERT: an LRU link was evicted to make room
        "link": LINK_FIELD_WIDTH,
        "region": REGION_FIELD_WIDTH,
        "count": count_width,
        "hash": hash_width,
        "stamp": stamp_width,             # READ
        "prev": LINK_FIELD_WIDTH,         # READ (NIL: none)
        "next": LINK_FIELD_WIDTH,         # READ (NIL: none)
        "victim": LINK_FIELD_WIDTH,       # INSERT with evicted=1: the evicted link
        "expired": LINK_FIELD_WIDTH,      # EXPIRE: number of links expired
        "probes": PROBES_FIELD_WIDTH,     # PROBE: links compared over the whole run
    }


def probe_fields(count_width=24, hash_width=64) -> dict:
    """The ``probe`` stream's payload fields from the LSB (the keys of a PROBE run): the
    hash engine's output fields, so that its stream plugs in unchanged."""
    return {"hash": hash_width, "count": count_width, "last": 1}


def check_directory_params(buckets, links, regions, count_width, hash_width, stamp_width,
                           b_threshold):
    """Check the parameters shared by the RTL and the golden model; return ``b_threshold``."""
    check_pow2("Bucket count", buckets, low=2, high=1 << 16)
    check_pow2("Link count", links, low=2, high=1 << (LINK_FIELD_WIDTH - 1))
    check_pow2("Region count", regions, low=2, high=1 << REGION_FIELD_WIDTH)
    check_int("Count width", count_width, low=1, high=32, unit=" bits")
    check_int("Hash width", hash_width, low=buckets.bit_length() - 1, high=128, unit=" bits")
    check_int("Stamp width", stamp_width, low=1, high=32, unit=" bits")
    if b_threshold is None:
        b_threshold = max(1, regions // 2)
    check_int("FIFO B threshold", b_threshold, low=1, high=regions)
    return b_threshold
