"""The record format codec: header and payload encoding and decoding, one region's import and
verify, ring images, a record's bytes as they move between devices, and sealing (tags).

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

Sealing (:func:`seal_header`, :func:`check_mac`, :func:`check_key_ring`, :func:`record_tag`)
stays here rather than in a module of its own: the encoder seals and the import checks tags,
and a tag covers the header the codec writes.

Rings are given as an integer array of shape ``(layers, kv_heads, 2, window, head_dim)``
(kind 0 = K, 1 = V) holding each element's ``8*EB``-bit two's-complement word (``uint8`` for
fx1, ``uint16`` for fx2; signed values are accepted and taken modulo ``2**(8*EB)``), in the
attention core's ring-access order: element ``((layer*Hkv + kv_head)*2 + kind)*W*d + slot*d +
dim`` at byte address ``element * EB + byte`` of the ring port (:func:`ring_image` /
:func:`rings_from_image` convert between the two).
"""

import hmac
import zlib
from dataclasses import dataclass, field

import numpy as np

from ringkv.defs.config import DEFAULT_CONFIG, RingKVConfig
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
)

from ..errors import StorageError
from ..golden.mac import check_key, mac

__all__ = [
    "Header", "RecordError", "crc32", "encode_header", "decode_header", "decode_fields",
    "ring_dtype", "ring_image", "rings_from_image", "encode_payload", "encode_record",
    "decode_payload", "import_record", "kind_name", "read_record_bytes", "record_writes",
    "record_tag", "seal_header", "check_mac", "check_key_ring",
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


def decode_fields(buf) -> Header:
    """The fields of a header sector as stored, unchecked: magic, version, configuration
    and lengths are read, not judged (:func:`decode_header` checks them); only
    ``header_crc_ok`` says whether the stored header CRC matches. For the header of a
    record that failed its checks, or the configuration fields a device reports."""
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
    h = decode_fields(buf)
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
