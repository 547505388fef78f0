"""Shared helpers of the server's tests: ``ringkv serve`` started for real in a thread of the
test process (uvicorn on a free port), with the official ``openai`` client and plain HTTP."""

import contextlib

import httpx
import openai

from ringkv.serve.main import build_parser, build_server, serve_in_thread

__all__ = ["SYSTEM", "http", "Running", "running"]

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
    assert engine.wait_ready(60)
    try:
        yield Running(base, engine, name)
    finally:
        server.should_exit = True
        thread.join(30)
