"""The scans of a store and what recovery makes of them: the deep scan (every record's header,
configuration, payload CRC and, with keys, tag) and the host's rebuild plan; the header scan
and the device's recovery plan, its bit-exact golden model.

Recovery (:func:`scan_image`, :func:`plan_rebuild`) treats every byte read from storage as
untrusted: only a record that passes every check gives the rebuild its key, count and commit
sequence; anything else is a region to free with its reason, and nothing on the medium makes
the scan or the rebuild raise. Commit sequences are compared in serial-number order modulo
2**32 (:func:`ringkv.defs.record.seq_newer`); the rule is in ``docs/blocks/record-format.md``.
"""

from dataclasses import dataclass, field

from ringkv.defs.mac import KEY_ID_NONE
from ringkv.defs.record import RecordLayout, RecordStatus, seq_newer, seq_newest, seq_next

from .codec import RecordError, _import, decode_header

__all__ = [
    "RecordInfo", "scan_region", "scan_image", "RebuildPlan", "plan_rebuild", "rebuild",
    "HeaderInfo", "check_header", "scan_headers", "RecoveryPlan", "plan_recovery",
]


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
