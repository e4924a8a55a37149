"""What a run says when it ends (docs/method.md#metrics): its training summary read back from
metrics.jsonl, one line on the updates it applied (and, when none were, why), and the path of
every file it wrote -- the parameters, the Hugging Face export, the metrics and the curves;
and what an evaluation writes (`write_report`: the results table and the accuracy-vs-TPF
plot)."""
from __future__ import annotations

import os

import numpy as np

from orl_jax import distributed
from orl_jax.evaluate import format_table
from orl_jax.metrics import TPF_COUNT, read_jsonl

CURVE_KEYS = ("reward", "rollout_tpf", "loss_ce", "loss_aec", "loss_rkl", "residual_norm_ratio",
              "replay_entropy", "rollout_entropy_step0", "rollout_entropy_step2")
WARMUP_CURVE_KEYS = ("loss", "masked_nll", "masked_acc", "residual_norm_ratio")
CURVES_FILE = "curves.png"     # WORKDIR/curves.png: a finished run's training curves


def training_summary(metrics_path: str) -> dict:
  """What a reader checks first in a run's metrics.jsonl: the residual norm ratio at the start
  and end, the anchor's mean value over the second half, the reward at the start and end (means
  over the first and last tenth of the logged iterations) and the skipped updates."""
  rows = read_jsonl(metrics_path)
  out = {"iterations": rows[-1]["step"] if rows else 0}
  tenth = max(len(rows) // 10, 1)
  for key in ("residual_norm_ratio", "reward", "rollout_tpf", "loss_ce", "loss_aec"):
    vals = [r[key] for r in rows if key in r]
    if vals:
      out[f"{key}_start"] = float(np.mean(vals[:tenth]))
      out[f"{key}_end"] = float(np.mean(vals[-tenth:]))
  rkl = [r["loss_rkl"] for r in rows[len(rows) // 2:] if "loss_rkl" in r]
  if rkl:
    out["loss_rkl_mean_second_half"] = float(np.mean(rkl))
  # The weighted AEC term's share of the objective and its size against the CE, averaged over
  # the logged updates (issue: is AEC 0.3% or 30% of what the optimizer sees?)
  terms = [r for r in rows if "loss_aec_weighted" in r and r.get("loss", 0) > 0]
  if terms:
    out["aec_share"] = float(np.mean([r["loss_aec_weighted"] / r["loss"] for r in terms]))
    out["aec_to_ce"] = float(np.mean([r["loss_aec_weighted"] / max(r["loss_ce"], 1e-12)
                                      for r in terms]))
    out["rkl_share"] = float(np.mean([r["loss_rkl_weighted"] / r["loss"] for r in terms]))
  if rows and "updates_skipped" in rows[-1]:
    out["updates_skipped"] = rows[-1]["updates_skipped"]
  # the ORL loop's phase times (docs/training.md#verification-overlapped-with-decoding)
  for key in PHASE_KEYS:
    vals = [r[key] for r in rows if key in r]
    if vals:
      out[f"{key}_mean"] = float(np.mean(vals))
  return out


PHASE_KEYS = ("sec_rollout", "sec_verify_exposed", "sec_verify_host", "sec_plan", "sec_gather",
              "sec_update", "sec_checkpoint", "sec_iteration", "device_busy")


def phase_line(summary: dict) -> str:
  """'phase times (mean seconds per iteration): rollout 1.20, verify exposed 0.05 (host
  0.80), ...; device busy 91%' from `training_summary`, or '' for a run without them."""
  if "sec_iteration_mean" not in summary:
    return ""
  names = [(k, k.removeprefix("sec_").replace("_", " ")) for k in PHASE_KEYS[:-1]
           if k != "sec_verify_host"]
  parts = [f"{name} {summary[f'{k}_mean']:.2f}" for k, name in names]
  parts[1] += f" (host {summary['sec_verify_host_mean']:.2f})"
  return (f"phase times (mean seconds per iteration): {', '.join(parts)}; device busy "
          f"{summary['device_busy_mean']:.0%}")


def updates_line(config, summary: dict) -> str:
  """'orl: 2/2 updates applied, reward 0.00 -> 0.12, ...' -- or, when no update was applied
  because no response verified, that and what to check."""
  mode, done = config.train.mode, int(summary.get("iterations", 0))
  if mode != "orl":
    loss = "".join(f", {k} {summary[f'{k}_start']:.3f} -> {summary[f'{k}_end']:.3f}"
                   for k in ("loss",) if f"{k}_start" in summary)
    return f"{mode}: {done} updates{loss}"
  skipped = int(summary.get("updates_skipped", 0))
  applied = done - skipped
  if done and not applied:
    return (f"orl: 0/{done} updates applied: no response verified (orl.min_reward="
            f"{config.orl.min_reward:g}); check the reward/answers of the task's problems "
            "and that the model can answer some of them")
  trend = "".join(f", {name} {summary[f'{k}_start']:.2f} -> {summary[f'{k}_end']:.2f}"
                  for k, name in (("reward", "reward"), ("rollout_tpf", "rollout TPF"))
                  if f"{k}_start" in summary)
  why = f" ({skipped} skipped: no response verified)" if skipped else ""
  return f"orl: {applied}/{done} updates applied{why}{trend}"


# a trained stage's line: (training_summary key prefix, name, format), when recorded
_STAGE_TRENDS = (("reward", "reward", ".2f"), ("rollout_tpf", "rollout TPF", ".2f"),
                 ("residual_norm_ratio", "residual norm ratio", ".3f"), ("loss_ce", "CE", ".3f"))


def stage_line(label: str, summary: dict) -> str:
  """'training orl: 300 iterations, reward 0.91 -> 0.97, rollout TPF 3.53 -> 5.20, ...' from
  `training_summary` (the trends start -> end, the AEC term's share of the loss); the whole
  record stays in training_summary.json."""
  parts = [f"{int(summary.get('iterations', 0))} iterations"]
  parts += [f"{name} {summary[f'{key}_start']:{spec}} -> {summary[f'{key}_end']:{spec}}"
            for key, name, spec in _STAGE_TRENDS if f"{key}_start" in summary]
  if "aec_share" in summary:
    parts.append(f"AEC {summary['aec_share']:.1%} of the loss")
  if summary.get("updates_skipped"):
    parts.append(f"{int(summary['updates_skipped'])} updates skipped")
  return f"training {label}: {', '.join(parts)}"


def report_run(config, params_dir: str) -> list[str]:
  """The lines a finished training run ends with: `updates_line` and the path of every file
  it wrote; draws WORKDIR/curves.png from metrics.jsonl (process 0 calls this)."""
  from orl_jax.apps import plots
  from orl_jax.storage.hf_export import HF_EXPORT_DIR
  workdir = config.workdir
  metrics = os.path.join(workdir, "metrics.jsonl")
  rows = read_jsonl(metrics)
  summary = training_summary(metrics) if rows else {}
  lines = [updates_line(config, summary)] if rows else []
  if rows and any("rollout_tpf" in r for r in rows):
    lines.append(f"rollout TPF: {TPF_COUNT}")
  if phase_line(summary):
    lines.append(phase_line(summary))
  lines.append(f"parameters: {params_dir}")
  hf_dir = os.path.join(workdir, HF_EXPORT_DIR)
  if os.path.isdir(hf_dir):
    lines.append(f"Hugging Face export: {hf_dir}")
  if rows:
    mode_keys = {"orl": CURVE_KEYS, "residual_warmup": WARMUP_CURVE_KEYS}.get(config.train.mode)
    keys = [k for k in mode_keys or rows[-1] if k != "step" and any(k in r for r in rows)]
    png = plots.plot_training_curves(metrics, os.path.join(workdir, CURVES_FILE), keys=keys,
                                     title=f"{os.path.basename(workdir)}: {config.train.mode}")
    lines += [f"metrics: {metrics} (TensorBoard: {os.path.join(workdir, 'tensorboard')})",
              f"training curves: {png}"]
  return lines


def write_report(all_results: dict, workdir: str, title: str = "") -> tuple[str, str]:
  """Writes the table (results_table.txt) and the accuracy-vs-TPF Pareto plot (PNG); only
  process 0 writes, every process gets the paths."""
  from orl_jax.apps import plots
  table_path = os.path.join(workdir, "results_table.txt")
  png = os.path.join(workdir, "accuracy_vs_tpf.png")
  if distributed.is_lead_process():
    os.makedirs(workdir, exist_ok=True)
    with open(table_path, "w") as f:
      f.write(format_table(all_results) + "\n")
    png = plots.plot_frontier(all_results, png, title=title or "accuracy vs tokens per forward")
  return table_path, png
