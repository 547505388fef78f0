"""Snapshot records in external storage: golden encoder/decoder, scan and inspection.

The format is ``docs/blocks/record-format.md``; its rules of use ``docs/CONVENTIONS.md#records``.

This module is the bit-exact reference of what ``hw/storage/dma.py`` writes and checks. The format's
definitions (header fields, :class:`~ringkv.defs.record.RecordLayout`, ``RecordStatus``, the
commit sequence rule) are :mod:`ringkv.defs.record`; the byte layout is documented in
``docs/blocks/record-format.md``; in short (all integers little-endian, sectors
of 512 bytes, storage region ``r`` starting at sector ``r * sectors_per_region``):

* region sector 0: the **header** (512 bytes, table :data:`HEADER_FIELDS`), header CRC last;
* region sectors ``1 .. 1+T``: the **tokens**, ``token_bytes`` bytes each, little-endian,
  zero padded to a sector boundary (``T`` = sectors for ``max_tokens`` tokens);
* region sectors ``1+T ..``: the **KV area**: K then V, zero padded to a sector boundary.
  Each element is ``EB`` bytes (:func:`elem_bytes`: 1 for ``ringkv-fx1``'s int8, 2 for
  ``ringkv-fx2``'s int16), little-endian, its bytes kept together.
  With ``v = min(n, W)`` valid slots and ``s_t = (head - v + 1 + t) mod W`` the slot of the
  ``t``-th oldest valid token:

  - K: ``for layer, for kv_head, for t in 0..v-1, for dim: K[layer][kv_head][s_t][dim]``
    (token order, each token's K vector contiguous);
  - V: ``for layer, for kv_head, for dim, for t in 0..v-1: V[layer][kv_head][s_t][dim]``
    (column-wise: all tokens of dim 0, then dim 1, ...).

The payload CRC (CRC-32/ISO-HDLC) covers the token bytes, then K, then V, without padding.
Write order is payload first, header last: an interrupted export leaves no valid header, so the
previous snapshot (in another region) stays the newest valid one.

Recovery (:func:`scan_image`, :func:`plan_rebuild`) treats every byte read from storage as
untrusted: only a record that passes every check gives the rebuild its key, count and commit
sequence; anything else is a region to free with its reason, and nothing on the medium makes
the scan or the rebuild raise. Commit sequences are compared in serial-number order modulo
2**32 (:func:`ringkv.defs.record.seq_newer`); the rule is in ``docs/blocks/record-format.md``.

Rings are given as an integer array of shape ``(layers, kv_heads, 2, window, head_dim)``
(kind 0 = K, 1 = V) holding each element's ``8*EB``-bit two's-complement word (``uint8`` for
fx1, ``uint16`` for fx2; signed values are accepted and taken modulo ``2**(8*EB)``), in the
attention core's ring-access order: element ``((layer*Hkv + kv_head)*2 + kind)*W*d + slot*d +
dim`` at byte address ``element * EB + byte`` of the ring port (:func:`ring_image` /
:func:`rings_from_image` convert between the two).
"""

import hmac
import os
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig, with_numerics
from ringkv.defs.mac import KEY_ID_BYTES, KEY_ID_NONE, TAG_BYTES
from ringkv.defs.numerics import NUMERICS_TABLE
from ringkv.defs.record import (
    CONFIG_FIELDS,
    CONST_RANGES,
    HEADER_OFFSETS,
    MAGIC,
    SECTOR,
    SEQ_MOD,
    VERSION,
    RecordKind,
    RecordLayout,
    RecordStatus,
    decode_fracs,
    elem_bytes,
    header_template,
    kv_bytes_of,
    mac_message,
    put_field,
    seq_newer,
    seq_newest,
    seq_next,
)

from .errors import (
    ConfigError,
    NotACardImage,
    RingKVError,
    StorageError,
    UsageError,
    run_main,
)
from .golden.mac import check_key, mac

__all__ = [
    "Header", "RecordError", "crc32", "encode_header", "decode_header", "ring_dtype",
    "ring_image", "rings_from_image", "encode_payload", "encode_record", "decode_payload",
    "import_record", "RecordInfo", "scan_region", "scan_image", "RebuildPlan", "plan_rebuild",
    "rebuild", "format_listing", "fsck_report", "HeaderInfo", "check_header", "scan_headers",
    "RecoveryPlan", "plan_recovery", "kind_name", "read_record_bytes", "record_writes", "main",
    "region_states", "PROBLEM_STATES", "ImageSurvey", "survey_image", "CardImage",
    "open_card_image", "read_image_file", "repair_image", "record_tag", "seal_header",
    "REPAIRABLE_STATES",
    "check_mac", "check_key_ring",
]

def crc32(data: bytes) -> int:
    """CRC-32/ISO-HDLC (:data:`ringkv.defs.record.RECORD_CRC`), the header and payload CRC."""
    return zlib.crc32(bytes(data))


def ring_dtype(config: RingKVConfig) -> np.dtype:
    """The unsigned little-endian numpy type of one K/V element word (``<u1`` or ``<u2``)."""
    return np.dtype(f"<u{elem_bytes(config)}")


def _words(config, rings):
    """``rings`` as unsigned element words (``ring_dtype``), any integer input modulo 2**EW."""
    bits = 8 * elem_bytes(config)
    return (np.asarray(rings).astype(np.int64) & ((1 << bits) - 1)).astype(ring_dtype(config))


def ring_image(config: RingKVConfig, rings) -> bytes:
    """The ring port's byte space: element ``e`` at bytes ``e*EB .. e*EB+EB-1``, little-endian."""
    return _words(config, rings).reshape(-1).tobytes()


def rings_from_image(config: RingKVConfig, data: bytes, *, signed: bool = False):
    """Rings ``(layers, kv_heads, 2, window, head_dim)`` from the ring port's bytes: unsigned
    element words, or (``signed``) the signed int64 element values."""
    c = config
    words = np.frombuffer(bytes(data), dtype=ring_dtype(c)).reshape(
        c.layers, c.kv_heads, 2, c.window, c.head_dim)
    if not signed:
        return words.copy()
    bits = 8 * elem_bytes(c)
    w = words.astype(np.int64)
    return w - ((w >> (bits - 1)) << bits)


@dataclass
class Header:
    magic: bytes
    version: int
    header_bytes: int
    commit_seq: int
    config_digest: bytes
    prefix_hash: int
    count: int
    ring_head: int
    token_bytes: int
    k_bytes: int
    v_bytes: int
    payload_crc: int
    config_fields: dict = field(default_factory=dict)
    header_crc: int = 0
    header_crc_ok: bool = True
    kind: int = RecordKind.TURN.value      #: :class:`~ringkv.defs.record.RecordKind` value
    key_id: int = KEY_ID_NONE              #: id of the key that sealed it; 0: an open record
    mac_tag: bytes = bytes(TAG_BYTES)      #: the stored tag (all zero in an open record)

    @property
    def sealed(self) -> bool:
        return self.key_id != KEY_ID_NONE


def kind_name(kind: int) -> str:
    """``turn`` or ``checkpoint`` (:class:`~ringkv.defs.record.RecordKind`); another stored
    value as ``kind N``."""
    try:
        return RecordKind(kind).name.lower()
    except ValueError:
        return f"kind {kind}"


class RecordError(StorageError):
    """A record that cannot be used; ``status`` is the :class:`RecordStatus`."""

    def __init__(self, status: RecordStatus, message: str, header: Header | None = None):
        super().__init__(message)
        self.status = status
        self.header = header


