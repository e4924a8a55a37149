"""The server's scheduler (orl_jax/serve/scheduler.py) on a scripted engine: a block event per
committed block, the text cut at EOS, max_tokens and stop strings, slots reused only once their
call's view was read (pipelined calls), cancellation, a full queue, and a weight swap that
waits for the requests in flight."""
import collections
import concurrent.futures
import threading
import time

import numpy as np
import pytest

from orl_jax.serve.engine import EngineShape, HostView
from orl_jax.serve.scheduler import Draining, Event, QueueFull, Request, Scheduler
from orl_jax.unmasking import UnmaskRule

MASK, EOS, B = 0, 1, 4
WORDS = ["<mask>", "<eos>"] + [f"w{i}" for i in range(2, 40)]


class Words:
  """A tokenizer of WORDS: ids <-> space-separated words."""
  eos_id, mask_id, vocab_size = EOS, MASK, len(WORDS)

  def decode(self, ids, stop_at_eos=False):
    return " ".join(WORDS[int(i)] for i in ids)

  def encode(self, text):
    return [WORDS.index(w) for w in text.split()]


class ScriptedEngine:
  """An engine whose rows each commit one block of a scripted response per call (the
  response of a prompt [t] is tokens t, t+1, ... then EOS after `script[t]` tokens); it
  records what each call admitted and cancelled."""

  def __init__(self, rows=2, waiting=2, blocks=3, script=None):
    self.shape = EngineShape(rows=rows, waiting=waiting, prompt_len=8, iterations=1)
    self.cfg = type("Cfg", (), dict(block_size=B, mask_id=MASK, gen_length=blocks * B,
                                    block_placement="prompt_end"))()
    self.script = script or {}
    self.q = self.shape.slots
    self.rows = [None] * rows               # (slot, response, blocks done)
    self.order: collections.deque = collections.deque()
    self.done = np.zeros(self.q, bool)
    self.blocks = np.full((self.q, blocks * B), MASK, np.int32)
    self.calls: list[tuple[list[int], list[int]]] = []
    self.params = "v0"
    self.lock = threading.Lock()

  def _response(self, e):
    first = int(e.prompt[0])
    n = self.script.get(first, 100)
    toks = [(first + i - 2) % 38 + 2 for i in range(n)] + [EOS]
    toks += [EOS] * (len(self.blocks[0]) - len(toks))
    return np.array(toks[:len(self.blocks[0])], np.int32)

  def dispatch(self, entries, cancel):
    with self.lock:
      self.calls.append(([e.slot for e in entries], list(cancel)))
      for e in entries:
        self.done[e.slot] = False
        self.order.append((e.slot, self._response(e), e.max_tokens))
      self.order = collections.deque(x for x in self.order if x[0] not in cancel)
      self.rows = [None if r is not None and r[0] in cancel else r for r in self.rows]
      for i, r in enumerate(self.rows):
        if r is None and self.order:
          slot, resp, limit = self.order.popleft()
          self.rows[i] = [slot, resp, 0, -(-limit // B)]
      row_blocks = np.full((len(self.rows), len(self.blocks[0])), MASK, np.int32)
      for i, r in enumerate(self.rows):
        if r is None:
          continue
        r[2] += 1
        slot, resp, k, limit = r
        done_blocks = resp[:k * B]
        if k >= limit or EOS in done_blocks:
          self.blocks[slot] = MASK
          self.blocks[slot][:k * B] = done_blocks
          self.done[slot] = True
          self.rows[i] = None
        else:
          row_blocks[i][:k * B] = done_blocks
      slots = np.array([self.q if r is None else r[0] for r in self.rows], np.int32)
      nfe = np.arange(self.q, dtype=np.int32) + 10
      return HostView(slots, row_blocks, nfe[:len(self.rows)], nfe[:len(self.rows)],
                      self.blocks.copy(), nfe, nfe, nfe, self.done.copy(), len(self.order),
                      len(self.calls))

  def fetch(self, view):
    return view

  def set_params(self, params):
    self.params = params


def _request(first, events, n=1, max_tokens=12, stop=(), stream=True):
  return Request([first, 3], max_tokens, UnmaskRule(), 0.0, 0, events.append, n=n, stop=stop,
                 stream=stream)


def _wait(events, count, timeout=10.0):
  deadline = time.monotonic() + timeout
  while sum(e.kind == "done" for e in events) < count and time.monotonic() < deadline:
    time.sleep(0.005)
  assert sum(e.kind == "done" for e in events) == count, events


@pytest.fixture
def scheduler():
  made = []

  def make(engine, **kw):
    s = Scheduler(engine, Words(), max_waiting=kw.pop("max_waiting", 64), **kw)
    s.start()
    made.append(s)
    return s
  yield make
  for s in made:
    s.stop(timeout=10)


def test_one_block_event_per_committed_block_then_done_with_the_text(scheduler):
  engine = ScriptedEngine(script={5: 6})              # 6 tokens, EOS in the second block
  s = scheduler(engine)
  events: list[Event] = []
  s.submit(_request(5, events))
  _wait(events, 1)
  blocks = [e.text for e in events if e.kind == "block"]
  assert blocks == ["w5 w6 w7 w8", " w9 w10"]
  done = events[-1]
  assert done.text == "w5 w6 w7 w8 w9 w10" and done.finish_reason == "stop"
  assert done.usage["completion_tokens"] == 6 and done.usage["generated"] == 7   # + EOS


def test_max_tokens_cuts_the_text_and_ends_with_length(scheduler):
  s = scheduler(ScriptedEngine())
  events: list[Event] = []
  s.submit(_request(5, events, max_tokens=6))
  _wait(events, 1)
  assert events[-1].text == "w5 w6 w7 w8 w9 w10" and events[-1].finish_reason == "length"
  assert events[-1].usage["generated"] == 6


def test_a_stop_string_ends_the_choice_and_frees_its_row(scheduler):
  engine = ScriptedEngine(blocks=3)
  s = scheduler(engine)
  events: list[Event] = []
  s.submit(_request(5, events, stop=("w7",)))
  _wait(events, 1)
  assert events[-1].text == "w5 w6 " and events[-1].finish_reason == "stop"
  assert events[-1].usage["completion_tokens"] == 2
  deadline = time.monotonic() + 5
  while not any(c for _, c in engine.calls) and time.monotonic() < deadline:
    time.sleep(0.005)
  assert any(c for _, c in engine.calls), "the stopped choice's row was not cancelled"
  assert s.idle()


def test_non_streamed_requests_get_only_their_done_event(scheduler):
  s = scheduler(ScriptedEngine(script={5: 6}))
  events: list[Event] = []
  s.submit(_request(5, events, stream=False))
  _wait(events, 1)
  assert [e.kind for e in events] == ["done"]


def test_many_requests_through_few_slots_each_answered_once_with_its_own_text(scheduler):
  """Slots are reused across pipelined calls: each request gets its own response, once."""
  engine = ScriptedEngine(rows=2, waiting=2, script={i: i % 7 for i in range(2, 30)})
  s = scheduler(engine)
  events = {i: [] for i in range(2, 30)}
  for i in events:
    s.submit(_request(i, events[i]))
  for i in events:
    _wait(events[i], 1)
  for i, evs in events.items():
    n = i % 7
    want = " ".join(WORDS[(i + k - 2) % 38 + 2] for k in range(n))
    assert [e.kind for e in evs].count("done") == 1
    assert evs[-1].text == want, (i, evs)
    assert "".join(e.text for e in evs if e.kind == "block") == want


def test_n_choices_are_separate_slots(scheduler):
  s = scheduler(ScriptedEngine())
  events: list[Event] = []
  s.submit(_request(5, events, n=3, max_tokens=4))
  _wait(events, 3)
  assert sorted(e.choice for e in events if e.kind == "done") == [0, 1, 2]


def test_cancel_removes_waiting_and_running_choices(scheduler):
  engine = ScriptedEngine(rows=1, waiting=1)
  s = scheduler(engine)
  first: list[Event] = []
  r = _request(5, first)
  s.submit(r)
  later = [_request(6 + i, []) for i in range(3)]
  for x in later:
    s.submit(x)
  s.cancel(r)
  for x in later:
    s.cancel(x)
  deadline = time.monotonic() + 5
  while not s.idle() and time.monotonic() < deadline:
    time.sleep(0.005)
  assert s.idle()
  assert not any(e.kind == "done" for e in first)


def test_a_full_queue_refuses_and_a_draining_scheduler_refuses(scheduler):
  engine = ScriptedEngine(rows=1, waiting=1)
  s = scheduler(engine, max_waiting=2)
  gate = engine.lock
  gate.acquire()                                     # the engine is busy: choices pile up
  try:
    s.submit(_request(5, []))
    time.sleep(0.1)
    s.submit(_request(6, [], n=2))
    with pytest.raises(QueueFull, match="max_waiting=2"):
      s.submit(_request(7, []))
  finally:
    gate.release()
  s.drain()
  with pytest.raises(Draining):
    s.submit(_request(8, []))


def test_a_reload_waits_for_the_requests_in_flight(scheduler):
  engine = ScriptedEngine(rows=1, waiting=1)
  s = scheduler(engine)
  before: list[Event] = []
  s.submit(_request(5, before, max_tokens=12))
  time.sleep(0.02)
  future = s.reload("v1")
  after: list[Event] = []
  s.submit(_request(6, after, max_tokens=4))
  assert future.result(timeout=10) == 1 and engine.params == "v1"
  _wait(before, 1)
  _wait(after, 1)
  admitted = [slots for slots, _ in engine.calls if slots]
  assert len(admitted) == 2, "the second request was admitted before the swap"


def _app(engine, **kw):
  """The HTTP app over a scripted engine (its tokenizer: WORDS)."""
  from starlette.testclient import TestClient

  from orl_jax.serve.app import Served, create_app
  from orl_jax.serve.metrics import ServerMetrics
  from orl_jax.unmasking import RULES
  metrics = ServerMetrics(engine.shape.rows)
  s = Scheduler(engine, Words(), max_waiting=kw.pop("max_waiting", 64))
  s.start()
  served = Served("scripted", Words(), "none", s, metrics, UnmaskRule(), 0.0, True, RULES, 8,
                  engine.cfg.gen_length, block_size=None, max_body_bytes=1 << 20)
  return TestClient(create_app(served)), s


def test_http_429_when_the_queue_is_full_and_503_while_draining():
  engine = ScriptedEngine(rows=1, waiting=1)
  client, s = _app(engine, max_waiting=1)
  try:
    body = {"model": "scripted", "prompt": "w5 w6"}
    assert client.post("/v1/completions", json=body).status_code == 200
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      engine.lock.acquire()                # the engine is busy: choices pile up
      try:
        futures = [pool.submit(client.post, "/v1/completions", json=body) for _ in range(8)]
        deadline = time.monotonic() + 30   # the refused ones answer while the engine waits
        while sum(f.done() for f in futures) < 6 and time.monotonic() < deadline:
          time.sleep(0.01)
      finally:
        engine.lock.release()
      replies = [f.result(timeout=60) for f in futures]
    codes = sorted(r.status_code for r in replies)
    assert 429 in codes and 200 in codes, codes
    full = [r.json() for r in replies if r.status_code == 429][0]
    assert "serve.max_waiting=1" in full["error"]["message"]
    assert full["error"]["type"] == "rate_limit_error"
    s.drain()
    late = client.post("/v1/completions", json=body)
    assert late.status_code == 503 and "shutting down" in late.json()["error"]["message"]
    assert client.get("/health").status_code == 503
  finally:
    s.stop(timeout=10)
