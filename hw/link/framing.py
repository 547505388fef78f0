"""Frame decoder and encoder of the link protocol (see :mod:`ringkv.defs.protocol`).

:class:`FrameDecoder` turns the received byte stream into checked requests; :class:`FrameEncoder`
frames responses. The byte layouts are in ``docs/blocks/link.md``; the golden model is
:mod:`ringkv.host.device.frames`, bit-exact: for any byte string (and any placement of idle gaps
longer than ``timeout``) the RTL emits the same frames and the same errors in the same order.
"""

from amaranth import *
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ringkv.defs.checks import check_int
from ringkv.defs.protocol import DEFAULT_MAX_PAYLOAD, RESPONSE_FLAG, SYNC

from ..protocol import CRC16, Op, Status

__all__ = ["FrameDecoder", "FrameEncoder", "RequestHeader", "ResponseHeader", "PayloadByte",
           "FrameErrorLayout"]

#: ``op`` in these layouts is a byte, not an ``Op``: the decoder passes any opcode on (an
#: unknown one is answered ``UNKNOWN_OP`` by the dispatcher), values that no member names.
#:
#: A checked request's header, offered on ``FrameDecoder.header``.
RequestHeader = data.StructLayout({"op": 8, "seq": 8, "length": 16})
#: One payload byte; ``last`` marks the frame's final byte.
PayloadByte = data.StructLayout({"data": 8, "last": 1})
#: A dropped frame: why, and the opcode and sequence number as far as they were received.
FrameErrorLayout = data.StructLayout({"status": Status, "op": 8, "seq": 8})
#: A response's header, taken by ``FrameEncoder.header``.
ResponseHeader = data.StructLayout({"op": 8, "seq": 8, "status": Status, "length": 16})


class FrameDecoder(wiring.Component):
    """Request frames in, checked headers and payloads out; a bad frame has no effect.

    Parameters
    ----------
    max_payload : int
        Largest accepted payload (1..65535 bytes); the payload buffer is a block RAM of this many
        bytes. A length field above it is answered with ``Status.BAD_LENGTH`` as soon as the
        length is in, and the decoder hunts for the next SYNC from the following byte.
    timeout : int
        Idle cycles inside a frame (between SYNC and the last CRC byte) after which the partial
        frame is dropped with ``Status.TIMEOUT`` and the decoder hunts for SYNC again.

    Ports
    -----
    ``i``: received bytes. ``header`` (:data:`RequestHeader`): one per frame whose CRC checked
    and whose opcode is an :class:`Op`. ``data`` (:data:`PayloadByte`): that frame's ``length``
    payload bytes, after its header has been taken (none when ``length`` is 0). ``error``
    (:data:`FrameErrorLayout`): one per dropped frame (``BAD_LENGTH``, ``BAD_CRC``,
    ``UNKNOWN_OP``, ``TIMEOUT``). Bytes outside frames (before a SYNC) are skipped silently.

    Why nothing happens on a bad frame: the payload is written into the buffer while the CRC
    runs and is released on ``data`` only after the CRC and the opcode checked, so a consumer
    never sees a byte of a frame that is later found bad.

    Latency: the header is offered 2 cycles after the last CRC byte is taken (one cycle for the
    CRC register, one for the check); the first payload byte right after the header transfer.
    Throughput: one byte per cycle in, one per cycle out; reception and release alternate, so
    a frame of ``n`` payload bytes occupies the decoder for ``n + 7`` input cycles and then
    ``n + 2`` output cycles (plus consumer stalls). Backpressure: ``i.ready`` is high while a
    frame is being received or hunted for, low while a checked frame or an error is being
    released (the UART's FIFO absorbs what the host sends meanwhile; the host keeps one
    request in flight). Idle gaps on ``i`` count towards ``timeout`` only while receiving.
    """

    i: In(stream.Signature(8))
    header: Out(stream.Signature(RequestHeader))
    data: Out(stream.Signature(PayloadByte))
    error: Out(stream.Signature(FrameErrorLayout))

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD, timeout: int = 1 << 16):
        check_int("Maximum payload", max_payload, low=1, high=0xFFFF)
        check_int("Timeout", timeout, low=1)
        self._max_payload = max_payload
        self._timeout = timeout
        super().__init__()

    @property
    def max_payload(self) -> int:
        return self._max_payload

    @property
    def timeout(self) -> int:
        return self._timeout

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC16.create()
        m.submodules.buffer = buffer = memory.Memory(shape=8, depth=self._max_payload, init=[])
        wr = buffer.write_port()
        rd = buffer.read_port(transparent_for=())

        op = Signal(8)
        seq = Signal(8)
        length = Signal(16)
        count = Signal(16)
        idle = Signal(range(self._timeout + 1))
        status = Signal(Status)
        known_op = Signal()
        m.d.comb += known_op.eq(Cat(op == member.value for member in Op).any())

        byte = self.i.payload
        take = self.i.valid & self.i.ready
        m.d.comb += [
            crc.data.eq(byte),
            self.header.payload.op.eq(op),
            self.header.payload.seq.eq(seq),
            self.header.payload.length.eq(length),
            self.data.payload.data.eq(rd.data),
            self.data.payload.last.eq(count == length - 1),
            self.error.payload.status.eq(status),
            self.error.payload.op.eq(op),
            self.error.payload.seq.eq(seq),
            wr.addr.eq(count),
            wr.data.eq(byte),
            rd.addr.eq(0),
        ]

        def fail(why):
            m.d.sync += status.eq(why)
            m.next = "ERROR"

        receiving = ["OP", "SEQ", "LEN0", "LEN1", "PAYLOAD", "CRC0", "CRC1"]
        with m.FSM():
            with m.State("HUNT"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid & (byte == SYNC)):
                    m.d.comb += crc.start.eq(1)
                    m.d.sync += [op.eq(0), seq.eq(0), length.eq(0), count.eq(0), idle.eq(0)]
                    m.next = "OP"
            for state in receiving:
                with m.State(state):
                    m.d.comb += [self.i.ready.eq(1), crc.valid.eq(self.i.valid)]
                    with m.If(self.i.valid):
                        m.d.sync += idle.eq(0)
                    with m.Elif(idle == self._timeout - 1):
                        fail(Status.TIMEOUT)
                    with m.Else():
                        m.d.sync += idle.eq(idle + 1)
                    with m.If(take):
                        if state == "OP":
                            m.d.sync += op.eq(byte)
                            m.next = "SEQ"
                        elif state == "SEQ":
                            m.d.sync += seq.eq(byte)
                            m.next = "LEN0"
                        elif state == "LEN0":
                            m.d.sync += length[:8].eq(byte)
                            m.next = "LEN1"
                        elif state == "LEN1":
                            m.d.sync += length[8:].eq(byte)
                            with m.If(Cat(length[:8], byte) > self._max_payload):
                                fail(Status.BAD_LENGTH)
                            with m.Elif(Cat(length[:8], byte) == 0):
                                m.next = "CRC0"
                            with m.Else():
                                m.next = "PAYLOAD"
                        elif state == "PAYLOAD":
                            m.d.comb += wr.en.eq(1)
                            m.d.sync += count.eq(count + 1)
                            with m.If(count == length - 1):
                                m.next = "CRC0"
                        elif state == "CRC0":
                            m.next = "CRC1"
                        elif state == "CRC1":
                            m.next = "CHECK"
            with m.State("CHECK"):
                m.d.sync += count.eq(0)
                with m.If(~crc.match_detected):
                    fail(Status.BAD_CRC)
                with m.Elif(~known_op):
                    fail(Status.UNKNOWN_OP)
                with m.Else():
                    m.next = "HEADER"
            with m.State("HEADER"):
                # rd.addr is 0 here, so rd.data holds payload byte 0 when DATA begins.
                m.d.comb += self.header.valid.eq(1)
                with m.If(self.header.ready):
                    with m.If(length == 0):
                        m.next = "HUNT"
                    with m.Else():
                        m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += [
                    self.data.valid.eq(1),
                    rd.en.eq(self.data.ready),
                    rd.addr.eq(count + 1),
                ]
                with m.If(self.data.ready):
                    m.d.sync += count.eq(count + 1)
                    with m.If(count == length - 1):
                        m.next = "HUNT"
            with m.State("ERROR"):
                m.d.comb += self.error.valid.eq(1)
                with m.If(self.error.ready):
                    m.next = "HUNT"
        return m


