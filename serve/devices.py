"""The devices behind the server: what ``--device`` names, how each is opened, reopened after
a failure, listed and closed.

``--device`` (repeatable):

* ``software`` -- the device in software (:class:`~ringkv.host.device.software.SoftwareDevice`,
  the golden models), its store in memory; its hot tier (``hot_bytes``, ``ringkv serve
  --hot-bytes``) holds many conversations' rings at once, so the server batches on it;
* ``software:IMAGE`` -- the same, its store kept in the image file ``IMAGE`` (a restart of the
  server, or a recovery, is a new device on the same image);
* ``sim`` or ``sim:IMAGE`` -- a simulated board: ``RingKVTop`` built with Verilator and run
  under cocotb by the existing harness (:class:`ringkv.sim.harness.SimDevice`), its card an
  image file (a temporary one for ``sim``: ``sim`` may be named many times, a board and a
  card each); the top of ``ringkv sim`` for the same ``--config`` (the demo shape: the demo's
  top, ``DEMO_TOP``, the build ``make demo`` uses); if the simulator dies, the recovery starts
  it again on the same image (a power cycle: the board recovers its directory by itself);
* ``socket://HOST:PORT`` -- a device reached over TCP (a ``ringkv sim`` started elsewhere);
* anything else -- a serial port (``/dev/ttyUSB0``: the board's USB UART).

With no ``--device`` the server runs one software device on the card image
:func:`default_image` in the user's data directory (``platformdirs``: the platform's
convention, ``$XDG_DATA_HOME/ringkv`` on Linux).

Each :class:`DeviceHandle` gives a fresh, ready :class:`~ringkv.host.device.interface.Device` from
:meth:`DeviceHandle.open` (for a board: connected, its configuration checked against the
host's, its power-on recovery waited for) and lists the records the device holds
(:meth:`DeviceHandle.listing`: the software device's store, the board's own directory) --
the server's index of a device is rebuilt from that listing, never guessed.

Sealed devices (``ringkv serve --sealed``): every handle is given the record key ring
(``keys``, a :class:`~ringkv.host.keys.KeyRing`); the device is opened sealed, each key id its
own tenant (``tenants={id: id}``): the software device in its sealed mode, a simulated board
as ``RingKVTop(sealed=True)`` (``ringkv sim --sealed``), a board over a link with
``FpgaDevice(sealed=True)`` (the board must be a sealed build: an open one refuses the first
key with a clear error).
"""

import logging
import tempfile
from pathlib import Path

from ringkv.host.device.software import SoftwareDevice
from ringkv.host.errors import ConfigError, UsageError

__all__ = ["DeviceHandle", "SoftwareHandle", "LinkHandle", "SimHandle", "parse_device",
           "default_image"]

log = logging.getLogger(__name__)


def default_image() -> Path:
    """The software device's card image when no ``--device`` is given."""
    import platformdirs
    return Path(platformdirs.user_data_dir("ringkv", appauthor=False)) / "card.img"


class DeviceHandle:
    """One ``--device``: ``name`` (for logs and metrics), :meth:`open`, :meth:`listing`,
    :meth:`close`."""

    kind = "device"

    def __init__(self, spec: str, *, keys=None):
        self.spec = spec
        self.name = spec
        #: the record key ring of a sealed device (None: an open one)
        self.keys = keys

    @property
    def sealed(self) -> bool:
        return self.keys is not None

    def __getstate__(self):
        # A handle crosses once, in the setup message, to its device's own process, over the
        # private socket pair between the two (serve/worker.py); a KeyRing refuses to be
        # pickled anywhere else (so that keys never reach a log, a cache or an error), so its
        # keys cross here as a plain dict and are a KeyRing again on the other side.
        state = dict(self.__dict__)
        if self.keys is not None:
            state["keys"] = (self.keys.keys(), self.keys.source)
        return state

    def __setstate__(self, state):
        if state.get("keys") is not None:
            from ringkv.host.keys import KeyRing
            keys, source = state["keys"]
            state = dict(state, keys=KeyRing(keys, source))
        self.__dict__.update(state)

    def _sealed_kwargs(self) -> dict:
        """The device's ``sealed``, ``keys`` and ``tenants`` (a key id is its own tenant)."""
        if self.keys is None:
            return {}
        return {"sealed": True, "keys": self.keys, "tenants": {i: i for i in self.keys.ids()}}

    def open(self):
        raise NotImplementedError

    def listing(self, device) -> list[tuple[int, int]]:
        """``(count, hash)`` of every record the device holds, from the device itself."""
        raise NotImplementedError

    def disconnect(self) -> None:
        """After a failure: let go of the connection, keep what the device is (a simulator
        still running, its card); :meth:`open` connects again."""

    def close(self) -> None:
        """At the end: let go of everything (a simulator started here is stopped)."""


