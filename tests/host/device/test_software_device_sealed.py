"""The software device in sealed mode: tenants' seeds and keys keep their records apart, a
forged record (CRCs, tokens and hash recomputed) is a miss, a tenant without a key is refused,
and a power cut during export keeps the previous sealed snapshot valid."""

import numpy as np
import pytest
from softdev_helpers import (
    LAY,
    SMALL,
    compute,
    fixed,
    stored,
    tokens_of,
    valid_state,
)

from ringkv.defs.record import SECTOR, RecordStatus, put_field
from ringkv.host.device.interface import QueryResult
from ringkv.host.device.software import SoftwareDevice
from ringkv.host.errors import KeyRequired, UsageError
from ringkv.host.golden.hash import sequence_hash
from ringkv.host.golden.mac import tenant_seed
from ringkv.host.keys import KeyRing
from ringkv.host.model.transformer import Float64Backend, Model
from ringkv.host.record import RecordError, crc32, decode_header, scan_image
from ringkv.host.scheduler import Scheduler, plain_run

KEY_A = bytes(range(32))
KEY_B = bytes(range(64, 96))
KEYS = {1: KEY_A, 2: KEY_B}
TENANTS = {"a": 1, "b": 2}


@pytest.fixture(scope="module")
def model():
    return Model(SMALL, hidden=64, ffn=96, seed=11)


def sealed(**kw):
    kw.setdefault("attention", fixed())
    return SoftwareDevice(SMALL, sealed=True, keys=KEYS, tenants=TENANTS, **kw)


def test_tenant_b_never_hits_tenant_a(model):
    dev = sealed()
    toks = tokens_of(1, 30)
    compute(dev, toks, model)
    key_a, _ = dev.export(toks, tenant="a")
    assert key_a[1] == sequence_hash(toks, tenant_seed(KEY_A, SMALL.digest()))
    assert dev.key_of(toks, tenant="b") != key_a
    assert not dev.query(toks, tenant="b").hit
    assert not dev.query_prefix(toks, len(toks), tenant="b").hit
    assert dev.query(toks, tenant="a").hit
    assert dev.query_prefix(toks + [5, 6], len(toks) + 2, tenant="a").count == len(toks)
    # even B's request for A's directory key (same count and hash): the key id is not B's
    assert dev._verify(dev._lookup(key_a), key_a, toks, 2)[0] is RecordStatus.NO_KEY
    [info] = [i for i in scan_image(SMALL, dev.card.read, dev.regions) if i.valid]
    assert info.key_id == 1


def test_memory_store_keeps_tenants_apart_too(model):
    dev = SoftwareDevice(SMALL, attention=Float64Backend(SMALL), sealed=True, keys=KEYS,
                         tenants=TENANTS)
    toks = tokens_of(2, 20)
    compute(dev, toks, model)
    key_a, _ = dev.export(toks, tenant="a")
    assert dev.query(toks, tenant="a").hit and not dev.query(toks, tenant="b").hit
    assert dev._verify(dev._lookup(key_a), key_a, toks, 2)[0] is RecordStatus.NO_KEY


@pytest.mark.parametrize("store", ["card", "memory"])
def test_no_key_record_stays_for_its_tenant(model, store):
    """A record refused with ``NO_KEY`` stays in the directory (the gateware's rule): tenant
    B holds A's key bytes under another key id, so B's seed and directory keys are A's; B's
    QUERY and QUERY_PREFIX of A's record are misses ("no key") that keep it, in its region,
    and A's QUERY then hits. One tenant's request never frees another tenant's record."""
    attention = fixed() if store == "card" else Float64Backend(SMALL)
    dev = SoftwareDevice(SMALL, attention=attention, sealed=True, keys={1: KEY_A, 3: KEY_A},
                         tenants={"a": 1, "b": 3})
    assert (dev.card is None) == (store == "memory")
    toks = tokens_of(8, 20)
    compute(dev, toks, model)
    key_a, _ = dev.export(toks, tenant="a")
    assert dev.key_of(toks, tenant="b") == key_a
    link = dev._keys[key_a]
    assert dev.query(toks, tenant="b") == QueryResult(False, *key_a, "no key")
    res = dev.query_prefix(toks + [9], len(toks) + 1, tenant="b")
    assert (res.hit, res.count, res.reason) == (False, 0, "no key")
    assert dev._keys[key_a] == link and list(dev.directory.live) == [link]
    assert dev.query(toks, tenant="a") == QueryResult(True, *key_a, "")


