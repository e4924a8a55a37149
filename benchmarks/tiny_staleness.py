"""One step of lag on the tiny task (docs/method.md#one-step-of-lag): the demo's ORL stage with
`orl.max_staleness` 0 (on-policy) and 1 (each update replays a rollout drawn one update
earlier, docs/training.md#one-step-of-lag), over rollout seeds, at an equal number of updates;
each run evaluated on the held-out set (accuracy, pooled TPF) with its iteration times.

  python benchmarks/tiny_staleness.py                          # 3 seeds x 2 modes, 50 updates
  python benchmarks/tiny_staleness.py --updates=300 --jobs=1   # the demo's budget, one at a time

Each run is `benchmarks/tiny_sweeps.py`'s (`train_and_measure`: the ORL stage of
configs/tiny.py from the committed warm-up, a seed setting the rollout noise and the prompt
order), without the intermediate accuracy points. `--jobs=2` trains two runs side by side, in
the order lag 0 / lag 1 of each seed, so both modes share the machine alike; their iteration
times are then those of a shared machine. The JSON (resumable: finished runs are skipped) holds
every run and the per-mode means and spreads; the last line printed is the headline, the mean
pooled TPF of lag 1 minus that of lag 0.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common  # noqa: E402  (the repository on sys.path)
import numpy as np  # noqa: E402

MODES = (0, 1)


def _name(lag: int) -> str:
  return f"lag{lag}"


def measure(lag: int, seed: int, args: dict) -> tuple[str, dict]:
  """(key, run) of one training and evaluation (in a fresh process with --jobs > 1)."""
  import tiny_sweeps
  from orl_jax.metrics import read_jsonl
  name = _name(lag)
  opts = types.SimpleNamespace(**args, segment=0, curve_problems=64,
                               final_settings=[args["setting"]], progress=False)
  overrides = {"orl.max_staleness": lag, "train.steps": args["updates"]}
  run = tiny_sweeps.train_and_measure(name, overrides, seed, opts)
  rows = read_jsonl(os.path.join(args["workdir"], name, f"seed{seed}", "metrics.jsonl"))
  # the first logged iteration holds no compilation (log_every 5: iteration 5 on)
  times = [r["sec_iteration"] for r in rows if "sec_iteration" in r]
  run["sec_iteration_median"] = float(np.median(times)) if times else None
  run["staleness"] = [r.get("staleness", 0) for r in rows]
  run["policy_lag"] = [r["policy_lag"] for r in rows if "policy_lag" in r]
  return f"{name}@seed{seed}", run


def summarize(results: dict, setting: str) -> dict:
  """Per mode: per-seed and mean ± std (over the seeds) accuracy, pooled TPF and median
  iteration seconds; the difference of the means (lag 1 - lag 0)."""
  out: dict = {}
  for lag in MODES:
    runs = sorted((r for k, r in results.items() if k.startswith(_name(lag) + "@")),
                  key=lambda r: r["seed"])
    if not runs:
      continue
    per = {key: [r["final"][setting][key] for r in runs] for key in ("accuracy", "tpf_pooled")}
    per["sec_iteration"] = [r["sec_iteration_median"] for r in runs]
    per["rollout_tpf_end"] = [r["summary"].get("rollout_tpf_end") for r in runs]
    out[_name(lag)] = {"seeds": [r["seed"] for r in runs], **{
        k: {"per_seed": v, "mean": float(np.mean(v)), "std": float(np.std(v))}
        for k, v in per.items()}}
  if all(_name(lag) in out for lag in MODES):
    out["lag1_minus_lag0"] = {k: out["lag1"][k]["mean"] - out["lag0"][k]["mean"]
                              for k in ("accuracy", "tpf_pooled", "sec_iteration")}
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--seeds", default="0,1,2")
  ap.add_argument("--updates", type=int, default=50, help="ORL updates per run (demo: 300)")
  ap.add_argument("--jobs", type=int, default=2, help="trainings run side by side")
  ap.add_argument("--workdir", default="work_dirs/tiny_staleness")
  ap.add_argument("--out", default="benchmarks/results/tiny_staleness.json")
  ap.add_argument("--final_problems", type=int, default=2048)
  ap.add_argument("--setting", default="threshold_0.9")
  args = ap.parse_args()
  results = {}
  if os.path.exists(args.out):
    with open(args.out) as f:
      results = json.load(f).get("runs", {})
  todo = [(lag, int(s)) for s in args.seeds.split(",") for lag in MODES
          if f"{_name(lag)}@seed{int(s)}" not in results]
  shared = dict(updates=args.updates, workdir=args.workdir, final_problems=args.final_problems,
                setting=args.setting)

  def save():
    payload = {"about": __doc__.split("\n\n")[0], "updates": args.updates, "jobs": args.jobs,
               "setting": args.setting, "final_problems": args.final_problems,
               "summary": summarize(results, args.setting), "runs": results}
    _common.write_json(args.out, payload)
    return payload

  ctx = multiprocessing.get_context("spawn")   # each training in a fresh JAX process
  with concurrent.futures.ProcessPoolExecutor(args.jobs, mp_context=ctx) as pool:
    futures = [pool.submit(measure, lag, seed, shared) for lag, seed in todo]
    for done in concurrent.futures.as_completed(futures):
      key, run = done.result()
      results[key] = run
      r = run["final"][args.setting]
      print(f"{key}: accuracy {r['accuracy']:.4f}, pooled TPF {r['tpf_pooled']:.3f}, "
            f"iteration {run['sec_iteration_median']:.2f} s", flush=True)
      save()
  summary = save()["summary"]
  for lag in MODES:
    s = summary.get(_name(lag))
    if s:
      print(f"{_name(lag)}: accuracy {s['accuracy']['mean']:.4f} ± {s['accuracy']['std']:.4f}, "
            f"pooled TPF {s['tpf_pooled']['mean']:.3f} ± {s['tpf_pooled']['std']:.3f}, "
            f"iteration {s['sec_iteration']['mean']:.2f} s")
  if "lag1_minus_lag0" in summary:
    print(f"tiny_staleness_tpf_lag1_minus_lag0: {summary['lag1_minus_lag0']['tpf_pooled']:.3f}")


if __name__ == "__main__":
  main()
