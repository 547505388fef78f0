"""Record keys on the host: a key ring ``{key_id: key}`` read from a key file or from the
environment, never from the command line, never logged.

Format (a key file, or the value of :data:`ENV_VAR`): one key per line, ``key_id hex``, where
``key_id`` is a decimal integer 1 .. 65535 (the id records carry; 0 is an open record's) and
``hex`` the 32-byte key as 64 hexadecimal digits. Blank lines and lines starting with ``#`` are
ignored; in the environment variable, ``;`` also separates entries. A key id may appear once.

A key file must be a regular file that only its owner can read or write (mode ``0600`` or
stricter, as ``ssh`` requires of private keys): a file that its group or others may read or
write is refused, and the error says how to fix it (``chmod 600 FILE``).

Errors are :class:`~ringkv.host.errors.ConfigError` (a bad file or value: exit 3) and never
hold a key's bytes: a malformed line is named by its number and what is wrong with it, not
quoted. :class:`KeyRing` holds the keys; its ``repr`` and ``str`` show the key ids only.

The standard library does the work (``bytes.fromhex``, ``os.stat``); no third-party parser is
needed for a two-column format.
"""

import logging
import os
import stat
from pathlib import Path

from ringkv.defs.mac import KEY_BYTES, KEY_ID_BYTES, KEY_ID_NONE

from .errors import ConfigError, KeyRequired

__all__ = ["ENV_VAR", "KeyRing", "parse_keys", "read_key_file", "read_private_file",
           "keys_from_env", "load_keys", "tenant_key_id"]

log = logging.getLogger(__name__)

#: The environment variable that may hold keys (same format as a key file).
ENV_VAR = "RINGKV_KEYS"
_KEY_ID_MAX = (1 << (8 * KEY_ID_BYTES)) - 1


class KeyRing:
    """Keys by key id. ``keys()`` gives the plain ``{key_id: key}`` the record functions take;
    ``repr``/``str`` name only the key ids and where the keys came from."""

    __slots__ = ("_keys", "source")

    def __init__(self, keys: dict, source: str = "given"):
        self._keys = dict(keys)
        self.source = source

    def keys(self) -> dict:
        """``{key_id: 32-byte key}`` (a copy)."""
        return dict(self._keys)

    def ids(self) -> list[int]:
        return sorted(self._keys)

    def __contains__(self, key_id) -> bool:
        return key_id in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, key_id) -> bytes:
        return self._keys[key_id]

    def __repr__(self) -> str:
        return f"KeyRing(ids={self.ids()}, source={self.source!r})"

    __str__ = __repr__

    def __reduce__(self):
        raise TypeError("a KeyRing is not pickled (it holds keys)")


def parse_keys(text: str, source: str) -> KeyRing:
    """The keys in ``text`` (the format of the module docstring); ``source`` names it in
    errors (a path, or the environment variable)."""
    keys = {}
    entries = [part for line in text.splitlines() for part in line.split(";")]
    for n, entry in enumerate(entries, 1):
        entry = entry.strip()
        if not entry or entry.startswith("#"):
            continue
        where = f"{source}: entry {n}"
        fields = entry.split()
        if len(fields) != 2:
            raise ConfigError(f"{where}: expected 'key_id hex' (2 fields), found {len(fields)}",
                              hint="one key per line: a key id 1..65535, a space, 64 hex digits",
                              fields=["keys"])
        key_id, hexkey = fields
        if not (key_id.isascii() and key_id.isdigit()) or not 0 < int(key_id) <= _KEY_ID_MAX:
            raise ConfigError(f"{where}: the key id must be an integer 1..{_KEY_ID_MAX} "
                              f"({KEY_ID_NONE} marks open records)", fields=["keys"])
        if len(hexkey) != 2 * KEY_BYTES:
            raise ConfigError(f"{where}: a key is {2 * KEY_BYTES} hex digits ({KEY_BYTES} "
                              f"bytes), this one has {len(hexkey)}", fields=["keys"])
        try:
            key = bytes.fromhex(hexkey)
        except ValueError:
            raise ConfigError(f"{where}: the key is not hexadecimal", fields=["keys"]) from None
        if int(key_id) in keys:
            raise ConfigError(f"{where}: key id {int(key_id)} given twice", fields=["keys"])
        keys[int(key_id)] = key
    if not keys:
        raise ConfigError(f"{source}: no keys in it", fields=["keys"],
                          hint="one key per line: a key id 1..65535, a space, 64 hex digits")
    ring = KeyRing(keys, source)
    log.debug("loaded %d key(s) (ids %s) from %s", len(ring), ring.ids(), source)
    return ring


def read_private_file(path, what: str = "key file") -> str:
    """The ASCII text of ``path`` (at most 1 MiB), after checking that it is a regular file
    only its owner may read or write and that the owner is this user; anything else is a
    :class:`ConfigError` that begins with ``what`` and the path. Every secret the host reads
    from a file (record keys, the server's API keys) comes through here."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise ConfigError(f"{what} {path}: not found", fields=["keys"]) from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: cannot open it ({e.strerror})",
                          fields=["keys"]) from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise ConfigError(f"{what} {path}: not a regular file", fields=["keys"])
    with os.fdopen(fd, "rb") as f:
        if st.st_mode & 0o077:
            raise ConfigError(f"{what} {path}: permissions {stat.S_IMODE(st.st_mode):04o} "
                              f"are too open (its group or others may access it)",
                              hint=f"chmod 600 {path}", fields=["keys"])
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            raise ConfigError(f"{what} {path}: owned by another user (uid {st.st_uid})",
                              fields=["keys"])
        raw = f.read(1 << 20)
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path}: not ASCII text", fields=["keys"]) from None


def read_key_file(path) -> KeyRing:
    """The keys of a key file, after checking it is a regular file only its owner may read
    or write (:func:`read_private_file`)."""
    return parse_keys(read_private_file(path), f"key file {path}")


def keys_from_env(environ=None) -> KeyRing | None:
    """The keys in :data:`ENV_VAR`, or ``None`` when it is not set (or empty)."""
    environ = os.environ if environ is None else environ
    value = environ.get(ENV_VAR, "")
    if not value.strip():
        return None
    return parse_keys(value, f"${ENV_VAR}")


def load_keys(key_file=None, environ=None) -> KeyRing | None:
    """The key file's keys when ``key_file`` is given, else those of :data:`ENV_VAR`, else
    ``None`` (no keys: open mode)."""
    if key_file is not None:
        return read_key_file(key_file)
    return keys_from_env(environ)


def tenant_key_id(tenants: dict, held, tenant) -> int:
    """The key id of ``tenant`` (``tenants``: tenant -> key id) when its key is ``held`` (a
    container of key ids); :class:`KeyRequired` naming the tenant, never a key, otherwise.
    What both devices' sealed modes ask before a tenant's request."""
    key_id = tenants.get(tenant)
    if key_id is None or key_id not in held:
        why = "unknown tenant" if key_id is None else f"key id {key_id} not held"
        raise KeyRequired(f"sealed device: tenant {tenant!r} has no key ({why})",
                          hint="set the tenant's key (a key file or RINGKV_KEYS)",
                          fields=["keys"])
    return key_id
