"""The directory's linked lists (hw/store/directory_lists.py) against a Python model, on random and
boundary operation sequences, in both table forms (block RAM, and the registers of the formal
build).

Two models: ``RowsModel`` is the piece clock by clock (the three tables' rows, the registered
reads, the writes of each operation); ``lists`` (a list of links per bucket) is what the rows
must encode after every complete operation. Every clock the piece's ``head``/``prev``/``next``
equal the row model's, and after every operation the row model encodes ``lists``.
"""

import random

import pytest
from amaranth.sim import Simulator
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from ringkv.hw.store.directory_lists import LIST_BUGS, BucketLists

# (buckets, links): the smallest, more links than buckets, more buckets than links
SHAPES = [(2, 2), (4, 8), (16, 4)]
FORMS = [False, True]


class RowsModel:
    """The three tables and the piece's registered reads; ``edge()`` is one clock edge."""

    def __init__(self, buckets, links, formal):
        self.nil = links
        # block RAM starts at 0 (the owner's reset sweep sets every head to none); the register
        # form starts as the sweep leaves it
        self.heads = [links if formal else 0] * buckets
        self.prevs = [0] * links
        self.nexts = [0] * links
        self.read = (0, 0, 0)               # (head, prev, next) of the last edge's addresses
        self.old_head = 0

    def edge(self, head_addr, link_addr, op=None, bucket=0, link=0):
        p, n = self.read[1], self.read[2]
        head = self.read[0]
        self.read = (self.heads[head_addr], self.prevs[link_addr], self.nexts[link_addr])
        if op == "clear":
            self.heads[bucket] = self.nil
        elif op == "push":
            self.prevs[link] = self.nil
            self.nexts[link] = head
            self.heads[bucket] = link
            self.old_head = head
        elif op == "push_prev":
            self.prevs[self.old_head] = link
        elif op == "unlink":
            if p == self.nil:
                self.heads[bucket] = n
            else:
                self.nexts[p] = n
            if n != self.nil:
                self.prevs[n] = p

    def encodes(self, lists):
        """Whether the rows hold ``lists`` (the rows of links in no list are free to differ)."""
        nil = self.nil
        for b, chain in enumerate(lists):
            if self.heads[b] != (chain[0] if chain else nil):
                return False
            for k, link in enumerate(chain):
                want_prev = chain[k - 1] if k else nil
                want_next = chain[k + 1] if k + 1 < len(chain) else nil
                if (self.prevs[link], self.nexts[link]) != (want_prev, want_next):
                    return False
        return True


class Driver:
    """Drives the piece and the models together and compares every clock."""

    def __init__(self, ctx, dut, rng):
        self.ctx, self.dut, self.rng = ctx, dut, rng
        self.model = RowsModel(dut.buckets, dut.links, dut.formal)
        self.lists = [[] for _ in range(dut.buckets)]
        self.clocks = 0
        self.seen = set()          # which kinds of operation ran (for the test's own check)

    async def clock(self, head_addr=None, link_addr=None, op=None, bucket=0, link=0):
        ctx, dut, rng = self.ctx, self.dut, self.rng
        head_addr = rng.randrange(dut.buckets) if head_addr is None else head_addr
        link_addr = rng.randrange(dut.links) if link_addr is None else link_addr
        want = self.model.read
        assert (ctx.get(dut.head), ctx.get(dut.prev), ctx.get(dut.next)) == want, self.clocks
        ctx.set(dut.head_addr, head_addr)
        ctx.set(dut.link_addr, link_addr)
        for name in ("clear", "push", "push_prev", "unlink"):
            ctx.set(getattr(dut, name), name == op)
        # operands are random when unused: the piece must ignore them
        ctx.set(dut.bucket, bucket if op else rng.randrange(dut.buckets))
        ctx.set(dut.link, link if op else rng.randrange(dut.links))
        self.model.edge(head_addr, link_addr, op, bucket, link)
        await ctx.tick()
        self.clocks += 1

    async def idle(self, most=2):
        for _ in range(self.rng.randrange(most + 1)):
            await self.clock()

    def check_lists(self):
        assert self.model.encodes(self.lists), (self.clocks, self.lists)

    async def sweep(self):
        """The owner's reset sweep: every head to none (every link free)."""
        for b in range(self.dut.buckets):
            await self.clock(op="clear", bucket=b)
            await self.idle(1)
        self.lists = [[] for _ in range(self.dut.buckets)]
        self.check_lists()

    async def push(self, link, bucket):
        empty = not self.lists[bucket]
        await self.clock(head_addr=bucket)
        await self.clock(op="push", bucket=bucket, link=link)
        if not empty:
            await self.idle()
            await self.clock(op="push_prev", link=link)
        self.lists[bucket].insert(0, link)
        self.seen.add("push onto empty" if empty else "push onto non-empty")
        self.check_lists()

    async def unlink(self, link):
        bucket = next(b for b, chain in enumerate(self.lists) if link in chain)
        chain = self.lists[bucket]
        k = chain.index(link)
        self.seen.add("only" if len(chain) == 1 else "head" if k == 0
                      else "tail" if k == len(chain) - 1 else "middle")
        await self.idle()
        await self.clock(link_addr=link)
        await self.clock(op="unlink", bucket=bucket)
        chain.remove(link)
        self.check_lists()

    async def read_all(self):
        """Every head and every link's pointers through the read ports."""
        for b in range(self.dut.buckets):
            await self.clock(head_addr=b)
        for n in range(self.dut.links):
            await self.clock(link_addr=n)
        await self.clock()

    def live(self):
        return [link for chain in self.lists for link in chain]

    def free(self):
        live = set(self.live())
        return [n for n in range(self.dut.links) if n not in live]


