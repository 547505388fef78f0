"""RingKV benchmarks: ``python -m bench.run`` (``make bench``)."""
