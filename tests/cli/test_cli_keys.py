"""``ringkv storage`` on sealed records: ``ls`` shows each record's key id, ``fsck --key-file``
verifies tags offline (0 clean, 1 problems), a bad key file is exit 3 with one line and no
traceback, and a key never appears in any output."""

import os

import numpy as np
import pytest
from cli_helpers import CFG, assert_clean_failure, ringkv

from ringkv.defs.record import SECTOR, RecordLayout, put_field
from ringkv.host.errors import ExitCode
from ringkv.host.record import crc32, encode_record

KEY = bytes(range(7, 39))
OTHER = bytes(range(90, 122))
LAY = RecordLayout(CFG)


def _image(path, forged=False):
    """Region 0: sealed under key id 1; region 1: open; region 2: sealed under key id 1, and
    with ``forged`` its K/V changed and both CRCs recomputed (what a writer without the key
    can do)."""
    img = bytearray(4 * LAY.sectors_per_region * SECTOR)
    rings = np.arange(CFG.layers * CFG.kv_heads * 2 * CFG.window * CFG.head_dim,
                      dtype=np.uint64).astype(np.uint8).reshape(
        CFG.layers, CFG.kv_heads, 2, CFG.window, CFG.head_dim)
    for region, (h, key, key_id) in enumerate([(5, KEY, 1), (6, None, 0), (7, KEY, 1)]):
        for off, data in encode_record(CFG, list(range(10)), rings, count=10, ring_head=9,
                                       prefix_hash=h, commit_seq=region + 1, key=key,
                                       key_id=key_id):
            at = (region * LAY.sectors_per_region + off) * SECTOR
            img[at:at + len(data)] = data
    if forged:
        base = 2 * LAY.sectors_per_region * SECTOR
        kv_at = base + LAY.kv_sector * SECTOR
        img[kv_at] ^= 0x11
        header = bytearray(img[base:base + SECTOR])
        tok = bytes(img[base + SECTOR:base + SECTOR + 10 * LAY.token_bytes])
        kvn = int.from_bytes(header[68:72], "little") * 2
        put_field(header, "payload_crc", crc32(tok + bytes(img[kv_at:kv_at + kvn])))
        put_field(header, "header_crc", crc32(header[:508]))
        img[base:base + SECTOR] = header
    path.write_bytes(img)
    return path


def _keyfile(path, text, mode=0o600):
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sealed")
    return {"good": _image(tmp / "good.img"), "forged": _image(tmp / "forged.img", True),
            "keys": _keyfile(tmp / "keys", f"1 {KEY.hex()}\n"),
            "wrong": _keyfile(tmp / "wrong", f"1 {OTHER.hex()}\n"),
            "other_id": _keyfile(tmp / "other_id", f"4 {KEY.hex()}\n"),
            "open": _keyfile(tmp / "open", f"1 {KEY.hex()}\n", 0o644),
            "bad": _keyfile(tmp / "bad", f"1 {KEY.hex()[:-1]}\n")}


def _no_key_in(r):
    out = r.stdout + r.stderr
    assert KEY.hex() not in out and KEY.hex()[:-1] not in out and OTHER.hex() not in out


def test_ls_shows_key_ids(files, tmp_path):
    r = ringkv(["storage", "ls", str(files["good"])], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.split()
            and line.split()[0] in ("0", "1", "2")}
    assert " key " in r.stdout
    assert " 1 " in rows["0"][60:] and " open " in rows["1"] and " 1 " in rows["2"][60:]


def test_fsck_verifies_tags(files, tmp_path):
    r = ringkv(["storage", "fsck", str(files["good"]), "--key-file", str(files["keys"])],
               tmp_path)
    assert r.returncode == 0 and "clean" in r.stdout and "key 1+tag" in r.stdout, r.stdout
    _no_key_in(r)
    # CRCs alone cannot see the forgery; the key can
    r = ringkv(["storage", "fsck", str(files["forged"])], tmp_path)
    assert r.returncode == 0, r.stdout
    r = ringkv(["storage", "fsck", str(files["forged"]), "--key-file", str(files["keys"])],
               tmp_path)
    assert r.returncode == 1 and "repairable: 1 bad tag" in r.stdout, r.stdout + r.stderr
    r = ringkv(["storage", "fsck", str(files["good"]), "--key-file", str(files["wrong"])],
               tmp_path)
    assert r.returncode == 1 and "repairable: 2 bad tag" in r.stdout, r.stdout + r.stderr
    _no_key_in(r)
    r = ringkv(["storage", "fsck", str(files["good"]), "--key-file", str(files["other_id"])],
               tmp_path)
    assert r.returncode == 1 and "unverified: 2 sealed" in r.stdout, r.stdout + r.stderr


def test_repair_erases_forged_records_only(files, tmp_path):
    img = tmp_path / "forged.img"
    img.write_bytes(files["forged"].read_bytes())
    r = ringkv(["storage", "fsck", str(img), "--key-file", str(files["keys"]), "--repair"],
               tmp_path)
    assert r.returncode == 0 and "region(s) 2" in r.stdout, r.stdout + r.stderr
    # a key file without the records' key id repairs nothing
    img.write_bytes(files["good"].read_bytes())
    before = img.read_bytes()
    r = ringkv(["storage", "fsck", str(img), "--key-file", str(files["other_id"]), "--repair"],
               tmp_path)
    assert r.returncode == 1 and img.read_bytes() == before, r.stdout


@pytest.mark.parametrize("name,code,message", [
    ("open", ExitCode.CONFIG, "too open"),
    ("bad", ExitCode.CONFIG, "64 hex digits"),
    ("missing", ExitCode.CONFIG, "not found"),
])
def test_bad_key_file(files, tmp_path, name, code, message):
    path = files.get(name, tmp_path / "no-such-keys")
    r = ringkv(["storage", "fsck", str(files["good"]), "--key-file", str(path)], tmp_path)
    assert_clean_failure(r, code, tmp_path, message=message)
    _no_key_in(r)


def test_key_file_goes_with_fsck_of_an_image(files, tmp_path):
    r = ringkv(["storage", "ls", str(files["good"]), "--key-file", str(files["keys"])],
               tmp_path)
    assert_clean_failure(r, ExitCode.USAGE, tmp_path, message="--key-file")
    r = ringkv(["storage", "fsck", "--link", "socket://127.0.0.1:9", "--key-file",
                str(files["keys"])], tmp_path)
    assert_clean_failure(r, ExitCode.USAGE, tmp_path, message="--key-file")
