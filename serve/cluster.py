"""Many ``ringkv serve`` instances, one exact index: the instances' registry and the records
they hold, in a Valkey (or Redis) server (``ringkv serve --valkey URL``).

**What is stored.** Every key is under ``ringkv:{identity}:``, the deployment's identity
(:func:`identity`): a hash of the configuration digest, the numerics and the weights, so that
two deployments whose records are not interchangeable never see each other's. Tenants are in
the records' keys themselves: a sealed server's prefix hash is seeded by the tenant's record
key (``tenant_seed``), so a tenant's lookup computes hashes that no other tenant's record
has, and a copied record is verified under the receiving tenant's key; besides, each
record's entry names its tenant and a lookup reads only its own tenant's. Per instance
start:

* ``epochs``: a set of the epochs of the instances registered (an epoch: 64 random bits and
  the start time, new at every start);
* ``live:{epoch}``: the instance's heartbeat, a JSON object ``{"url", "load", "room",
  "started"}`` (its advertised URL, requests queued and running, how many more it takes)
  written every ``interval`` seconds with a time-to-live of ``ttl`` seconds;
* ``held:{epoch}``: a set of ``"{tenant}:{count}:{hash:016x}:{device}"``, one member per
  record its devices hold, read from the devices' own directories as the local index is (at
  start, after every recovery, after every request on a software device, at every export);
  ``tenant`` is the record key id whose seed the record's prefix hash chains from (``open``
  on an open server), found from the record's tokens (a record whose tokens the device does
  not give is not published: it is found by no lookup);
  ``ver:{epoch}``: a counter bumped at every change of it. Both expire ``10 * ttl`` after
  the last heartbeat.

**Who uses what.** Each instance's thread (:class:`Cluster`) publishes its own entries
(only what changed; everything again when Valkey comes back) and, every ``interval``, reads
the other instances': those without a live heartbeat are dropped (and their keys deleted),
those whose version moved are read again. The router's lookup
(:meth:`Cluster.longest`) is then a lookup in that copy, made in the request's own hashes:
no round trip per request. An entry is used only while its instance's heartbeat lives: an
instance killed stops being routed to within ``ttl + interval`` seconds (and a request
forwarded to it meanwhile fails to connect and is served locally); an instance restarted has
a new epoch, and its records are published again under it, read from its devices.

**Valkey down**: every instance serves from its own devices (the copy of the others'
entries is dropped), ``ringkv_cluster_up`` is 0 and ``ringkv_cluster_errors_total`` counts
the failed rounds; when Valkey answers again the instance registers and publishes all it
holds again.
"""

import hashlib
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field

from ringkv.host.errors import UsageError

__all__ = ["Cluster", "Peer", "identity", "weights_identity"]

log = logging.getLogger(__name__)


def weights_identity(model) -> bytes:
    """A hash of the model's weights (shape and every value): two models differ in it as soon
    as one weight does."""
    h = hashlib.sha256(f"{model.hidden}:{model.ffn}".encode())
    for name in sorted(model.w):
        a = model.w[name]
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.digest()


def identity(config, model) -> str:
    """The deployment's identity: what makes two instances' records interchangeable (the
    configuration digest, its numerics, the weights), 16 hex digits."""
    h = hashlib.sha256(config.digest())
    h.update(str(config.numerics).encode())
    h.update(weights_identity(model))
    return h.hexdigest()[:16]


@dataclass
class Peer:
    """Another instance, as its heartbeat and its published records say."""
    epoch: str
    url: str
    load: int = 0
    room: int = 0
    version: int = -1
    keys: dict = field(default_factory=dict)     # (tenant, count, hash) -> device name


