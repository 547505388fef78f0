"""The record MAC's constants: keyed BLAKE2s (RFC 7693), its tag and key sizes, key slots.

Shared by the gateware (:class:`ringkv.hw.seal.mac.MacCore`,
:class:`ringkv.hw.seal.key_slots.KeySlots`) and the golden model (:mod:`ringkv.host.golden.mac`).
``docs/blocks/mac.md`` explains the choice; in short:

- **Keyed BLAKE2s** (RFC 7693, keyed mode: the key, zero padded to a 64-byte block, is the
  first block). It is a standard MAC with published test vectors (RFC 7693 Appendix B and the
  BLAKE2 reference repository's keyed known-answer tests) and an independent reference in the
  Python standard library (``hashlib.blake2s``), which the host and every test use. Its
  32-bit words suit the FPGA (32-bit adders on ECP5 carry chains; SHA-256-based HMAC would
  need two hash passes per message and a 64-round schedule; SipHash is 64-bit ARX and its
  64-bit tag is too short for an adversary with unlimited offline attempts on a card image).
- **128-bit tags** (``digest_size=16``). A forger who cannot query the device's key gets one
  guess per import attempt; 2^-128 per guess is beyond any attempt count, and the tag stays
  short enough for the record header. BLAKE2s' ``digest_size`` is in its parameter block, so a
  16-byte tag is not a truncated 32-byte digest: the two never share values.
- **256-bit keys** (``key_size=32``, BLAKE2s' maximum): a key is never the weak part.
- **Personalisation** (``person=``, 8 bytes in the parameter block) separates the two uses of
  one tenant key, so the same core computes both: :data:`PERSON_RECORD` for record tags,
  :data:`PERSON_SEED` for deriving the tenant's 64-bit prefix-hash seed
  (:func:`ringkv.host.golden.mac.tenant_seed`). A value computed for one use is never valid for
  the other.
"""

__all__ = ["BLOCK_BYTES", "TAG_BYTES", "KEY_BYTES", "KEY_WORDS", "PERSON_BYTES", "PERSON_RECORD",
           "PERSON_SEED", "PERSONS", "KEY_SLOTS", "KEY_ID_BYTES", "KEY_ID_NONE", "SLOT_BITS",
           "KEY_WRITE_BYTES", "SEED_BYTES", "IV", "SIGMA", "ROUNDS", "MAX_MESSAGE_BYTES",
           "param_word0"]

#: BLAKE2s block size in bytes.
BLOCK_BYTES = 64
#: Tag length in bytes (BLAKE2s ``digest_size``).
TAG_BYTES = 16
#: Key length in bytes (BLAKE2s ``key_size``; the key block is the key zero padded to 64 bytes).
KEY_BYTES = 32
KEY_WORDS = KEY_BYTES // 4
#: BLAKE2s personalisation length in bytes.
PERSON_BYTES = 8
#: Personalisation of record tags.
PERSON_RECORD = b"RKVrecd1"
#: Personalisation of the tenant hash-seed derivation.
PERSON_SEED = b"RKVseed1"
#: The persons the device's MAC core selects between, by index (``MacCore``'s ``cmd.person``).
PERSONS = (PERSON_RECORD, PERSON_SEED)
#: Bytes of the derived prefix-hash seed (the hash engine's 64-bit ``h_0``).
SEED_BYTES = 8

#: Key slots on the device: volatile registers, written over the link, read only by the MAC.
KEY_SLOTS = 4
#: Width of a slot number in a key-slot write (one protocol byte; slots >= KEY_SLOTS refused).
SLOT_BITS = 8
#: Bytes of a key id: chosen by the host when it sets a slot, stored with the key, carried by
#: every record so that keys can rotate. Not secret.
KEY_ID_BYTES = 2
#: The key id of an unauthenticated (open mode) record; a slot may not be set with it.
KEY_ID_NONE = 0
#: Bytes written into a slot, in order: the key id (little-endian), then the key.
KEY_WRITE_BYTES = KEY_ID_BYTES + KEY_BYTES

#: The longest message the device's core accepts: its byte counter is the low word ``t0`` of
#: BLAKE2s' counter (``t1`` is 0), which counts the key block too.
MAX_MESSAGE_BYTES = 2 ** 32 - 1 - BLOCK_BYTES

#: RFC 7693 section 2.6: the initialisation vector (SHA-256's).
IV = (0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
      0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19)
#: RFC 7693 section 2.7: the message schedule, one permutation per round.
SIGMA = (
    (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
    (14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3),
    (11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4),
    (7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8),
    (9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13),
    (2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9),
    (12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11),
    (13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10),
    (6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5),
    (10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0),
)
#: BLAKE2s rounds per compression.
ROUNDS = 10


def param_word0(digest_bytes: int, key_bytes: int) -> int:
    """Word 0 of the BLAKE2s parameter block (RFC 7693 section 2.5): digest length, key
    length, fanout 1, depth 1 (sequential mode)."""
    return 0x01010000 | (key_bytes << 8) | digest_bytes
