"""Host key files and ``RINGKV_KEYS``: format, permission checks, and that a key's bytes never
reach a repr, an error message or the log."""

import logging
import os

import pytest

from ringkv.host.errors import ConfigError, ExitCode
from ringkv.host.keys import ENV_VAR, KeyRing, keys_from_env, load_keys, read_key_file

KEY1 = bytes(range(32))
KEY2 = bytes(range(200, 232))
TEXT = f"# tenant keys\n1 {KEY1.hex()}\n\n7 {KEY2.hex().upper()}\n"


def write(tmp_path, text, mode=0o600, name="keys"):
    p = tmp_path / name
    p.write_text(text)
    os.chmod(p, mode)
    return p


def test_read_file(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    ring = read_key_file(write(tmp_path, TEXT))
    assert ring.keys() == {1: KEY1, 7: KEY2} and ring.ids() == [1, 7] and 7 in ring
    for shown in (repr(ring), str(ring), caplog.text):
        assert KEY1.hex() not in shown and KEY2.hex() not in shown.lower()
    assert "1, 7" in repr(ring)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660, 0o644, 0o620])
def test_open_permissions_refused(tmp_path, mode):
    p = write(tmp_path, TEXT, mode)
    with pytest.raises(ConfigError) as e:
        read_key_file(p)
    assert "too open" in e.value.message and "chmod 600" in e.value.hint
    assert e.value.exit_code == ExitCode.CONFIG


def test_env(tmp_path):
    assert keys_from_env({}) is None
    ring = keys_from_env({ENV_VAR: f"1 {KEY1.hex()}; 7 {KEY2.hex()}"})
    assert ring.keys() == {1: KEY1, 7: KEY2} and ENV_VAR in ring.source
    # a key file, when given, wins over the environment
    p = write(tmp_path, f"3 {KEY2.hex()}\n")
    assert load_keys(p, {ENV_VAR: f"1 {KEY1.hex()}"}).ids() == [3]
    assert load_keys(None, {}) is None


BAD = [
    (f"1 {KEY1.hex()[:-2]}", "64 hex digits"),
    (f"1 {KEY1.hex()[:-1]}g", "not hexadecimal"),
    (f"0 {KEY1.hex()}", "1..65535"),
    (f"65536 {KEY1.hex()}", "1..65535"),
    (f"x {KEY1.hex()}", "1..65535"),
    (f"1 {KEY1.hex()} extra", "2 fields"),
    (f"{KEY1.hex()}", "2 fields"),
    (f"1 {KEY1.hex()}\n1 {KEY2.hex()}", "twice"),
    ("# nothing\n", "no keys"),
]


@pytest.mark.parametrize("text,why", BAD)
def test_bad_content_never_quotes_a_key(tmp_path, caplog, text, why):
    caplog.set_level(logging.DEBUG)
    for load in (lambda: read_key_file(write(tmp_path, text)),
                 lambda: keys_from_env({ENV_VAR: text})):
        with pytest.raises(ConfigError) as e:
            load()
        msg = e.value.one_line() + repr(e.value)
        assert why in msg
        for secret in (KEY1.hex(), KEY2.hex(), KEY1.hex()[:-2], KEY1.hex()[:-1] + "g"):
            assert secret not in msg and secret not in caplog.text


def test_missing_and_not_regular(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        read_key_file(tmp_path / "nope")
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    with pytest.raises(ConfigError):
        read_key_file(d)


def test_key_ring_is_not_pickled():
    import pickle
    with pytest.raises(TypeError):
        pickle.dumps(KeyRing({1: KEY1}))
