"""The ``serve`` benchmark runs end to end at a tiny size (its figures are not checked: they
are wall-clock; its results' shape and their token accounting are)."""

import pytest


@pytest.mark.slow
def test_serve_bench_runs_at_a_tiny_size():
    from bench import bench_serve as b
    results = b.run(smoke=True)
    names = {r["name"] for r in results}
    for key in ("one_device", "four_devices", "four_devices_round-robin",
                "one_device_infinite_store"):
        for figure in ("ttft_p50_s", "ttft_p99_s", "tokens_per_s", "cached_fraction",
                       "overhead_ms"):
            assert f"serve.{key}.{figure}" in names
    for r in results:
        if r["name"].endswith("cached_fraction"):
            p = r["params"]
            assert p["requests"] == 8 and 0 < p["cached_tokens"] < p["prompt_tokens"]
            assert r["value"] == round(p["cached_tokens"] / p["prompt_tokens"], 4)
    assert "prefix_vs_round_robin" in b.markdown(results)
