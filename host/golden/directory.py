"""Golden model of the cache directory and allocator (:mod:`ringkv.hw.store.directory`), bit-exact.

Commands and responses are dicts keyed by the fields of ``command_layout`` and
``response_layout``; a response has every field, and the fields an operation does not report
are zero. ``GoldenDirectory.command(cmd)`` answers exactly what the gateware answers, and
``probe(keys)`` is a PROBE run (the command plus its keys on the ``probe`` stream) with
its exact clock count, and ``state()`` exposes the whole directory (bucket lists, link rows,
the free-link FIFO in order, FIFO A and FIFO B in order) for checks and for the formal
invariants' reference.
"""

from collections import deque

from ringkv.defs.directory import (
    LINK_FIELD_WIDTH,
    NIL,
    PROBES_FIELD_WIDTH,
    REGION_FIELD_WIDTH,
    Op,
    Status,
    check_directory_params,
    command_fields,
    response_fields,
)

__all__ = ["GoldenDirectory", "RESPONSE_FIELDS", "COMMAND_FIELDS", "random_commands"]

COMMAND_FIELDS = tuple(command_fields())
RESPONSE_FIELDS = tuple(response_fields())


_OPS = {op.value: op for op in Op}


def _int(value) -> int:
    return int(value.value) if isinstance(value, (Op, Status)) else int(value)


