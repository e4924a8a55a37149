"""Every headline figure of docs/benchmarks.md's results table is the committed results JSON
it names, to the doc's rounding.

`FIGURES` maps each documented figure (the text as the doc prints it) to the JSON under
benchmarks/results/ and the field it comes from (a path of keys, or a function of the JSON
where the doc derives it), and the format the doc prints it in. A figure whose JSON moved, or
a re-run whose JSON no longer rounds to the doc's text, fails here; so does a bold (headline)
figure of the table that `FIGURES` does not cover.
"""
from __future__ import annotations

import json
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
RESULTS = os.path.join(ROOT, "benchmarks", "results")
GIB = float(1 << 30)


def _at(*keys):
  """The field at a path of keys (list indices as ints)."""
  def get(data):
    for k in keys:
      data = data[k]
    return data
  return get


def _serve_sweep_ratio(data) -> float:
  """ORL's served tok/s over the base's, both at threshold 0.9."""
  tps = {(p["model"], p["setting"]): p["clean_tokens_per_s"] for p in data["points"]}
  return tps[("orl", "threshold_0.9")] / tps[("base", "threshold_0.9")]


def _kernel_cases(data) -> str:
  cases = data["default"]
  return f"{sum(c['accepted'] for c in cases)}/{len(cases)}"


# (the benchmark's row in the table, the figure as printed, results JSON, field, format)
FIGURES = [
    ("`decode_throughput.py`", "5.35×", "decode_throughput.json", _at("speedup"), "{:.2f}×"),
    ("`decode_throughput.py`", "34% / 63% / 37%", "decode_throughput.json",
     lambda d: " / ".join(f"{d['bounds'][b]['flop_bound_fraction']:.0%}"
                          for b in ("1", "16", "64")), "{}"),
    ("`decode_throughput.py`", "4.9% / 1.1% / 0.5%", "decode_throughput.json",
     lambda d: " / ".join(f"{d['bounds'][b]['bandwidth_bound_fraction']:.1%}"
                          for b in ("1", "16", "64")), "{}"),
    ("`replay_speedup.py`", "27.7 s", "replay_speedup.json",
     _at("by_group", "16", "naive", "seconds_median"), "{:.1f} s"),
    ("`replay_speedup.py`", "2.92 s", "replay_speedup.json",
     _at("by_group", "16", "packed", "seconds_median"), "{:.2f} s"),
    ("`replay_speedup.py`", "9.5×", "replay_speedup.json", _at("by_group", "16", "speedup"),
     "{:.1f}×"),
    ("`staircase_kernel.py`", "87%", "staircase_kernel.json",
     _at("rows", "tiny_demo", "fraction_skipped"), "{:.0%}"),
    ("`kernel_compile.py`", "150/150", "kernel_compile.json", _kernel_cases, "{}"),
    ("`moe_layer_compile.py`", "22.89 GiB", "moe_layer_compile.json",
     lambda d: d["temp_bytes"] / GIB, "{:.2f} GiB"),
    ("`bidirectional_cache.py`", "3.05×", "bidirectional_cache.json",
     _at("results", "dual", "tps_vs_none"), "{:.2f}×"),
    ("`serve_load.py`", "0.946", "serve_load.json", _at("saturation", "ratio_median"), "{:.3f}"),
    ("`math_rule_vs_math_verify.py`", "34 math-verify right", "math_rule_vs_math_verify.json",
     _at("math_verify_right_ours_wrong"), "{} math-verify right"),
    ("`serve_sweep.py`", "1.39×", "serve_sweep.json", _serve_sweep_ratio, "{:.2f}×"),
    ("`prefill_once.py`", "1.32×", "prefill_once.json", _at("runs", 0, "speedup_measured"),
     "{:.2f}×"),
    ("`prefill_once.py`", "1.53×", "prefill_once.json", _at("runs", 1, "speedup_measured"),
     "{:.2f}×"),
    ("`prefill_once.py --schedules per_row --rounds 3`", "1.13×", "prefill_once_per_row.json",
     _at("runs", 0, "speedup_measured"), "{:.2f}×"),
    ("`prefill_once.py --schedules per_row --rounds 3`", "1.72×", "prefill_once_per_row.json",
     _at("runs", 1, "speedup_measured"), "{:.2f}×"),
    ("`prefill_once_options.py`", "1.34×", "prefill_once_options.json",
     _at("runs", 0, "once_no_fusions_vs_repeated_default"), "{:.2f}×"),
    ("`prefill_once_options.py`", "1.77×", "prefill_once_options.json",
     _at("runs", 1, "once_no_fusions_vs_repeated_default"), "{:.2f}×"),
    ("`snapshot_write.py`", "0.08", "snapshot_write.json", _at("blocking_fraction"), "{:.2f}"),
    ("`iteration_overlap.py --part a`", "84%", "iteration_overlap_tiny.json",
     _at("saved_share_of_serial_verification"), "{:.0%}"),
    ("`iteration_overlap.py` (part b", "7%", "iteration_overlap.json",
     _at("worst_idle_fraction_overlapped_sample_isolation"), "{:.0%}"),
    ("`sandbox_cost.py`", "27.1 ms", "sandbox_cost.json",
     _at("ms_per_sample", "current", "total"), "{:.1f} ms"),
    ("`vocab_memory.py`", "5.6×", "vocab_memory.json", _at("orl_peak_reduction"), "{:.1f}×"),
]


def _table_rows() -> dict[str, str]:
  """{the row's first cell: the row} of the results table."""
  rows = {}
  with open(DOC) as fh:
    for line in fh:
      if line.startswith("| `"):
        first = line.split("|")[1].strip()
        rows[first] = line
  return rows


def _row(rows: dict, name: str) -> str:
  matches = [row for first, row in rows.items() if first.startswith(name)]
  assert len(matches) == 1, f"docs/benchmarks.md: {len(matches)} table rows start with {name}"
  return matches[0]


@pytest.mark.parametrize("name,figure,path,field,fmt", FIGURES,
                         ids=[f"{f[2]}:{f[1]}" for f in FIGURES])
def test_documented_figure_is_the_committed_result(name, figure, path, field, fmt):
  row = _row(_table_rows(), name)
  assert figure in row, f"docs/benchmarks.md's {name} row no longer prints {figure!r}"
  with open(os.path.join(RESULTS, path)) as fh:
    value = field(json.load(fh))
  assert fmt.format(value) == figure, (
      f"docs/benchmarks.md's {name} row prints {figure!r}; benchmarks/results/{path} holds "
      f"{value!r}, printed {fmt.format(value)!r}")


def test_every_headline_figure_is_checked():
  """Each bold figure of the table holds a figure that FIGURES checks."""
  rows, checked = _table_rows(), {}
  for name, figure, *_ in FIGURES:
    checked.setdefault(_row(rows, name), []).append(figure)
  for first, row in rows.items():
    for bold in re.findall(r"\*\*(.+?)\*\*", row):
      assert any(f in bold for f in checked.get(row, [])), (
          f"docs/benchmarks.md: the headline {bold!r} of the {first} row is not in FIGURES")
