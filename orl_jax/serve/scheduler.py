"""The scheduler: one thread owns the engine and is the only one that calls the device.

HTTP handlers `submit` requests and read their events; between device calls the thread admits
waiting choices (each choice of a request is one slot of the engine, FIFO by arrival), sends
cancellations, swaps weights when asked (`reload`: admission pauses, the requests in flight
finish on the weights they started with, then the new ones serve), calls the engine, and turns
what the call finished into events: one `block` event per block a choice committed (its new
text), then one `done` event with the whole text, the finish reason and the forward counts.

Text: a choice's response is its blocks from the prompt's `lead` tokens on (absolute block
placement), cut at `max_tokens` and at the first EOS; a stop string ends it where the string
starts (the choice's row is then freed: fewer forwards than decoding on). A block's text is
what the decoded prefix adds (a byte-level tokenizer's incomplete character waits for the next
block).

A request that asks for the denoising (`denoise`, the API's `orl_denoise`) also gets `canvas`
events: after each device call, the positions of its response whose token changed (committed,
or edited by an editing rule) and the forwards run so far. While such a request holds a slot,
device calls run one engine iteration each, so each canvas event is one forward's commits
(docs/serving.md#the-playground); the other requests' answers do not change, only their calls
get shorter.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, NamedTuple, Protocol

import numpy as np

from orl_jax.data.tokenizer import token_text
from orl_jax.decode.config import DecodeConfig
from orl_jax.serve.engine import EngineShape, Entry, HostView
from orl_jax.unmasking import UnmaskRule


class QueueFull(RuntimeError):
  """More choices wait than `serve.max_waiting` allows (HTTP 429)."""


class Draining(RuntimeError):
  """The server is shutting down and takes no new request (HTTP 503)."""


class Engine(Protocol):
  """What the scheduler needs of an engine (`engine.BlockEngine`)."""
  shape: EngineShape
  cfg: DecodeConfig
  params: Any

  def dispatch(self, entries: list[Entry], cancel_slots: list[int], **call): ...

  def fetch(self, view) -> HostView: ...

  def set_params(self, params) -> None: ...


class Event(NamedTuple):
  """What a request's handler receives, in order, per choice: `block` events (and `canvas`
  events, for a request with `denoise`), then `done`."""
  kind: str                    # "block" | "canvas" | "done" | "error"
  choice: int
  text: str                    # block: the text it adds; done: the choice's whole text
  finish_reason: str | None = None   # done: "stop" (EOS or a stop string) | "length"
  usage: dict | None = None    # done: this choice's counts (`ChoiceUsage` as a dict)
  canvas: dict | None = None   # canvas: what changed on the response (`Scheduler._canvas`)


@dataclasses.dataclass
class Request:
  """One API request: `n` choices of one prompt."""
  prompt: list[int]            # prompt token ids (at most the engine's prompt length)
  max_tokens: int
  rule: UnmaskRule
  temperature: float
  seed: int
  emit: Callable[[Event], None]   # called on the scheduler thread, must not block
  n: int = 1
  stop: tuple[str, ...] = ()
  stream: bool = True          # False: no `block` events (only `done`)
  denoise: bool = False        # `canvas` events too, one per forward (module docstring)
  arrival: float = dataclasses.field(default_factory=time.monotonic)
  first_block: float | None = None
  admitted: float | None = None   # when its first choice took a slot
  cancelled: bool = False


@dataclasses.dataclass
class _Choice:
  request: Request
  index: int
  slot: int = -1
  call: int = -1               # the device call that admitted it
  lead: int = 0
  blocks_seen: int = 0
  text: str = ""               # sent so far
  stopped: bool = False        # a stop string ended it
  canvas: np.ndarray | None = None   # [max_tokens] response tokens sent in canvas events


class Stats(NamedTuple):
  """The scheduler's state for /health and /metrics."""
  waiting: int                 # choices waiting for a slot
  active: int                  # choices holding a slot
  busy_rows: int
  rows: int
  calls: int
  iterations: int
  model_version: int
  draining: bool