def test_no_key_refused(model):
    dev = SoftwareDevice(SMALL, attention=fixed(), sealed=True)
    toks = tokens_of(3, 10)
    compute(dev, toks, model)
    for call in (lambda: dev.query(toks, tenant="a"),
                 lambda: dev.query_prefix(toks, 5, tenant="a"),
                 lambda: dev.export(toks, tenant="a")):
        with pytest.raises(KeyRequired, match="tenant 'a' has no key"):
            call()
    assert dev.stats()["exports"] == 0 and dev.stats()["queries"] == 0
    dev = sealed()
    with pytest.raises(KeyRequired, match="unknown tenant"):
        dev.query(toks, tenant="c")
    dev.set_key(3, bytes(32), tenants=["c"])
    assert not dev.query(toks, tenant="c").hit
    assert "KeyRing" not in repr(dev) and KEY_A.hex() not in repr(dev)


def test_scheduler_sessions_of_two_tenants_never_share_a_record(model):
    """The scheduler on a sealed device: a session's tenant seals its records and seeds its
    prefix hash, so another tenant's session with the same prompt computes it afresh while the
    same tenant's reuses it; every answer is the run without reuse; a session stays its
    tenant's; a tenant without a key is refused with the session unchanged."""
    dev = sealed()
    sched = Scheduler(model, dev, chunk=5, checkpoint_every=8)
    prompt = tokens_of(7, 20)
    outs = [sched.request("a1", prompt, 3, tenant="a"),
            sched.request("b1", prompt, 3, tenant="b"),
            sched.request("a2", prompt, 3, tenant="a")]
    assert [(e["path"], e["reused"]) for e in sched.events] == \
        [("first", 0), ("first", 0), ("prefix", 16)]
    assert outs == [plain_run(model, [(0, prompt, 3)], fixed, chunk=5)[0]] * 3
    assert {i.key_id for i in scan_image(SMALL, dev.card.read, dev.regions) if i.valid} == \
        {1, 2}
    state = (list(sched.sessions["a1"].tokens), list(sched.sessions["a1"].turns))
    with pytest.raises(UsageError, match="^session 'a1' belongs to another tenant$"):
        sched.request("a1", [5], 1, tenant="b")
    assert (sched.sessions["a1"].tokens, sched.sessions["a1"].turns) == state
    sched.request("a1", [5], 1, tenant="a")
    assert sched.events[-1]["path"] == "hit"
    with pytest.raises(KeyRequired, match="tenant 'c' has no key"):
        sched.request("c1", prompt, 1, tenant="c")
    assert sched.sessions["c1"].tokens == [] and sched.resident is None


def test_open_mode_is_the_default_and_unchanged(model):
    dev = SoftwareDevice(SMALL, attention=fixed())
    toks = tokens_of(4, 12)
    compute(dev, toks, model)
    key, _ = dev.export(toks, tenant="whoever")      # tenants mean nothing in open mode
    assert key == dev.key_of(toks) and dev.query(toks).hit
    info = [i for i in scan_image(SMALL, dev.card.read, dev.regions) if i.valid][0]
    assert info.key_id == 0
    # a sealed device does not import the open record (same card, same tokens)
    other = sealed()
    other.card = dev.card
    assert other._verify(dev._lookup(key), key, toks, 1)[0] is RecordStatus.NO_KEY


def test_forged_record_misses(model):
    """A record rewritten without the key (other K/V, payload and header CRCs recomputed) is
    a miss with its reason, the rings are left empty, and the record is freed."""
    dev = sealed()
    toks = tokens_of(5, 24)
    compute(dev, toks, model)
    key, _ = dev.export(toks, tenant="a")
    region = dev._lookup(key)
    base = LAY.region_lba(region)
    header = bytearray(dev.card.read(base, 1))
    h = decode_header(bytes(header), SMALL)
    kv = bytearray(dev.card.read(base + LAY.kv_sector, LAY.kv_sectors(h.count)))
    kv[0] ^= 0x40
    tok = dev.card.read(base + 1, LAY.token_sectors(h.count))[:h.token_bytes]
    dev.card.write(base + LAY.kv_sector, bytes(kv))
    put_field(header, "payload_crc", crc32(tok + bytes(kv[:h.k_bytes + h.v_bytes])))
    put_field(header, "header_crc", crc32(header[:508]))
    dev.card.write(base, bytes(header))
    compute(dev, toks[:3], model)
    res = dev.query(toks, tenant="a")
    assert not res.hit and res.reason == "bad tag"
    assert int(dev.attention.snapshot()[1][0]) == 0            # the rings are empty
    assert key not in dev._keys                                # freed: it can never verify


