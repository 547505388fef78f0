"""``ringkv.hw.store``: what the device knows of stored sessions -- the hash engine over a
session's tokens, the cache directory (hash table of doubly linked lists, the two address FIFOs
of its region allocator, the free-link FIFO), the hot tier (which SDRAM slot holds a copy of
which card region's record) and the token memory.

It may import Amaranth, the standard library, ``ringkv.defs`` and ``ringkv.hw.enums``; it knows
nothing of the link, storage, attention or sealing (``tests/repo/test_layers.py``).
"""

from .directory import CacheDirectory
from .directory_alloc import FreeLinks, RegionAllocator, Table
from .directory_lists import BucketLists
from .hash_engine import HashEngine
from .hot_tier import HotTier
from .token_memory import TokenMemory, TokenReadSignature

__all__ = ["HashEngine", "CacheDirectory", "BucketLists", "RegionAllocator", "FreeLinks",
           "Table", "HotTier", "TokenMemory", "TokenReadSignature"]
