"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own.

Requests by outcome; prompt, completion and generated tokens; forwards in both counts (the
paper's, with one commit forward per decoded block, and the authors' denoising forwards) and
pooled TPF; queue depth, busy rows, device calls and engine iterations; the prompt pool's
prefills and the choices it served; histograms of time to first block, end-to-end latency,
queue wait and device call time.
"""
from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               generate_latest)
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401 - re-exported for the app

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class ServerMetrics:
  """Every metric of one server (its own registry, so two servers in one process, as in the
  tests, do not collide)."""

  def __init__(self, rows: int):
    r = self.registry = CollectorRegistry()
    self.requests = Counter("orl_requests", "Requests by outcome (ok, cancelled, bad_request, "
                            "unauthorized, not_found, queue_full, draining, error).", ["outcome"],
                            registry=r)
    self.prompt_tokens = Counter("orl_prompt_tokens", "Prompt tokens of served requests.",
                                 registry=r)
    self.completion_tokens = Counter("orl_completion_tokens", "Tokens of the returned texts.",
                                     registry=r)
    self.generated_tokens = Counter("orl_generated_tokens", "Tokens generated through the "
                                    "first EOS (the EOS included; TPF's numerator).", registry=r)
    self.forwards = Counter("orl_forwards", "Model forwards: count=paper (denoising + one "
                            "commit per decoded block; TPF's denominator), denoise (the "
                            "authors' count), engine (what the engine ran).", ["count"],
                            registry=r)
    self.tpf = Gauge("orl_tpf", "Pooled tokens per forward since start (paper's count).",
                     registry=r)
    self.queue_depth = Gauge("orl_queue_depth", "Choices waiting for an engine slot.",
                             registry=r)
    self.busy_rows = Gauge("orl_busy_rows", "Engine rows decoding after the last device call.",
                           registry=r)
    self.rows = Gauge("orl_rows", "Engine rows.", registry=r)
    self.rows.set(rows)
    self.device_calls = Counter("orl_device_calls", "Device calls of the engine.", registry=r)
    self.model_version = Gauge("orl_model_version", "Weights served (1 at start, +1 a reload).",
                               registry=r)
    self.ttfb = Histogram("orl_time_to_first_block_seconds", "Arrival to the first committed "
                          "block of a request.", buckets=_SECONDS, registry=r)
    self.latency = Histogram("orl_request_latency_seconds", "Arrival to the last token of a "
                             "request.", buckets=_SECONDS, registry=r)
    self.queue_wait = Histogram("orl_queue_wait_seconds", "Arrival to the engine taking the "
                                "request.", buckets=_SECONDS, registry=r)
    self.call_seconds = Histogram("orl_device_call_seconds", "One device call (up to "
                                  "serve.iterations_per_call engine iterations).",
                                  buckets=_SECONDS, registry=r)

  def served(self, usage: dict) -> None:
    """A finished request's counts."""
    self.prompt_tokens.inc(usage["prompt_tokens"])
    self.completion_tokens.inc(usage["completion_tokens"])
    self.generated_tokens.inc(usage["generated_tokens"])
    for count, key in (("paper", "forwards"), ("denoise", "forwards_denoise"),
                       ("engine", "forwards_engine")):
      self.forwards.labels(count).inc(usage[key])
    paper = self.forwards.labels("paper")._value.get()
    self.tpf.set(self.generated_tokens._value.get() / max(paper, 1))

  def watch_pool(self, book) -> None:
    """Reads the engine's prompt pool account (`serve.engine.PoolBook`) at each scrape."""
    self.pool_prefills = Gauge("orl_prompt_pool_prefills", "Prompts prefilled once into the "
                               "prompt pool for the n choices of a request (since start).",
                               registry=self.registry)
    self.pool_choices = Gauge("orl_prompt_pool_choices", "Choices whose prompt cache came from "
                              "the prompt pool (since start; n per pooled request).",
                              registry=self.registry)
    self.pool_entries = Gauge("orl_prompt_pool_entries", "Prompt caches in the pool "
                              "(serve.prompt_pool).", registry=self.registry)
    self.pool_prefills.set_function(lambda: book.fills)
    self.pool_choices.set_function(lambda: book.shared)
    self.pool_entries.set(book.n)

  def device_call(self, seconds: float, busy_rows: int) -> None:
    self.device_calls.inc()
    self.call_seconds.observe(seconds)
    self.busy_rows.set(busy_rows)

  def text(self) -> bytes:
    return generate_latest(self.registry)
