"""The device/model configuration every part of RingKV agrees on, and its digest.

A snapshot record is only usable by a device with the same configuration: the record header
stores :meth:`RingKVConfig.digest` and the fields themselves, so a foreign record is refused with
a message naming the differing field. The hash engine's seed folds in the same digest (SPEC §2,
:func:`ringkv.defs.hash.hash_seed`), so prefix hashes of different configurations never match.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, fields

__all__ = ["RingKVConfig", "DEFAULT_CONFIG", "DEMO_CONFIG"]


@dataclass(frozen=True)
class RingKVConfig:
    """Model shape and arithmetic as the FPGA sees it.

    ``numerics`` names the fixed-point scheme of the attention core (formats and scales:
    :mod:`ringkv.defs.numerics`); two devices whose numerics differ must not share snapshots.
    """

    layers: int = 4
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    window: int = 128
    token_width: int = 16
    max_tokens: int = 16384
    numerics: str = "ringkv-fx1"

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type is int or f.type == "int":
                if not isinstance(value, int) or value <= 0:
                    raise ValueError(f"{f.name} must be a positive integer, not {value!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(f"q_heads ({self.q_heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA group size G)."""
        return self.q_heads // self.kv_heads

    def canonical(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()

    def digest(self) -> bytes:
        """32-byte BLAKE2b digest of the canonical field encoding."""
        return hashlib.blake2b(self.canonical(), digest_size=32,
                               person=b"ringkv-config").digest()

    def diff(self, other: "RingKVConfig") -> list[str]:
        """Names and values of the fields that differ, for error messages."""
        return [f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
                for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


DEFAULT_CONFIG = RingKVConfig()

#: The end-to-end demo's device: small enough that a Verilator simulation of the whole top
#: answers a token in well under a second, large enough to wrap the ring many times.
DEMO_CONFIG = RingKVConfig(layers=2, q_heads=4, kv_heads=2, head_dim=16, window=32,
                           max_tokens=1024)

