"""Listings and fsck reports of a scan: each region's state in the words of ``storage ls``
(:func:`region_states`), the inspection table (:func:`format_listing`) and the check's report
(:func:`fsck_report`), from a deep scan (:mod:`.scan`)."""

from ringkv.defs.mac import KEY_ID_NONE
from ringkv.defs.record import SEQ_MOD, RecordStatus, seq_newest

from .codec import kind_name
from .scan import RebuildPlan, RecordInfo, plan_rebuild

__all__ = ["PROBLEM_STATES", "REPAIRABLE_STATES", "region_states", "format_listing",
           "fsck_report"]


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