def run(dut, script, seed=0):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    result = {}

    async def bench(ctx):
        drv = Driver(ctx, dut, random.Random(seed))
        await drv.sweep()
        await script(drv)
        await drv.read_all()
        result["driver"] = drv

    sim.add_testbench(bench)
    sim.run()
    return result["driver"]


async def random_script(drv, operations=300):
    rng, dut = drv.rng, drv.dut
    # a few buckets take most pushes, so that lists grow long
    favourite = rng.sample(range(dut.buckets), min(2, dut.buckets))
    for _ in range(operations):
        free, live = drv.free(), drv.live()
        choice = rng.random()
        if choice < 0.02:
            await drv.sweep()
        elif free and (not live or choice < 0.5):
            bucket = rng.choice(favourite) if rng.random() < 0.6 else rng.randrange(dut.buckets)
            await drv.push(rng.choice(free), bucket)
        elif live:
            await drv.unlink(rng.choice(live))
        if rng.random() < 0.1:
            await drv.read_all()


@pytest.mark.parametrize("formal", FORMS)
@pytest.mark.parametrize("buckets, links", SHAPES)
def test_random_sequences_match_model(buckets, links, formal):
    """Random pushes (onto empty and non-empty lists, idle clocks before the second clock of a
    push), unlinks of live links (only, head, middle, tail), sweeps and random reads: every
    clock's reads equal the model's, and after every operation the tables encode the lists."""
    drv = run(BucketLists(buckets=buckets, links=links, formal=formal), random_script,
              seed=buckets * 31 + links + formal)
    kinds = {"push onto empty", "push onto non-empty", "only", "head", "tail"}
    if links > 2:
        kinds.add("middle")
    assert kinds <= drv.seen, drv.seen


@settings(max_examples=examples(fast=4, thorough=60), deadline=None)
@given(shape=st.sampled_from(SHAPES), formal=st.sampled_from(FORMS),
       seed=st.integers(0, 2**32 - 1))
def test_random_sequences_property(shape, formal, seed):
    """The random sequences of ``test_random_sequences_match_model`` from drawn seeds."""
    buckets, links = shape
    run(BucketLists(buckets=buckets, links=links, formal=formal),
        lambda drv: random_script(drv, 150), seed=seed)


def _boundary_scripts(links):
    """Every link into one bucket, then unlinked in several orders; every bucket its own."""
    async def one_bucket(drv, order):
        for n in range(links):
            await drv.push(n, 1)
        chain = list(drv.lists[1])                  # head first
        if order == "head first":
            victims = chain
        elif order == "tail first":
            victims = chain[::-1]
        else:                                       # middle out, then the ends
            victims = chain[1:-1] + [chain[0], chain[-1]]
        for n in victims:
            await drv.unlink(n)
        # refill in the reverse order, so that free links are reused
        for n in reversed(range(links)):
            await drv.push(n, 1)

    async def spread(drv):
        for n in range(links):
            await drv.push(n, n % drv.dut.buckets)
        for n in range(links):
            await drv.unlink(n)

    return {"head first": lambda drv: one_bucket(drv, "head first"),
            "tail first": lambda drv: one_bucket(drv, "tail first"),
            "middle out": lambda drv: one_bucket(drv, "middle out"),
            "spread": spread}


@pytest.mark.parametrize("formal", FORMS)
@pytest.mark.parametrize("buckets, links", SHAPES)
@pytest.mark.parametrize("name", list(_boundary_scripts(2)))
def test_boundary_sequences_match_model(name, buckets, links, formal):
    """A bucket filled with every link (the longest list) and emptied head first, tail first
    and middle out, then refilled; and every link in a bucket of its own."""
    drv = run(BucketLists(buckets=buckets, links=links, formal=formal),
              _boundary_scripts(links)[name])
    assert drv.clocks > 4 * links


@pytest.mark.parametrize("bug", LIST_BUGS)
def test_broken_variants_fail(bug):
    """The formal proofs' broken variants break the model test too: it can fail."""
    with pytest.raises(AssertionError):
        run(BucketLists(buckets=4, links=8, _bug=bug), random_script)


def test_parameter_errors():
    with pytest.raises(ValueError, match=r"^buckets must be a power of two"):
        BucketLists(buckets=3, links=4)
    with pytest.raises(ValueError, match=r"^links must be a power of two"):
        BucketLists(buckets=4, links=1 << 16)
    with pytest.raises(TypeError, match=r"^links must be an integer"):
        BucketLists(buckets=4, links=4.0)
    with pytest.raises(ValueError, match=r"^Unknown bug 'x'"):
        BucketLists(buckets=4, links=4, _bug="x")