class GoldenDirectory:
    """The directory as plain Python: lists, a deque per FIFO, the same policy and order."""

    def __init__(self, *, buckets, links, regions, count_width=24, hash_width=64,
                 stamp_width=32, b_threshold=None):
        self.b_threshold = check_directory_params(buckets, links, regions, count_width,
                                                  hash_width, stamp_width, b_threshold)
        self.buckets, self.links, self.regions = buckets, links, regions
        self.count_mask = (1 << count_width) - 1
        self.hash_mask = (1 << hash_width) - 1
        self.stamp_mask = (1 << stamp_width) - 1
        self.deep_hits = 0                      # lookup hits below the head of a chain
        self.clear()

    # -- state ----------------------------------------------------------------------------

    def clear(self):
        self.head = [None] * self.buckets
        self.live = {}                          # link -> {"count", "hash", "region", "stamp"}
        self.prev = [None] * self.links
        self.next = [None] * self.links
        self.free_links = deque(range(self.links))
        self.a_next = 0                         # FIFO A = range(a_next, regions)
        self.fifo_b = deque()

    def state(self) -> dict:
        return {
            "heads": {b: self.chain(b) for b in range(self.buckets) if self.head[b] is not None},
            "live": {n: dict(row, prev=self.prev[n], next=self.next[n])
                     for n, row in sorted(self.live.items())},
            "free_links": list(self.free_links),
            "fifo_a": list(range(self.a_next, self.regions)),
            "fifo_b": list(self.fifo_b),
        }

    def chain(self, bucket) -> list[int]:
        out, link = [], self.head[bucket]
        while link is not None:
            out.append(link)
            link = self.next[link]
        return out

    def bucket(self, hash_value) -> int:
        return hash_value & (self.buckets - 1)

    def age(self, now, stamp) -> int:
        return (now - stamp) & self.stamp_mask

    # -- allocation -----------------------------------------------------------------------

    def use_b(self) -> bool:
        """Policy: FIFO B when it holds at least ``b_threshold`` regions or A is empty."""
        a_avail = self.a_next != self.regions
        return bool(self.fifo_b) and (not a_avail or len(self.fifo_b) >= self.b_threshold)

    def _link_in(self, link, count, hash_value, region, now):
        old = self.head[self.bucket(hash_value)]
        self.live[link] = {"count": count, "hash": hash_value, "region": region, "stamp": now}
        self.prev[link] = None
        self.next[link] = old
        if old is not None:
            self.prev[old] = link
        self.head[self.bucket(hash_value)] = link

    def _unlink(self, link):
        row = self.live.pop(link)
        p, n = self.prev[link], self.next[link]
        if p is None:
            self.head[self.bucket(row["hash"])] = n
        else:
            self.next[p] = n
        if n is not None:
            self.prev[n] = p
        self.free_links.append(link)
        self.fifo_b.append(row["region"])
        return row

    def lru_victim(self, now):
        best, best_age = None, -1
        for link in range(self.links):
            if link in self.live:
                age = self.age(now, self.live[link]["stamp"])
                if age > best_age:
                    best, best_age = link, age
        return best

    # -- commands -------------------------------------------------------------------------

    def command(self, cmd: dict) -> dict:
        c = {k: _int(cmd.get(k, 0)) for k in COMMAND_FIELDS}
        c["op"] &= 0xF
        c["evict"] &= 1
        c["link"] &= (1 << LINK_FIELD_WIDTH) - 1
        c["region"] &= (1 << REGION_FIELD_WIDTH) - 1
        c["count"] &= self.count_mask
        c["hash"] &= self.hash_mask
        c["now"] &= self.stamp_mask
        c["max_age"] &= self.stamp_mask
        r = dict.fromkeys(RESPONSE_FIELDS, 0)
        r["op"] = c["op"]
        r["status"] = self._execute(c, r).value
        return r

    def probe(self, keys) -> tuple[dict, int]:
        """A PROBE run over ``keys`` (``[(count, hash), ...]``, at least one): ``(response,
        clocks)``.

        Each key is looked up as LOOKUP does (the first link of its bucket's list with equal
        count and hash), but no stamp changes. The response reports the **last** key that hit
        (``status`` OK, its ``link``, ``region``, ``count``, ``hash``), or MISS; ``probes`` is
        the number of links compared over the run. ``clocks`` is the gateware's cost of the
        keys when each is on offer as soon as the previous one is done: a key whose bucket is
        empty takes 1 clock, any other ``3 + 2c`` for ``c`` links compared (``c = k + 1`` for a
        hit at chain position ``k``, the chain length for a miss; two clocks a link: the read
        at a registered address, then the step to its next pointer; each link's row is
        compared a clock after its read).
        """
        keys = list(keys)
        if not keys:
            raise ValueError("a probe run needs at least one key")
        r = dict.fromkeys(RESPONSE_FIELDS, 0)
        r["op"], r["status"] = Op.PROBE.value, Status.MISS.value
        clocks = 0
        for count, hash_value in keys:
            count &= self.count_mask
            hash_value &= self.hash_mask
            link = self.head[self.bucket(hash_value)]
            if link is None:
                clocks += 1
                continue
            compared = 0
            while link is not None and compared < self.links:
                row = self.live[link]
                compared += 1
                if row["count"] == count and row["hash"] == hash_value:
                    r.update(status=Status.OK.value, link=link, region=row["region"],
                             count=count, hash=hash_value)
                    break
                link = self.next[link]
            r["probes"] += compared
            clocks += 3 + 2 * compared
        r["probes"] &= (1 << PROBES_FIELD_WIDTH) - 1
        return r, clocks

    def _execute(self, c, r) -> Status:
        op = _OPS.get(c["op"])
        if op == Op.PROBE:
            raise ValueError("a PROBE command comes with its keys: use GoldenDirectory.probe")
        if op == Op.LOOKUP:
            if c["count"] == 0:
                return Status.BAD_COUNT
            link = self.head[self.bucket(c["hash"])]
            position = 0
            while link is not None:
                row = self.live[link]
                if row["count"] == c["count"] and row["hash"] == c["hash"]:
                    self.deep_hits += position > 0
                    row["stamp"] = c["now"]
                    r.update(link=link, region=row["region"], count=c["count"], hash=c["hash"])
                    return Status.OK
                link = self.next[link]
                position += 1
            return Status.MISS
        if op in (Op.INSERT, Op.INSERT_EXISTING):
            existing = op == Op.INSERT_EXISTING
            if c["count"] == 0:
                return Status.BAD_COUNT
            if existing and not self.a_next <= c["region"] < self.regions:
                return Status.BAD_REGION
            have_region = self.a_next != self.regions or bool(self.fifo_b)
            if not self.free_links or (not existing and not have_region):
                if existing or not c["evict"]:
                    return Status.FULL
                victim = self.lru_victim(c["now"])
                self._unlink(victim)
                r.update(evicted=1, victim=victim)
            if existing:
                self.fifo_b.extend(range(self.a_next, c["region"]))
                region = c["region"]
                self.a_next = region + 1
            elif self.use_b():
                region = self.fifo_b.popleft()
            else:
                region = self.a_next
                self.a_next += 1
            link = self.free_links.popleft()
            self._link_in(link, c["count"], c["hash"], region, c["now"])
            r.update(link=link, region=region)
            return Status.OK
        if op in (Op.DELETE, Op.TOUCH, Op.READ):
            link = c["link"]
            if link >= self.links:
                return Status.BAD_LINK
            if link not in self.live:
                return Status.NOT_LIVE
            r["link"] = link
            row = self.live[link]
            if op == Op.DELETE:
                self._unlink(link)
                r["region"] = row["region"]
            elif op == Op.TOUCH:
                row["stamp"] = c["now"]
            else:
                p, n = self.prev[link], self.next[link]
                r.update(region=row["region"], count=row["count"], hash=row["hash"],
                         stamp=row["stamp"], prev=NIL if p is None else p,
                         next=NIL if n is None else n)
            return Status.OK
        if op == Op.EXPIRE:
            for link in range(self.links):
                row = self.live.get(link)
                if row is not None and self.age(c["now"], row["stamp"]) > c["max_age"]:
                    self._unlink(link)
                    r["expired"] += 1
            return Status.OK
        if op == Op.CLEAR:
            self.clear()
            return Status.OK
        return Status.BAD_OP


