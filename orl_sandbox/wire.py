"""Values across the judge/sample boundary: plain data as a tree, and framing.

The judge (which holds the unit tests) and the sandboxed sample (which holds the candidate
function) share no memory; they exchange length-prefixed JSON messages over pipes. What crosses,
both ways (the tests' arguments to the sample, the sample's answers back), is **plain data**
(docs/verifier.md#what-crosses): None, bool, int, float (nan, inf, -0.0), complex, str, bytes,
bytearray, list, tuple, dict, set, frozenset, and `fractions.Fraction` and `decimal.Decimal`,
of exactly those types (not subclasses), as a tree:

* **No identity.** Every value is encoded afresh and decoded into new objects; nothing is
  remembered from one message to the next. An argument the tests pass twice arrives as two
  equal values; what the candidate does to its arguments is never sent back.
* **No order from the sender for sets.** A set or frozenset is rebuilt inserting its elements
  in an order fixed by their values (`_content_order`), so its iteration order in the tests is
  the same whatever the sender's set looked like.
* **No aliasing.** A sub-value that appears twice inside a value arrives as two copies; a value
  that contains itself (a cycle) is deeper than `MAX_DEPTH` and is not data.
* **Anything else is not data** (`WireError` naming its type): a generator, a named tuple, an
  enum member, a `re.Match`, a class instance, a function, a subclass of a built-in type.

A value is JSON: None, bool, str, a float that is finite and an int below 2**63 as themselves,
a list as a JSON array, everything else as a one-key tag ({"$tuple": [...]}, {"$dict": [[k, v],
...]}, {"$int": hex}, {"$float": "nan"}, ...).

The judge decodes what a hostile sample sends, so decoding has a bounded cost. `loads` refuses a
message with more than `MAX_ELEMENTS` JSON values or nested deeper than `_MAX_JSON_DEPTH` (one
linear scan, before any object is built); decoding refuses values nested deeper than
`MAX_DEPTH`, and a `Budget` counts, over all the values one judge received, the distinct values
that share each hash: more than `MAX_EQUAL_HASHES` is hash flooding (integers, floats and tuples
can be chosen to collide; inserting n colliding keys into a set or dict costs n^2, whether the
codec or the test builds it), and hashing is budgeted (`MAX_HASH_WORK`). Only the standard
library is imported: the sandbox runner loads this file directly.
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import struct
import sys

MAX_DEPTH = 64
MAX_ELEMENTS = 1 << 21   # JSON values in one message
MAX_EQUAL_HASHES = 16
MAX_HASH_WORK = 1 << 24
_MAX_JSON_DEPTH = 3 * MAX_DEPTH + 8   # a dict level is three JSON levels ({"$dict": [[k, v]]})
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_HEADER = struct.Struct(">I")
_BIG = 1 << 63
_SMALL = 1 << 60
_COLLECTIONS = {tuple: "$tuple", set: "$set", frozenset: "$frozenset"}


class WireError(ValueError):
  """A value is not plain data, or a message is malformed or too large."""


def type_name(value) -> str:
  """`module.qualname` of a value's type, for a sentence (`builtins.` left out)."""
  kind = type(value)
  module = getattr(kind, "__module__", "")
  qualname = getattr(kind, "__qualname__", kind.__name__)
  return qualname if module == "builtins" else f"{module}.{qualname}"


def _std(value, module: str, name: str) -> bool:
  """Whether `value` is exactly the standard library's `module.name` (a loaded module only)."""
  found = sys.modules.get(module)
  return found is not None and type(value) is vars(found).get(name)


class _Encoder:
  """One value's encoding: a walk that counts the nodes it writes (every copy of a shared
  sub-value again), so that a value that expands past `MAX_ELEMENTS` is refused."""

  def __init__(self):
    self.nodes = 0

  def value(self, v, depth: int):
    self.nodes += 1
    if self.nodes > MAX_ELEMENTS:
      raise WireError(f"a value of more than {MAX_ELEMENTS} parts (shared parts counted each "
                      "time) is not data")
    if depth > MAX_DEPTH:
      raise WireError(f"a value nested deeper than {MAX_DEPTH} (or containing itself) is not "
                      "data")
    kind = type(v)
    if v is None or kind is bool or kind is str:
      return v
    if kind is int:
      return v if -_BIG < v < _BIG else {"$int": hex(v)}
    if kind is float:
      return v if math.isfinite(v) else {"$float": repr(v)}
    if kind is list:
      return [self.value(x, depth + 1) for x in v]
    if kind is dict:
      return {"$dict": [[self.value(k, depth + 1), self.value(x, depth + 1)]
                        for k, x in v.items()]}
    if kind in _COLLECTIONS:
      return {_COLLECTIONS[kind]: [self.value(x, depth + 1) for x in v]}
    if kind is bytes or kind is bytearray:
      return {"$" + kind.__name__: base64.b64encode(v).decode("ascii")}
    if kind is complex:
      return {"$complex": [self.value(v.real, depth + 1), self.value(v.imag, depth + 1)]}
    if _std(v, "fractions", "Fraction"):
      return {"$fraction": [self.value(v.numerator, depth), self.value(v.denominator, depth)]}
    if _std(v, "decimal", "Decimal"):
      return {"$decimal": str(v)}
    raise WireError(f"a value of type {type_name(v)} is not plain data")


def encode(value):
  """A value as its JSON form; `WireError` when it is not plain data (its type named)."""
  try:
    return _Encoder().value(value, 0)
  except RecursionError:
    raise WireError(f"a value nested deeper than {MAX_DEPTH} is not data") from None


