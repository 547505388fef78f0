"""The FPGA (or its simulation) as the scheduler's :class:`~ringkv.host.device.interface.Device` and
the model's :class:`~ringkv.host.model.AttentionBackend`, over a
:class:`~ringkv.host.device.link.Link`.

Every call is one or more requests of :mod:`ringkv.defs.protocol`, packed with its layouts
and the tail codecs of :mod:`ringkv.host.device.ops`; transfers larger than the device's payload
bound are split. The device's ``QUERY`` verifies **and imports** on a hit (hash, lookup,
token comparison, config digest, payload CRC), so :meth:`FpgaDevice.import_` only reports the
bytes moved.

Attention runs in the fixed-point numerics of the core, the configuration's ``numerics``
(``ringkv-fx1``: q/k/v int8, ``ringkv-fx2``: q/k/v int16; see :mod:`ringkv.host.golden.fixed`):
q/k/v are quantized here with that numerics (``ringkv-fx1c``: with the layer's fractions from
``config.qkv_fracs``), outputs (int16 in all) dequantized with it.

A sealed build (``RingKVTop(sealed=True)``, ``FpgaDevice(sealed=True)``) takes a tenant key slot
in ``QUERY``, ``QUERY_PREFIX`` and ``EXPORT``; the driver maps tenants to key ids
(``tenants``), key ids to the device's slots, and writes a key into a slot (``KEY_SET``) the
first time a tenant of that key is used, from the :class:`~ringkv.host.keys.KeyRing` it was
given (or :meth:`FpgaDevice.set_key`). Keys are never logged, and the device never sends one
back.
"""

import logging

import numpy as np

from ringkv.defs.config import RingKVConfig
from ringkv.defs.mac import KEY_SLOTS
from ringkv.defs.numerics import numerics_of
from ringkv.defs.protocol import (
    DEFAULT_MAX_PAYLOAD,
    DIR_RESPONSE,
    FLAG_EXISTING,
    META_BYTES,
    PREFIX_RESPONSE,
    RECOVERY_STATUS,
    REQUESTS,
    RESPONSES,
    RING_CLEAR_ALL,
    RING_ELEMENTS,
    RING_META,
    SDRAM_TEST_RESPONSE,
    SNAPSHOT_RESPONSE,
    STORAGE_INFO,
    CardType,
    Op,
    RecoveryState,
    Status,
    StorageError,
    StorageKind,
    build_requests,
    max_attn_tokens,
)
from ringkv.defs.record import (
    SECTOR,
    RecordKind,
    RecordLayout,
    RecordStatus,
    encode_fracs,
    put_field,
    ring_elements,
    token_bytes,
)
from ringkv.defs.sdram import BistPhase

from .. import errors
from ..errors import ConfigError, DeviceError, KeyRequired
from ..golden.fixed import dequantize_out, quantize
from ..keys import KeyRing, tenant_key_id
from ..record import (
    RecordError,
    check_key_ring,
    decode_header,
    decode_payload,
    kind_name,
    plan_rebuild,
    read_record_bytes,
    record_writes,
    rings_from_image,
    scan_image,
)
from .interface import Device, Holding, QueryResult
from .ops import pack_attn, pack_tokens, unpack_attn, unpack_tokens

__all__ = ["FpgaDevice", "ConfigMismatch", "DeviceNotReady", "STORAGE_ERRORS",
           "PREFIX_RETRIES"]

log = logging.getLogger(__name__)

#: The storage port's error codes (``hw/storage.StorageError``), as reported by a failed
#: recovery.
STORAGE_ERRORS = {0: "OK", 1: "TIMEOUT", 2: "CRC", 3: "CARD", 4: "RANGE", 5: "NOT_READY"}

#: How many shorter prefixes :meth:`FpgaDevice.query_prefix` tries after a directory hit whose
#: record fails its verification (a hash collision, a corrupt or stale record) before it
#: answers a miss: each try is one QUERY_PREFIX and one QUERY, and a record that can never
#: verify is deleted by that QUERY, so the bound only matters for repeated collisions and
#: records under other key ids (``NO_KEY``: the device keeps them for the tenant that holds
#: the key), whose entries stay.
PREFIX_RETRIES = 4

_MISS_REASONS = {
    RecordStatus.EMPTY: "no record",
    RecordStatus.FOREIGN_CONFIG: "foreign config",
    RecordStatus.TOKEN_MISMATCH: "tokens differ",
    RecordStatus.BAD_PAYLOAD_CRC: "corrupt record",
    RecordStatus.BAD_HEADER: "corrupt record",
    RecordStatus.BAD_VERSION: "foreign format",
    RecordStatus.NOT_THIS: "stale directory entry",
    RecordStatus.STORAGE: "storage error",
    RecordStatus.NO_KEY: "no key",
    RecordStatus.BAD_MAC: "bad tag",
}


class ConfigMismatch(ConfigError):
    """The device's configuration differs from the host's; ``fields`` names the differences."""

    def __init__(self, fields):
        fields = list(fields)
        super().__init__("device configuration differs from the host's: " + "; ".join(fields),
                         fields=fields,
                         hint="build the device with the host's configuration, or pass the "
                              "device's --config/--numerics to the host")


