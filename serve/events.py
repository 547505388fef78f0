"""KV events in vLLM's format (``ringkv serve --kv-events tcp://*:5557``), for the KV-aware
routers that consume vLLM's (llm-d's KV-cache indexer, Dynamo's KV router).

**The wire.** As vLLM's ``ZmqEventPublisher`` (``vllm/distributed/kv_events.py``): a ZMQ PUB
socket sends each batch as three frames, the topic (``--kv-events-topic``, empty by default),
the batch's sequence number (8 bytes, big-endian, from 0 at every start) and the payload:
``KVEventBatch(ts, events)`` in msgpack, msgspec's ``array_like`` encoding with tagged events
(each event an array whose first element is its class name): ``BlockStored(block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium)``, ``BlockRemoved(block_hashes,
medium)``, ``AllBlocksCleared()``. A ROUTER socket (``--kv-events-replay``) answers a request
``[b"", start_seq (8 bytes)]`` (a REQ or DEALER client) with every batch still buffered
(the last ``buffer`` batches) from ``start_seq`` on, each ``[b"", seq, payload]``, then the
end marker ``[b"", -1 (8 bytes, signed), b""]``.

**Records as blocks.** A RingKV record holds ``count`` tokens of a conversation (a turn
snapshot, or a checkpoint at a message end), keyed by the prefix hash ``h_count`` of the
device (:mod:`ringkv.host.golden.hash`, chained token by token from the tenant's seed). Its
blocks are its ``count // block_size`` full blocks of ``block_size`` tokens (default 16,
vLLM's); block ``k``'s hash is the prefix hash at its end, ``h_{k * block_size}``, and its
parent the one before (none for the first): equal prefixes give equal block hashes, as vLLM's
chained hashes do, and the hashes are 64-bit unsigned integers (vLLM's ``ExternalBlockHash``
is an int or bytes). The tokens after the last full block are not published (a router
matches full blocks only). Records share blocks (a checkpoint and every turn behind it): a
block is stored when the first record of the instance's devices holding it appears, and
removed when the last one goes (evicted, overwritten, lost with its device). At every start
the first batch is ``AllBlocksCleared``, then the records the devices' directories hold. The
tokens come from the device's own directory (``Device.holdings``), like everything the index
knows. ``medium`` is ``None`` and ``lora_id`` ``None`` (no adapters).
"""

import logging
import threading
import time
from collections import deque

import msgspec

from .engine import _chain

__all__ = ["KVEvents", "KVEventBatch", "BlockStored", "BlockRemoved", "AllBlocksCleared",
           "END_SEQ"]

log = logging.getLogger(__name__)

#: the replay's end marker (vLLM's ``ZmqEventPublisher.END_SEQ``)
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(_Event):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(_Event):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


class KVEvents:
    """The publisher (module docstring): a thread that follows the devices' indexes and sends
    what changed, and answers replay requests."""

    def __init__(self, engine, endpoint: str, replay: str | None = None, *,
                 block_size: int = 16, buffer: int = 10000, topic: str = ""):
        self.engine, self.endpoint, self.replay = engine, endpoint, replay
        self.block_size, self.topic = block_size, topic.encode()
        self.buffer: deque = deque(maxlen=buffer)
        self.seq = 0
        self.records: dict = {}      # (worker name, key) -> block hashes
        self.tokens: dict = {}       # block hash -> (parent, tokens of the block)
        self.refs: dict = {}         # block hash -> records holding it
        self.changed = threading.Event()
        self._stop = threading.Event()
        self._encoder = msgspec.msgpack.Encoder()
        self._thread = threading.Thread(target=self._main, name="ringkv-kv-events",
                                         daemon=True)
        self.bound = threading.Event()

    def start(self):
        self._thread.start()

    def stop(self):
        self._stop.set()
        self._thread.join(10)

    def _main(self):
        import zmq
        context = zmq.Context.instance()
        pub = context.socket(zmq.PUB)
        pub.setsockopt(zmq.LINGER, 0)
        pub.bind(self.endpoint)
        router = None
        poller = zmq.Poller()
        if self.replay:
            router = context.socket(zmq.ROUTER)
            router.setsockopt(zmq.LINGER, 0)
            router.bind(self.replay)
            poller.register(router, zmq.POLLIN)
        self.bound.set()
        try:
            self._send(pub, [AllBlocksCleared()])
            while not self._stop.is_set():
                if router is not None:
                    if poller.poll(100):
                        self._answer(router)
                else:
                    self.changed.wait(0.1)
                if self.changed.is_set():
                    self.changed.clear()
                    try:
                        events = self.sync()
                    except Exception:              # noqa: BLE001 - keep publishing
                        log.exception("kv events: the devices' records not read")
                        events = []
                    if events:
                        self._send(pub, events)
        finally:
            pub.close()
            if router is not None:
                router.close()

    def _send(self, pub, events):
        payload = self._encoder.encode(KVEventBatch(ts=time.time(), events=events))
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))

    def _answer(self, router):
        frames = router.recv_multipart()
        if len(frames) != 3:
            log.warning("kv events: a replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        start = int.from_bytes(start, "big")
        for seq, payload in list(self.buffer):
            if seq >= start:
                router.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        router.send_multipart((client, b"", END_SEQ, b""))

    # -- records -> blocks ---------------------------------------------------------------------
    def _blocks(self, key, tokens) -> list | None:
        """The block hashes of a record of ``tokens`` whose key is ``key``, from the seed
        (the tenant's) whose chain ends at its hash; None when none does."""
        count, h = key
        if tokens is None or len(tokens) != count:
            return None
        for hasher in self.engine.hashers.values():
            chain = _chain(hasher.seed, tokens)
            if chain and chain[-1] == h:
                return chain[self.block_size - 1::self.block_size]
        return None

    def sync(self) -> list:
        """The events that bring the published blocks to what the devices hold now."""
        b = self.block_size
        stored, removed = [], []
        now = {}
        for w in self.engine.workers:
            with w.lock:
                keys = set(w.index) if w.state == "ready" else set()
            for key in keys:
                now[(w.name, key)] = None
            new = [k for k in keys if (w.name, k) not in self.records]
            if new:
                held = w.record_tokens()
                for key in new:
                    blocks = self._blocks(key, held.get(key))
                    if blocks is None:          # (no tokens from this device: nothing to say)
                        self.records[(w.name, key)] = []
                        continue
                    tokens = held[key]
                    self.records[(w.name, key)] = blocks
                    fresh = [i for i, x in enumerate(blocks) if self.refs.get(x, 0) == 0]
                    for x in blocks:
                        self.refs[x] = self.refs.get(x, 0) + 1
                    if fresh:
                        first = fresh[0]
                        stored.append(BlockStored(
                            block_hashes=blocks[first:],
                            parent_block_hash=blocks[first - 1] if first else None,
                            token_ids=list(tokens[first * b:len(blocks) * b]),
                            block_size=b, lora_id=None, medium=None))
        for rec in [r for r in self.records if r not in now]:
            gone = []
            for x in self.records.pop(rec):
                self.refs[x] -= 1
                if not self.refs[x]:
                    del self.refs[x]
                    gone.append(x)
            if gone:
                removed.append(BlockRemoved(block_hashes=gone, medium=None))
        return removed + stored