class SoftwareHandle(DeviceHandle):
    """The software device (see the module docstring)."""

    kind = "software"

    def __init__(self, spec, config, *, image=None, capacity=None, attention_factory=None,
                 keys=None, hot_bytes=None):
        super().__init__(spec, keys=keys)
        self.config, self.image, self.capacity = config, image, capacity
        self.hot_bytes = hot_bytes
        self.attention_factory = attention_factory
        self._memory = None

    def open(self):
        attention = self.attention_factory(self.config) if self.attention_factory else None
        if self.image is None:
            # in memory: the store survives a reopen (it is the device's), the rings do not
            if self._memory is None:
                self._memory = SoftwareDevice(self.config, attention=attention,
                                              capacity=self.capacity, hot_bytes=self.hot_bytes,
                                              **self._sealed_kwargs())
            else:
                # the store survives, the hot tier does not (a reopen is a power cycle)
                for i in range(self._memory.resident_limit):
                    ctx = self._memory.context(i)
                    self._memory.bind(ctx)
                    self._memory.attention.reset()
                    self._memory.write_tokens([])
                self._memory.bind(self._memory.context(0))
            return self._memory
        Path(self.image).parent.mkdir(parents=True, exist_ok=True)
        return SoftwareDevice(self.config, attention=attention, capacity=self.capacity,
                              image=self.image, hot_bytes=self.hot_bytes,
                              **self._sealed_kwargs())

    def listing(self, device):
        return [h.key for h in device.holdings(tokens=False)]


class LinkHandle(DeviceHandle):
    """A board (or a simulated one) over a byte link: ``socket://HOST:PORT`` or a serial
    port."""

    kind = "link"

    def __init__(self, spec, config, *, url=None, timeout=60.0, ready_timeout=600.0,
                 keys=None):
        super().__init__(spec, keys=keys)
        self.config, self.url, self.timeout = config, url or spec, timeout
        self.ready_timeout = ready_timeout
        self._link = None

    def open(self):
        from ringkv.host.device.fpga import FpgaDevice
        from ringkv.host.device.link import Link
        self._close_link()
        self._link = Link(self.url, timeout=self.timeout)
        device = FpgaDevice(self._link, self.config, **self._sealed_kwargs())
        device.check_config()            # a device built for another configuration: refused
        if device.is_sealed_build() != self.sealed:
            # refused at once, not at the first request (whose failure would only send the
            # device to recovery, again and again)
            raise ConfigError(f"{self.name} is {'a sealed' if not self.sealed else 'an open'} "
                              f"build, the server is {'sealed' if self.sealed else 'open'}",
                              hint="serve it with --sealed and the record keys"
                              if not self.sealed else "serve it without --sealed",
                              fields=["sealed"])
        device.wait_ready(self.ready_timeout)
        return device

    def listing(self, device):
        return [(count, h) for count, h, _region in device.directory()]

    def _close_link(self):
        if self._link is not None:
            try:
                self._link.close()
            except OSError:
                pass
            self._link = None

    def disconnect(self):
        self._close_link()

    def close(self):
        self._close_link()


class SimHandle(LinkHandle):
    """A simulated board started by the server (``sim[:IMAGE]``)."""

    kind = "sim"

    def __init__(self, spec, config, *, image=None, workdir=None, timeout=60.0,
                 top_kwargs=None, keys=None):
        super().__init__(spec, config, url="", timeout=timeout, keys=keys)
        self.top_kwargs = dict(top_kwargs or {})      # RingKVTop's parameters (regions, ...)
        self._built = False
        # ``sim`` alone: a temporary card, made where the simulator runs (the device's
        # process), at its first start
        self.workdir, self._tmp = workdir, None
        self.image = None if image is None else Path(image)
        self.sim = None

    def open(self):
        from ringkv.sim.harness import SimDevice, top_parameters
        if self.image is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="ringkv-serve-sim-",
                                                    dir=self.workdir)
            self.image = Path(self._tmp.name) / "card.img"
        if self.sim is None or self.sim.proc.poll() is not None:
            if self.sim is not None:
                log.warning("%s: the simulator ended (exit %s); starting it again on %s",
                            self.name, self.sim.proc.poll(), self.image)
            log.info("%s: starting the simulated board on %s (Verilator build on first use)",
                     self.name, self.image)
            # the first start builds (or finds) the Verilator model; a restart reuses it
            self.sim = SimDevice(self.image, config=self.config, prebuilt=self._built,
                                 log=self.image.with_suffix(".log"),
                                 **top_parameters(self.top_kwargs, self.sealed))
            self._built = True
        self.url = self.sim.url
        return super().open()

    def close(self):
        super().close()
        if self.sim is not None:
            self.sim.stop()
            self.sim = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def parse_device(spec: str, config, *, capacity=None, attention_factory=None, timeout=60.0,
                 workdir=None, top_kwargs=None, keys=None, hot_bytes=None) -> DeviceHandle:
    """A :class:`DeviceHandle` for one ``--device`` value (module docstring); ``top_kwargs``:
    a simulated board's ``RingKVTop`` parameters (``ringkv sim``'s: ``DEMO_TOP`` for the demo
    shape); ``keys``: the record key ring of sealed devices (None: open)."""
    if not isinstance(spec, str) or not spec:
        raise UsageError(f"--device must name a device, not {spec!r}", param="--device")
    kind, _, rest = spec.partition(":")
    if kind == "software":
        return SoftwareHandle(spec, config, image=rest or None, capacity=capacity,
                              attention_factory=attention_factory, keys=keys,
                              hot_bytes=hot_bytes)
    if kind == "sim":
        return SimHandle(spec, config, image=rest or None, workdir=workdir, timeout=timeout,
                         top_kwargs=top_kwargs, keys=keys)
    if spec.startswith("socket://") or spec.startswith("/") or spec.upper().startswith("COM"):
        return LinkHandle(spec, config, timeout=timeout, keys=keys)
    raise UsageError(f"--device {spec!r}: expected software[:IMAGE], sim[:IMAGE], "
                     f"socket://HOST:PORT or a serial port path", param="--device")