def test_power_cut_during_sealed_export_keeps_previous_snapshot(model, tmp_path):
    image = tmp_path / "card.img"
    toks = tokens_of(9, 40)
    dev = sealed(image=image, regions=4)
    stored(dev, toks[:20], model, tenant="a")
    compute(dev, toks, model)
    real = dev.card.write

    def dying(lba, data):
        if lba % LAY.sectors_per_region == 0:
            raise OSError("power cut")
        real(lba, data)
    dev.card.write = dying
    with pytest.raises(OSError, match="power cut"):
        dev.export(toks, tenant="a")
    dev.close()
    again = sealed(image=image)                     # recovery: header scan, no key needed
    assert again.recovery.live == 1
    assert again.query(toks, tenant="a").reason == "no record"
    assert again.query(toks[:20], tenant="a").hit
    compute(dev, toks[:20], model)
    assert valid_state(again) == valid_state(dev)
    assert not again.query(toks[:20], tenant="b").hit


def test_records_copied_between_sealed_devices(model):
    src, dst = sealed(), sealed()
    toks = tokens_of(6, 18)
    compute(src, toks, model)
    key, _ = src.export(toks, tenant="a")
    data = src.read_record(key)
    assert dst.write_record(data) == key
    assert dst.query(toks, tenant="a").hit and not dst.query(toks, tenant="b").hit
    opened = SoftwareDevice(SMALL, attention=fixed())
    with pytest.raises(RecordError) as e:
        opened.write_record(data)
    assert e.value.status is RecordStatus.NO_KEY
    assert np.frombuffer(data[:SECTOR], np.uint8)[324] == 1            # key id 1 on the wire
    # copied for a tenant: only a record sealed under that tenant's key
    other = sealed()
    with pytest.raises(RecordError, match="sealed under key id 1, not under tenant 'b'") as e:
        other.write_record(data, tenant="b")
    assert e.value.status is RecordStatus.NO_KEY and other.holdings() == []
    assert other.write_record(data, tenant="a") == key


def test_a_sealed_board_refuses_a_copy_before_sending_anything(model):
    """``FpgaDevice.write_record`` on a sealed device: another tenant's record, a forged one
    and an open one are refused before the first request (the link here fails at once if
    used); on an open device a sealed record is refused the same way."""
    from ringkv.host.device.fpga import FpgaDevice

    class NoLink:
        def request(self, *a, **kw):
            raise AssertionError("the link was used")

    src = sealed()
    toks = tokens_of(9, 14)
    compute(src, toks, model)
    data = src.read_record(src.export(toks, tenant="a")[0])
    board = FpgaDevice(NoLink(), SMALL, sealed=True, keys=KeyRing(KEYS), tenants=TENANTS)
    with pytest.raises(RecordError, match="sealed under key id 1, not under tenant 'b'"):
        board.write_record(data, tenant="b")
    # forged without the key: a K/V byte changed, both CRCs recomputed
    h = decode_header(data[:SECTOR], SMALL)
    forged = bytearray(data)
    kv_at = SECTOR * (1 + LAY.token_sectors(h.count))        # the copy's K/V, after its tokens
    forged[kv_at] ^= 0x40
    tok = data[SECTOR:SECTOR + h.token_bytes]
    header = bytearray(forged[:SECTOR])
    put_field(header, "payload_crc", crc32(tok + bytes(forged[kv_at:kv_at + h.k_bytes
                                                              + h.v_bytes])))
    put_field(header, "header_crc", crc32(header[:508]))
    forged[:SECTOR] = header
    with pytest.raises(RecordError) as e:
        board.write_record(bytes(forged), tenant="a")
    assert e.value.status is RecordStatus.BAD_MAC
    opened = FpgaDevice(NoLink(), SMALL)
    with pytest.raises(RecordError, match="an open one only open records"):
        opened.write_record(data)