class Budget:
  """What hashing the values one receiver decoded costs, over all its messages: the distinct
  values seen per hash (more than `MAX_EQUAL_HASHES` is hash flooding) and the work spent."""

  def __init__(self):
    self.hashes: dict = {}
    self.work = 0

  def count(self, value, cost: int) -> None:
    """Counts `value` among the distinct values of its hash; strings and bytes hash with a
    per-process secret key and cannot be made to collide, small ints hash to themselves."""
    kind = type(value)
    if value is None or kind is bool or kind is str or kind is bytes or (
        kind is int and -_SMALL < value < _SMALL):
      return
    self.work += cost
    if self.work > MAX_HASH_WORK:
      raise WireError(f"hashing the values received would take more than {MAX_HASH_WORK} "
                      "steps")
    try:
      digest = hash(value)
    except (TypeError, ValueError):   # unhashable (a list, a signalling NaN)
      return
    seen = self.hashes.get(digest)
    if seen is None:
      self.hashes[digest] = (value,)   # the common case: one value per hash
      return
    if any(other is value or other == value for other in seen):
      return
    if len(seen) >= MAX_EQUAL_HASHES:
      raise WireError(f"more than {MAX_EQUAL_HASHES} distinct values received share a hash "
                      "value (hash flooding)")
    self.hashes[digest] = seen + (value,)


def _module(name: str):
  """A standard-library module the codec builds values of, imported on first use."""
  import importlib  # pylint: disable=import-outside-toplevel
  return sys.modules.get(name) or importlib.import_module(name)


def _content_order(value) -> tuple:
  """A set's elements are inserted in an order that depends on their values only (hash, type,
  then repr), never on the order the sender's set iterated: a sample cannot choose the
  iteration order of the set the tests receive (docs/verifier.md#what-crosses)."""
  try:
    text = repr(value)
  except ValueError:   # an int past the interpreter's digit limit (its hash orders it)
    text = ""
  return hash(value), type(value).__name__, text


class _Decoder:
  """One value's decoding into new objects; `size` of each value (its nodes) is what hashing
  it costs."""

  def __init__(self, budget: Budget):
    self.budget = budget

  def value(self, data, depth: int):
    if depth > MAX_DEPTH:
      raise WireError(f"value nested deeper than {MAX_DEPTH}")
    kind = type(data)
    if data is None or kind is bool or kind is str:
      return data, 1
    if kind is int or kind is float:
      self.budget.count(data, 1)
      return data, 1
    if kind is list:
      items = [self.value(x, depth + 1) for x in data]
      return [v for v, _ in items], 1 + sum(s for _, s in items)
    if kind is not dict or len(data) != 1:
      raise WireError(f"malformed value of type {kind.__name__}")
    (tag, body), = data.items()
    try:
      value, size = self._tagged(tag, body, depth)
    except (TypeError, ValueError, ArithmeticError, UnicodeError) as error:
      if isinstance(error, WireError):
        raise
      raise WireError(f"malformed {tag!r}: {error}") from None
    self.budget.count(value, size)
    return value, size

  def _items(self, body, depth: int) -> tuple[list, int]:
    if type(body) is not list:
      raise WireError("malformed container")
    items = [self.value(x, depth + 1) for x in body]
    return [v for v, _ in items], 1 + sum(s for _, s in items)

  def _tagged(self, tag: str, body, depth: int):
    if tag == "$tuple":
      items, size = self._items(body, depth)
      return tuple(items), size
    if tag in ("$set", "$frozenset"):
      items, size = self._items(body, depth)
      return (set if tag == "$set" else frozenset)(sorted(items, key=_content_order)), size
    if tag == "$dict":
      if type(body) is not list or not all(type(p) is list and len(p) == 2 for p in body):
        raise WireError("malformed dict")
      keys, size = self._items([k for k, _ in body], depth)
      values, more = self._items([v for _, v in body], depth)
      return dict(zip(keys, values)), size + more
    if tag == "$int" and type(body) is str:
      return int(body, 16), 1
    if tag == "$float" and body in ("inf", "-inf", "nan"):
      return float(body), 1
    if tag in ("$bytes", "$bytearray") and type(body) is str:
      raw = base64.b64decode(body.encode("ascii"), validate=True)
      return (raw if tag == "$bytes" else bytearray(raw)), 1
    if tag == "$decimal" and type(body) is str and len(body) < 10_000:
      return _module("decimal").Decimal(body), 1
    if tag in ("$complex", "$fraction") and type(body) is list and len(body) == 2:
      parts = [self.value(x, depth + 1)[0] for x in body]
      if tag == "$complex" and all(type(x) is float for x in parts):
        return complex(*parts), 1
      if tag == "$fraction" and all(type(x) is int for x in parts):
        return _module("fractions").Fraction(*parts), 1
    raise WireError(f"malformed or unknown tag {tag!r}")


def decode(data, budget: Budget | None = None):
  """Inverse of `encode`: new objects, hashing counted in `budget` (a fresh one if None)."""
  return _Decoder(budget or Budget()).value(data, 0)[0]


# ------------------------------------------------------------------------------------ framing


def check_cost(payload: bytes) -> None:
  """Refuses a JSON payload with more than MAX_ELEMENTS values or nested deeper than
  _MAX_JSON_DEPTH, before any object is built (one linear scan; strings are skipped)."""
  skeleton = _JSON_STRING.sub(b'""', payload)
  brackets = skeleton.translate(None, _NOT_BRACKETS)
  if len(brackets) // 2 + skeleton.count(b",") + 1 > MAX_ELEMENTS:
    raise WireError(f"message holds more than {MAX_ELEMENTS} values")
  depth = 0
  for byte in brackets:
    depth += 1 if byte in b"[{" else -1
    if depth > _MAX_JSON_DEPTH:
      raise WireError(f"message nested deeper than {_MAX_JSON_DEPTH}")


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