class Cluster:
    """An instance's membership of the cluster (module docstring): ``url`` the Valkey
    server, ``advertise`` the instance's own base URL as the others reach it."""

    def __init__(self, engine, url: str, advertise: str, ident: str, *,
                 interval: float = 1.0, ttl: float = 3.0, move: str = "auto", client=None):
        if not ttl > interval > 0:
            raise UsageError(f"the heartbeat's time-to-live ({ttl} s) must be longer than its "
                             f"interval ({interval} s)", param="--cluster-ttl")
        self.engine, self.url, self.advertise, self.ident = engine, url, advertise, ident
        self.interval, self.ttl = interval, ttl
        #: how a request reaches another instance's record: ``forward`` the request there,
        #: ``copy`` the record here, ``auto``: forward while that instance has room, else copy
        self.move = move
        #: this start's epoch: 64 random bits and the start time (ms)
        self.epoch = f"{secrets.randbits(64):016x}-{int(time.time() * 1000):x}"
        self.started = time.time()
        self.prefix = f"ringkv:{ident}:"
        self.peers: dict = {}                   # epoch -> Peer
        self.up = False
        self._client = client
        self._published: set | None = None      # what Valkey holds of ours (None: unknown)
        self._version = 0
        self._tenants: dict = {}                # (device, key) -> its tenant's label, or None
        self.changed = threading.Event()        # the local index changed: publish soon
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="ringkv-cluster", daemon=True)
        self.lock = threading.Lock()

    # -- life ----------------------------------------------------------------------------------
    def _connect(self):
        if self._client is None:
            import valkey
            self._client = valkey.Valkey.from_url(self.url, socket_timeout=max(0.5, self.ttl / 3),
                                                  socket_connect_timeout=max(0.5, self.ttl / 3),
                                                  decode_responses=True)
        return self._client

    def start(self):
        self._thread.start()

    def stop(self, *, deregister: bool = True):
        """Stop the thread; ``deregister``: delete this epoch's entries (a clean shutdown; a
        killed instance's expire with its heartbeat)."""
        self._stop.set()
        self.changed.set()
        self._thread.join(10)
        if deregister and self.up:
            try:
                c = self._connect()
                p = self.prefix
                pipe = c.pipeline()
                pipe.delete(f"{p}live:{self.epoch}", f"{p}held:{self.epoch}",
                            f"{p}ver:{self.epoch}")
                pipe.srem(f"{p}epochs", self.epoch)
                pipe.execute()
            except Exception as e:                 # noqa: BLE001 - Valkey down: they expire
                log.info("cluster: entries not deleted at shutdown (%s); they expire", e)
        self.up = False

    def _main(self):
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.round()
            except Exception as e:                 # noqa: BLE001 - any failure: degraded
                self._down(e)
            self.engine.metrics.cluster_round.observe(time.perf_counter() - t0)
            # changes that come together (a request's exports, many requests' ends) are one
            # round: at most ten a second, at least one an interval (the heartbeat)
            self._stop.wait(min(0.1, self.interval / 2))
            self.changed.wait(self.interval)
            self.changed.clear()

    def _down(self, exc):
        if self.up or self._published is not None:
            log.warning("cluster: Valkey at %s unreachable (%s: %s); serving from this "
                        "instance's devices only", self.url, type(exc).__name__, exc)
        self.up = False
        self._published = None
        with self.lock:
            self.peers = {}
        m = self.engine.metrics
        m.cluster_up.set(0)
        m.cluster_errors.inc()
        m.cluster_peers.set(0)

    # -- one round -----------------------------------------------------------------------------
    @staticmethod
    def label(tenant) -> str:
        return "open" if tenant is None else str(tenant)

    def _tenant_of(self, key, tokens):
        """The label of the tenant whose seed ``key``'s hash chains from over ``tokens``."""
        from .engine import _chain
        count, h = key
        if tokens is None or len(tokens) != count:
            return None
        for tenant, hasher in self.engine.hashers.items():
            if _chain(hasher.seed, tokens)[-1] == h:
                return self.label(tenant)
        return None

    def holdings(self) -> set:
        """This instance's records, as published: ``"{tenant}:{count}:{hash:016x}:{device}"``
        (each new record's tenant found from its tokens, read from its device's directory)."""
        out, known = set(), {}
        for w in self.engine.workers:
            if w.state != "ready":
                continue
            with w.lock:
                keys = list(w.index)
            new = [k for k in keys if (w.name, k) not in self._tenants]
            if new:
                # briefly: a busy device's new records wait for the next round, the heartbeat
                # does not
                held = w.record_tokens(timeout=self.interval / 4)
                for k in new:
                    if k in held:
                        self._tenants[(w.name, k)] = self._tenant_of(k, held[k])
            for c, h in keys:
                label = self._tenants.get((w.name, (c, h)))
                known[(w.name, (c, h))] = label
                if label is not None:
                    out.add(f"{label}:{c}:{h:016x}:{w.name}")
        for gone in set(self._tenants) - set(known):
            del self._tenants[gone]
        return out

    def _heartbeat(self) -> str:
        workers = self.engine.ready()
        room = sum(max(0, w.batch + self.engine.max_queue - w.load) for w in workers)
        return json.dumps({"url": self.advertise, "load": sum(w.load for w in workers),
                           "room": room, "started": self.started, "pid": os.getpid()})

    def round(self):
        """Publish the heartbeat and what changed, then read the others' entries."""
        if self.advertise is None:              # (set once the server listens)
            return
        c, p, e = self._connect(), self.prefix, self.epoch
        ttl_ms, keep_ms = int(self.ttl * 1000), int(self.ttl * 10000)
        now = self.holdings()
        pipe = c.pipeline(transaction=True)
        if self._published is None:             # first round, or Valkey came back
            pipe.delete(f"{p}held:{e}")
            added, removed = now, set()
        else:
            added, removed = now - self._published, self._published - now
        if added:
            pipe.sadd(f"{p}held:{e}", *added)
        if removed:
            pipe.srem(f"{p}held:{e}", *removed)
        if added or removed or self._published is None:
            pipe.incr(f"{p}ver:{e}")
        pipe.sadd(f"{p}epochs", e)
        pipe.set(f"{p}live:{e}", self._heartbeat(), px=ttl_ms)
        pipe.pexpire(f"{p}held:{e}", keep_ms)
        pipe.pexpire(f"{p}ver:{e}", keep_ms)
        pipe.execute()
        if not self.up:
            log.info("cluster: registered at %s as epoch %s (%s), %d records published",
                     self.url, e, self.advertise, len(now))
        self._published = now
        self.up = True
        self.engine.metrics.cluster_up.set(1)
        self._read_peers(c)

    def _read_peers(self, c):
        p = self.prefix
        epochs = [x for x in c.smembers(f"{p}epochs") if x != self.epoch]
        pipe = c.pipeline(transaction=False)
        for x in epochs:
            pipe.get(f"{p}live:{x}")
            pipe.get(f"{p}ver:{x}")
        answers = pipe.execute() if epochs else []
        peers = {}
        dead = []
        for i, x in enumerate(epochs):
            beat, ver = answers[2 * i], answers[2 * i + 1]
            if beat is None:                    # no live heartbeat: never used again
                dead.append(x)
                continue
            info = json.loads(beat)
            old = self.peers.get(x)
            peer = Peer(x, info["url"], int(info.get("load", 0)), int(info.get("room", 0)),
                        old.version if old else -1, old.keys if old else {})
            version = int(ver or 0)
            if version != peer.version:
                members = c.smembers(f"{p}held:{x}")
                keys = {}
                for m in members:
                    tenant, count, h, device = m.split(":", 3)
                    keys[(tenant, int(count), int(h, 16))] = device
                peer.keys, peer.version = keys, version
            peers[x] = peer
        if dead:
            pipe = c.pipeline(transaction=False)
            for x in dead:
                pipe.srem(f"{p}epochs", x)
                pipe.delete(f"{p}held:{x}", f"{p}ver:{x}")
            pipe.execute()
            log.info("cluster: %d instance(s) without a heartbeat dropped", len(dead))
        with self.lock:
            self.peers = peers
        self.engine.metrics.cluster_peers.set(len(peers))

    # -- lookups -------------------------------------------------------------------------------
    def longest(self, hashes, tenant=None) -> tuple:
        """``(count, peer)``: the longest prefix of a request of ``tenant`` (its prefix hashes
        ``h_1 .. h_n``) that another live instance holds, ``(0, None)`` for none."""
        with self.lock:
            peers = list(self.peers.values())
        best, holder = 0, None
        n, label = len(hashes), self.label(tenant)
        for peer in peers:
            for t, c, h in peer.keys:
                if t == label and best < c <= n and hashes[c - 1] == h:
                    best, holder = c, peer
        return best, holder

    def forget(self, peer):
        """A peer that did not answer: not used again until its next heartbeat is read."""
        with self.lock:
            if self.peers.get(peer.epoch) is peer:
                del self.peers[peer.epoch]
