"""cocotb test of the generated MAC unit Verilog (MacCore + KeySlots) against hashlib's keyed
BLAKE2s: random keys in every slot (one rewritten midway), both persons, random and boundary
lengths up to tens of kilobytes, random idle on the byte stream and stalls on the tag; a
monitor fails the test if ``i.ready`` is ever low while a byte is offered (bytes are only
offered inside a message, so that would be a stall mid-message)."""

import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from ringkv.defs.mac import KEY_ID_BYTES, PERSONS
from ringkv.host.golden.mac import mac
from ringkv.sim.cocotb_run import cocotb_params
from ringkv.sim.cocotb_streams import StreamSink, StreamSource, pack_fields

CMD = [("person", 1), ("slot", 2), ("empty", 1)]
BYTE = [("data", 8), ("last", 1)]
WRITE = [("slot", 8), ("index", 6), ("data", 8), ("clear", 1)]
BOUNDARY = (0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 4096)


async def stall_monitor(dut, stalls):
    while True:
        await RisingEdge(dut.clk)
        await ReadOnly()
        if int(dut.i__valid.value) and not int(dut.i__ready.value):
            stalls.append(1)


@cocotb.test(timeout_time=1800, timeout_unit="sec")
async def random_messages(dut):
    p = cocotb_params()
    rng = random.Random(p["seed"])
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    keys_in = StreamSource(dut, "key_write", dut.clk)
    cmd = StreamSource(dut, "cmd", dut.clk, idle=p["idle"], rng=random.Random(rng.random()))
    data = StreamSource(dut, "i", dut.clk, idle=p["idle"], rng=random.Random(rng.random()))
    tags = StreamSink(dut, "o", dut.clk, stall=p["stall"], rng=random.Random(rng.random()))
    for _ in range(3):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    stalls = []
    cocotb.start_soon(stall_monitor(dut, stalls))

    async def set_key(slot, key_id, key):
        raw = key_id.to_bytes(KEY_ID_BYTES, "little") + key
        for index, byte in enumerate(raw):
            await keys_in.send(pack_fields(WRITE, {"slot": slot, "index": index, "data": byte}))

    keys = {}
    for slot in range(4):
        keys[slot] = rng.randbytes(32)
        await set_key(slot, slot + 1, keys[slot])
    await RisingEdge(dut.clk)
    assert int(dut.set.value) == 0b1111

    total = 0
    for n in range(p["messages"]):
        if n == p["messages"] // 2:
            keys[1] = rng.randbytes(32)
            await set_key(1, 77, keys[1])
        if n == 0:
            length = p["long"]
        elif n <= len(BOUNDARY):
            length = BOUNDARY[n - 1]
        else:
            length = rng.choice([rng.randrange(0, 200), rng.randrange(200, 3000)])
        slot, person = rng.randrange(4), rng.randrange(2)
        message = rng.randbytes(length)
        await cmd.send(pack_fields(CMD, {"person": person, "slot": slot,
                                         "empty": int(not message)}))
        for j, byte in enumerate(message):
            await data.send(pack_fields(BYTE, {"data": byte, "last": int(j == length - 1)}))
        got = (await tags.recv()).to_bytes(16, "little")
        want = mac(keys[slot], message, person=PERSONS[person])
        assert got == want, f"message {n} ({length} bytes, slot {slot}, person {person})"
        total += length
    assert not stalls, f"i.ready low under an offered byte {len(stalls)} times"
    dut._log.info("%d messages, %d bytes, every tag equal to hashlib's", p["messages"], total)
