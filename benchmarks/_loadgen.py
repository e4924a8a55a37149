"""A small HTTP/1.1 load generator over loopback (asyncio streams, keep-alive connections):
what the serving benchmarks send their requests with. It spends little CPU a request (a
general client such as httpx spends several times more), so on a 2-core machine the figures
measure the server, not the client. Server-sent event streams are read chunk by chunk (the
time of each event is kept); a request can be abandoned mid-stream (the connection closes, as
a client that goes away)."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


@dataclass
class Reply:
  status: int
  body: dict | None = None          # the JSON body (non-streamed), or the error body
  chunks: list[dict] = field(default_factory=list)   # the streamed events' JSON
  chunk_times: list[float] = field(default_factory=list)   # seconds after the request was sent
  seconds: float = 0.0              # sent -> last byte
  abandoned: bool = False           # the client closed the connection mid-stream


class Connection:
  """One keep-alive connection to `host:port`."""

  def __init__(self, url: str):
    host, port = url.split("//", 1)[1].rstrip("/").split(":")
    self.host, self.port = host, int(port)
    self._reader: asyncio.StreamReader | None = None
    self._writer: asyncio.StreamWriter | None = None

  async def _open(self) -> None:
    self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
    self._reader = self._writer = None

  async def request(self, method: str, path: str, body: bytes | dict | None = None,
                    abandon_after: int | None = None) -> Reply:
    """Sends one request; `body` a dict (as JSON) or raw bytes. `abandon_after`: close the
    connection after that many streamed events (a client going away)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
    head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    start = time.perf_counter()
    for fresh in (self._writer is None, True):   # a kept-alive connection the server closed
      if fresh:                                  # while idle is opened again, once
        self.close()
        await self._open()
      assert self._reader is not None and self._writer is not None
      self._writer.write(head + data)
      status_line = await self._reader.readline()
      if status_line:
        break
    status = int(status_line.split()[1])
    length, chunked, keep = 0, False, True
    while True:
      line = await self._reader.readline()
      if line in (b"\r\n", b""):
        break
      name, _, value = line.decode("latin-1").partition(":")
      name, value = name.strip().lower(), value.strip().lower()
      if name == "content-length":
        length = int(value)
      elif name == "transfer-encoding":
        chunked = "chunked" in value
      elif name == "connection":
        keep = value != "close"
    reply = Reply(status)
    if not chunked:
      raw = await self._reader.readexactly(length)
      reply.body = json.loads(raw) if raw else None
    else:
      buffer = b""
      while True:
        size = int((await self._reader.readline()).strip() or b"0", 16)
        chunk = await self._reader.readexactly(size + 2)
        if size == 0:
          break
        buffer += chunk[:-2]
        while b"\n\n" in buffer:
          event, buffer = buffer.split(b"\n\n", 1)
          payload = event.decode().removeprefix("data: ")
          if payload == "[DONE]":
            continue
          reply.chunks.append(json.loads(payload))
          reply.chunk_times.append(time.perf_counter() - start)
          if abandon_after is not None and len(reply.chunks) >= abandon_after:
            reply.abandoned = True
            self.close()
            reply.seconds = time.perf_counter() - start
            return reply
    reply.seconds = time.perf_counter() - start
    if not keep:
      self.close()
    return reply

  async def post(self, path: str, body: bytes | dict, **kw) -> Reply:
    return await self.request("POST", path, body, **kw)


async def closed_loop(url: str, bodies: list[dict], clients: int) -> tuple[float, list[Reply]]:
  """Every body POSTed to /v1/completions by `clients` closed-loop clients (each sends its next
  request when its last one is answered). -> (wall seconds, replies in the bodies' order)."""
  replies: list[Reply | None] = [None] * len(bodies)
  todo = list(range(len(bodies)))[::-1]

  async def client():
    conn = Connection(url)
    while todo:
      i = todo.pop()
      replies[i] = await conn.post("/v1/completions", bodies[i])
    conn.close()

  start = time.perf_counter()
  await asyncio.gather(*[client() for _ in range(clients)])
  return time.perf_counter() - start, replies  # type: ignore[return-value]


def percentile(values, q: float) -> float:
  values = sorted(values)
  if not values:
    return float("nan")
  k = min(len(values) - 1, max(0, int(round(q / 100 * (len(values) - 1)))))
  return values[k]