class _InFlight(NamedTuple):
  """A dispatched device call whose view the host has not read yet."""
  view: object                 # the view on the device (`Engine.fetch`)
  number: int                  # calls dispatched before it
  cancel: list[int]            # slots it took off the device
  admitted: int                # entries it admitted
  start: float


class Scheduler:
  """Owns `engine` on one thread (module docstring). `tokenizer`: decode(ids) and eos_id;
  `on_call(seconds, busy_rows)`: called after each device call (metrics).

  Calls are pipelined: the next call is dispatched before the last one's view is read, so the
  host's work (admission, text, events) overlaps the device's. A choice is read only in the
  views of calls from the one that admitted it on; a slot is reused only after the view of
  the call that released it was read."""

  def __init__(self, engine: Engine, tokenizer, *, max_waiting: int,
               on_call: Callable[[float, int], None] | None = None):
    self.engine, self.tokenizer = engine, tokenizer
    self.max_waiting = max_waiting
    self._on_call = on_call
    shape = engine.shape
    self._free = collections.deque(range(shape.slots))
    self._queue: collections.deque[_Choice] = collections.deque()
    self._active: dict[int, _Choice] = {}          # slot -> choice
    self._cancel_next: list[int] = []              # slots to cancel at the next call
    self._lock = threading.Condition()
    self._incoming: list[_Choice] = []
    self._cancelled: list[Request] = []
    self._reloads: list[tuple[object, concurrent.futures.Future]] = []
    self._swaps: list[tuple[object, concurrent.futures.Future]] = []   # this thread's
    self._stopping = False
    self.draining = False
    self._device_waiting = 0
    self._busy_rows = 0
    self._dispatched = 0
    self._calls = 0
    self._iterations = 0
    self.model_version = 0
    self._thread = threading.Thread(target=self._loop, name="orl-engine", daemon=True)
    self.error: BaseException | None = None

  # ---------------------------------------------------------------- called from other threads

  def start(self) -> None:
    self._thread.start()

  def submit(self, request: Request) -> None:
    """Queues the request's choices; QueueFull past `max_waiting` waiting choices, Draining
    while shutting down."""
    with self._lock:
      if self.draining or self._stopping:
        raise Draining("the server is shutting down and takes no new requests")
      if self.error is not None:
        raise RuntimeError(f"the engine stopped: {self.error}")
      waiting = len(self._queue) + len(self._incoming)
      if waiting + request.n > self.max_waiting:
        raise QueueFull(f"{waiting} choices are waiting for the engine, serve.max_waiting="
                        f"{self.max_waiting}: retry later")
      self._incoming.extend(_Choice(request, i) for i in range(request.n))
      self._lock.notify()

  def cancel(self, request: Request) -> None:
    """The request's client is gone: its choices leave the queue and free their rows at the
    next call; no more events are emitted for it."""
    with self._lock:
      request.cancelled = True
      self._cancelled.append(request)
      self._lock.notify()

  def reload(self, params) -> concurrent.futures.Future:
    """Serves `params` (the same tree and shapes) once the choices in flight have finished;
    admission pauses meanwhile (waiting requests wait, none is dropped). The future's result
    is the new model version."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    with self._lock:
      self._reloads.append((params, future))
      self._lock.notify()
    return future

  def drain(self) -> None:
    """No new requests (Draining); the ones in flight or waiting finish."""
    with self._lock:
      self.draining = True
      self._lock.notify()

  def idle(self) -> bool:
    with self._lock:
      return not (self._incoming or self._queue or self._active or self._reloads or self._swaps)

  def stop(self, timeout: float | None = None) -> None:
    with self._lock:
      self._stopping = True
      self._lock.notify()
    self._thread.join(timeout)

  def stats(self) -> Stats:
    with self._lock:
      return Stats(len(self._queue) + len(self._incoming), len(self._active), self._busy_rows,
                   self.engine.shape.rows, self._calls, self._iterations, self.model_version,
                   self.draining)

  # ------------------------------------------------------------------ the scheduler thread

  def _has_work(self) -> bool:
    return bool(self._incoming or self._cancelled or self._queue or self._active
                or self._reloads or self._swaps or self._cancel_next)

  def _loop(self) -> None:
    in_flight: _InFlight | None = None
    try:
      while True:
        with self._lock:         # only what other threads hand over; the rest is this thread's
          while not (self._has_work() or in_flight or self._stopping):
            self._lock.wait()
          if self._stopping:
            break
          self._queue.extend(self._incoming)
          self._incoming.clear()
          cancelled, self._cancelled = self._cancelled, []
          self._swaps.extend(self._reloads)
          self._reloads.clear()
        self._drop_cancelled(cancelled)
        if in_flight is None:
          self._swap_weights()
        entries = self._admit(0 if in_flight is None else in_flight.admitted)
        dispatch = bool(entries or self._active or self._cancel_next)
        cancel = self._cancel_next if dispatch else []
        if dispatch:
          self._cancel_next = []
        new = None
        if dispatch:
          if any(c.request.denoise for c in self._active.values()):
            view = self.engine.dispatch(entries, cancel, iterations=1)
          else:
            view = self.engine.dispatch(entries, cancel)
          new = _InFlight(view, self._dispatched, cancel, len(entries), time.perf_counter())
          self._dispatched += 1
        if in_flight is not None:
          self._read_call(in_flight)
        in_flight = new
    except BaseException as e:  # noqa: BLE001 - every request learns the engine is gone
      logging.exception("the engine thread stopped")
      with self._lock:
        self.error = e
        for c in list(self._active.values()) + list(self._queue) + self._incoming:
          if not c.request.cancelled:
            c.request.emit(Event("error", c.index, f"the engine stopped: {e}"))

  def _read_call(self, call: _InFlight) -> None:
    view = self.engine.fetch(call.view)
    seconds = time.perf_counter() - call.start
    self._free.extend(call.cancel)             # that call took them off the device
    self._calls += 1
    self._iterations, self._device_waiting = view.iterations, view.waiting
    self._busy_rows = int(np.sum(view.row_slot < self.engine.shape.slots))
    self._read(view, call.number)
    if self._on_call is not None:
      self._on_call(seconds, self._busy_rows)

  def _drop_cancelled(self, requests: list[Request]) -> None:
    if not requests:
      return
    self._queue = collections.deque(c for c in self._queue if not c.request.cancelled)
    for slot, c in list(self._active.items()):
      if c.request.cancelled:
        del self._active[slot]
        self._cancel_next.append(slot)

  def _swap_weights(self) -> None:
    """A pending reload happens once no choice holds a slot (admission waits for it)."""
    if not self._swaps or self._active or self._cancel_next:
      return
    reloads, self._swaps = self._swaps, []
    params, _ = reloads[-1]
    try:
      self.engine.set_params(params)
    except Exception as e:  # noqa: BLE001 - the caller learns why; the old weights serve on
      for _, future in reloads:
        future.set_exception(e)
      return
    self.model_version += 1
    for _, future in reloads:
      future.set_result(self.model_version)

  def _admit(self, unread: int) -> list[Entry]:
    """Waiting choices into free slots, as many as the device's waiting order surely takes
    (`unread`: admissions of a call whose view is not read yet)."""
    if self._swaps:
      return []
    room = self.engine.shape.waiting - self._device_waiting - unread
    entries: list[Entry] = []
    b = self.engine.cfg.block_size
    absolute = self.engine.cfg.block_placement == "absolute"
    now = time.monotonic()
    while self._queue and self._free and len(entries) < room:
      c = self._queue.popleft()
      c.slot, c.call = self._free.popleft(), self._dispatched
      r = c.request
      c.lead = len(r.prompt) % b if absolute else 0
      r.admitted = r.admitted or now
      self._active[c.slot] = c
      entries.append(Entry(c.slot, np.asarray(r.prompt, np.int32), r.seed, c.index,
                           r.max_tokens, r.rule, r.temperature))
    return entries

  def _finished_blocks(self, blocks: np.ndarray) -> np.ndarray:
    """[...] leading finished blocks of [..., M*b] decoded blocks (a finished block holds no
    mask)."""
    b, mask = self.engine.cfg.block_size, self.engine.cfg.mask_id
    if not blocks.size:
      return np.zeros(blocks.shape[:-1], np.int64)
    whole = np.all(blocks.reshape(blocks.shape[:-1] + (-1, b)) != mask, axis=-1)
    return np.sum(np.cumprod(whole, axis=-1), axis=-1)

  def _read(self, view: HostView, number: int) -> None:
    """Events for what call `number` finished; slots of finished choices are freed. Only the
    retired slots and the rows that finished a block a streamed request (or a stop string)
    waits for are looked at."""
    active = self._active
    for slot in np.flatnonzero(view.done).tolist():
      c = active.get(slot)
      if c is not None and c.call <= number:        # not admitted by a later call
        if c.request.denoise:
          self._canvas(c, view.blocks[slot], int(view.nfe_engine[slot]))
        self._progress(c, view.blocks[slot], final=True)
        self._finish(c, view, slot, on_row=None)
    self._read_canvases(view, number)
    finished = self._finished_blocks(view.row_blocks)
    for row in np.flatnonzero(finished).tolist():
      slot = int(view.row_slot[row])
      c = active.get(slot)
      if (c is not None and c.call <= number and finished[row] > c.blocks_seen
          and (c.request.stream or c.request.stop)
          and self._progress(c, view.row_blocks[row], final=False)):
        self._finish(c, view, slot, on_row=row)

  def _read_canvases(self, view: HostView, number: int) -> None:
    """Canvas events of the rows whose choice asked for the denoising: its finished blocks
    with the block it is denoising laid over them."""
    if view.row_active is None or view.row_tokens is None:
      return
    b = self.engine.cfg.block_size
    for row, slot in enumerate(view.row_slot.tolist()):
      c = self._active.get(slot)
      if c is None or c.call > number or not c.request.denoise:
        continue
      blocks = view.row_blocks[row].copy()
      block = int(view.row_active[row])
      if block >= 0:
        blocks[block * b:(block + 1) * b] = view.row_tokens[row]
      self._canvas(c, blocks, int(view.row_nfe[row]))

  def _canvas(self, c: _Choice, blocks: np.ndarray, forwards: int) -> None:
    """Emits the choice's canvas event: [position, token id, token text] of each response
    position (`max_tokens` of them) that changed since the last one, after `forwards` forwards
    the engine ran for it (none when nothing changed)."""
    r, cfg = c.request, self.engine.cfg
    tokens = blocks[c.lead:c.lead + r.max_tokens]
    if c.canvas is None:
      c.canvas = np.full((r.max_tokens,), cfg.mask_id, blocks.dtype)
    changed = np.flatnonzero(tokens != c.canvas[:len(tokens)]).tolist()
    if not changed or r.cancelled:
      return
    c.canvas[:len(tokens)] = tokens
    commits = [[p, int(tokens[p]), "" if tokens[p] == cfg.mask_id
                else token_text(self.tokenizer, tokens[p])] for p in changed]
    r.emit(Event("canvas", c.index, "", canvas={
        "forwards": forwards, "length": r.max_tokens, "block_size": cfg.block_size,
        "lead": c.lead, "mask_id": cfg.mask_id, "eos_id": self.tokenizer.eos_id,
        "commits": commits}))

  def _response(self, c: _Choice, blocks: np.ndarray, upto: int) -> tuple[np.ndarray, bool]:
    """(the choice's response tokens through finished block `upto`, cut at max_tokens and
    before the first EOS; an EOS was reached)."""
    r = c.request
    tokens = blocks[c.lead:upto * self.engine.cfg.block_size][:r.max_tokens]
    eos = np.flatnonzero(tokens == self.tokenizer.eos_id)
    return (tokens[:eos[0]], True) if eos.size else (tokens, False)

  def _progress(self, c: _Choice, blocks: np.ndarray, final: bool) -> bool:
    """Emits a `block` event per block the choice finished since the last call (a request
    neither streamed nor stopped by a string: its text once, when final). -> True when a
    stop string ended the choice (its `done` then follows)."""
    finished = int(self._finished_blocks(blocks))
    r = c.request
    if not (r.stream or r.stop):
      c.blocks_seen = finished
      c.text = self.tokenizer.decode(self._response(c, blocks, finished)[0])
      return False
    while c.blocks_seen < finished:
      c.blocks_seen += 1
      tokens, _ = self._response(c, blocks, c.blocks_seen)
      text = self.tokenizer.decode(tokens)
      stop_at = _stop_index(text, r.stop, len(c.text))
      if stop_at is not None:
        text = text[:stop_at]
      elif text.endswith("\ufffd") and not final:
        continue                    # an incomplete character: its next bytes are in a later block
      new = text[len(c.text):]
      if r.first_block is None:
        r.first_block = time.monotonic()
      c.text += new
      if new and r.stream and not r.cancelled:
        r.emit(Event("block", c.index, new))
      if stop_at is not None:
        c.stopped = True
        return True
    return False

  def _finish(self, c: _Choice, view: HostView, slot: int, on_row: int | None) -> None:
    """The choice's `done` event; its slot is freed (at once, or, for a stop string ending it
    on a row, once the next call has taken it off)."""
    r = c.request
    del self._active[slot]
    if on_row is None:
      self._free.append(slot)
      blocks = view.blocks[slot]
      forwards = (int(view.nfe[slot]), int(view.nfe_denoise[slot]), int(view.nfe_engine[slot]))
    else:
      self._cancel_next.append(slot)
      blocks = view.row_blocks[on_row]
      engine = int(view.row_nfe[on_row])
      forwards = (engine, int(view.row_denoise[on_row]), engine)
    tokens, eos = self._response(c, blocks, c.blocks_seen)
    if c.stopped:      # the tokens before the stop string
      tokens = tokens[:_tokens_for(self.tokenizer, tokens, len(c.text))]
      eos = False
    usage = ChoiceUsage(len(tokens), len(tokens) + eos, *forwards).as_dict()
    reason = "stop" if (eos or c.stopped) else "length"
    if not r.cancelled:
      r.emit(Event("done", c.index, c.text, reason, usage))


def _tokens_for(tokenizer, tokens: np.ndarray, n_chars: int) -> int:
  """The most leading `tokens` whose text fits in `n_chars` characters (the tokens before a
  stop string)."""
  lo, hi = 0, len(tokens)
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if len(tokenizer.decode(tokens[:mid])) <= n_chars:
      lo = mid
    else:
      hi = mid - 1
  return lo


def _stop_index(text: str, stops: tuple[str, ...], searched: int) -> int | None:
  """Where the first stop string starts in `text` (looking from just before `searched`, the
  text already sent), or None."""
  hits = [text.find(s, max(0, searched - len(s) + 1)) for s in stops if s]
  hits = [h for h in hits if h >= 0]
  return min(hits) if hits else None


@dataclasses.dataclass(frozen=True)
class ChoiceUsage:
  """What one choice cost. `generated` counts the tokens through the first EOS (the EOS
  included, as TPF counts them); `forwards` is the paper's count (denoising forwards + one
  commit forward per decoded block), `forwards_denoise` the authors' (denoising only),
  `forwards_engine` what the engine ran (commits nobody reads skipped)."""
  completion_tokens: int
  generated: int
  forwards: int
  forwards_denoise: int
  forwards_engine: int

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)
