"""The host's errors cross a process boundary whole: a worker process's error reaches the
server with its class, message, hint, field and its subclass's own attributes."""

import pickle

import pytest

from ringkv.host.device.fpga import ConfigMismatch
from ringkv.host.errors import ConfigError, DeviceError, LinkError, Overloaded, UsageError
from ringkv.host.record import RecordError


@pytest.mark.parametrize("error", [
    UsageError("bad value", param="temperature", hint="use 0..2"),
    ConfigError("other shape", fields=["max_tokens"], param="--config"),
    LinkError("link dropped", hint="check the cable"),
    DeviceError(3, 0x11, b"\x01\x02"),
    Overloaded("all full", hint="retry later"),
    RecordError(2, "bad checksum"),
    ConfigMismatch(["numerics: a != b"]),
])
def test_errors_pickle_with_their_attributes(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and back.args == error.args
    assert vars(back) == vars(error)
    assert back.one_line() == error.one_line() and back.http_status == error.http_status
    assert isinstance(back, OSError) == isinstance(error, OSError)
