"""``ringkv serve``: an OpenAI-compatible HTTP server over one or many RingKV devices.

Modules: :mod:`~ringkv.serve.template` (chat template, prompts, streamed text and stop
sequences), :mod:`~ringkv.serve.devices` (``--device``), :mod:`~ringkv.serve.engine` (a worker
per device, the router, the index of each device), :mod:`~ringkv.serve.worker` (a device's own
process), :mod:`~ringkv.serve.app` (the HTTP API),
:mod:`~ringkv.serve.metrics` (Prometheus), :mod:`~ringkv.serve.main` (the command line).

Layer: may import ``ringkv.defs``, ``ringkv.host`` and ``ringkv.sim`` (``ringkv.sim.procs``
starts and stops each device's process; the ``sim`` device starts a simulated board through
the harness, imported only then), and its web stack
(Starlette, uvicorn, prometheus-client, platformdirs); nothing imports it but the CLI.
"""