def random_commands(rng, golden: GoldenDirectory, n: int, *, hash_pool: int = 24,
                    max_count: int = 6, now_start: int = 0):
    """``n`` random commands with their expected responses, stepping ``golden``.

    The mix covers hits, misses, collisions in one bucket (hashes share their low bits), the
    same hash with another count, eviction (on and off), expiry, rebuild inserts after a clear
    (ascending regions, some refused), out-of-range and free links, count 0 and bad opcodes.
    Returns ``(commands, responses)``.
    """
    g = golden
    low = rng.randrange(g.buckets)
    pool = []
    for k in range(hash_pool):
        high = rng.getrandbits(max(0, g.hash_mask.bit_length() - 2)) << 2
        bucket = low if k % 3 == 0 else rng.randrange(g.buckets)   # a third share one bucket
        pool.append(((high | bucket) & ~(g.buckets - 1) | bucket) & g.hash_mask)
    now = now_start
    rebuild = 0
    cmds, resps = [], []
    for _ in range(n):
        now = (now + rng.randrange(4)) & g.stamp_mask
        live = sorted(g.live)
        roll = rng.random()
        key = {"count": rng.randrange(1, max_count + 1), "hash": rng.choice(pool), "now": now}
        if rebuild:
            rebuild -= 1
            region = g.a_next + rng.randrange(3) if rng.random() < 0.9 else rng.randrange(
                g.regions + 2)
            cmd = {"op": Op.INSERT_EXISTING, **key, "region": region}
        elif roll < 0.30:
            if live and rng.random() < 0.5:
                row = g.live[rng.choice(live)]
                key.update(count=row["count"], hash=row["hash"])
            elif rng.random() < 0.05:
                key["count"] = 0
            cmd = {"op": Op.LOOKUP, **key}
        elif roll < 0.56:
            cmd = {"op": Op.INSERT, **key, "evict": int(rng.random() < 0.6)}
        elif roll < 0.70:
            cmd = {"op": Op.DELETE, "link": _pick_link(rng, g, live)}
        elif roll < 0.78:
            cmd = {"op": Op.TOUCH, "link": _pick_link(rng, g, live), "now": now}
        elif roll < 0.88:
            cmd = {"op": Op.READ, "link": _pick_link(rng, g, live)}
        elif roll < 0.93:
            cmd = {"op": Op.EXPIRE, "now": now, "max_age": rng.randrange(8, 120)}
        elif roll < 0.95:
            cmd = {"op": Op.INSERT_EXISTING, **key,
                   "region": g.a_next + rng.randrange(-2, 3) if rng.random() < 0.8
                   else rng.randrange(1 << 24)}
        elif roll < 0.97:
            cmd = {"op": rng.randrange(Op.PROBE.value + 1, 16), **key}   # unknown opcodes
        else:
            cmd = {"op": Op.CLEAR}
            rebuild = rng.randrange(0, 12)
        cmd = {k: _int(v) for k, v in cmd.items()}
        cmds.append(cmd)
        resps.append(g.command(cmd))
    return cmds, resps


def _pick_link(rng, g, live):
    roll = rng.random()
    if live and roll < 0.8:
        return rng.choice(live)
    if roll < 0.93:
        return rng.randrange(g.links)                      # often a free link
    return rng.choice([g.links, g.links + rng.randrange(1000), NIL])   # out of range
