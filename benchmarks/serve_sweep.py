"""The paper's serving sweep on the tiny task: accuracy against clean-request tokens/s, models
served with identical decoder settings (docs/serving.md).

For each model a server is started as the README prints it (`launch/serve.py`, its own
process, a free port); for each decoder setting, `--clients` closed-loop clients send the first
`--problems` evaluation problems (the request's `decoder` field), and the responses are scored
by the tiny task's verifier. Per point: accuracy, clean-request tokens/s (generated tokens of
successful requests over the wall time), requests/s and the pooled TPF the server reported.
The ORL model is a run of `configs/tiny.py:orl`:

  python launch/train.py --config=configs/tiny.py:orl     # writes work_dirs/tiny_orl
  python benchmarks/serve_sweep.py \
      --models=base=assets/tiny_base,warmup=assets/tiny_warmup,orl=work_dirs/tiny_orl

Writes benchmarks/results/serve_sweep.json and serve_sweep.png; the last line is ORL's served
tokens/s over the base's at the first setting.
"""
import argparse
import asyncio
import os
import statistics

import _common
import jax

from _loadgen import closed_loop
from configs import tiny
from orl_jax.config.build import build
from orl_jax.serve.process import ServerProcess
from orl_jax.tasks import get_task

SETTINGS = "threshold_0.9,threshold_0.7,entropy_budget_0.5"


def parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--models", default="base=assets/tiny_base,warmup=assets/tiny_warmup,"
                 "orl=work_dirs/tiny_orl")
  p.add_argument("--settings", default=SETTINGS)
  p.add_argument("--problems", type=int, default=1024)
  p.add_argument("--clients", type=int, default=256)
  p.add_argument("--rows", type=int, default=16)
  p.add_argument("--repeats", type=int, default=3, help="rounds per point (median tokens/s)")
  p.add_argument("--out", default=os.path.join(_common.ROOT, "benchmarks", "results",
                                               "serve_sweep.json"))
  return p.parse_args()


def sweep_model(args, name: str, path: str, problems, verifier) -> list[dict]:
  points = []
  server_args = ["--config=configs/tiny.py:eval", f"--config.model.path={path}",
                 f"--config.serve.rows={args.rows}", "--config.serve.max_waiting=100000",
                 f"--config.serve.model_name={name}"]
  with ServerProcess(server_args) as server:
    for setting in [s for s in args.settings.split(",") if s]:
      bodies = [{"model": name, "prompt": p.prompt, "decoder": setting} for p in problems]
      asyncio.run(closed_loop(server.url, bodies[:args.clients], args.clients))   # warm-up
      rounds = []
      for _ in range(args.repeats):
        wall, replies = asyncio.run(closed_loop(server.url, bodies, args.clients))
        ok = [r for r in replies if r.status == 200]
        rounds.append((wall, replies, ok))
      wall, replies, ok = sorted(rounds, key=lambda x: x[0])[len(rounds) // 2]
      texts = [r.body["choices"][0]["text"] if r.status == 200 else "" for r in replies]
      scores = verifier.score_batch(problems, texts)
      generated = sum(r.body["usage"]["generated_tokens"] for r in ok)
      forwards = sum(r.body["usage"]["forwards"] for r in ok)
      point = {"model": name, "weights": path, "setting": setting,
               "accuracy": sum(scores) / len(problems), "failed": len(replies) - len(ok),
               "clean_tokens_per_s": generated / wall,
               "clean_tokens_per_s_rounds": [sum(r.body["usage"]["generated_tokens"]
                                                 for r in o) / w for w, _, o in rounds],
               "requests_per_s": len(ok) / wall, "tpf": generated / max(forwards, 1)}
      points.append(point)
      print(f"  {name} {setting}: accuracy {point['accuracy']:.3f}, served "
            f"{point['clean_tokens_per_s']:.0f} tok/s, TPF {point['tpf']:.2f}", flush=True)
  return points


def plot(points: list[dict], path: str) -> str:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.4))
  for model in dict.fromkeys(p["model"] for p in points):
    mine = [p for p in points if p["model"] == model]
    ax.plot([p["clean_tokens_per_s"] for p in mine], [p["accuracy"] for p in mine], "o-",
            label=model)
    for p in mine:
      ax.annotate(p["setting"], (p["clean_tokens_per_s"], p["accuracy"]), fontsize=7,
                  xytext=(4, 4), textcoords="offset points")
  ax.set_xlabel("served tokens/s (clean requests, 2 CPU cores, saturated)")
  ax.set_ylabel("accuracy (tiny task, held-out problems)")
  ax.set_title("Served speed vs accuracy, identical decoder settings")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def main():
  args = parse_args()
  config = tiny.get_config("eval")
  task = get_task(build(config).task)
  problems = task.eval_problems()[:args.problems]
  points = []
  models = dict(m.split("=", 1) for m in args.models.split(",") if m)
  for name, path in models.items():
    if not os.path.exists(path):
      raise SystemExit(f"--models: {path} does not exist (the ORL model: python launch/train.py "
                       "--config=configs/tiny.py:orl writes work_dirs/tiny_orl)")
    points += sweep_model(args, name, path, problems, task.verifier)
  out = {"about": __doc__.split("\n\n")[0], "device": str(jax.devices()[0]),
         "cores": os.cpu_count(), "problems": args.problems, "clients": args.clients,
         "rows": args.rows, "points": points}
  print(f"wrote {_common.write_json(args.out, out)}")
  print(f"plot: {plot(points, os.path.splitext(args.out)[0] + '.png')}")
  first = args.settings.split(",")[0]
  speed = {p["model"]: p["clean_tokens_per_s"] for p in points if p["setting"] == first}
  if "orl" in speed and "base" in speed:
    print(f"orl_over_base_served_{first}: {speed['orl'] / speed['base']:.2f}")
  else:
    print(f"served_tokens_per_s_{first}: {statistics.median(speed.values()):.0f}")


if __name__ == "__main__":
  main()
