"""Plain data across the judge/sample boundary: a strict, tagged JSON codec and message framing.

The judge (which holds the unit tests) and the sandboxed sample (which holds the candidate
function) share no memory; they exchange length-prefixed JSON messages over pipes. Values are
*plain data* only, encoded so that their Python type survives the trip:

  None, bool, str, int, finite float   JSON as is (ints beyond 2**63 as {"$int": hex})
  list                                  JSON array
  tuple, set, frozenset                 {"$tuple": [...]}, {"$set": [...]}, {"$frozenset": [...]}
  dict (any hashable keys)              {"$dict": [[key, value], ...]}
  bytes, complex, inf / nan             {"$bytes": base64}, {"$complex": [re, im]},
                                        {"$float": "inf" | "-inf" | "nan"}

Anything else (a subclass of a built-in type included) cannot be encoded: `WireError`. The
decoder builds exact built-in values only, so whatever the sample sends, the judge compares
ordinary data with ordinary operators. Only the standard library is imported: the sandbox
runner loads this file directly.

The judge decodes what a hostile sample sends, so decoding has a bounded cost. Before any object
is built, `loads` refuses a message with more than `MAX_ELEMENTS` JSON values or nested deeper
than the JSON form of `MAX_DEPTH` (a scan of the bytes, linear, no recursion); `decode` refuses
sets, frozensets and dict keys in which more than `MAX_EQUAL_HASHES` keys share one hash value
(integers, floats and tuples of them can be chosen to collide; inserting n colliding keys costs
n^2), so building a container costs at most `MAX_EQUAL_HASHES` probes per key. Strings and bytes
hash with the per-process random key and cannot be made to collide.
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import struct

MAX_DEPTH = 64
MAX_ELEMENTS = 1 << 19
MAX_EQUAL_HASHES = 16
# JSON nesting of a value of depth MAX_DEPTH: each tagged container adds an object and an array.
_MAX_JSON_DEPTH = 2 * MAX_DEPTH + 8
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_HEADER = struct.Struct(">I")
_BIG = 1 << 63
_TAGS = ("$int", "$float", "$tuple", "$set", "$frozenset", "$dict", "$bytes", "$complex")


class WireError(ValueError):
  """A value is not plain data, or a message is malformed or too large."""


def encode(value, depth: int = 0):
  """`value` as JSON-compatible data (see the module docstring); raises `WireError`."""
  if depth > MAX_DEPTH:
    raise WireError(f"value nested deeper than {MAX_DEPTH}")
  kind = type(value)
  if value is None or kind is bool or kind is str:
    return value
  if kind is int:
    return value if -_BIG < value < _BIG else {"$int": hex(value)}
  if kind is float:
    return value if math.isfinite(value) else {"$float": repr(value)}
  if kind is list:
    return [encode(item, depth + 1) for item in value]
  if kind is tuple:
    return {"$tuple": [encode(item, depth + 1) for item in value]}
  if kind is set or kind is frozenset:
    return {"$" + kind.__name__: [encode(item, depth + 1) for item in value]}
  if kind is dict:
    return {"$dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
  if kind is bytes:
    return {"$bytes": base64.b64encode(value).decode("ascii")}
  if kind is complex:
    return {"$complex": [encode(value.real, depth + 1), encode(value.imag, depth + 1)]}
  raise WireError(f"{kind.__module__}.{kind.__qualname__} is not plain data")


def decode(data, depth: int = 0):
  """Inverse of `encode`; builds built-in values only; raises `WireError` on anything else."""
  if depth > MAX_DEPTH:
    raise WireError(f"value nested deeper than {MAX_DEPTH}")
  kind = type(data)
  if data is None or kind is bool or kind is str or kind is int:
    return data
  if kind is float:
    return data
  if kind is list:
    return [decode(item, depth + 1) for item in data]
  if kind is not dict or len(data) != 1:
    raise WireError(f"malformed value of type {kind.__name__}")
  (tag, body), = data.items()
  try:
    if tag == "$int" and type(body) is str:
      return int(body, 16)
    if tag == "$float" and body in ("inf", "-inf", "nan"):
      return float(body)
    if tag == "$bytes" and type(body) is str:
      return base64.b64decode(body.encode("ascii"), validate=True)
    if type(body) is not list:
      raise WireError(f"malformed {tag!r}")
    items = [decode(item, depth + 1) for item in body]
    if tag == "$tuple":
      return tuple(items)
    if tag == "$set":
      return set(_spread_hashes(items))
    if tag == "$frozenset":
      return frozenset(_spread_hashes(items))
    if tag == "$complex" and len(items) == 2 and all(type(x) is float for x in items):
      return complex(*items)
    if tag == "$dict" and all(type(pair) is list and len(pair) == 2 for pair in items):
      _spread_hashes([key for key, _ in items])
      return {key: value for key, value in items}
  except (TypeError, ValueError, UnicodeError) as error:   # unhashable key, bad base64, ...
    raise WireError(f"malformed {tag!r}: {error}") from None
  raise WireError(f"malformed or unknown tag {tag!r}")


def _spread_hashes(keys: list) -> list:
  """`keys`, if no more than MAX_EQUAL_HASHES of them share a hash value (hash flooding)."""
  counts: dict[int, int] = {}   # hash values are ints that hash to themselves: no collisions
  for key in keys:
    digest = hash(key)
    counts[digest] = counts.get(digest, 0) + 1
    if counts[digest] > MAX_EQUAL_HASHES:
      raise WireError(f"more than {MAX_EQUAL_HASHES} keys of one container share a hash value "
                      "(hash flooding)")
  return keys


def check_cost(payload: bytes) -> None:
  """Refuses a JSON payload with more than MAX_ELEMENTS values or deeper than the JSON form of
  MAX_DEPTH, before any object is built (one linear scan; strings are skipped)."""
  skeleton = _JSON_STRING.sub(b'""', payload)
  brackets = skeleton.translate(None, _NOT_BRACKETS)
  if len(brackets) // 2 + skeleton.count(b",") + 1 > MAX_ELEMENTS:
    raise WireError(f"message holds more than {MAX_ELEMENTS} values")
  depth = 0
  for byte in brackets:
    depth += 1 if byte in b"[{" else -1
    if depth > _MAX_JSON_DEPTH:
      raise WireError(f"value nested deeper than {MAX_DEPTH}")


def _no_constant(name):
  raise WireError(f"bare {name} is not allowed (use the $float tag)")


def dumps(message: dict) -> bytes:
  """A message (a dict with string keys whose values are already encoded) as framed bytes."""
  payload = json.dumps(message, allow_nan=False, separators=(",", ":")).encode("utf-8")
  return _HEADER.pack(len(payload)) + payload


def loads(payload: bytes) -> dict:
  check_cost(payload)
  try:
    message = json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
  except (ValueError, RecursionError) as error:   # JSONDecodeError, int digit limit, depth
    raise WireError(f"malformed message: {error}") from None
  if type(message) is not dict:
    raise WireError("a message must be a JSON object")
  return message


def write_all(fd: int, data: bytes) -> None:
  view = memoryview(data)
  while view:
    written = os.write(fd, view)
    view = view[written:]


def write_message(fd: int, message: dict) -> None:
  write_all(fd, dumps(message))


def _read_exact(fd: int, size: int) -> bytes | None:
  chunks, left = [], size
  while left:
    chunk = os.read(fd, min(left, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    left -= len(chunk)
  return b"".join(chunks)


def read_frame(fd: int, max_bytes: int) -> bytes | None:
  """The next message on `fd` as undecoded bytes; None at end of file; `WireError` if it is cut
  short or larger than `max_bytes` (refused from its header, before it is read)."""
  header = _read_exact(fd, _HEADER.size)
  if header is None:
    return None
  (size,) = _HEADER.unpack(header)
  if size > max_bytes:
    raise WireError(f"message of {size} bytes exceeds the {max_bytes}-byte limit")
  payload = _read_exact(fd, size)
  if payload is None:
    raise WireError("message cut short")
  return payload


def read_message(fd: int, max_bytes: int) -> dict | None:
  """The next message on `fd`; None at end of file; `WireError` if malformed or too large."""
  payload = read_frame(fd, max_bytes)
  return None if payload is None else loads(payload)
