"""The server's metrics, in Prometheus' text format at ``GET /metrics`` (``prometheus-client``,
the Prometheus project's own library; names in its conventions: ``_total`` counters,
``_seconds`` histograms).

Requests and tokens: ``ringkv_requests_total{endpoint,status}``,
``ringkv_prompt_tokens_total``, ``ringkv_generation_tokens_total``; latency:
``ringkv_time_to_first_token_seconds``, ``ringkv_inter_token_latency_seconds``,
``ringkv_request_duration_seconds``, ``ringkv_scheduler_seconds`` (inside the scheduler) and
``ringkv_server_overhead_seconds`` (the rest of a request's time in the server); prompt tokens
by where their state came from: ``ringkv_tokens_reused_total`` (imported from a device's
store), ``ringkv_tokens_resident_total`` (still in the rings from the conversation's previous
turn), ``ringkv_tokens_prefilled_total`` (computed) and, of those,
``ringkv_tokens_recomputed_total`` (computed before by the same conversation). Per device
(label ``device``): ``ringkv_device_hits_total`` (requests that imported a record from the
store), ``ringkv_device_hot_hits_total`` (that continued a conversation resident in the hot
tier: nothing imported), ``ringkv_device_resident_conversations`` (the hot tier's idle
conversations),
``ringkv_device_misses_total`` (that found none), ``ringkv_device_prefix_hits_total`` (that
imported a longest stored prefix), ``ringkv_device_requests_total{path}``,
``ringkv_device_exports_total``, ``ringkv_device_recoveries_total``,
``ringkv_device_moves_total{source,device}`` (records copied in from another device),
``ringkv_device_queue_depth``, ``ringkv_device_up``, ``ringkv_device_records`` (the index).

Each server has its own registry, so that several run in one process (the tests).
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            30.0, 60.0)
_OVERHEAD = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01,
             0.025, 0.1)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("ringkv_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("ringkv_prompt_tokens", "prompt tokens of served requests",
                                     registry=r)
        self.generation_tokens = Counter("ringkv_generation_tokens", "tokens generated",
                                         registry=r)
        self.ttft = Histogram("ringkv_time_to_first_token_seconds",
                              "from the request's arrival to its first generated token",
                              buckets=_LATENCY, registry=r)
        self.inter_token = Histogram("ringkv_inter_token_latency_seconds",
                                     "between two generated tokens of a request",
                                     buckets=_LATENCY, registry=r)
        self.duration = Histogram("ringkv_request_duration_seconds",
                                  "a generation request's whole time in the server",
                                  buckets=_LATENCY, registry=r)
        self.scheduler_seconds = Histogram("ringkv_scheduler_seconds",
                                           "a request's time inside the device's scheduler",
                                           buckets=_LATENCY, registry=r)
        self.overhead = Histogram("ringkv_server_overhead_seconds",
                                  "a request's time in the server outside the scheduler "
                                  "(parsing, routing, queueing excluded, streaming)",
                                  buckets=_OVERHEAD, registry=r)
        self.queue_wait = Histogram("ringkv_queue_wait_seconds",
                                    "from routing to the device's process reading the "
                                    "request (a batching device reads between two steps)",
                                    buckets=_LATENCY, registry=r)
        self.tokens_reused = Counter("ringkv_tokens_reused",
                                     "prompt tokens imported from a device's store", registry=r)
        self.tokens_resident = Counter("ringkv_tokens_resident",
                                       "prompt tokens still in the rings from the previous turn",
                                       registry=r)
        self.tokens_prefilled = Counter("ringkv_tokens_prefilled", "prompt tokens computed",
                                        registry=r)
        self.tokens_recomputed = Counter("ringkv_tokens_recomputed",
                                         "computed tokens the conversation had computed before",
                                         registry=r)
        d = ["device"]
        self.device_hits = Counter("ringkv_device_hits", "requests that imported a record", d,
                                   registry=r)
        self.device_hot_hits = Counter(
            "ringkv_device_hot_hits", "requests that continued a conversation resident in the "
            "device's hot tier (no import)", d, registry=r)
        self.device_resident = Gauge(
            "ringkv_device_resident_conversations",
            "conversations resident in the device's hot tier (idle, their turn exported)", d,
            registry=r)
        self.device_misses = Counter("ringkv_device_misses",
                                     "requests that found no record to import", d, registry=r)
        self.device_prefix_hits = Counter("ringkv_device_prefix_hits",
                                          "requests that imported a longest stored prefix", d,
                                          registry=r)
        self.device_requests = Counter("ringkv_device_requests", "requests by scheduler path",
                                       ["device", "path"], registry=r)
        self.device_exports = Counter("ringkv_device_exports",
                                      "records exported (turn snapshots and checkpoints)", d,
                                      registry=r)
        self.device_recoveries = Counter("ringkv_device_recoveries",
                                         "times the device was reopened after a failure", d,
                                         registry=r)
        self.device_moves = Counter("ringkv_device_moves",
                                    "records copied from one device to another (a "
                                    "conversation moved)", ["source", "device"], registry=r)
        self.device_queue = Gauge("ringkv_device_queue_depth",
                                  "requests queued or running on the device", d, registry=r)
        self.device_up = Gauge("ringkv_device_up", "1 when the device serves, 0 when not", d,
                               registry=r)
        self.device_records = Gauge("ringkv_device_records",
                                    "records the server's index says the device holds", d,
                                    registry=r)
        # --valkey (serve/cluster.py): the shared index of several instances
        self.cluster_up = Gauge("ringkv_cluster_up", "1 while the shared index (Valkey) "
                                "answers; 0: degraded, serving from this instance's devices "
                                "only (also 0 without --valkey)", registry=r)
        self.cluster_errors = Counter("ringkv_cluster_errors", "rounds of publishing and "
                                      "reading the shared index that failed (Valkey down)",
                                      registry=r)
        self.cluster_peers = Gauge("ringkv_cluster_peers", "other instances with a live "
                                   "heartbeat", registry=r)
        self.cluster_round = Histogram("ringkv_cluster_round_seconds", "one round of "
                                       "heartbeat, publishing and reading the others",
                                       registry=r)
        self.cluster_lookup = Histogram(
            "ringkv_cluster_lookup_seconds", "a request's lookup of its longest prefix on the "
            "other instances", buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1),
            registry=r)
        self.cluster_copies = Counter("ringkv_cluster_copies", "records copied from the "
                                      "instance holding a request's prefix, by outcome "
                                      "(copied; missing there: evicted meanwhile; "
                                      "unreachable)", ["outcome"],
                                      registry=r)
        self.cluster_forwards = Counter("ringkv_cluster_forwards", "requests sent to the "
                                        "instance holding their prefix, by outcome (served "
                                        "there, or failed and served here)", ["outcome"],
                                        registry=r)

    def add_device(self, name: str):
        """Show a device's series from the start (zeros), before its first request."""
        for m in (self.device_hits, self.device_hot_hits, self.device_resident,
                  self.device_misses, self.device_prefix_hits, self.device_exports,
                  self.device_recoveries, self.device_queue, self.device_up,
                  self.device_records):
            m.labels(name)
