"""The largest buffers of a program libtpu refused for HBM, from libtpu's own report.

When a program does not fit a TPU's HBM, the exception says only the total ("Ran out of memory
on HBM ... (370.30G) exceeds available HBM (95.74G)"). libtpu writes which buffers make up that
total to its log (`TPU_LOG_DIR`, one `tpu_driver.*.log.ERROR.*.<pid>` file a process) as a
"Memory usage report": one table a memory space, a row per buffer offset with its size and the
shapes of the values that share it. `largest_buffers` reads the HBM table (the first) of the
newest report this process wrote, so a refusal can name what holds the memory.
"""
from __future__ import annotations

import glob
import os
import re
import tempfile
from typing import NamedTuple

# libtpu's default when TPU_LOG_DIR is unset; `targets.use_compiler` sets it to this
DEFAULT_LOG_DIR = os.path.join(tempfile.gettempdir(), "tpu_logs")
_UNIT = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
# "   16.00GiB( 33%);   16.00GiB;  17179869184;    2; bf16[65536,65536], f32[65536,65536]"
_ROW = re.compile(r"^\s*[\d.]+\w+\(\s*\d+%\);\s*(?P<size>[\d.]+)(?P<unit>[KMGT]?i?B);"
                  r"\s*\d+;\s*(?P<values>\d+);\s*(?P<shapes>.+?)\s*$")


class Buffer(NamedTuple):
  """One HBM allocation of the report: its bytes, how many values share it, their shapes."""
  nbytes: int
  values: int
  shapes: str


def log_dir() -> str:
  return os.environ.get("TPU_LOG_DIR") or DEFAULT_LOG_DIR


def largest_buffers(report: str, n: int = 4) -> list[Buffer]:
  """The `n` largest buffers of the first table (HBM, libtpu's default memory space) of a
  memory usage report, largest first; [] if `report` holds no table."""
  table: list[Buffer] = []
  started = False
  for line in report.splitlines():
    m = _ROW.match(line)
    if m:
      started = True
      table.append(Buffer(int(float(m.group("size")) * _UNIT[m.group("unit")]),
                          int(m.group("values")), m.group("shapes")))
    elif started and not line.strip():
      break                       # the first table ends at its blank line
  return sorted(table, key=lambda b: -b.nbytes)[:n]


def latest_report(directory: str | None = None, pid: int | None = None) -> str:
  """The text of the newest memory usage report in this process's libtpu ERROR log ("" if
  there is none: no log, or libtpu wrote it elsewhere)."""
  pid = os.getpid() if pid is None else pid
  paths = glob.glob(os.path.join(directory or log_dir(), f"tpu_driver.*.log.ERROR.*.{pid}"))
  if not paths:
    return ""
  with open(max(paths, key=os.path.getmtime), errors="replace") as f:
    text = f.read()
  start = text.rfind("Memory usage report")
  return "" if start < 0 else text[start:]


def describe(buffers: list[Buffer]) -> str:
  """"16.00 GiB f32[65536,65536]; 16.00 GiB 2×s32[65536,65536] (2 values); ..."."""
  def one(b: Buffer) -> str:
    shared = f" ({b.values} values)" if b.values > 1 else ""
    shapes = b.shapes if len(b.shapes) <= 120 else b.shapes[:117] + "..."
    return f"{b.nbytes / 2**30:.2f} GiB {shapes}{shared}"
  return "; ".join(one(b) for b in buffers)