class FrameEncoder(wiring.Component):
    """Response header + payload bytes in, framed bytes with CRC out.

    Ports: ``header`` (:data:`ResponseHeader`; ``op`` is the request's opcode, the encoder sets
    bit 7), ``data`` (exactly ``length`` payload bytes follow each header; the encoder passes
    them through as they come), ``o`` (bytes to the UART transmitter).

    Latency: SYNC is offered the cycle after the header transfer. Throughput: one byte per
    cycle; a response of ``n`` payload bytes takes ``n + 8`` output transfers. Backpressure:
    ``o.ready`` low stalls everything; ``data.ready`` follows ``o.ready`` while the payload is
    being sent, so a slow payload source just inserts idle cycles on ``o`` (a UART transmitter
    does not mind).
    """

    header: In(stream.Signature(ResponseHeader))
    data: In(stream.Signature(8))
    o: Out(stream.Signature(8))

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = crc = CRC16.create()
        hdr = Signal(ResponseHeader)
        count = Signal(16)
        send = self.o.valid & self.o.ready
        m.d.comb += crc.data.eq(self.o.payload)

        def emit(value, next_state, *, checked=True):
            m.d.comb += [self.o.valid.eq(1), self.o.payload.eq(value)]
            if checked:
                m.d.comb += crc.valid.eq(send)
            with m.If(self.o.ready):
                m.next = next_state

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.header.ready.eq(1), crc.start.eq(1)]
                with m.If(self.header.valid):
                    m.d.sync += [hdr.eq(self.header.payload), count.eq(0)]
                    m.next = "SYNC"
            with m.State("SYNC"):
                emit(SYNC, "OP", checked=False)
            with m.State("OP"):
                emit(hdr.op | RESPONSE_FLAG, "SEQ")
            with m.State("SEQ"):
                emit(hdr.seq, "STATUS")
            with m.State("STATUS"):
                emit(hdr.status, "LEN0")
            with m.State("LEN0"):
                emit(hdr.length[:8], "LEN1")
            with m.State("LEN1"):
                emit(hdr.length[8:], "CRC0")
                with m.If(hdr.length != 0):
                    with m.If(self.o.ready):
                        m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                m.d.comb += [
                    self.o.valid.eq(self.data.valid),
                    self.o.payload.eq(self.data.payload),
                    self.data.ready.eq(self.o.ready),
                    crc.valid.eq(send),
                ]
                with m.If(send):
                    m.d.sync += count.eq(count + 1)
                    with m.If(count == hdr.length - 1):
                        m.next = "CRC0"
            with m.State("CRC0"):
                emit(crc.crc[8:], "CRC1", checked=False)
            with m.State("CRC1"):
                emit(crc.crc[:8], "IDLE", checked=False)
        return m
