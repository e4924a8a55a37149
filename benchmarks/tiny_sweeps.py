"""Sweeps of ORL's settings on the tiny task: each run is one ORL stage of configs/tiny.py with
overrides, trained in segments so its held-out accuracy is measured along the way, then
evaluated on the full evaluation set. One JSON holds every run (resumable: finished runs are
skipped), with the training summary (reward, rollout TPF, the AEC term's share of the
objective), the rollout entropy profile (mean normalized entropy of the masked positions at
step k of a block, over the last tenth of training) and the curves.

  python benchmarks/tiny_sweeps.py --study=aec              # loss.w_aec 1, 10, 100, 300
  python benchmarks/tiny_sweeps.py --study=anchor           # lr 2e-4 / 1e-3, with / without KL
  python benchmarks/tiny_sweeps.py --run=hot:train.lr=3e-4,loss.w_aec=10 --seeds=0,1,2
  python benchmarks/tiny_sweeps.py --plot=lr1e-3,lr1e-3_no_kl --png=curves.png   # no training
  python benchmarks/tiny_sweeps.py --record=hot:train.lr=3e-4   # a run stopped early: its logs
  python benchmarks/tiny_sweeps.py --table=lr5e-4,lr5e-4_no_kl   # mean ± std over the seeds
  python benchmarks/tiny_sweeps.py --out=benchmarks/results/tiny_anchor_drift.json \
      --plot=lr5e-4_diag --diagnostics --png=docs/img/anchor.png  # the anchor's view per update

Runs start from the committed warm-up (`assets/tiny_warmup`) unless `stage=` names a stage of
configs/tiny.py that starts from the base. A seed sets the rollout noise and the prompt order
(`demo.stage_config`).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np


STUDIES = {
    "aec": {"w_aec1": {}, "w_aec10": {"loss.w_aec": 10.0}, "w_aec100": {"loss.w_aec": 100.0},
            "w_aec300": {"loss.w_aec": 300.0}},
    "anchor": {"lr2e-4": {"train.lr": 2e-4}, "lr2e-4_no_kl": {"train.lr": 2e-4, "loss.w_kl": 0.0},
               "lr1e-3": {"train.lr": 1e-3}, "lr1e-3_no_kl": {"train.lr": 1e-3, "loss.w_kl": 0.0}},
}


# the per-update metrics kept per run (docs/method.md#metrics): the terms, the anchor's view,
# the gradient norms (with loss.term_grad_norms)
DIAGNOSTICS = ("loss", "loss_ce", "loss_aec_weighted", "loss_rkl", "loss_rkl_weighted",
               "anchor_gate_share", "anchor_cap_share", "anchor_kl_uncapped", "kl_ref_masked",
               "grad_norm", "grad_norm_ce", "grad_norm_aec", "grad_norm_anchor")


def parse_run(spec: str) -> tuple[str, dict]:
  """'name:a.b=1,c.d=x' -> ('name', {'a.b': 1, 'c.d': 'x'})."""
  name, _, rest = spec.partition(":")
  overrides = {}
  for item in filter(None, rest.split(",")):
    key, _, value = item.partition("=")
    try:
      overrides[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      overrides[key] = value
  return name, overrides


def run_config(name: str, overrides: dict, seed: int, workdir: str):
  """The ORL stage's config with `overrides` (dotted keys; `stage` picks the stage)."""
  from configs import tiny
  from orl_jax.apps import demo
  overrides = dict(overrides)
  stage = overrides.pop("stage", "orl")
  config = tiny.get_config("demo")
  start = config.demo.stage_start[stage]
  init = demo._repo_path(config.demo.base_checkpoint if start == "base"
                         else config.demo.warmup_checkpoint)
  cfg = demo.stage_config(config, stage, init, seed)
  with cfg.unlocked():
    cfg.workdir = os.path.join(workdir, name, f"seed{seed}")
    for key, value in overrides.items():
      node, *path, leaf = key.split(".")
      target = cfg[node]
      for p in path:
        target = target[p]
      if leaf not in target:
        raise KeyError(f"--run {name}: no config field {key!r}")
      target[leaf] = type(target[leaf])(value)
  return cfg


