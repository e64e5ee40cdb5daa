"""`GET /metrics`: the server's counters and latency histograms in Prometheus' text format, through
prometheus-client, with the names vLLM exposes (prefixed `gpt2_`), so existing dashboards need only the prefix.

One registry per app (never the process-wide default one): two servers in one process count apart.

- requests accepted, sequences finished by reason, prompt and generated tokens (counters);
- sequences running and waiting in the engine (gauges, read when scraped);
- the prefix cache's counters, read when scraped: prompt tokens looked up (`gpt2_prefix_cache_queries_total`) and
  of those reused (`gpt2_prefix_cache_hits_total`; their ratio is the hit rate), blocks evicted, bytes held (all
  zero with the cache off);
- speculative decoding's counters, read when scraped, with vLLM's spec-decode names: verifications
  (`gpt2_spec_decode_num_drafts_total`), drafted tokens (`..._num_draft_tokens_total`) and of those accepted
  (`..._num_accepted_tokens_total`; their ratio is the acceptance rate), all zero without a drafter;
- the memory each loaded LoRA adapter's tensors hold (`gpt2_lora_adapter_bytes{adapter="NAME"}`, a gauge read
  when scraped; adapters loaded or unloaded at run time appear and go);
- time to the first token, time per output token after it, and end-to-end latency (histograms), measured where
  the server hands outputs to the client, so they include queueing and the engine's turns.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpt2.inference.lora_batch import AdapterSet, UnknownAdapterError
from gpt2.serve.engine import Engine
from gpt2.serve.sequence import SequenceOutput

# Seconds. First tokens wait for a prefill (and a queue); later tokens for one decode step of the batch.
FIRST_TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
REQUEST_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class ServerMetrics:
    """The metrics of one app; `observe` is called for every output the server receives from the engine."""

    def __init__(self, engine: Engine, adapters: AdapterSet) -> None:
        self.registry = CollectorRegistry()
        registry = self.registry
        self.requests = Counter("gpt2_requests", "Requests accepted by the engine", registry=registry)
        self.finished = Counter(
            "gpt2_request_finished", "Sequences ended, by finish reason", ["finish_reason"], registry=registry
        )
        self.prompt_tokens = Counter("gpt2_prompt_tokens", "Prompt tokens prefilled", registry=registry)
        self.generation_tokens = Counter("gpt2_generation_tokens", "Tokens generated", registry=registry)
        running = Gauge("gpt2_num_requests_running", "Sequences decoding now", registry=registry)
        running.set_function(lambda: engine.active)
        waiting = Gauge("gpt2_num_requests_waiting", "Sequences queued for a row", registry=registry)
        waiting.set_function(lambda: engine.waiting)
        registry.register(PrefixCacheCollector(engine))
        registry.register(SpeculationCollector(engine))
        registry.register(AdapterMemoryCollector(adapters))
        self.first_token = Histogram(
            "gpt2_time_to_first_token_seconds", "From submission to a sequence's first token",
            buckets=FIRST_TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.per_token = Histogram(
            "gpt2_time_per_output_token_seconds", "Between a sequence's tokens after the first",
            buckets=TOKEN_BUCKETS, registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "gpt2_e2e_request_latency_seconds", "From submission to a sequence's end",
            buckets=REQUEST_BUCKETS, registry=registry,
        )  # fmt: skip

    def submitted(self, prompt_tokens: int) -> None:
        self.requests.inc()
        self.prompt_tokens.inc(prompt_tokens)

    def observe(self, output: SequenceOutput, *, since_submission: float, since_previous: float | None) -> None:
        """One output of a sequence; `since_previous` is None until the sequence has produced a token."""
        if output.token_ids:
            if since_previous is None:
                self.first_token.observe(since_submission)
            else:
                self.per_token.observe(since_previous / len(output.token_ids))
        if output.final:
            self.generation_tokens.inc(output.completion_tokens)
            self.finished.labels(output.finish_reason or "error").inc()
            self.latency.observe(since_submission)

    def render(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class PrefixCacheCollector(Collector):
    """The engine's prefix-cache counters as Prometheus metrics, read at each scrape (the cache counts them)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        cache = self._engine.prefix_cache
        if cache is None:
            queries = hits = evictions = held = 0
        else:
            queries, hits, evictions, held = cache.queries, cache.hits, cache.evictions, cache.nbytes
        yield CounterMetricFamily(
            "gpt2_prefix_cache_queries", "Prompt tokens looked up in the prefix cache", value=queries
        )
        yield CounterMetricFamily("gpt2_prefix_cache_hits", "Prompt tokens reused from the prefix cache", value=hits)
        yield CounterMetricFamily("gpt2_prefix_cache_evictions", "Prefix cache blocks evicted", value=evictions)
        yield GaugeMetricFamily("gpt2_prefix_cache_bytes", "Bytes of the prefix cache's blocks in use", value=held)


class SpeculationCollector(Collector):
    """The engine's speculative-decoding counters as Prometheus metrics, read at each scrape."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.speculation
        yield CounterMetricFamily(
            "gpt2_spec_decode_num_drafts", "Speculative steps (one verification each)", value=stats.verifications
        )
        yield CounterMetricFamily("gpt2_spec_decode_num_draft_tokens", "Tokens drafted", value=stats.drafted)
        yield CounterMetricFamily(
            "gpt2_spec_decode_num_accepted_tokens", "Drafted tokens the model accepted", value=stats.accepted
        )


class AdapterMemoryCollector(Collector):
    """The bytes of each loaded LoRA adapter's A and B tensors, labelled with its name, read at each scrape."""

    def __init__(self, adapters: AdapterSet) -> None:
        self._adapters = adapters

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "gpt2_lora_adapter_bytes", "Bytes a loaded LoRA adapter's tensors hold", labels=["adapter"]
        )
        for name in self._adapters.names:
            try:
                family.add_metric([name], self._adapters.get(name).nbytes)
            except UnknownAdapterError:  # unloaded between the two reads
                continue
        yield family