def _get(buf, name):
    off, size = HEADER_OFFSETS[name]
    return int.from_bytes(buf[off:off + size], "little")


def encode_header(config, *, count, ring_head, prefix_hash, commit_seq, payload_crc,
                  kind=RecordKind.TURN.value, key_id=KEY_ID_NONE,
                  mac_tag=bytes(TAG_BYTES)) -> bytes:
    """The 512-byte header sector of a record (header CRC included); ``kind`` a
    :class:`~ringkv.defs.record.RecordKind` (or its value). An open record has ``key_id`` 0
    and a zero ``mac_tag``; :func:`seal_header` makes a sealed one."""
    lay = RecordLayout(config)
    kv = kv_bytes_of(config, count)
    buf = bytearray(header_template(config))
    put_field(buf, "commit_seq", commit_seq)
    put_field(buf, "prefix_hash", prefix_hash)
    put_field(buf, "count", count)
    put_field(buf, "ring_head", ring_head)
    put_field(buf, "token_bytes", count * lay.token_bytes)
    put_field(buf, "k_bytes", kv // 2)
    put_field(buf, "v_bytes", kv // 2)
    put_field(buf, "payload_crc", payload_crc)
    put_field(buf, "kind", kind.value if isinstance(kind, RecordKind) else kind)
    put_field(buf, "key_id", key_id)
    put_field(buf, "mac_tag", bytes(mac_tag))
    put_field(buf, "header_crc", crc32(buf[:508]))
    return bytes(buf)


def _check_key_id(key_id) -> int:
    if (isinstance(key_id, bool) or not isinstance(key_id, int)
            or not 0 < key_id < 1 << (8 * KEY_ID_BYTES)):
        raise ValueError(f"a key id is an integer 1 .. {(1 << (8 * KEY_ID_BYTES)) - 1} "
                         f"(0 is an open record's), not {key_id!r}")
    return key_id


def check_key_ring(keys) -> dict:
    """``keys`` (``{key_id: 32-byte key}``) checked: ids 1 .. 65535, keys of 32 bytes.
    The message of the ``ValueError``/``TypeError`` never holds a key's bytes."""
    if not isinstance(keys, dict):
        raise TypeError(f"a key ring is a dict {{key_id: key}}, not {type(keys).__name__}")
    ring = {}
    for key_id, key in keys.items():
        _check_key_id(key_id)
        try:
            ring[key_id] = check_key(key)
        except (TypeError, ValueError) as e:
            raise type(e)(f"key id {key_id}: {e}") from None
    return ring


def record_tag(key: bytes, tok: bytes, kv: bytes, header: bytes) -> bytes:
    """The tag of a record under ``key``: keyed BLAKE2s with ``PERSON_RECORD`` over
    :func:`~ringkv.defs.record.mac_message` (tokens, K/V, header with the tag read as zeros)."""
    return mac(key, mac_message(tok, kv, header))


def seal_header(header: bytes, tok: bytes, kv: bytes, key: bytes, key_id: int) -> bytes:
    """``header`` (a record's header sector) sealed under ``key``: ``key_id`` written, the tag
    of the record (:func:`record_tag`) written into ``mac_tag``, then the header CRC
    recomputed over the header with the tag."""
    buf = bytearray(header)
    put_field(buf, "key_id", _check_key_id(key_id))
    put_field(buf, "mac_tag", bytes(TAG_BYTES))
    put_field(buf, "mac_tag", record_tag(check_key(key), tok, kv, buf))
    put_field(buf, "header_crc", crc32(buf[:508]))
    return bytes(buf)


def check_mac(h: "Header", header: bytes, tok: bytes, kv: bytes, keys,
              *, sealed: bool = False) -> tuple[RecordStatus, str]:
    """``(OK | NO_KEY | BAD_MAC, reason)`` of a record's key id and tag under the key ring
    ``keys`` (``{key_id: key}``; the keys that may authenticate this record).

    An open record (key id 0) is ``OK`` unless ``sealed`` (a sealed device takes only records
    it can authenticate) or its tag is not all zero (``BAD_MAC``); a sealed record whose key
    id is not in ``keys`` is ``NO_KEY``, one whose tag differs from the tag under that key is
    ``BAD_MAC`` (compared in constant time)."""
    if not h.sealed:
        if sealed:
            return RecordStatus.NO_KEY, "open record (key id 0): a sealed device needs a tag"
        if any(h.mac_tag):
            # an open record is written with a zero tag: a tag with key id 0 is a sealed
            # record whose key id was cleared
            return RecordStatus.BAD_MAC, "open record (key id 0) with a tag"
        return RecordStatus.OK, ""
    key = keys.get(h.key_id)
    if key is None:
        return RecordStatus.NO_KEY, f"sealed under key id {h.key_id}, which is not held"
    if not hmac.compare_digest(record_tag(key, tok, kv, header), h.mac_tag):
        return RecordStatus.BAD_MAC, f"tag does not verify under key id {h.key_id}"
    return RecordStatus.OK, ""


def _decode_fields(buf) -> Header:
    cfg = {name: _get(buf, name) for name in CONFIG_FIELDS[:-1]}
    off, size = HEADER_OFFSETS["numerics"]
    cfg["numerics"] = bytes(buf[off:off + size]).rstrip(b"\0").decode("ascii", "replace")
    nx = NUMERICS_TABLE.get(cfg["numerics"])
    if nx is not None and nx.per_layer:
        cfg["qkv_fracs"] = decode_fracs(buf, cfg["layers"])
    return Header(
        magic=bytes(buf[0:8]), version=_get(buf, "version"),
        header_bytes=_get(buf, "header_bytes"), commit_seq=_get(buf, "commit_seq"),
        config_digest=bytes(buf[16:48]), prefix_hash=_get(buf, "prefix_hash"),
        count=_get(buf, "count"), ring_head=_get(buf, "ring_head"),
        token_bytes=_get(buf, "token_bytes"), k_bytes=_get(buf, "k_bytes"),
        v_bytes=_get(buf, "v_bytes"), payload_crc=_get(buf, "payload_crc"),
        config_fields=cfg, header_crc=_get(buf, "header_crc"),
        header_crc_ok=crc32(buf[:508]) == _get(buf, "header_crc"), kind=_get(buf, "kind"),
        key_id=_get(buf, "key_id"), mac_tag=bytes(buf[308:324]))


def decode_header(buf: bytes, config: RingKVConfig = DEFAULT_CONFIG) -> Header:
    """Decode and check a header sector; raise :class:`RecordError` if it is not usable here.

    A foreign record's message names the differing config fields (``RingKVConfig.diff``).
    """
    if len(buf) != SECTOR:
        raise ValueError(f"a header is {SECTOR} bytes, not {len(buf)}")
    h = _decode_fields(buf)
    if h.magic != MAGIC:
        raise RecordError(RecordStatus.EMPTY, "no record (magic missing)", h)
    if h.version != VERSION or h.header_bytes != SECTOR:
        raise RecordError(RecordStatus.BAD_VERSION,
                          f"record format version {h.version} (header {h.header_bytes} bytes) "
                          f"is not version {VERSION}", h)
    if not h.header_crc_ok:
        raise RecordError(RecordStatus.BAD_HEADER, "header CRC mismatch", h)
    template = header_template(config)
    if any(bytes(buf[lo:hi]) != template[lo:hi] for name, (lo, hi) in CONST_RANGES.items()
           if name.startswith("config")):
        raise RecordError(RecordStatus.FOREIGN_CONFIG,
                          "record written under another configuration: "
                          + _config_diff_message(h, config), h)
    lay = RecordLayout(config)
    kv = kv_bytes_of(config, h.count)
    if (h.count > config.max_tokens or h.ring_head >= config.window
            or h.token_bytes != h.count * lay.token_bytes
            or h.k_bytes != kv // 2 or h.v_bytes != kv // 2):
        raise RecordError(RecordStatus.BAD_HEADER,
                          f"header fields inconsistent (count {h.count}, head {h.ring_head}, "
                          f"lengths {h.token_bytes}/{h.k_bytes}/{h.v_bytes})", h)
    return h


def _config_diff_message(h: Header, config: RingKVConfig) -> str:
    try:
        theirs = RingKVConfig(**h.config_fields)
    except (ValueError, TypeError) as e:
        return f"stored config fields are invalid ({e})"
    diffs = theirs.diff(config)
    if not diffs:
        return ("config digest differs (same fields: a different digest scheme or numerics "
                "scales)")
    return "; ".join(f"{d} (record != this device)" for d in diffs)


def _ring_order(config, count, head):
    v = min(count, config.window)
    return [(head - v + 1 + t) % config.window for t in range(v)]


def encode_payload(config, tokens, rings, count, head) -> tuple[bytes, bytes]:
    """(token bytes, K+V bytes) of a record, unpadded; ``tokens[:count]`` are stored."""
    lay = RecordLayout(config)
    if len(tokens) < count:
        raise ValueError(f"{len(tokens)} tokens given, record needs {count}")
    tok = b"".join(int(t).to_bytes(lay.token_bytes, "little") for t in tokens[:count])
    slots = _ring_order(config, count, head)
    r = _words(config, rings)                    # little-endian EB-byte element words
    k = r[:, :, 0, slots, :]                     # layer, head, t, dim
    v = np.transpose(r[:, :, 1, slots, :], (0, 1, 3, 2))   # layer, head, dim, t
    return tok, np.ascontiguousarray(k).tobytes() + np.ascontiguousarray(v).tobytes()


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % SECTOR)


def encode_record(config, tokens, rings, *, count, ring_head, prefix_hash, commit_seq,
                  kind=RecordKind.TURN.value, key=None, key_id=KEY_ID_NONE):
    """The sector writes of an export, in write order: ``[(sector offset in region, bytes)]``.

    Payload first (tokens, then KV, each padded to sectors, omitted when empty), header last.
    With ``key`` (32 bytes) and ``key_id`` (1 .. 65535) the record is sealed
    (:func:`seal_header`); without, it is open (key id 0, zero tag).
    """
    lay = RecordLayout(config)
    if (key is None) != (key_id == KEY_ID_NONE):
        raise ValueError("a sealed record needs both a key and a key id other than 0; an open "
                         "record neither")
    tok, kv = encode_payload(config, tokens, rings, count, ring_head)
    header = encode_header(config, count=count, ring_head=ring_head, prefix_hash=prefix_hash,
                           commit_seq=commit_seq, payload_crc=crc32(tok + kv), kind=kind)
    if key is not None:
        header = seal_header(header, tok, kv, key, key_id)
    writes = []
    if tok:
        writes.append((1, _pad(tok)))
    if kv:
        writes.append((lay.kv_sector, _pad(kv)))
    writes.append((0, header))
    return writes


def decode_payload(config, h: Header, tok: bytes, kv: bytes):
    """Tokens and the valid slots' K/V from unpadded payload bytes: ``(tokens, slots, k, v)``
    with ``k``/``v`` of shape ``(layers, kv_heads, t, head_dim)`` (``t`` = oldest to newest
    valid token, in ring slots ``slots``), unsigned element words of :func:`ring_dtype`."""
    lay = RecordLayout(config)
    c = config
    tokens = [int.from_bytes(tok[i:i + lay.token_bytes], "little")
              for i in range(0, h.count * lay.token_bytes, lay.token_bytes)]
    slots = _ring_order(c, h.count, h.ring_head)
    v = len(slots)
    half = len(kv) // 2
    dt = ring_dtype(c)
    k = np.frombuffer(kv[:half], dtype=dt).reshape(c.layers, c.kv_heads, v, c.head_dim)
    vv = np.frombuffer(kv[half:], dtype=dt).reshape(c.layers, c.kv_heads, c.head_dim, v)
    return tokens, slots, k, np.transpose(vv, (0, 1, 3, 2))


def import_record(config, read, region, *, count=None, prefix_hash=None, session_tokens=None,
                  rings=None, keys=None, sealed=False):
    """Golden import/verify of ``region`` through ``read(lba, sectors) -> bytes``.

    With ``count``/``prefix_hash``/``session_tokens`` given this is an import: they must match
    the record, and on success the valid slots of ``rings`` (modified in place) are overwritten.
    Without them it is a verify (the rebuild scan).

    ``keys`` (``{key_id: key}``) are the keys that may authenticate the record, ``sealed``
    whether an open record is refused (:func:`check_mac`). An import always checks: without
    ``keys`` a sealed record is ``NO_KEY``. A verify without ``keys`` checks no tag (the
    record's key id is reported; recovery runs without keys). The key id is checked right after
    the header, the tag after the payload CRC. Returns ``(status, header or None, meta)``;
    never raises on bad records. ``meta`` is the ``(count, head)`` the DMA writes to every layer,
    or ``None`` when the metadata stays unchanged. After a failure in the KV phase (payload CRC)
    an import has partly overwritten the rings, so it writes count 0 and head ``W - 1``: the
    state a ring clear leaves (empty, the next token in slot 0), a miss, never a stale cache
    claiming to be valid.

    The bytes read are untrusted: the payload is read only after the header passed every check
    (so ``count <= max_tokens`` and the lengths are those of ``count``), and never beyond the
    region's token and KV areas whatever the header says.
    """
    status, h, meta, _ = _import(config, read, region, count=count, prefix_hash=prefix_hash,
                                 session_tokens=session_tokens, rings=rings, keys=keys,
                                 sealed=sealed)
    return status, h, meta


def _import(config, read, region, *, count=None, prefix_hash=None, session_tokens=None,
            rings=None, keys=None, sealed=False):
    """:func:`import_record` plus the reason in words: ``(status, header, meta, message)``."""
    lay = RecordLayout(config)
    base = lay.region_lba(region)
    header = bytes(read(base, 1))
    try:
        h = decode_header(header, config)
    except RecordError as e:
        return e.status, e.header, None, str(e)
    importing = count is not None
    if importing and keys is None:
        keys = {}
    if keys is not None:
        keys = check_key_ring(keys)
        if (h.sealed and h.key_id not in keys) or (sealed and not h.sealed):
            # decided from the header: no payload byte of a record no key vouches for is read
            return (RecordStatus.NO_KEY, h, None,
                    check_mac(h, header, b"", b"", keys, sealed=sealed)[1])
    if importing and (h.count != count or h.prefix_hash != prefix_hash):
        return RecordStatus.NOT_THIS, h, None, "count or prefix hash differ from the request"
    # decode_header bounds count by max_tokens; the min() keeps every read inside the region
    # even if those checks change.
    tok_sectors = min(lay.token_sectors(h.count), lay.token_sectors_max)
    kv_sectors = min(lay.kv_sectors(h.count), lay.kv_sectors_max)
    tok = read(base + 1, tok_sectors)[:h.token_bytes] if h.count else b""
    if importing:
        want = b"".join(int(t).to_bytes(lay.token_bytes, "little")
                        for t in session_tokens[:count])
        if len(session_tokens) < count or tok != want:
            return RecordStatus.TOKEN_MISMATCH, h, None, "stored tokens differ"
    kvn = h.k_bytes + h.v_bytes
    kv = read(base + lay.kv_sector, kv_sectors)[:kvn] if kvn else b""
    if len(tok) != h.token_bytes or len(kv) != kvn:      # the region ends before the payload
        return (RecordStatus.BAD_PAYLOAD_CRC, h, None,
                "payload shorter than its header says (torn or truncated)")
    ok = crc32(tok + kv) == h.payload_crc
    if importing and kvn:
        _, slots, k, v = decode_payload(config, h, tok, kv)
        for t, s in enumerate(slots):
            rings[:, :, 0, s, :] = k[:, :, t, :]
            rings[:, :, 1, s, :] = v[:, :, t, :]
    emptied = (0, config.window - 1) if importing and kvn else None    # the cleared state
    if not ok:
        return (RecordStatus.BAD_PAYLOAD_CRC, h, emptied,
                "payload CRC mismatch (torn or corrupt payload)")
    if keys is not None:
        status, why = check_mac(h, header, tok, kv, keys, sealed=sealed)
        if status is not RecordStatus.OK:
            return status, h, emptied, why
    return RecordStatus.OK, h, ((h.count, h.ring_head) if importing else None), ""


@dataclass
class RecordInfo:
    """One region's record as found by a scan.

    ``count``, ``prefix_hash``, ``commit_seq`` and ``config`` are taken from the header only
    when ``status`` is ``OK`` (header, config and payload CRC all good); for any other status
    they are 0 / empty, whatever the header says, and ``message`` says why the region is
    unusable.
    """
    region: int
    status: RecordStatus
    message: str = ""
    count: int = 0
    prefix_hash: int = 0
    commit_seq: int = 0
    config: dict = field(default_factory=dict)
    kind: int = 0        #: the header's RecordKind value (valid records only)
    torn: bool = False   #: a write cut short: a header without CRC, or the image ends early
    #: the header's key id (0: open record), whenever the header passed its CRC (a record that
    #: is NO_KEY or BAD_MAC still names its key id: it is not secret)
    key_id: int = KEY_ID_NONE
    #: whether the tag verified: ``True``/``False`` for a sealed record scanned with keys,
    #: ``None`` when no tag was checked (an open record, or a scan without keys)
    mac_ok: bool | None = None

    @property
    def valid(self) -> bool:
        return self.status is RecordStatus.OK


_BLANK_CRC = (b"\0" * 4, b"\xff" * 4)


def scan_region(config, read, region, keys=None) -> RecordInfo:
    """Verify one region's record (header, config and the full payload CRC; with ``keys``,
    ``{key_id: key}``, also a sealed record's tag: a key id not in ``keys`` is ``NO_KEY``, a
    wrong tag ``BAD_MAC``; open records stay valid).

    Every byte read is untrusted input: nothing from a record that fails a check is kept (see
    :class:`RecordInfo`), and nothing in the bytes makes this raise. A ``read`` that raises (a
    storage or link fault, not bad data) propagates.
    """
    status, h, _, message = _import(config, read, region, keys=keys)
    info = RecordInfo(region, status, message)
    if h is not None and h.header_crc_ok:
        info.key_id = h.key_id
        if keys is not None and h.sealed and status in (RecordStatus.OK, RecordStatus.BAD_MAC):
            info.mac_ok = status is RecordStatus.OK
    if status is RecordStatus.BAD_HEADER and h is not None and not h.header_crc_ok:
        # a header whose write was cut holds the bytes written so far, then the medium's
        # erased value (0x00 or 0xFF) up to the end: its CRC field is blank
        if bytes(read(RecordLayout(config).region_lba(region), 1)[508:512]) in _BLANK_CRC:
            info.torn = True
            info.message = "torn header (its write was cut: no header CRC)"
    elif status is RecordStatus.BAD_PAYLOAD_CRC and message.startswith("payload shorter"):
        info.torn = True
    if status is RecordStatus.OK:
        info.count, info.prefix_hash, info.commit_seq = h.count, h.prefix_hash, h.commit_seq
        info.config, info.kind = h.config_fields, h.kind
    return info


def scan_image(config, read, regions: int, keys=None) -> list[RecordInfo]:
    return [scan_region(config, read, r, keys) for r in range(regions)]


@dataclass
class RebuildPlan:
    """What a rebuild does with a scan (:func:`plan_rebuild`).

    ``inserts``: ``(count, prefix_hash, region, commit_seq)`` of the live records, by region;
    ``frees``: every other region, ascending; ``reasons``: ``{region: why}`` for each freed
    region that is not empty (unusable record, superseded, no tokens); ``next_seq``: the commit
    sequence number of the next export.
    """
    inserts: list
    frees: list
    next_seq: int
    reasons: dict


def plan_rebuild(infos: list[RecordInfo]) -> RebuildPlan:
    """The directory rebuild from a scan (the rule of ``docs/blocks/record-format.md``).

    * Only valid records (status ``OK``) count. A region with any other status -- torn,
      corrupt, foreign, a header that fails its checks -- contributes nothing (not its key,
      count or sequence) and is freed, its reason kept.
    * Zero-token records are valid but freed: there is nothing to resume.
    * Of the valid records of one key ``(count, prefix_hash)`` the newest commit in
      serial-number order wins (:func:`~ringkv.defs.record.seq_newest` over that key's
      sequence numbers); on equal sequence numbers (a record copied twice) the highest region.
      The result does not depend on the order of ``infos``. The others are freed (superseded).
    * ``next_seq`` is :func:`~ringkv.defs.record.seq_next` of the newest valid sequence number
      (zero-token and superseded records included), or 1 -- the gateware's reset value -- when
      there is no valid record: always in ``0 .. 2**32 - 1``, so the next export's record is
      newer than every valid one.
    """
    by_key: dict[tuple[int, int], list[RecordInfo]] = {}
    reasons = {}
    for info in infos:
        if not info.valid:
            if info.status is not RecordStatus.EMPTY:
                reasons[info.region] = f"{info.status.name}: {info.message}"
        elif info.count == 0:
            reasons[info.region] = "valid but holds no tokens: nothing to resume"
        else:
            by_key.setdefault((info.count, info.prefix_hash), []).append(info)
    live = []
    for group in by_key.values():
        newest = seq_newest(i.commit_seq for i in group)
        winner = max((i for i in group if i.commit_seq == newest), key=lambda i: i.region)
        live.append(winner)
        for i in group:
            if i is not winner:
                reasons[i.region] = (f"superseded by commit {winner.commit_seq} in region "
                                     f"{winner.region}")
    live_regions = {i.region for i in live}
    inserts = sorted(((i.count, i.prefix_hash, i.region, i.commit_seq) for i in live),
                     key=lambda x: x[2])
    frees = sorted(i.region for i in infos if i.region not in live_regions)
    newest = seq_newest(i.commit_seq for i in infos if i.valid)
    next_seq = 1 if newest is None else seq_next(newest)
    return RebuildPlan(inserts, frees, next_seq, reasons)


def rebuild(infos: list[RecordInfo]):
    """Directory rebuild from a scan: ``(inserts, frees, next_seq)`` of :func:`plan_rebuild`.

    ``inserts`` are ``(count, prefix_hash, region, commit_seq)`` for the directory's
    insert-existing command, one per distinct ``(count, prefix_hash)``, the newest commit (in
    serial-number order) winning; they are sorted by region, the order ``INSERT_EXISTING``
    requires (the directory puts the regions it skips into its FIFO B). ``frees`` are the
    regions not inserted: empty, torn, corrupt, foreign, zero-token and superseded records.
    ``next_seq`` is one after the newest *valid* record's commit sequence, modulo 2**32 (1 with
    none). Nothing is taken from a record that failed a check.
    """
    plan = plan_rebuild(infos)
    return plan.inserts, plan.frees, plan.next_seq


@dataclass(frozen=True)
class HeaderInfo:
    """One region's header sector as the device's recovery scan sees it (header only).

    ``status`` is the first failing check of the header (the import's header checks, in the
    DMA's order: magic, version and header size, header CRC, config, field consistency) or
    ``OK``; ``count``, ``prefix_hash`` and ``commit_seq`` are the header's when ``OK`` and 0
    otherwise. The payload is not read: its CRC and the tokens are checked at import.
    """
    region: int
    status: RecordStatus
    count: int = 0
    prefix_hash: int = 0
    commit_seq: int = 0
    message: str = ""
    kind: int = 0        #: the header's RecordKind value (valid headers only)
    key_id: int = KEY_ID_NONE   #: the header's key id (valid headers only; 0: open record)

    @property
    def valid(self) -> bool:
        return self.status is RecordStatus.OK


def check_header(config, sector: bytes, region: int) -> HeaderInfo:
    """The golden ``DmaOp.HEADER`` of ``hw/storage/dma.py``: :func:`decode_header` of one sector."""
    try:
        h = decode_header(bytes(sector), config)
    except RecordError as e:
        return HeaderInfo(region, e.status, message=str(e))
    return HeaderInfo(region, RecordStatus.OK, h.count, h.prefix_hash, h.commit_seq,
                      kind=h.kind, key_id=h.key_id)


def scan_headers(config, read, regions: int) -> list[HeaderInfo]:
    """:func:`check_header` of every region's header sector, through ``read(lba, n)``."""
    lay = RecordLayout(config)
    return [check_header(config, read(lay.region_lba(r), 1), r) for r in range(regions)]


@dataclass
class RecoveryPlan:
    """What the device's recovery does with a header scan (:func:`plan_recovery`).

    ``commands``: the directory commands in issue order, after the initial ``CLEAR``:
    ``("lookup", count, hash)``, ``("delete",)`` (the link the previous lookup found),
    ``("insert", count, hash, region)`` (insert-existing); ``reads``: the header sectors read,
    by region, in order (every region once, and the stored winner of a duplicate key again
    right after the duplicate);
    ``inserts``: ``(count, prefix_hash, region, commit_seq)`` of the live records at the end,
    by region; ``frees``: every other region, ascending; ``freed``: how many of those held
    something the scan did not use (their ``reasons``); ``live``: ``len(inserts)``;
    ``next_seq``: the commit sequence register after the scan.
    """
    commands: list
    reads: list
    inserts: list
    frees: list
    freed: int
    live: int
    next_seq: int
    reasons: dict


def plan_recovery(infos: list[HeaderInfo], links: int | None = None) -> RecoveryPlan:
    """The golden model of the device's recovery scan (``hw/commands/recovery.py``), bit-exact.

    The hardware rule, in region order (``infos`` sorted by region), one pass, no memory but
    the directory and three registers:

    * a header that fails a check is freed (an empty one -- no magic -- is simply free);
    * a valid header updates the running newest sequence number ``newest`` (the first valid
      one sets it; a later ``s`` replaces it when :func:`~ringkv.defs.record.seq_newer`
      ``(s, newest)``), zero-token records included; a zero-token record is then freed;
    * a valid record with tokens is looked up by its key ``(count, prefix_hash)``: on a miss it
      is inserted (insert-existing at its region; with ``links`` given, a directory already
      holding ``links`` records refuses it, ``FULL``, and it is freed); on a hit the stored
      winner's header is read again for its sequence ``s0``, and the new record wins unless
      ``seq_newer(s0, s)`` (so on equal sequences the later region wins): the winner's link is
      deleted (its region freed) and the new record inserted; otherwise the new one is freed;
    * ``next_seq = seq_next(newest)``, or 1 (the reset value) with no valid header.

    Whenever the store's valid sequence numbers lie on an arc shorter than half the circle
    (the store's invariant, ``ringkv.defs.record``), ``seq_newer`` is a total order on them
    that agrees with the arc, so the running newest is the arc's end, which is
    :func:`~ringkv.defs.record.seq_newest`; and each key's survivor is that key's newest
    commit, the highest region on a tie: the same records and ``next_seq`` as
    :func:`plan_rebuild` of a scan whose payloads all check out.
    """
    infos = sorted(infos, key=lambda i: i.region)
    commands, reads, reasons = [], [], {}
    winners = {}                        # key -> (region, seq): the directory's live records
    newest = None
    for info in infos:
        r = info.region
        reads.append(r)
        if not info.valid:
            if info.status is not RecordStatus.EMPTY:
                reasons[r] = f"{info.status.name}: {info.message}"
            continue
        s = info.commit_seq
        if newest is None or seq_newer(s, newest):
            newest = s
        if info.count == 0:
            reasons[r] = "valid but holds no tokens: nothing to resume"
            continue
        key = (info.count, info.prefix_hash)
        commands.append(("lookup", *key))
        if key not in winners:
            if links is not None and len(winners) >= links:
                reasons[r] = "the directory is full"
                continue
            commands.append(("insert", *key, r))
            winners[key] = (r, s)
            continue
        r0, s0 = winners[key]
        reads.append(r0)
        if seq_newer(s0, s):
            reasons[r] = f"superseded by commit {s0} in region {r0}"
            continue
        reasons[r0] = f"superseded by commit {s} in region {r}"
        commands += [("delete",), ("insert", *key, r)]
        winners[key] = (r, s)
    inserts = sorted(((c, h, r, s) for (c, h), (r, s) in winners.items()), key=lambda x: x[2])
    live = {r for _, _, r, _ in inserts}
    frees = [i.region for i in infos if i.region not in live]
    next_seq = 1 if newest is None else seq_next(newest)
    return RecoveryPlan(commands, reads, inserts, frees, len(reasons), len(inserts),
                        next_seq, reasons)


def read_record_bytes(config, read, region, keys=None) -> bytes:
    """One verified record as it moves between devices: its header sector, then its token
    sectors, then its K/V sectors, each area as long as the record's count needs
    (``RecordLayout.record_bytes(count)`` bytes; the unused rest of the token area is left
    out). ``read(lba, n)`` reads the region's store. Raises :class:`RecordError` when the
    region's record fails a check (header, configuration, payload CRC)."""
    lay = RecordLayout(config)
    status, h, _, message = _import(config, read, region, keys=keys)
    if status is not RecordStatus.OK:
        raise RecordError(status, f"region {region}: {message}", h)
    base = lay.region_lba(region)
    out = read(base, 1 + lay.token_sectors(h.count))
    if h.count:
        out += read(base + lay.kv_sector, lay.kv_sectors(h.count))
    return bytes(out)


def record_writes(config, data: bytes, *, commit_seq: int | None = None,
                  keys=None) -> tuple[Header, list]:
    """Check a record of :func:`read_record_bytes` and give the sector writes that store it in a
    region: ``(header, [(sector offset in region, bytes)])`` in write order, payload first and
    header last (like :func:`encode_record`). ``commit_seq`` re-stamps the header with the
    receiving store's sequence number (the header CRC is recomputed; the payload is unchanged).

    The bytes are untrusted: a record whose length, header or payload CRC does not check out
    raises :class:`RecordError` (``FOREIGN_CONFIG`` for a record of another configuration,
    naming the differing fields), and nothing is written from it.

    A sealed record's tag covers ``commit_seq``: with ``keys`` (``{key_id: key}``) its tag is
    checked (``NO_KEY``/``BAD_MAC`` raise) and, when re-stamped, written anew under the same
    key; re-stamping a sealed record without its key raises ``NO_KEY`` (the receiving store
    could never authenticate it). Without ``keys`` and without re-stamping, a sealed record
    is passed on as it is: the importing device checks its tag.
    """
    lay = RecordLayout(config)
    data = bytes(data)
    if len(data) < SECTOR or len(data) % SECTOR:
        raise RecordError(RecordStatus.BAD_HEADER,
                          f"a record is whole 512-byte sectors, not {len(data)} bytes")
    h = decode_header(data[:SECTOR], config)
    if len(data) != lay.record_bytes(h.count):
        raise RecordError(RecordStatus.BAD_PAYLOAD_CRC,
                          f"a record of {h.count} tokens is {lay.record_bytes(h.count)} bytes, "
                          f"not {len(data)} (torn or truncated)", h)
    tok_end = SECTOR * (1 + lay.token_sectors(h.count))
    tok, kv = data[SECTOR:tok_end], data[tok_end:]
    if crc32(tok[:h.token_bytes] + kv[:h.k_bytes + h.v_bytes]) != h.payload_crc:
        raise RecordError(RecordStatus.BAD_PAYLOAD_CRC,
                          "payload CRC mismatch (torn or corrupt payload)", h)
    header = bytearray(data[:SECTOR])
    tok_used, kv_used = tok[:h.token_bytes], kv[:h.k_bytes + h.v_bytes]
    if h.sealed and (keys is not None or commit_seq is not None):
        ring = check_key_ring(keys or {})
        status, why = check_mac(h, bytes(header), tok_used, kv_used, ring)
        if status is not RecordStatus.OK:
            raise RecordError(status, why, h)
    if commit_seq is not None:
        put_field(header, "commit_seq", commit_seq % SEQ_MOD)
        put_field(header, "header_crc", crc32(header[:508]))
        h.commit_seq = commit_seq % SEQ_MOD
        if h.sealed:
            header = bytearray(seal_header(header, tok_used, kv_used, ring[h.key_id], h.key_id))
            h.mac_tag = bytes(header[308:324])
    writes = []
    if tok:
        writes.append((1, tok))
    if kv:
        writes.append((lay.kv_sector, kv))
    writes.append((0, bytes(header)))
    return h, writes


#: What a scan makes of a region (:func:`region_states`), in the words of ``storage ls``.
#: ``live``, ``superseded``, ``empty`` and ``no tokens`` are normal; ``foreign``, ``torn``,
#: ``corrupt`` and ``bad version`` are problems a rebuild repairs by freeing the region; so is
#: ``bad tag`` (a sealed record whose tag does not verify under its key: forged or damaged),
#: found only by a scan with keys. ``no key`` (a sealed record under a key id the scan was not
#: given) is a problem -- it could not be verified -- that a repair leaves alone.
PROBLEM_STATES = ("foreign", "torn", "corrupt", "bad version", "bad tag", "no key")
#: The problem states ``fsck --repair`` erases.
REPAIRABLE_STATES = ("foreign", "torn", "corrupt", "bad version", "bad tag")


def region_states(infos: list[RecordInfo], plan: RebuildPlan | None = None) -> dict:
    """``{region: state}``: ``live`` (the rebuild keeps it), ``superseded`` (a valid record of
    a key with a newer commit elsewhere: normal), ``no tokens`` (valid, nothing to resume),
    ``empty``, ``foreign`` (written under another configuration), ``bad version`` (an unknown
    record format), ``torn`` (a write cut short: a header without CRC, a payload past the
    image's end), ``bad tag`` / ``no key`` (a scan with keys: a sealed record whose tag fails,
    or whose key was not given) or ``corrupt`` (a header or payload that fails its CRC or
    checks: damaged bytes, or an export into a used region cut before its header, which leaves
    the old header over a partly new payload -- the bytes cannot tell those apart)."""
    plan = plan_rebuild(infos) if plan is None else plan
    live = {r for _, _, r, _ in plan.inserts}
    states = {}
    for i in infos:
        if i.valid:
            states[i.region] = ("live" if i.region in live else
                                "no tokens" if i.count == 0 else "superseded")
        elif i.status is RecordStatus.EMPTY:
            states[i.region] = "empty"
        elif i.status is RecordStatus.FOREIGN_CONFIG:
            states[i.region] = "foreign"
        elif i.status is RecordStatus.BAD_VERSION:
            states[i.region] = "bad version"
        elif i.status is RecordStatus.BAD_MAC:
            states[i.region] = "bad tag"
        elif i.status is RecordStatus.NO_KEY:
            states[i.region] = "no key"
        else:
            states[i.region] = "torn" if i.torn else "corrupt"
    return states


def format_listing(infos: list[RecordInfo], *, show_empty: bool = False) -> str:
    """The inspection table: region, status, count, hash, commit sequence, age, kind (``turn``
    snapshot or ``checkpoint``: :class:`~ringkv.defs.record.RecordKind`), key (``open``, or the
    key id of a sealed record, ``+tag`` when a scan with keys verified its tag; ``-`` when the
    header failed its CRC), state (:func:`region_states`), note.

    Count, hash and sequence are shown for valid records only (``-`` otherwise: nothing of a
    record that failed a check is trusted); ``age`` is the number of commits since the newest
    valid record, in serial-number arithmetic (so it stays right across the wrap at 2**32); the
    note says why a region is unusable or superseded.
    """
    plan = plan_rebuild(infos)
    states = region_states(infos, plan)
    newest = seq_newest(i.commit_seq for i in infos if i.valid)
    live = {r for _, _, r, _ in plan.inserts}
    lines = [f"{'region':>6} {'status':<16} {'count':>7} {'prefix hash':<18} {'seq':>10} "
             f"{'age':>5}  {'kind':<10}  {'key':<10}  {'state':<11} note"]
    shown = 0
    for i in infos:
        if i.status is RecordStatus.EMPTY and not show_empty:
            continue
        shown += 1
        if i.valid:
            kind = kind_name(i.kind)
            count, h, seq = f"{i.count}", f"{i.prefix_hash:#018x}", f"{i.commit_seq}"
            age = f"{(newest - i.commit_seq) % SEQ_MOD}"
            note = "" if i.region in live else plan.reasons.get(i.region, "")
        else:
            kind, count, h, seq, age, note = "-", "-", "-", "-", "", i.message
        key = _key_cell(i)
        lines.append(f"{i.region:>6} {i.status.name:<16} {count:>7} {h:<18} {seq:>10} "
                     f"{age:>5}  {kind:<10}  {key:<10}  {states[i.region]:<11} {note}")
    ok = sum(i.valid for i in infos)
    lines.append(f"{len(infos)} regions, {shown} shown, {ok} valid, {len(live)} live, "
                 f"{len(plan.reasons)} to free; next commit sequence {plan.next_seq}")
    return "\n".join(lines)


def _key_cell(i: RecordInfo) -> str:
    if i.status in (RecordStatus.EMPTY, RecordStatus.BAD_VERSION) or (
            i.status is RecordStatus.BAD_HEADER and i.key_id == KEY_ID_NONE):
        return "-"
    if i.key_id == KEY_ID_NONE:
        return "open"
    return f"{i.key_id}" + ("+tag" if i.mac_ok else "")


def fsck_report(infos: list[RecordInfo]) -> tuple[str, int]:
    """``(report, problems)``: what a rebuild would keep and free, and why; ``problems`` is the
    number of regions in a :data:`PROBLEM_STATES` state (foreign, torn, corrupt, bad version).

    The report lists the live records (region, count, prefix hash, commit sequence), then every
    non-empty region a rebuild frees with its state and reason (superseded records and
    zero-token records are normal: the rebuild frees them, they are not problems), then the
    next commit sequence number and the verdict: ``clean``, or how many regions of each
    problem state a rebuild (or ``--repair``) frees.
    """
    plan = plan_rebuild(infos)
    states = region_states(infos, plan)
    problems = {r: st for r, st in states.items() if st in PROBLEM_STATES}
    lines = [f"{len(infos)} regions scanned: {sum(i.valid for i in infos)} valid records, "
             f"{len(plan.inserts)} live, {len(plan.reasons)} to free"]
    if plan.inserts:
        kinds = {i.region: kind_name(i.kind) for i in infos if i.valid}
        keys = {i.region: _key_cell(i) for i in infos if i.valid}
        lines.append("live records:")
        lines += [f"  region {r:>5}  count {c:>7}  hash {h:#018x}  seq {s}  {kinds[r]}  "
                  f"key {keys[r]}" for c, h, r, s in plan.inserts]
    if plan.reasons:
        lines.append("to free:")
        lines += [f"  region {r:>5}  {why}" + (f"  [{states[r]}]" if r in problems else "")
                  for r, why in sorted(plan.reasons.items())]
    lines.append(f"next commit sequence: {plan.next_seq}")
    if problems:
        counts = {st: sum(1 for v in problems.values() if v == st) for st in PROBLEM_STATES}
        fixable = {st: n for st, n in counts.items() if n and st in REPAIRABLE_STATES}
        if fixable:
            lines.append("repairable: " + ", ".join(f"{n} {st}" for st, n in fixable.items())
                         + (" (the device frees them at power-on; --repair erases their "
                            "headers)" if "bad tag" not in fixable else
                            " (the device frees foreign, torn and corrupt records at power-on "
                            "and misses on a bad tag at import; --repair erases their "
                            "headers)"))
        if counts["no key"]:
            lines.append(f"unverified: {counts['no key']} sealed record(s) under key ids not "
                         "in the key file (left alone by --repair)")
    else:
        lines.append("clean")
    return "\n".join(lines), len(problems)


# -- images: what a file holds, which configuration wrote it ---------------------------------

#: Erased-medium byte values: an image of only these (per file) holds no record.
_ERASED = (0x00, 0xFF)


@dataclass
class ImageSurvey:
    """What :func:`survey_image` found in an image file, before any configuration is chosen.

    ``headers``: sectors beginning with the record magic; ``intact``: of those, the ones whose
    header passes its CRC and version checks and whose stored config fields give back the
    stored digest, as ``{digest: (config, [lba, ...])}``; ``damaged``: the other magic
    sectors; ``blank``: the file holds only one erased value (0x00 or 0xFF).
    """
    size: int
    blank: bool
    headers: list
    intact: dict
    damaged: list

    @property
    def sectors(self) -> int:
        return self.size // SECTOR


def _config_of(buf) -> RingKVConfig | None:
    """The configuration a header sector states, when its fields are a valid configuration
    whose digest is the stored one (else ``None``)."""
    h = _decode_fields(buf)
    try:
        config = RingKVConfig(**h.config_fields)
        RecordLayout(config)
    except (ValueError, TypeError):
        return None
    return config if config.digest() == h.config_digest else None


def survey_image(data) -> ImageSurvey:
    """Find every record header in ``data`` (bytes or a read-only ``numpy`` view of an image
    file, a whole number of sectors): sectors that begin with the magic, sorted into intact
    headers (by configuration) and damaged ones. Reads each sector's first 8 bytes, and whole
    sectors only where the magic is."""
    buf = np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data
    size = len(buf)
    sectors = buf[:size - size % SECTOR].reshape(-1, SECTOR)
    magic = np.frombuffer(MAGIC, dtype=np.uint8)
    hits = np.flatnonzero((sectors[:, :8] == magic).all(axis=1)) if len(sectors) else []
    intact, damaged = {}, []
    for lba in map(int, hits):
        sector = bytes(sectors[lba])
        h = _decode_fields(sector)
        config = _config_of(sector)
        if (h.header_crc_ok and h.version == VERSION and h.header_bytes == SECTOR
                and config is not None):
            intact.setdefault(config.digest(), (config, []))[1].append(lba)
        else:
            damaged.append(lba)
    blank = size == 0 or any(bool((buf == v).all()) for v in _ERASED if buf[0] == v)
    return ImageSurvey(size, blank, [int(x) for x in hits], intact, damaged)


@dataclass
class CardImage:
    """An image file read as a card: its configuration, where its regions start, how many
    there are, and why that configuration (``source``)."""
    path: Path
    data: object
    config: RingKVConfig
    base_lba: int
    regions: int
    source: str
    notes: list

    def read(self, lba: int, n: int) -> bytes:
        """Sectors ``lba .. lba+n-1``; short (or empty) past the image's end: a record cut by
        the end of the image is a torn record, never zero padding taken for data."""
        return bytes(self.data[lba * SECTOR:(lba + n) * SECTOR])

    def scan(self, keys=None) -> list[RecordInfo]:
        return [scan_region(self.config, lambda lba, n: self.read(self.base_lba + lba, n), r,
                            keys)
                for r in range(self.regions)]


def _describe(config: RingKVConfig) -> str:
    return (f"layers={config.layers} Hq={config.q_heads} Hkv={config.kv_heads} "
            f"d={config.head_dim} W={config.window} max_tokens={config.max_tokens} "
            f"{config.numerics} (digest {config.digest().hex()[:16]})")


def read_image_file(path) -> np.ndarray:
    """The bytes of an image file, memory-mapped read-only (an empty array for an empty
    file). A file that cannot be read is a :class:`~ringkv.host.errors.UsageError`."""
    path = Path(path)
    try:
        if path.is_dir():
            raise IsADirectoryError(21, "Is a directory")
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return np.zeros(0, dtype=np.uint8)
            return np.memmap(f, dtype=np.uint8, mode="r", shape=(size,))
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}", param="image") from None


def open_card_image(path, config: RingKVConfig | None = None, *,
                    numerics: str | None = None) -> CardImage:
    """Read ``path`` as a card image.

    The configuration comes from the records themselves: the one stated by the intact headers
    (header CRC good, fields and digest agreeing), by most headers when several are found; the
    regions start at the offset (modulo a region's sectors) those headers sit at. With no
    intact header, a damaged header whose fields and digest still agree names it. ``config``
    (``--config``) is honoured when it has the image's region layout (records of another
    configuration then show as foreign) and refused (:class:`ConfigError`) when the image's
    records were written with another layout; ``numerics`` (``--numerics``) changes the
    configuration's numerics (given or found).

    Raises :class:`NotACardImage` for an empty file, one that is not a whole number of
    sectors, or one with no record header that is not blank (text, random bytes, another
    format); a blank file (all 0x00 or all 0xFF) is a card image with no records, read with
    ``config`` (or the default configuration).
    """
    path = Path(path)
    data = read_image_file(path)
    size = len(data)
    if size == 0:
        raise NotACardImage(f"{path} is empty (0 bytes): not a RingKV card image",
                            hint="'ringkv sim --image FILE' makes a card image")
    if size % SECTOR:
        raise NotACardImage(f"{path} is {size} bytes, not a whole number of {SECTOR}-byte "
                            f"sectors: not a RingKV card image (truncated?)")
    survey = survey_image(data)
    notes = []
    try:
        given = with_numerics(config, numerics) if config is not None else None
    except ValueError as e:
        raise ConfigError(str(e), param="numerics") from None
    found = sorted(survey.intact.values(), key=lambda cl: -len(cl[1]))
    if given is None and numerics is not None and found:
        try:
            given = with_numerics(found[0][0], numerics)
        except ValueError as e:
            raise ConfigError(str(e), param="numerics") from None
    if given is None and not found and survey.damaged:
        for lba in survey.damaged:
            guess = _config_of(bytes(data[lba * SECTOR:(lba + 1) * SECTOR]))
            if guess is not None:
                found = [(guess, [lba])]
                notes.append("configuration read from a damaged header (its fields and "
                             "digest agree)")
                break
    if not survey.headers and not survey.blank:
        raise NotACardImage(f"{path} is not a RingKV card image: no record header in its "
                            f"{survey.sectors} sectors, and it is not blank",
                            hint="check the file name; 'ringkv sim --image NEW' makes a "
                                 "card image")
    if given is not None:
        chosen = given
        source = "as given (--config)" if config is not None else (
            f"from its records, numerics {numerics} as given")
        ours = survey.intact.get(given.digest(), (given, []))[1]
        spr = RecordLayout(given).sectors_per_region
        others = [(c, lbas) for c, lbas in found if c.digest() != given.digest()]
        if not ours and others and RecordLayout(others[0][0]).sectors_per_region != spr:
            c = others[0][0]
            raise ConfigError(f"{path} was written by a device of another configuration "
                              f"({_describe(c)}), with another region layout, not "
                              f"{_describe(given)}",
                              fields=c.diff(given), param="config",
                              hint="leave out --config and --numerics to read it as "
                                   "written")
        lbas = ours or [lba for _, ls in others for lba in ls]
    elif found:
        chosen, lbas = found[0][0], found[0][1]
        source = "from its records"
        if len(found) > 1:
            notes.append(f"records of {len(found) - 1} other configuration(s) found: "
                         + "; ".join(f"{len(ls)} of {_describe(c)}" for c, ls in found[1:]))
    elif survey.headers:
        raise RingKVError(f"{path}: no intact record header states the configuration "
                          f"({len(survey.damaged)} damaged header(s))",
                          hint="give it with --config (default, demo or JSON fields)")
    else:
        chosen, lbas, source = DEFAULT_CONFIG, [], "blank image: no records"
    lay = RecordLayout(chosen)
    spr = lay.sectors_per_region
    residues = [lba % spr for lba in lbas]
    base = max(set(residues), key=residues.count) if residues else 0
    # every whole region, and a last partial one whose header sector is there (a torn record)
    regions = max(0, -(-(survey.sectors - base) // spr))
    stray = [lba for lba in survey.headers if (lba - base) % spr or lba < base]
    if stray:
        notes.append(f"{len(stray)} record header(s) off this layout's region starts "
                     f"(sectors {', '.join(map(str, stray[:4]))}{' ...' if len(stray) > 4 else ''})"
                     ": left over from another configuration, the device never reads them")
    return CardImage(path, data, chosen, base, regions, source, notes)


FSCK_HELP = ("exit status: 0 clean (superseded records are normal), 1 repairable (foreign, "
             "torn or corrupt regions, which the device frees at power-on; --repair erases "
             "their headers; with --key-file also sealed records whose tag fails, or whose key "
             "is not in the file), 2 usage or an unreadable file, 3 --config refused or a bad "
             "key file, 5 not a card image.")


def repair_image(card: CardImage, infos: list[RecordInfo]) -> list[int]:
    """Erase the header sector of every region in a :data:`REPAIRABLE_STATES` state (with the
    image's erased value), so that no scan finds them again; returns those regions. The only
    writes ``storage fsck --repair`` makes."""
    states = region_states(infos)
    bad = [r for r, st in sorted(states.items()) if st in REPAIRABLE_STATES]
    if not bad:
        return []
    lay = RecordLayout(card.config)
    erased = bytes(SECTOR)
    with open(card.path, "r+b") as f:
        for r in bad:
            f.seek((card.base_lba + lay.region_lba(r)) * SECTOR)
            f.write(erased)
        f.flush()
        os.fsync(f.fileno())
    return bad


def main(argv=None) -> int:
    """``python -m ringkv.host.record IMAGE [--config C] [--numerics N] [--all | --fsck
    [--repair]]``: list the records in an image (its configuration read from the records), or
    check it (``--fsck``); exit status as :data:`FSCK_HELP`."""
    from ringkv.defs.config import named_config

    from .errors import ArgumentParser
    parser = ArgumentParser(prog="ringkv storage", description="List (or --fsck: check) the "
                            "snapshot records in a card image", epilog=FSCK_HELP)
    parser.add_argument("image", type=Path)
    parser.add_argument("--all", action="store_true", help="also list empty regions")
    parser.add_argument("--regions", type=int, default=None,
                        help="scan only the first REGIONS regions (default: every region the "
                             "image holds)")
    parser.add_argument("--fsck", action="store_true",
                        help="check instead of list; exit 1 if a region is foreign, torn or "
                             "corrupt")
    parser.add_argument("--repair", action="store_true",
                        help="with --fsck: erase the headers of the foreign, torn and corrupt "
                             "regions (the only change fsck ever makes)")
    parser.add_argument("--config", default=None,
                        help="read the image as this configuration ('default', 'demo' or "
                             "fields as JSON) instead of the one its records state")
    parser.add_argument("--numerics", default=None, choices=sorted(NUMERICS_TABLE),
                        help="the numerics of the configuration (given or found)")
    parser.add_argument("--key-file", type=Path, default=None,
                        help="with --fsck: verify sealed records' tags with the keys in this "
                             "file (lines 'key_id hex', mode 0600)")
    args = parser.parse_args(argv)
    if args.repair and not args.fsck:
        raise UsageError("--repair goes with fsck", param="repair")
    if args.key_file is not None and not args.fsck:
        raise UsageError("--key-file goes with fsck", param="key_file")
    keys = None
    if args.key_file is not None:
        from .keys import read_key_file
        keys = read_key_file(args.key_file).keys()
    config = None
    if args.config is not None:
        try:
            config = named_config(args.config, args.numerics)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--config {args.config!r}: {e}", param="config") from None
    if args.regions is not None and args.regions < 1:
        raise UsageError(f"--regions must be a positive number, not {args.regions}",
                         param="regions")
    card = open_card_image(args.image, config, numerics=args.numerics)
    if args.regions is not None:
        card.regions = min(card.regions, args.regions)
    started = time.monotonic()
    infos = card.scan(keys)
    print(f"{card.path}: {card.regions} regions of {_describe(card.config)}, "
          f"configuration {card.source}"
          + (f", regions from sector {card.base_lba}" if card.base_lba else ""))
    for note in card.notes:
        print(f"note: {note}")
    if keys is not None:
        sealed = sum(1 for i in infos if i.key_id != KEY_ID_NONE)
        print(f"tags checked with key ids {sorted(keys)}: {sealed} sealed record(s) found")
    if not args.fsck:
        print(format_listing(infos, show_empty=args.all))
        print(f"scanned in {time.monotonic() - started:.2f} s")
        return 0
    report, problems = fsck_report(infos)
    print(report)
    if problems and args.repair:
        erased = repair_image(card, infos)
        print(f"repaired: erased the headers of region(s) {', '.join(map(str, erased))}")
        _, problems = fsck_report(CardImage(card.path, read_image_file(card.path), card.config,
                                            card.base_lba, card.regions, card.source,
                                            []).scan(keys))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
