"""The device protocol: what the scheduler needs from the accelerator side, and the results it
gets back.

:class:`Device` is the seam between :class:`~ringkv.host.scheduler.Scheduler` and a device:
:class:`~ringkv.host.device.software.SoftwareDevice` (the whole device in software, golden
models in the FPGA's place) and :class:`~ringkv.host.device.fpga.FpgaDevice` (the FPGA, or its
simulation, over the link) implement it. :class:`QueryResult` is a query's answer,
:class:`Holding` one record of a device's own directory, :func:`snapshot_bytes` the bytes a
snapshot moves. This module imports neither the scheduler nor a device, so that the scheduler
and the devices each import it and never each other.
"""

import abc
from dataclasses import dataclass, field

from ringkv.defs.config import RingKVConfig
from ringkv.defs.record import kv_bytes_of

from ..model.transformer import AttentionBackend

__all__ = ["Device", "Context", "QueryResult", "Holding", "snapshot_bytes"]


def snapshot_bytes(config: RingKVConfig, count: int) -> int:
    """Bytes a snapshot of ``count`` tokens moves: the tokens and the K/V rings (``EB`` bytes per
    element: int8 for ``ringkv-fx1``, int16 for ``ringkv-fx2``)."""
    return count * (config.token_width // 8) + kv_bytes_of(config, count)


@dataclass(eq=False)
class Context:
    """One conversation's place on a device: its rings (``attention``, an
    :class:`~ringkv.host.model.transformer.AttentionBackend`) and its token memory
    (``tokens``). A device holds :attr:`Device.resident_limit` of them at once; the store and
    token calls act on the one :meth:`Device.bind` chose. ``number`` is its index."""
    attention: object
    tokens: list = field(default_factory=list)
    number: int = 0


@dataclass(frozen=True)
class QueryResult:
    hit: bool
    count: int
    prefix_hash: int
    reason: str = ""          # why a miss: "no record", "tokens differ", "foreign config"


@dataclass(frozen=True)
class Holding:
    """One record a device holds, from the device's own directory (:meth:`Device.holdings`).

    ``kind`` is ``"turn"`` (a session's turn snapshot), ``"checkpoint"`` (a prefix checkpoint)
    or ``"kind N"`` for another stored value; ``region`` is the storage region (``None`` where
    the device has none); ``tokens`` the record's tokens when the device gives them cheaply
    (else ``None``); ``commit_seq`` the record's commit sequence number where known.
    """
    count: int
    prefix_hash: int
    kind: str = "turn"
    region: int | None = None
    tokens: tuple | None = None
    commit_seq: int | None = None

    @property
    def key(self) -> tuple[int, int]:
        """``(count, prefix_hash)``: the key :meth:`Device.export` returns."""
        return (self.count, self.prefix_hash)


class Device(abc.ABC):
    """What the scheduler needs from the accelerator side (FPGA or software).

    A device with sealed records also takes ``tenant=`` (a keyword) in :meth:`query`,
    :meth:`query_prefix`, :meth:`import_` and :meth:`export`; the scheduler passes it only for
    a session that has a tenant, so a device without tenants needs none of it."""

    config: RingKVConfig
    attention: AttentionBackend

    @abc.abstractmethod
    def write_tokens(self, tokens) -> None:
        """Replace the token memory with ``tokens`` (the resident session's computed tokens)."""

    @abc.abstractmethod
    def append_tokens(self, tokens) -> None:
        """Append computed tokens to the token memory."""

    @abc.abstractmethod
    def query(self, tokens) -> QueryResult:
        """Hash ``tokens``, look ``(count, hash)`` up, verify the stored tokens."""

    def query_prefix(self, tokens, limit: int) -> QueryResult:
        """The longest stored prefix of ``tokens`` of at most ``limit`` tokens whose record
        verifies. On a hit the rings hold the state after ``count`` tokens and the token memory
        holds exactly ``tokens[:count]`` (the import is part of the query, as ``QUERY``'s is on
        the FPGA; :meth:`import_` of the result then reports the bytes moved).
        ``QueryResult(hit, count, prefix_hash, reason)``.

        Every device implements it (:class:`SoftwareDevice` here, ``FpgaDevice`` with the
        ``QUERY_PREFIX`` request); this default only names a device that does not."""
        raise NotImplementedError(f"{type(self).__name__} has no longest-prefix query")

    @abc.abstractmethod
    def import_(self, result: QueryResult) -> int:
        """Load the snapshot found by a hit into the rings (if the query did not already);
        return the bytes moved."""

    @abc.abstractmethod
    def export(self, tokens, replaces: tuple | None = None, *,
               checkpoint: bool = False) -> tuple[tuple, int]:
        """Store the rings as the snapshot of ``tokens`` (the rings must hold exactly
        ``len(tokens)`` tokens and the token memory must begin with ``tokens``); delete the
        record ``replaces`` (a snapshot the session gives up). ``checkpoint`` marks the record's
        kind (a prefix checkpoint rather than a turn snapshot; same format and checks). Return
        ``(key, bytes moved)``."""

    # -- the hot tier: conversations resident at once ------------------------------------------
    @property
    def resident_limit(self) -> int:
        """How many conversations' rings the device holds at once (its hot tier): 1 for a
        device with one set of rings (the FPGA's block RAM today)."""
        return 1

    def context(self, number: int) -> Context:
        """Context ``number`` (``0 .. resident_limit - 1``). A device with one set of rings
        has only context 0: its own rings (its token memory stays on the device)."""
        if number != 0:
            raise ValueError(f"{type(self).__name__} holds one conversation at a time: no "
                             f"context {number}")
        ctx = getattr(self, "_only_context", None)
        if ctx is None or ctx.attention is not self.attention:
            ctx = self._only_context = Context(self.attention)
        return ctx

    def bind(self, context: Context) -> None:
        """Make ``context`` the rings and token memory that the next calls (queries, imports,
        exports, token writes) act on."""
        if context is not self.context(0):
            raise ValueError(f"{type(self).__name__} holds one conversation at a time")

    def holdings(self, *, tokens: bool = True) -> list[Holding]:
        """What the device holds, read from its own directory (after any restart or recovery,
        never remembered by the host): one :class:`Holding` per live record. ``tokens``: also
        give each record's tokens where the device can."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its records")

    def read_record(self, key) -> bytes:
        """The stored record of ``key = (count, hash)`` in the card format, as it moves between
        devices (:func:`ringkv.host.record.read_record_bytes`): header, token and K/V sectors.
        Raises :class:`~ringkv.host.errors.StorageError` when the device does not hold it."""
        raise NotImplementedError(f"{type(self).__name__} cannot read its records")

    def write_record(self, data: bytes) -> tuple:
        """Store a record read from another device (:meth:`read_record`) as this device's own
        (verified first; refused with :class:`~ringkv.host.errors.StorageError` or
        :class:`~ringkv.host.errors.ConfigError` otherwise); return its key."""
        raise NotImplementedError(f"{type(self).__name__} cannot store a copied record")

    def stats(self) -> dict:
        return {}
