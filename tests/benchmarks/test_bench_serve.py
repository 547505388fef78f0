"""The ``serve`` benchmark runs end to end at a tiny size (its figures are not checked: they
are wall-clock; its results' shape and their token accounting are)."""

import pytest


@pytest.mark.slow
def test_serve_bench_runs_at_a_tiny_size():
    from bench import bench_serve as b
    results = b.run(smoke=True)
    names = {r["name"] for r in results}
    for key in ("one_device", "one_device_one_at_a_time", "four_devices",
                "four_devices_one_at_a_time", "four_devices_round-robin",
                "one_device_infinite_store"):
        for figure in ("ttft_p50_s", "ttft_p99_s", "tokens_per_s", "cached_fraction",
                       "overhead_ms"):
            assert f"serve.{key}.{figure}" in names
    for r in results:
        if r["name"].endswith("cached_fraction"):
            p = r["params"]
            assert p["requests"] == 8 and 0 <= p["cached_tokens"] < p["prompt_tokens"]
            assert r["value"] == round(p["cached_tokens"] / p["prompt_tokens"], 4)
            # one device holds every conversation's earlier turns (8 requests of 2 clients:
            # each client's second request resumes); spread over four devices a client's
            # requests may each land on a device that has none of its turns yet
            if p["devices"] == 1:
                assert p["cached_tokens"] > 0, r["name"]
    for name in ("serve.one_device.batched_vs_one_at_a_time",
                 "serve.four_devices.batched_vs_one_at_a_time",
                 "serve.model_limit.step_tokens_per_s", "serve.model_limit.matmul_tokens_per_s",
                 "serve.clients1.batched.tokens_per_s", "serve.clients2.one_at_a_time.ttft_p50_s"):
        assert name in names
    text = b.markdown(results)
    assert "prefix_vs_round_robin" in text and "against the number of clients" in text


def test_serve_overhead_raises_the_server_and_its_device_process_above_the_load():
    """The ``serve_overhead`` group's priorities took effect on both processes (the nice value
    and, where the kernel groups by session, the session's autogroup, without which the nice
    value ranks a process only within its own session), and each request's steps were read
    from the server's log."""
    import os

    from bench import bench_serve_overhead as b
    by = {r["name"]: r["params"] for r in b.run(smoke=True)}
    started = by["serve.overhead.as_started.mean_ms"]
    assert started["requests_measured"] == 3 and started["logged"] == 3
    assert len(started["priorities"]) == 2           # the server and its device's process
    assert all(b.RAISED not in p["nice"] and p["policy"] == ["other"]
               for p in started["priorities"])
    if os.geteuid() == 0:
        for level, policy in (("raised", "other"), ("realtime", "rr")):
            params = by[f"serve.overhead.{level}.mean_ms"]
            assert params["logged"] == 3 and len(params["priorities"]) == 2
            assert all(p["nice"] == [b.RAISED] and p["autogroup_nice"] in (b.RAISED, None)
                       and p["policy"] == [policy] for p in params["priorities"])
    else:
        assert "serve.overhead.raised.mean_ms" not in by


def test_overhead_quantiles_from_the_histograms_buckets():
    """``bench_serve._quantile_ms`` reads a quantile from the server's cumulative buckets the
    way Prometheus' ``histogram_quantile`` does: linear within the bucket it falls in."""
    from bench.bench_serve import _quantile_ms
    # 10 requests at most 1 ms, 10 more up to 2 ms, 0 more up to 5 ms
    buckets = {"0.0005": 0.0, "0.001": 10.0, "0.002": 20.0, "0.005": 20.0, "+Inf": 20.0}
    assert _quantile_ms(buckets, 0.5) == 1.0
    assert _quantile_ms(buckets, 0.75) == 1.5
    assert _quantile_ms(buckets, 0.25) == 0.75            # halfway into (0.5, 1] ms
    assert _quantile_ms({"0.001": 0.0, "+Inf": 4.0}, 0.5) == 1.0   # beyond the last bound
    assert _quantile_ms({"0.001": 0.0, "+Inf": 0.0}, 0.5) is None
