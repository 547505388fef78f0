"""The host's error vocabulary: one base class, one subclass per kind of failure.

Library code (``ringkv.host``, ``ringkv.sim``, ``ringkv.boards``) raises these for ordinary
events: a dropped link, a device that answers an error, an unusable image, a configuration that
does not match, a bad value from a user. Only the entry points turn them into output:

- the command line (``ringkv.cli``) prints ``ringkv: <message>`` and, when there is one,
  ``  hint: <hint>`` on standard error, and exits with :attr:`RingKVError.exit_code`; the
  traceback only with ``--debug``;
- the server (``ringkv serve``) answers an OpenAI-style error body
  ``{"error": {"message", "type", "param", "code"}}`` with :attr:`RingKVError.http_status`
  and :attr:`RingKVError.api_type`.

Anything that is *not* a :class:`RingKVError` is a bug and keeps its traceback.

Exit codes (:class:`ExitCode`, documented in ``ringkv --help``): 0 success, 1 failure, 2 usage,
and distinct codes where scripts need to tell causes apart (a link that cannot be reached, a
configuration mismatch, a file that is not a card image). ``ringkv storage fsck`` adds its own
results on top (clean / repairable / not a card), listed in its help.

The module imports the standard library only, so every layer above ``ringkv.defs`` may use it.
"""

import argparse
import enum
import sys

__all__ = [
    "ExitCode", "RingKVError", "UsageError", "ConfigError", "LinkError", "DeviceError",
    "DeviceNotReady", "StorageError", "NotACardImage", "Interrupted", "Overloaded", "NotFound",
    "KeyRequired", "Unauthorized",
    "ArgumentParser", "error_lines", "run_main",
]


class ExitCode(enum.IntEnum):
    """Process exit status of every ``ringkv`` command."""
    OK = 0
    FAILURE = 1          #: the command could not do its job (the message says why)
    USAGE = 2            #: bad option, value or combination (argparse's own code)
    CONFIG = 3           #: the device's or the image's configuration differs from the host's
    LINK = 4             #: the device cannot be reached, or the link dropped
    NOT_A_CARD = 5       #: a file given as a card image is not one
    INTERRUPTED = 130    #: Ctrl-C or SIGTERM (128 + SIGINT, the shell's convention)


class RingKVError(Exception):
    """An ordinary event that ends an operation: one line of ``message``, an optional ``hint``
    (what to do about it).

    ``exit_code``, ``http_status`` and ``api_type`` say how the entry points report it; ``param``
    names the request field or option at fault, when there is one.
    """
    exit_code: ExitCode = ExitCode.FAILURE
    http_status: int = 500
    api_type: str = "server_error"
    #: the error body's ``code`` (the OpenAI API's: ``model_not_found``, ...), None if none
    api_code: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.param = param

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):
        # pickled with its attributes, not through ``__init__`` (whose signature differs by
        # subclass): an error raised in a worker process reaches the server whole
        return _rebuild, (type(self), self.args, dict(self.__dict__))

    def one_line(self) -> str:
        """``message`` and ``hint`` on one line, for logs."""
        return self.message + (f" ({self.hint})" if self.hint else "")