class DeviceNotReady(errors.DeviceNotReady):
    """The device answered ``NOT_READY``: its recovery scan runs, or failed; ``status`` is the
    :data:`~ringkv.defs.protocol.RECOVERY_STATUS` record."""

    def __init__(self, op, status: dict):
        self.status = status
        state = RecoveryState(status["state"]).name
        error = STORAGE_ERRORS.get(status["error"], status["error"])
        detail = (f"storage error {error}" if state == "FAILED"
                  else f"{status['scanned']}/{status['regions']} regions scanned")
        super().__init__(f"device not ready for {op.name}: recovery {state} ({detail})")


class FpgaDevice(Device):
    """:class:`Device` + :class:`AttentionBackend` driving ``RingKVTop`` over ``link``.

    ``max_payload`` is the device's request bound (``Op.VERSION`` reports it; default
    :data:`~ringkv.defs.protocol.DEFAULT_MAX_PAYLOAD`).

    ``sealed``: the device is a sealed build; the sealed API is the
    :class:`~ringkv.host.device.software.SoftwareDevice`'s: ``query``, ``query_prefix``,
    ``import_`` and ``export`` (and ``write_record``) take ``tenant=``, ``tenants`` maps a
    tenant to a key id, ``keys`` is the :class:`~ringkv.host.keys.KeyRing` the key ids come
    from (:func:`~ringkv.host.keys.load_keys`: a 0600 key file or ``RINGKV_KEYS``), and
    :meth:`set_key` adds one. A tenant whose key id is not held raises
    :class:`~ringkv.host.errors.KeyRequired` before anything is sent. The device has
    :data:`~ringkv.defs.mac.KEY_SLOTS` slots: a key goes into one (``KEY_SET``, which also
    derives the slot's hash seed on the device) the first time one of its tenants is used; when
    all are taken the least recently used key leaves its slot. A ``NO_KEY`` answer (the device
    was reset: its slots are volatile) makes the driver write the key again and repeat the
    request once. An open device ignores tenants.
    """

    def __init__(self, link, config: RingKVConfig, *, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 sealed: bool = False, keys: KeyRing | None = None, tenants=None):
        if not isinstance(config, RingKVConfig):
            raise TypeError(f"config must be a RingKVConfig, not {config!r}")
        if not isinstance(sealed, bool):
            raise TypeError(f"sealed must be a bool, not {sealed!r}")
        if keys is not None and not isinstance(keys, KeyRing):
            raise TypeError(f"keys must be a KeyRing (ringkv.host.keys.load_keys), not "
                            f"{type(keys).__name__}")
        self.link, self.config, self.max_payload = link, config, max_payload
        self.sealed = sealed
        self._keys = check_key_ring(keys.keys() if keys is not None else {})
        self.tenants = dict(tenants or {})
        self._slots: dict[int, int] = {}       # key id -> device slot, least recent first
        self._requests = build_requests(sealed)
        self.numerics = numerics_of(config.numerics)
        self._fracs = self.numerics.layer_fracs(config.layers, config.qkv_fracs)
        self.attention = self
        self._tb = token_bytes(config)
        self._attn_chunk = max_attn_tokens(config, max_payload)
        if self._attn_chunk < 1:
            raise ValueError(f"max_payload {max_payload} cannot carry one attention token")
        self._last_hit = None
        #: the :class:`~ringkv.host.record.RebuildPlan` of the last :meth:`rebuild`
        self.last_rebuild = None
        self.counters = {"queries": 0, "hits": 0, "misses": 0, "imports": 0, "exports": 0,
                         "bytes_in": 0, "bytes_out": 0, "device_cycles": 0}

    # -- plumbing ---------------------------------------------------------------------------
    def _request(self, op, payload=b"", ok=(Status.OK,)):
        status, data = self.link.request(op, payload)
        if status == Status.NOT_READY and status not in ok:
            raise DeviceNotReady(op, RECOVERY_STATUS.unpack(data))
        if status not in ok:
            raise DeviceError(status, op, data)
        return status, data

    def _call(self, op, **fields):
        return self._request(op, REQUESTS[op].pack(**fields))[1]

    # -- keys and tenants (sealed builds) -----------------------------------------------------
    def __repr__(self) -> str:
        mode = f"sealed, key ids {sorted(self._keys)}" if self.sealed else "open"
        return f"FpgaDevice({self.config.digest().hex()[:12]}, {mode})"

    def set_key(self, key_id: int, key: bytes, tenants=()) -> None:
        """Hold ``key`` under ``key_id`` (replacing a key of that id) and give it to
        ``tenants``; a key id already in a device slot is written again at once (so records
        sealed under the replaced key no longer verify), otherwise on first use."""
        ring = check_key_ring({key_id: key})
        self._keys.update(ring)
        for t in tenants:
            self.tenants[t] = key_id
        if self.sealed and key_id in self._slots:
            self._key_set(self._slots[key_id], key_id)

    def is_sealed_build(self) -> bool:
        """Ask the device whether it is a sealed build: ``KEY_CLEAR`` of its last key slot
        (``OK`` on a sealed build, ``UNKNOWN_OP`` on an open one). The slot is forgotten here
        too; a key in it is written again on its next use, as after a reset."""
        slot = KEY_SLOTS - 1
        try:
            self.link.request(Op.KEY_CLEAR, REQUESTS[Op.KEY_CLEAR].pack(slot=slot))
        except DeviceError as e:
            if e.status == Status.UNKNOWN_OP:
                return False
            raise
        self._slots = {k: v for k, v in self._slots.items() if v != slot}
        return True

    def _key_set(self, slot: int, key_id: int) -> None:
        payload = REQUESTS[Op.KEY_SET].pack(slot=slot, key_id=key_id) + self._keys[key_id]
        try:
            self.link.request(Op.KEY_SET, payload)
        except DeviceError as e:
            if e.status != Status.UNKNOWN_OP:
                raise
            raise ConfigError("the device is an open build: it has no key slots",
                              hint="use the device without keys (open mode), or build it "
                                   "sealed (RingKVTop(sealed=True))", fields=["sealed"]) from None
        log.debug("key id %d written to device slot %d", key_id, slot)

    def _slot(self, tenant) -> int | None:
        """The device slot of ``tenant``'s key (written there if it is not yet), or ``None``
        on an open device; :class:`KeyRequired` for a tenant without a key."""
        if not self.sealed:
            return None
        key_id = tenant_key_id(self.tenants, self._keys, tenant)
        slot = self._slots.pop(key_id, None)
        if slot is None:
            used = set(self._slots.values())
            free = [k for k in range(KEY_SLOTS) if k not in used]
            if free:
                slot = free[0]
            else:                                   # the least recently used key leaves
                slot = self._slots.pop(next(iter(self._slots)))
            self._key_set(slot, key_id)
        self._slots[key_id] = slot
        return slot

    def _tenant_request(self, op, tenant, ok, **fields):
        """``op`` (a tenant op) with ``tenant``'s slot in a sealed build; a ``NO_KEY`` answer
        (the device lost its volatile slots) writes the key again and repeats once."""
        for _attempt in range(2):
            slot = self._slot(tenant)
            if slot is not None:
                fields["slot"] = slot
            try:
                return self._request(op, self._requests[op].pack(**fields), ok=ok)
            except DeviceError as e:
                if e.status == Status.BAD_LENGTH and not self.sealed:
                    # the open layout of a tenant op is one byte short of the sealed one
                    raise ConfigError(f"the device refused {op.name}'s open layout: it is a "
                                      f"sealed build (its records are sealed per tenant)",
                                      hint="open it sealed, with the record keys (ringkv serve "
                                           "--sealed --key-file FILE)",
                                      fields=["sealed"]) from None
                if e.status != Status.NO_KEY:
                    raise
            self._slots.clear()
        raise KeyRequired(f"the device refused tenant {tenant!r}'s key slot twice (NO_KEY)",
                          fields=["keys"])

    # -- identity -----------------------------------------------------------------------------
    def version(self) -> dict:
        return RESPONSES[Op.VERSION].unpack(self._call(Op.VERSION))

    def check_config(self) -> None:
        """Compare the device's ``CONFIG_DIGEST`` with the host's configuration; raise
        :class:`ConfigMismatch` naming the differing fields."""
        from ..record.codec import decode_fields
        r = RESPONSES[Op.CONFIG_DIGEST].unpack(self._call(Op.CONFIG_DIGEST))
        if r["digest"] == self.config.digest():
            return
        buf = bytearray(SECTOR)
        buf[80:116] = r["fields"]
        # the device reports the fields of 80..116, not a per-layer numerics' fractions: the
        # host's are assumed, so a difference in them shows as a digest-only difference
        put_field(buf, "qkv_fracs", encode_fracs(self.config))
        fields = decode_fields(buf).config_fields
        try:
            theirs = RingKVConfig(**fields)
        except (TypeError, ValueError) as e:
            raise ConfigMismatch([f"device reports invalid fields ({e})"]) from None
        diffs = theirs.diff(self.config)
        raise ConfigMismatch([f"{d} (device != host)" for d in diffs]
                             or ["config digest (same fields: another digest scheme, or other "
                                 f"per-layer qkv_fracs than the host's {self.config.qkv_fracs})"
                                 if self.config.qkv_fracs else
                                 "config digest (same fields: another digest scheme)"])

    def stats(self) -> dict:
        out = dict(self.counters)
        out["device"] = RESPONSES[Op.STATS].unpack(self._call(Op.STATS))
        out["alloc"] = RESPONSES[Op.ALLOC_STATUS].unpack(self._call(Op.ALLOC_STATUS))
        return out

    # -- token memory ---------------------------------------------------------------------------
    def _token_chunk(self, header):
        return max(1, (self.max_payload - header) // self._tb)

    def write_tokens(self, tokens) -> None:
        tokens = list(tokens)
        step = self._token_chunk(REQUESTS[Op.TOKENS_WRITE].size)
        offset = 0
        while True:
            part = tokens[offset:offset + step]
            self._request(Op.TOKENS_WRITE, REQUESTS[Op.TOKENS_WRITE].pack(
                offset=offset, n=len(part)) + pack_tokens(self.config, part))
            offset += len(part)
            if offset >= len(tokens):
                return

    def append_tokens(self, tokens) -> None:
        tokens = list(tokens)
        step = self._token_chunk(REQUESTS[Op.TOKENS_APPEND].size)
        for s in range(0, len(tokens), step):
            part = tokens[s:s + step]
            self._request(Op.TOKENS_APPEND, REQUESTS[Op.TOKENS_APPEND].pack(n=len(part))
                          + pack_tokens(self.config, part))

    def read_tokens(self, offset: int, n: int) -> list[int]:
        out = []
        step = max(1, self.max_payload // self._tb)
        for s in range(offset, offset + n, step):
            k = min(step, offset + n - s)
            out += unpack_tokens(self.config, self._call(Op.TOKENS_READ, offset=s, n=k))
        return out

    # -- snapshot store -----------------------------------------------------------------------
    def query(self, tokens, *, tenant=None) -> QueryResult:
        """Write ``tokens`` to token memory, then ``QUERY``: on a hit the device has verified
        the record and imported it into the rings."""
        tokens = list(tokens)
        self._slot(tenant)                       # refused before anything is sent
        self.write_tokens(tokens)
        self.counters["queries"] += 1
        status, data = self._tenant_request(Op.QUERY, tenant, (Status.HIT, Status.MISS),
                                            n=len(tokens))
        r = SNAPSHOT_RESPONSE.unpack(data)
        self.counters["device_cycles"] += r["cycles"]
        hit = status == Status.HIT
        reason = ""
        if not hit:
            try:
                reason = _MISS_REASONS.get(RecordStatus(r["record_status"]), "miss")
            except ValueError:
                reason = "no record"
        self.counters["hits" if hit else "misses"] += 1
        result = QueryResult(hit, len(tokens), r["hash"], reason)
        self._last_hit = (result, r["bytes"]) if hit else None
        return result

    def query_prefix(self, tokens, limit, *, tenant=None) -> QueryResult:
        """The longest stored prefix of ``tokens[:limit]``, verified and imported.

        Writes ``tokens[:limit]`` to token memory and asks ``QUERY_PREFIX n=limit``: the device
        hashes every prefix once and answers the longest length ``c`` with a directory entry.
        ``QUERY n=c`` then verifies that record (stored tokens, config, payload CRC) and
        imports it; on success token memory is cut to ``tokens[:c]`` (``TOKENS_WRITE`` of no
        tokens at offset ``c`` sets the count), so the session continues from ``c``: a hit
        with ``count = c``. If the verification fails, the next shorter prefix is asked for
        (``QUERY_PREFIX n=c-1``), at most :data:`PREFIX_RETRIES` times; then, or when nothing
        is stored, a miss (``count`` 0, the reason of the last failure or "no stored prefix").
        After a miss token memory holds ``tokens[:limit]`` and the rings are undefined (an
        import that failed in its K/V phase has emptied them): the caller recomputes.
        """
        tokens = list(tokens)
        limit = min(int(limit), len(tokens))
        self._slot(tenant)
        self.counters["queries"] += 1
        self._last_hit = None
        reason = "no stored prefix"
        if limit >= 1:
            self.write_tokens(tokens[:limit])
            n = limit
            for _ in range(1 + PREFIX_RETRIES):
                status, data = self._tenant_request(Op.QUERY_PREFIX, tenant,
                                                    (Status.HIT, Status.MISS), n=n)
                p = PREFIX_RESPONSE.unpack(data)
                self.counters["device_cycles"] += p["cycles"]
                if status != Status.HIT:
                    break
                c = p["count"]
                status, data = self._tenant_request(Op.QUERY, tenant,
                                                    (Status.HIT, Status.MISS), n=c)
                r = SNAPSHOT_RESPONSE.unpack(data)
                self.counters["device_cycles"] += r["cycles"]
                if status == Status.HIT:
                    if c < limit:
                        self._request(Op.TOKENS_WRITE,
                                      REQUESTS[Op.TOKENS_WRITE].pack(offset=c, n=0))
                    self.counters["hits"] += 1
                    result = QueryResult(True, c, r["hash"], "")
                    self._last_hit = (result, r["bytes"])
                    return result
                try:
                    reason = _MISS_REASONS.get(RecordStatus(r["record_status"]), "miss")
                except ValueError:
                    reason = "no record"
                if c == 1:
                    break
                n = c - 1
        self.counters["misses"] += 1
        return QueryResult(False, 0, 0, reason)

    def import_(self, result: QueryResult, *, tenant=None) -> int:
        self._slot(tenant)
        if not result.hit or self._last_hit is None or self._last_hit[0] != result:
            raise ValueError("import needs the result of the last query, a hit")
        moved = self._last_hit[1]
        self.counters["imports"] += 1
        self.counters["bytes_in"] += moved
        return moved

    def export(self, tokens, replaces=None, *, checkpoint=False, tenant=None):
        """``EXPORT`` the rings as the record of ``tokens`` (a turn snapshot, or with
        ``checkpoint`` a prefix checkpoint: the record header's kind); delete the record
        ``replaces`` unless it is the same key. Returns ``(key, bytes moved)``. A sealed
        device seals it under ``tenant``'s key."""
        n = len(tokens)
        kind = RecordKind.CHECKPOINT if checkpoint else RecordKind.TURN
        data = self._tenant_request(Op.EXPORT, tenant, (Status.OK,), n=n, kind=kind.value)[1]
        r = SNAPSHOT_RESPONSE.unpack(data)
        key = (n, r["hash"])
        if replaces is not None and tuple(replaces) != key:
            self.forget(replaces)
        self.counters["exports"] += 1
        self.counters["bytes_out"] += r["bytes"]
        self.counters["device_cycles"] += r["cycles"]
        return key, r["bytes"]

    def forget(self, key) -> bool:
        """Delete the directory entry of ``key = (count, hash)`` (its region is freed)."""
        count, h = key
        status, data = self._request(Op.DIR_LOOKUP, REQUESTS[Op.DIR_LOOKUP].pack(
            count=count, hash=h), ok=(Status.OK, Status.MISS))
        if status != Status.OK:
            return False
        link = DIR_RESPONSE.unpack(data)["link"]
        self._request(Op.DIR_DELETE, REQUESTS[Op.DIR_DELETE].pack(link=link))
        return True

    # -- recovery (the device rebuilds its directory at power-on) -----------------------------
    def recovery_status(self) -> dict:
        """``STORAGE_STATUS``: the :data:`~ringkv.defs.protocol.RECOVERY_STATUS` record (state,
        storage error, regions scanned of all, live records, regions freed, next commit
        sequence, clocks of the scan)."""
        return RECOVERY_STATUS.unpack(self._call(Op.STORAGE_STATUS))

    def storage_info(self) -> dict:
        """``STORAGE_INFO``: the :data:`~ringkv.defs.protocol.STORAGE_INFO` record with its
        codes decoded: ``kind`` (:class:`~ringkv.defs.protocol.StorageKind`), ``card_type``
        (:class:`~ringkv.defs.protocol.CardType`), ``last_error``
        (:class:`~ringkv.defs.protocol.StorageError`), ``initialised`` and ``high_speed``
        as bools; ``sectors`` 0 means unknown (SPI mode does not read the card's CSD). The
        SDRAM hot tier (protocol version 5): ``hot_slots`` (0: the build has none),
        ``hot_residents`` (committed SDRAM copies now), ``hot_slot_sectors``,
        ``hot_slot_tokens`` (token sectors a slot holds)."""
        r = STORAGE_INFO.unpack(self._call(Op.STORAGE_INFO))
        r["kind"] = StorageKind(r["kind"])
        r["card_type"] = CardType(r["card_type"])
        r["last_error"] = StorageError(r["last_error"])
        r["initialised"] = bool(r["initialised"])
        r["high_speed"] = bool(r["high_speed"])
        return r

    def hot_tier(self) -> dict:
        """The SDRAM hot tier of ``STORAGE_INFO``: ``hot_slots`` (0: the build has none),
        ``hot_residents``, ``hot_slot_sectors``, ``hot_slot_tokens`` (as
        :meth:`SoftwareDevice.hot_tier <ringkv.host.device.software.SoftwareDevice.hot_tier>`
        gives them, without its ``resident_regions``: the device does not list them)."""
        info = self.storage_info()
        return {k: info[k] for k in ("hot_slots", "hot_residents", "hot_slot_sectors",
                                     "hot_slot_tokens")}

    def sdram_test(self, tests: int, words: int = 0, pause_ms: int = 0) -> dict:
        """``SDRAM_TEST``: the board's SDRAM self-test (a build with an SDRAM only; another
        build answers ``UNKNOWN_OP``). ``tests``: :class:`~ringkv.defs.sdram.BistTest` bits;
        ``words`` of the full pattern (0: the whole part); ``pause_ms`` of the retention test.
        Returns the :data:`~ringkv.defs.protocol.SDRAM_TEST_RESPONSE` record with ``failed``
        as a :class:`~ringkv.defs.sdram.BistPhase`."""
        r = SDRAM_TEST_RESPONSE.unpack(self._call(Op.SDRAM_TEST, tests=int(tests), words=words,
                                                  pause_ms=pause_ms))
        r["failed"] = BistPhase(r["failed"])
        return r

    def wait_ready(self, timeout: float | None = None, progress=None, poll: float = 0.02
                   ) -> dict:
        """Poll ``STORAGE_STATUS`` until the device's recovery scan has ended; return its
        record. ``progress(status)`` is called with every record polled while it scans.
        Raises :class:`DeviceNotReady` when the scan failed (the storage error is in the
        message) and ``TimeoutError`` after ``timeout`` seconds (None: no bound)."""
        import time
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.recovery_status()
            if st["state"] == RecoveryState.READY.value:
                return st
            if st["state"] == RecoveryState.FAILED.value:
                raise DeviceNotReady(Op.STORAGE_STATUS, st)
            if progress is not None:
                progress(st)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"device recovery not done after {timeout} s "
                                   f"({st['scanned']}/{st['regions']} regions)")
            time.sleep(poll)

    def recover(self, timeout: float | None = None, progress=None) -> dict:
        """``STORAGE_REBUILD`` (the device scans its headers again), then :meth:`wait_ready`.
        A scan already running (the power-on one) is waited for first: the request is
        answered ``NOT_READY`` while one runs."""
        try:
            self.wait_ready(timeout)
        except DeviceNotReady:
            pass                                # a failed scan: the rebuild retries it
        self._call(Op.STORAGE_REBUILD)
        return self.wait_ready(timeout, progress)

    def directory(self) -> list[tuple[int, int, int]]:
        """The live records of the device's directory: ``(count, hash, region)`` by region
        (``DIR_READ`` of every link)."""
        out = [(r["count"], r["hash"], r["region"])
               for r in self._live_links(self.version()["links"])]
        return sorted(out, key=lambda x: x[2])

    def _live_links(self, links: int):
        """The ``DIR_RESPONSE`` record of every live directory link (``DIR_READ`` of each of
        ``links``; a free link answers ``BAD_ARG``)."""
        for link in range(links):
            try:
                data = self._call(Op.DIR_READ, link=link)
            except DeviceError as e:            # BAD_ARG: a free link (NOT_LIVE)
                if e.status != Status.BAD_ARG:
                    raise
                continue
            yield DIR_RESPONSE.unpack(data)

    def read_sectors(self, lba: int, count: int) -> bytes:
        return b"".join(self._call(Op.SECTOR_READ, lba=lba + i) for i in range(count))

    def check(self, regions: int | None = None):
        """The deep check behind ``ringkv storage fsck --link`` (read only): every region read
        through ``SECTOR_READ`` -- header **and payload** -- with the golden record checks
        (:func:`ringkv.host.record.scan_image`). Returns ``(infos, plan)``: the scan and the
        :class:`~ringkv.host.record.RebuildPlan` (what a rebuild keeps, frees and why). Slow
        over a UART (every byte of every record crosses the link); the device's own recovery
        at power-on reads headers only."""
        info = self.version()
        regions = info["regions"] if regions is None else regions
        base = info["base_lba"]
        lay = RecordLayout(self.config)
        if info["sectors_per_region"] != lay.sectors_per_region:
            raise ConfigMismatch(["sectors_per_region: device and host record layouts differ"])

        def read(lba, n):
            return self.read_sectors(base + lba, n)

        infos = scan_image(self.config, read, regions)
        return infos, plan_rebuild(infos)

    def rebuild(self, regions: int | None = None):
        """Rebuild the directory from a deep check (host-driven; the device recovers by itself
        at power-on, see :meth:`wait_ready`): :meth:`check`, then ``DIR_CLEAR`` (setting the
        next commit sequence number) and one ``DIR_INSERT`` with ``FLAG_EXISTING`` per live
        record, in region order, so that records whose payload fails its CRC are not in the
        directory at all. Returns ``(inserts, frees, next_seq)`` as
        :func:`ringkv.host.record.rebuild`; :attr:`last_rebuild` keeps the whole
        :class:`~ringkv.host.record.RebuildPlan` (why each non-empty freed region was freed).

        What storage holds is untrusted: a region that fails any check contributes nothing and
        is freed, so no content of the medium makes this raise; the device stays usable. A
        device or link failure (an error answer, no answer) still raises.
        """
        _, plan = self.check(regions)
        self._request(Op.DIR_CLEAR, REQUESTS[Op.DIR_CLEAR].pack(next_seq=plan.next_seq))
        for count, h, region, _seq in plan.inserts:
            self._call(Op.DIR_INSERT, count=count, hash=h, region=region, flags=FLAG_EXISTING)
        self.last_rebuild = plan
        return plan.inserts, plan.frees, plan.next_seq

    # -- what the device holds; records copied between devices --------------------------------
    def holdings(self, *, tokens: bool = True) -> list[Holding]:
        """The live records of the device's own directory, least recently used first (after
        its recovery: a scan still running answers :class:`DeviceNotReady`).

        Cost: ``VERSION``, ``ALLOC_STATUS``, one ``DIR_READ`` per directory link (the table
        is read whole; a free link answers ``BAD_ARG``), then per live record one
        ``SECTOR_READ`` of its header (kind, commit sequence) and, with ``tokens``, one per
        512 bytes of its tokens (``ceil(count * token_bytes / 512)``): about
        ``links * 49 + records * (1 + T) * 531`` bytes over the link (requests and answers,
        frame overheads included) for ``T`` token sectors
        per record. Nothing is computed and the stamps (LRU order) do not change.
        """
        info = self.version()
        now = RESPONSES[Op.ALLOC_STATUS].unpack(self._call(Op.ALLOC_STATUS))["dir_now"]
        lay = RecordLayout(self.config)
        rows = list(self._live_links(info["links"]))
        rows.sort(key=lambda r: (now - r["stamp"]) & 0xFFFFFFFF, reverse=True)
        out = []
        for r in rows:
            lba = info["base_lba"] + lay.region_lba(r["region"])
            try:
                h = decode_header(self.read_sectors(lba, 1), self.config)
                kind, seq = kind_name(h.kind), h.commit_seq
            except RecordError:
                kind, seq = "corrupt", None     # its next QUERY misses and deletes it
            toks = None
            if tokens and seq is not None:
                raw = self.read_sectors(lba + 1, lay.token_sectors(r["count"]))
                toks = tuple(unpack_tokens(self.config, raw[:r["count"] * self._tb]))
            out.append(Holding(r["count"], r["hash"], kind, r["region"], toks, seq))
        return out

    def read_record(self, key) -> bytes:
        """The record of ``key = (count, hash)`` in the card format
        (:func:`~ringkv.host.record.read_record_bytes`), read with ``SECTOR_READ`` and checked
        here like an import (header, configuration, payload CRC). ``DIR_LOOKUP`` finds its
        region (a lookup is a use: the record becomes the most recently used). Cost: one
        ``SECTOR_READ`` per sector of the record, ``RecordLayout.record_bytes(count) / 512``
        requests (the demo configuration: 1 + 1 + 4 for 128 tokens). Raises
        StorageError (:mod:`ringkv.host.errors`) when the device holds no such record or it
        does not verify."""
        count, h = key
        status, data = self._request(Op.DIR_LOOKUP, REQUESTS[Op.DIR_LOOKUP].pack(
            count=count, hash=h), ok=(Status.OK, Status.MISS))
        if status != Status.OK:
            raise errors.StorageError(f"the device holds no record of {count} tokens with hash "
                               f"{h:#018x}")
        region = DIR_RESPONSE.unpack(data)["region"]
        lay = RecordLayout(self.config)
        base = self.version()["base_lba"] + lay.region_lba(region)
        sectors = {0: self.read_sectors(base, 1)}
        try:
            n = decode_header(sectors[0], self.config).count
        except RecordError as e:
            raise errors.StorageError(f"region {region}: {e}") from None
        for first, k in ((1, lay.token_sectors(n)), (lay.kv_sector, lay.kv_sectors(n))):
            for i in range(k):
                sectors[first + i] = self.read_sectors(base + first + i, 1)

        def read(lba, k):
            return b"".join(sectors.get(lba - lay.region_lba(region) + i, bytes(SECTOR))
                            for i in range(k))
        record = read_record_bytes(self.config, read, region)
        if decode_header(record[:SECTOR], self.config).prefix_hash != h:
            raise errors.StorageError(f"region {region} holds another record than the "
                                      "directory says")
        return record

    def write_record(self, data: bytes, *, tenant=None) -> tuple:
        """Store a record copied from another device: the gateware has no sector write, so the
        record's K/V go back into the rings and the device exports them itself.

        The record is checked first (:func:`~ringkv.host.record.record_writes`: length,
        header, configuration, payload CRC; a :class:`~ringkv.host.record.RecordError`
        otherwise, before anything is sent). Then ``RING_CLEAR``, ``TOKENS_WRITE`` of its
        tokens, and per layer one ``ATTN_PREFILL`` of ``count`` tokens whose K/V are the
        record's (the tokens before the window's ``min(count, W)``, which the rings do not
        keep, with zero K/V; the queries are zero and the outputs unused), so that every ring
        holds ``count`` tokens with the record's K/V in its valid slots; then ``EXPORT`` of its
        kind: the device writes the record (payload first, header last, its own commit
        sequence) and its directory knows it. The new record's K/V area equals the copied
        one's byte for byte; its hash is checked against the copy's.

        Cost: the link traffic of the attention part of a recompute of ``count`` tokens
        (``count * (Hq + 2*Hkv) * d * EB`` bytes per layer in, ``count * Hq * d * 2`` out) and
        one export; the host's model is not run. The rings and token memory then hold the
        copied record's state (as after an import). Returns its key.

        A sealed device takes only a sealed record whose tag verifies under one of its keys,
        sealed under ``tenant``'s key (its export seals the copy under that key again); an open
        device only an open record. Anything else is a ``RecordError`` (``NO_KEY``,
        ``BAD_MAC``) before anything is sent: a record is never re-sealed for another tenant,
        nor unsealed."""
        header, _ = record_writes(self.config, data,
                                  keys=self._keys if self.sealed else None)
        if header.sealed != self.sealed:
            raise RecordError(RecordStatus.NO_KEY, "a sealed device stores only sealed records, "
                              "an open one only open records", header)
        if self.sealed and header.key_id != self.tenants.get(tenant):
            raise RecordError(RecordStatus.NO_KEY, f"the record is sealed under key id "
                              f"{header.key_id}, not under tenant {tenant!r}'s key", header)
        c, n = self.config, header.count
        if n == 0:
            raise RecordError(RecordStatus.BAD_HEADER, "a record of no tokens holds nothing "
                              "to resume", header)
        lay = RecordLayout(c)
        tok_end = SECTOR * (1 + lay.token_sectors(n))
        tok, kv = data[SECTOR:tok_end], data[tok_end:]
        tokens, _, k, v = decode_payload(c, header, tok[:header.token_bytes],
                                         kv[:header.k_bytes + header.v_bytes])
        bits = 8 * self.numerics.elem_bytes

        def signed(words):
            w = np.asarray(words).astype(np.int64)
            return w - ((w >> (bits - 1)) << bits)
        valid = min(n, c.window)
        self.reset()
        self.write_tokens(tokens)
        q = np.zeros((n, c.q_heads, c.head_dim), dtype=np.int64)
        for layer in range(c.layers):
            ki = np.zeros((n, c.kv_heads, c.head_dim), dtype=np.int64)
            vi = np.zeros_like(ki)
            ki[n - valid:] = np.transpose(signed(k[layer]), (1, 0, 2))
            vi[n - valid:] = np.transpose(signed(v[layer]), (1, 0, 2))
            self._attend(Op.ATTN_PREFILL, layer, q, ki, vi)
        kind = header.kind if header.kind in {x.value for x in RecordKind} else 0
        r = SNAPSHOT_RESPONSE.unpack(self._tenant_request(Op.EXPORT, tenant, (Status.OK,),
                                                          n=n, kind=kind)[1])
        if r["hash"] != header.prefix_hash:
            raise errors.StorageError(
                f"the copied record's hash {header.prefix_hash:#018x} is not the device's "
                f"{r['hash']:#018x} for its tokens (another hash seed?)")
        self.counters["exports"] += 1
        self.counters["bytes_out"] += r["bytes"]
        self.counters["device_cycles"] += r["cycles"]
        return (n, r["hash"])

    # -- AttentionBackend -------------------------------------------------------------------
    @property
    def n(self) -> int:
        raw = self._call(Op.RING_READ, addr=0, n=1, what=RING_META)
        return int.from_bytes(raw[:4], "little")

    def ring_meta(self) -> list[tuple[int, int]]:
        c = self.config
        rings = c.layers * c.kv_heads
        raw = self._call(Op.RING_READ, addr=0, n=rings, what=RING_META)
        return [(int.from_bytes(raw[i:i + 4], "little"),
                 int.from_bytes(raw[i + 4:i + META_BYTES], "little"))
                for i in range(0, len(raw), META_BYTES)]

    def reset(self) -> None:
        self._call(Op.RING_CLEAR, layer=RING_CLEAR_ALL)

    def _attend(self, op, layer, qi, ki, vi):
        out = []
        for s in range(0, len(ki), self._attn_chunk):
            e = s + self._attn_chunk
            payload = pack_attn(self.config, layer, qi[s:e], ki[s:e], vi[s:e])
            data = self._request(op, payload)[1]
            out.append(unpack_attn(self.config, data, len(ki[s:e])))
        return np.concatenate(out)

    def prefill(self, layer, q, k, v):
        nx, fr = self.numerics, self._layer_fracs(layer)
        qi, ki, vi = (quantize(np.asarray(x), nx, f) for x, f in zip((q, k, v), fr))
        return dequantize_out(self._attend(Op.ATTN_PREFILL, layer, qi, ki, vi), nx, fr[2])

    def decode(self, layer, q, k, v):
        nx, fr = self.numerics, self._layer_fracs(layer)
        qi, ki, vi = (quantize(np.asarray(x), nx, f)[None] for x, f in zip((q, k, v), fr))
        return dequantize_out(self._attend(Op.ATTN_DECODE, layer, qi, ki, vi), nx,
                              fr[2])[0]

    def _layer_fracs(self, layer):
        """The layer's ``(Fq, Fk, Fv)``; a bad layer index goes to the device as it is (its
        answer is the error), with the numerics' base fractions."""
        if 0 <= layer < len(self._fracs):
            return self._fracs[layer]
        return (self.numerics.qkv_frac,) * 3

    def snapshot(self):
        """The rings (signed q/k/v integers of the numerics: int8 values for ``ringkv-fx1``,
        int16 for ``ringkv-fx2``; ``[layer, kv_head, kind, slot, dim]``) and per-ring metadata.

        ``RING_READ`` addresses the ring port's bytes (``EB`` per element, little-endian)."""
        c = self.config
        total = ring_elements(c) * self.numerics.elem_bytes
        step = self.max_payload - self.max_payload % self.numerics.elem_bytes
        raw = b""
        for addr in range(0, total, step):
            raw += self._call(Op.RING_READ, addr=addr, n=min(step, total - addr),
                              what=RING_ELEMENTS)
        return rings_from_image(c, raw, signed=True), self.ring_meta()

    def restore(self, snapshot) -> None:
        raise NotImplementedError("the device restores rings by QUERY (verified import) only")