def evaluate(cfg, params_dir: str, n_problems: int, settings) -> dict:
  import copy
  from orl_jax import evaluate as eval_lib
  ecfg = copy.deepcopy(cfg)
  with ecfg.unlocked():
    ecfg.eval.n_problems = n_problems
    ecfg.eval.settings = tuple(settings)
    ecfg.workdir = os.path.join(cfg.workdir, f"eval{n_problems}")
  results = eval_lib.evaluate_models(ecfg, [(params_dir, "m")], progress=False)["m"]
  # the sample outputs stay in the run's own results.json, not in the sweep's JSON
  return {setting: {k: v for k, v in r.items() if k != "examples"}
          for setting, r in results.items()}


def entropy_profile(rows: list[dict]) -> list[float]:
  """Mean rollout entropy at step k of a block over the last tenth of the logged iterations."""
  tail = rows[-max(len(rows) // 10, 1):]
  out = []
  for k in range(8):
    vals = [r[f"rollout_entropy_step{k}"] for r in tail if f"rollout_entropy_step{k}" in r]
    if not vals:
      break
    out.append(float(np.mean(vals)))
  return out


def train_and_measure(name: str, overrides: dict, seed: int, args) -> dict:
  from orl_jax.apps import demo
  from orl_jax.metrics import read_jsonl
  from orl_jax.train.entry import train
  cfg = run_config(name, overrides, seed, args.workdir)
  steps, t0 = cfg.train.steps, time.time()
  end = min(args.stop, steps) if args.stop else steps   # --stop: the schedule of `steps`, cut
  stops = list(range(args.segment, end, args.segment)) + [end] if args.segment else [end]
  # the curve points of an interrupted run (its checkpoints resume the training)
  curve_path = os.path.join(cfg.workdir, "curve.json")
  curve = json.load(open(curve_path)) if os.path.exists(curve_path) else []
  params_dir, r = os.path.join(cfg.workdir, "params"), None
  for stop in stops[len(curve):]:
    params_dir = train(cfg, progress=args.progress, stop_after=stop)
    r = evaluate(cfg, params_dir, args.curve_problems, [args.setting])[args.setting]
    curve.append({"updates": stop, "accuracy": r["accuracy"], "tpf_pooled": r["tpf_pooled"]})
    with open(curve_path, "w") as f:
      json.dump(curve, f)
    print(f"{name} seed {seed}: {stop}/{steps} updates, accuracy {r['accuracy']:.3f}, "
          f"TPF {r['tpf_pooled']:.2f} ({args.curve_problems} problems)", flush=True)
  if (r is not None and args.final_problems == args.curve_problems
      and args.final_settings == [args.setting]):
    final = {args.setting: r}   # the last curve point is the final evaluation
  else:
    final = evaluate(cfg, params_dir, args.final_problems, args.final_settings)
  metrics_path = os.path.join(cfg.workdir, "metrics.jsonl")
  rows = read_jsonl(metrics_path)
  return {"overrides": overrides, "seed": seed, "updates": end, "minutes":
          (time.time() - t0) / 60, "final": final, "curve": curve,
          "summary": demo.training_summary(metrics_path),
          "entropy_profile": entropy_profile(rows),
          "reward_curve": [(r["step"], r["reward"]) for r in rows if "reward" in r],
          "rollout_tpf_curve": [(r["step"], r["rollout_tpf"]) for r in rows
                                if "rollout_tpf" in r],
          "diagnostics": {k: [(r["step"], r[k]) for r in rows if k in r] for k in DIAGNOSTICS
                          if any(k in r for r in rows)}}


def logged_run(name: str, overrides: dict, seed: int, args) -> dict:
  """The record of a run stopped before its evaluation (`--record`): what its metrics.jsonl
  logged (reward, TPF and the anchor's per-update view), with no accuracy."""
  from orl_jax.metrics import read_jsonl
  cfg = run_config(name, overrides, seed, args.workdir)
  rows = read_jsonl(os.path.join(cfg.workdir, "metrics.jsonl"))
  if not rows:
    raise FileNotFoundError(f"--record {name}: nothing logged under {cfg.workdir}")
  return {"overrides": overrides, "seed": seed, "updates": int(rows[-1].get("updates", 0)),
          "stopped_before_evaluation": True, "final": None, "curve": [],
          "reward_curve": [(r["step"], r["reward"]) for r in rows if "reward" in r],
          "rollout_tpf_curve": [(r["step"], r["rollout_tpf"]) for r in rows
                                if "rollout_tpf" in r],
          "diagnostics": {k: [(r["step"], r[k]) for r in rows if k in r] for k in DIAGNOSTICS
                          if any(k in r for r in rows)}}


def runs_of(results: dict, name: str) -> list[dict]:
  """The runs of `name` (keys `name@seedK`), in seed order."""
  keys = sorted((k for k in results if k.rpartition("@")[0] == name),
                key=lambda k: int(k.rpartition("@seed")[2] or 0))
  return [results[k] for k in keys]


def seed_summary(results: dict, name: str, setting: str = "threshold_0.9") -> dict:
  """Mean and std over the seeds of one run name: final accuracy and pooled TPF, accuracy at
  each curve point (and TPF), the AEC and anchor shares of the objective, the mean reward over the
  second half of training; `seeds` the per-seed (accuracy, pooled TPF)."""
  runs = runs_of(results, name)
  if not runs:
    have = sorted({k.rpartition("@")[0] for k in results})
    raise KeyError(f"no run named {name!r} (have {have})")
  def stat(values):
    v = np.asarray(values, np.float64)
    return float(v.mean()), float(v.std())
  out = {"n_seeds": len(runs)}
  out["accuracy"] = stat([r["final"][setting]["accuracy"] for r in runs])
  out["tpf_pooled"] = stat([r["final"][setting]["tpf_pooled"] for r in runs])
  for share in ("aec_share", "rkl_share"):
    out[share] = stat([r["summary"].get(share, 0.0) for r in runs])
  out["reward_second_half"] = stat([np.mean([x for _, x in r["reward_curve"]
                                             [len(r["reward_curve"]) // 2:]]) for r in runs])
  points = sorted({p["updates"] for r in runs for p in r["curve"]})
  for key in ("accuracy", "tpf_pooled"):
    out[f"curve_{key}"] = {u: stat([p[key] for r in runs for p in r["curve"]
                                    if p["updates"] == u]) for u in points}
  out["seeds"] = [(r["seed"], r["final"][setting]["accuracy"],
                   r["final"][setting]["tpf_pooled"]) for r in runs]
  return out


def seed_table(results: dict, names: list[str], base_tpf: float,
               setting: str = "threshold_0.9") -> str:
  """A markdown table of `names`, each as mean ± std over its seeds."""
  lines = ["| run | seeds | accuracy | pooled TPF (× base) | accuracy along training "
           "(512 problems) | AEC / anchor share | reward, 2nd half |",
           "|---|---|---|---|---|---|---|"]
  for name in names:
    s = seed_summary(results, name, setting)
    (acc, acc_sd), (tpf, tpf_sd) = s["accuracy"], s["tpf_pooled"]
    curve = " / ".join(f"{m:.3f}±{sd:.3f}" for m, sd in s["curve_accuracy"].values())
    lines.append(f"| {name} | {s['n_seeds']} | {acc:.3f} ± {acc_sd:.3f} | {tpf:.2f} ± "
                 f"{tpf_sd:.2f} ({tpf / base_tpf:.2f}×) | {curve} | "
                 f"{100 * s['aec_share'][0]:.1f}% / {100 * s['rkl_share'][0]:.1f}% | "
                 f"{s['reward_second_half'][0]:.3f} ± {s['reward_second_half'][1]:.3f} |")
  return "\n".join(lines)


def plot(results: dict, names: list[str], png: str, title: str = "") -> None:
  """Reward (training rollouts, smoothed), held-out accuracy and TPF per run name: one colour
  per name, a thin line per seed and, over several seeds, a thick line for their mean."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (ax_r, ax_a, ax_t) = plt.subplots(1, 3, figsize=(15, 4))
  for i, name in enumerate(names):
    runs = runs_of(results, name)
    if not runs:
      raise KeyError(f"--plot: no run named {name!r}")
    color = f"C{i}"
    thin = dict(color=color, lw=0.8, alpha=0.45) if len(runs) > 1 else dict(color=color)
    rewards = []
    for run in runs:
      steps, reward = zip(*run["reward_curve"])
      k = max(len(reward) // 15, 1)
      smooth = np.convolve(reward, np.ones(k) / k, mode="valid")
      ax_r.plot(steps[k - 1:], smooth, **thin)
      rewards.append((steps[k - 1:], smooth))
      ups = [p["updates"] for p in run["curve"]]
      ax_a.plot(ups, [p["accuracy"] for p in run["curve"]], "o-", ms=3, **thin)
      ax_t.plot(ups, [p["tpf_pooled"] for p in run["curve"]], "o-", ms=3, **thin)
    label = f"{name} ({len(runs)} seed{'s' if len(runs) > 1 else ''})"
    if len(runs) > 1 and len({len(s) for s, _ in rewards}) == 1:
      ax_r.plot(rewards[0][0], np.mean([r for _, r in rewards], axis=0), color=color, lw=2.2,
                label=label)
      s = seed_summary(results, name)
      for ax, key in ((ax_a, "curve_accuracy"), (ax_t, "curve_tpf_pooled")):
        ax.plot(list(s[key]), [m for m, _ in s[key].values()], "o-", color=color, lw=2.2)
    else:
      ax_r.plot([], [], color=color, label=label)
  ax_r.set(title="training reward (rollouts, smoothed)", xlabel="ORL iteration")
  ax_a.set(title="held-out accuracy (greedy, 512 problems)", xlabel="ORL update")
  ax_t.set(title="held-out pooled TPF (paper count)", xlabel="ORL update")
  ax_r.legend(fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(png, dpi=110)
  print(f"plot: {png}")


def plot_diagnostics(results: dict, names: list[str], png: str, title: str = "") -> None:
  """The anchor's view per logged update (docs/method.md#metrics), one colour per run name, a
  line per seed: training reward, the policy's uncapped KL to the reference over every masked
  position and over the anchored ones, the shares of masked positions anchored and of anchored
  positions at the cap, and the anchor's and AEC's gradient norms over CE's."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  panels = [("reward", "training reward", None), ("kl_ref_masked", "KL(q || p_ref), all masked "
            "positions", None), ("anchor_kl_uncapped", "KL(q || p_ref), anchored positions",
            None), ("anchor_gate_share", "masked positions anchored (gate)", None),
            ("anchor_cap_share", "anchored positions at the cap", None),
            ("grad_norm_anchor", "|grad anchor| / |grad CE|", "grad_norm_ce"),
            ("grad_norm_aec", "|grad AEC| / |grad CE|", "grad_norm_ce")]
  fig, grid = plt.subplots(2, 4, figsize=(14, 6.4))
  axes = grid.ravel()
  for i, name in enumerate(names):
    for j, run in enumerate(runs_of(results, name)):
      d = dict(run.get("diagnostics", {}), reward=run["reward_curve"])
      for ax, (key, label, over) in zip(axes, panels):
        if key not in d or (over and over not in d):
          continue
        steps = [s for s, _ in d[key]]
        y = np.asarray([v for _, v in d[key]], np.float64)
        if over:
          y = y / np.maximum([v for _, v in d[over]], 1e-12)
        ax.plot(steps, y, color=f"C{i}", lw=1.2, label=name if j == 0 else None)
        ax.set(title=label, xlabel="ORL update")
        if key in ("kl_ref_masked", "anchor_kl_uncapped") or over:
          ax.set_yscale("log")
  for ax in axes:
    ax.title.set_fontsize(9)
  axes[-1].axis("off")
  axes[-1].legend(*axes[0].get_legend_handles_labels(), loc="center", fontsize=8)
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(png, dpi=100)
  print(f"plot: {png}")


def save(results: dict, out: str) -> None:
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out + ".tmp", "w") as f:
    json.dump({"about": __doc__.split("\n\n")[0], "runs": results}, f, indent=1)
  os.replace(out + ".tmp", out)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--study", choices=sorted(STUDIES), action="append", default=[])
  ap.add_argument("--run", action="append", default=[], help="name:key=value,key=value")
  ap.add_argument("--record", action="append", default=[], help="name:key=value,...: record "
                  "what a run stopped before its evaluation logged (no training)")
  ap.add_argument("--seeds", default="0")
  ap.add_argument("--workdir", default="work_dirs/tiny_sweeps")
  ap.add_argument("--out", default="benchmarks/results/tiny_sweeps.json")
  ap.add_argument("--segment", type=int, default=100, help="updates between accuracy points")
  ap.add_argument("--stop", type=int, default=0, help="end each run after this many updates of "
                  "its schedule (train.steps; 0 = all)")
  ap.add_argument("--curve_problems", type=int, default=512)
  ap.add_argument("--final_problems", type=int, default=2048)
  ap.add_argument("--setting", default="threshold_0.9")
  ap.add_argument("--final_settings", default="threshold_0.9")
  ap.add_argument("--plot", default="", help="comma-separated run names to plot (no training)")
  ap.add_argument("--png", default="benchmarks/results/tiny_sweeps.png")
  ap.add_argument("--title", default="", help="--plot: the figure's title")
  ap.add_argument("--diagnostics", action="store_true",
                  help="--plot: the anchor's per-update diagnostics instead of the curves")
  ap.add_argument("--table", default="", help="comma-separated run names: a markdown table of "
                  "each as mean ± std over its seeds (no training)")
  ap.add_argument("--base_tpf", type=float, default=3.23, help="--table: the base's pooled TPF")
  ap.add_argument("--progress", action="store_true")
  args = ap.parse_args()
  args.final_settings = args.final_settings.split(",")
  results = {}
  if os.path.exists(args.out):
    with open(args.out) as f:
      results = json.load(f).get("runs", {})
  if args.plot or args.table:
    if args.plot:
      draw = plot_diagnostics if args.diagnostics else plot
      draw(results, args.plot.split(","), args.png, args.title)
    if args.table:
      print(seed_table(results, args.table.split(","), args.base_tpf, args.setting))
    return
  if args.record:
    for seed in (int(s) for s in args.seeds.split(",")):
      for name, overrides in map(parse_run, args.record):
        results[f"{name}@seed{seed}"] = logged_run(name, overrides, seed, args)
    save(results, args.out)
    return
  runs = [item for study in args.study for item in STUDIES[study].items()]
  runs += [parse_run(spec) for spec in args.run]
  headline = None
  for seed in (int(s) for s in args.seeds.split(",")):
    for name, overrides in runs:
      key = f"{name}@seed{seed}"
      if key in results:
        print(f"{key}: done before, skipped")
        continue
      results[key] = train_and_measure(name, overrides, seed, args)
      r = results[key]["final"][args.final_settings[0]]
      headline = (key, r["accuracy"], r["tpf_pooled"])
      print(f"{key}: accuracy {r['accuracy']:.4f}, pooled TPF {r['tpf_pooled']:.3f}, "
            f"summary {json.dumps(results[key]['summary'])}", flush=True)
      save(results, args.out)
  if headline:
    print(f"tiny_sweeps_last_pooled_tpf[{headline[0]}]: {headline[2]:.3f}")


if __name__ == "__main__":
  main()