def _rebuild(cls, args, state):
    """An unpickled :class:`RingKVError` (see ``RingKVError.__reduce__``)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class UsageError(RingKVError, ValueError):
    """A bad option, value or combination given by the user or a client request."""
    exit_code = ExitCode.USAGE
    http_status = 400
    api_type = "invalid_request_error"


class ConfigError(RingKVError, ValueError):
    """A configuration that does not fit: the device's differs from the host's, an image was
    written by another configuration, weights do not match the model shape. ``fields`` names
    the differences where they are known."""
    exit_code = ExitCode.CONFIG
    http_status = 400
    api_type = "invalid_request_error"

    def __init__(self, message: str, *, fields=(), hint: str | None = None,
                 param: str | None = None):
        super().__init__(message, hint=hint, param=param)
        self.fields = list(fields)


class KeyRequired(ConfigError):
    """A sealed device was asked to QUERY, QUERY_PREFIX or EXPORT for a tenant that has no key
    (none set, or the tenant unknown): refused, nothing read or written. Names the tenant,
    never a key."""


class Unauthorized(RingKVError):
    """A server request without the API key the server requires, or with another one
    (``ringkv serve --api-key``): 401, ``code`` ``invalid_api_key``, as the OpenAI API answers.
    Never names the key given."""
    exit_code = ExitCode.USAGE
    http_status = 401
    api_type = "invalid_request_error"
    api_code = "invalid_api_key"


class LinkError(RingKVError, OSError):
    """No valid answer over the byte link: unreachable, dropped, timed out, or corrupted past
    the allowed retries. The request may or may not have run on the device."""
    exit_code = ExitCode.LINK
    http_status = 503
    api_type = "server_error"


class DeviceError(RingKVError):
    """The device answered a request with an error status (``status``, a
    :class:`~ringkv.defs.protocol.Status`) to ``op``; ``payload`` is the answer's payload."""
    http_status = 502
    api_type = "server_error"

    def __init__(self, status, op, payload: bytes = b"", *, message: str | None = None,
                 hint: str | None = None):
        self.status = status
        self.op = op
        self.payload = payload
        name = getattr(op, "name", None) or f"0x{int(op):02x}"
        status_name = getattr(status, "name", str(status))
        super().__init__(message or f"device answered {status_name} to {name}", hint=hint)


class DeviceNotReady(RingKVError):
    """The device is not ready for the request: its power-on recovery scan still runs, or it
    failed (``state``, ``detail``). Retry after :meth:`FpgaDevice.wait_ready`."""
    http_status = 503
    api_type = "server_error"


class StorageError(RingKVError):
    """Storage cannot be used: an image file that cannot be read or written, a full or failing
    card, a record that cannot be decoded where one is required."""


class NotACardImage(StorageError):
    """A file given as a card image is not a RingKV card image (and was not changed)."""
    exit_code = ExitCode.NOT_A_CARD
    http_status = 400
    api_type = "invalid_request_error"


class Interrupted(RingKVError):
    """Ctrl-C or SIGTERM: the command stopped its children, removed its temporary files and
    exits with :attr:`ExitCode.INTERRUPTED`."""
    exit_code = ExitCode.INTERRUPTED
    http_status = 503


class Overloaded(RingKVError):
    """Every device's queue is full: the request was not accepted (retry later). HTTP 429 with
    the OpenAI API's rate-limit body."""
    http_status = 429
    api_type = "requests"
    api_code = "rate_limit_exceeded"


class NotFound(UsageError):
    """A request names something that does not exist: a model, a route. HTTP 404."""
    http_status = 404
    api_code = "model_not_found"


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are :class:`UsageError` (exit 2, one line and
    a hint naming ``--help``) instead of argparse's usage block and ``SystemExit``: every
    ``ringkv`` command and module entry point reports a bad option the same way."""

    def error(self, message):
        raise UsageError(message, hint=f"'{self.prog} --help' lists the options")


def error_lines(error: RingKVError, prog: str = "ringkv") -> list[str]:
    """What an entry point prints for ``error``: ``prog: message`` and, with a hint,
    ``  hint: ...``."""
    return [f"{prog}: {error.message}"] + ([f"  hint: {error.hint}"] if error.hint else [])


def run_main(main, argv=None, *, prog: str = "ringkv") -> int:
    """Run a module's ``main(argv)`` as an entry point (``python -m ...``): a
    :class:`RingKVError` becomes its :func:`error_lines` on standard error and its exit code,
    Ctrl-C exit status 130; anything else (a bug) keeps its traceback."""
    try:
        return main(argv)
    except RingKVError as e:
        print("\n".join(error_lines(e, prog)), file=sys.stderr)
        return int(e.exit_code)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
