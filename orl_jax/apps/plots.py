"""PNG plots: training curves and the accuracy-vs-TPF frontier."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from orl_jax.metrics import read_jsonl  # noqa: E402


def running_mean(ys, window: int) -> list[float]:
  """Trailing mean over `window` values (fewer at the start)."""
  return [sum(ys[max(0, i - window + 1):i + 1]) / len(ys[max(0, i - window + 1):i + 1])
          for i in range(len(ys))]


def _finish(fig, png_path: str, title: str) -> str:
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return png_path


def plot_training_curves(jsonl_path: str, png_path: str, keys=None, title: str = "") -> str:
  rows = read_jsonl(jsonl_path)
  if not rows:
    raise ValueError(f"no metrics in {jsonl_path}")
  keys = keys or [k for k in rows[-1] if k != "step"]
  n = len(keys)
  cols = min(3, n)
  n_rows = (n + cols - 1) // cols
  fig, axes = plt.subplots(n_rows, cols, figsize=(4.5 * cols, 3 * n_rows), squeeze=False)
  for ax, key in zip(axes.flat, keys):
    pts = [(r["step"], r[key]) for r in rows if key in r]
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    ax.plot(xs, ys, alpha=0.35, color="tab:blue")
    if len(ys) >= 8:  # a running mean makes trends readable through rollout noise
      ax.plot(xs, running_mean(ys, max(len(ys) // 10, 3)), color="tab:blue")
    ax.set_title(key, fontsize=9)
    ax.set_xlabel("step", fontsize=8)
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[n:]:
    ax.axis("off")
  return _finish(fig, png_path, title)


def plot_curves_side_by_side(runs: dict, png_path: str, keys=("reward", "rollout_tpf"),
                             title: str = "") -> str:
  """One panel per metric, one line (running mean over the raw values) per run.
  `runs`: {label: metrics.jsonl path}."""
  fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 3.4), squeeze=False)
  for ax, key in zip(axes.flat, keys):
    for label, path in runs.items():
      pts = [(r["step"], r[key]) for r in read_jsonl(path) if key in r]
      if not pts:
        continue
      xs, ys = [p[0] for p in pts], [p[1] for p in pts]
      ax.plot(xs, running_mean(ys, max(len(ys) // 10, 1)), label=label)
    ax.set_title(key, fontsize=9)
    ax.set_xlabel("iteration", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
  return _finish(fig, png_path, title)


def plot_frontier(all_results: dict, png_path: str, title: str = "accuracy vs tokens per forward"):
  """One marker series per model; each point a decoder setting (x = pooled TPF)."""
  fig, ax = plt.subplots(figsize=(6, 4.2))
  for model, settings in all_results.items():
    pts = sorted((r["tpf_pooled"], r["accuracy"], label) for label, r in settings.items())
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=model)
    for x, y, label in pts:
      ax.annotate(label, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
  ax.set_xlabel("tokens per forward (pooled)")
  ax.set_ylabel("accuracy")
  ax.set_title(title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(png_path, dpi=110)
  plt.close(fig)
  return png_path
