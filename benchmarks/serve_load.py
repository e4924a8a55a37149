"""The served model under load, over real HTTP on loopback (docs/serving.md).

Starts `launch/serve.py` as the README prints it (a child process, a free port), loads the same
model in this process for the offline per-row engine, and measures, on the tiny task's
evaluation prompts:

1. **Saturated throughput**: `--clients` closed-loop clients (each sends its next request when
   its last one is answered) against the offline per-row engine (`decode.per_row`, the same
   rows, the same prompts, one call, compile excluded), alternating, `--repeats` rounds:
   clean-request tokens/s (generated tokens of successful requests over wall time) and the
   served/offline ratio (median of the rounds).
2. **Equal to decoding alone**: `--equal` requests sent by 64 concurrent clients in a shuffled
   order, mixing greedy and sampled requests, decoder rules, `max_tokens` and seeds; each
   response's text and both forward counts are compared with the offline engine decoding that
   prompt alone with the request's key.
3. **Open-loop Poisson arrivals** at `--rates` (fractions of the saturated request rate),
   streamed: clean-request and completed-output tokens/s (the latter charges failed requests'
   time), time to first block and end-to-end latency (p50, p99), queue wait, TPF.
4. With `--soak=SECONDS`: a long run at `--soak_rate` of the saturated rate with cancelled
   streams, malformed requests and n=2 requests mixed in: status codes (no 5xx), every
   accepted request answered once, the server's resident memory over time; then SIGTERM under
   load (in-flight requests finish, new ones get 503, exit status 0).

  python benchmarks/serve_load.py                         # ~3 minutes on 2 cores
  python benchmarks/serve_load.py --soak=600              # + the 10-minute soak

Writes benchmarks/results/serve_load.json; the last line is the headline ratio.
"""
import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import time

import _common
import jax
import numpy as np

from _loadgen import Connection, Reply, closed_loop, percentile
from configs import tiny
from orl_jax.data.pipeline import encode_prompt
from orl_jax.decode import per_row
from orl_jax.config.build import build
from orl_jax.serve.load import engine_parts
from orl_jax.serve.process import ServerProcess
from orl_jax.tasks import get_task
from orl_jax.unmasking import UnmaskRule


def parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--model", default="assets/tiny_base")
  p.add_argument("--rows", type=int, default=16)
  p.add_argument("--iterations", type=int, default=8, help="serve.iterations_per_call")
  p.add_argument("--prompts", type=int, default=2048, help="prompts of a saturated round")
  p.add_argument("--clients", type=int, default=256)
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--equal", type=int, default=128, help="requests compared with decoding alone")
  p.add_argument("--rates", default="0.25,0.5,0.75,0.9")
  p.add_argument("--rate_seconds", type=float, default=20.0)
  p.add_argument("--soak", type=float, default=0.0, help="seconds of the soak run (0: none)")
  p.add_argument("--soak_rate", type=float, default=0.6)
  p.add_argument("--out", default=os.path.join(_common.ROOT, "benchmarks", "results",
                                               "serve_load.json"))
  return p.parse_args()


def server_args(args) -> list[str]:
  return ["--config=configs/tiny.py:eval", f"--config.model.path={args.model}",
          f"--config.serve.rows={args.rows}",
          f"--config.serve.iterations_per_call={args.iterations}",
          "--config.serve.max_waiting=100000", "--config.serve.model_name=tiny"]


class Offline:
  """The model in this process: the offline per-row engine on `rows` rows."""

  def __init__(self, args):
    config = tiny.get_config("eval")
    config.model.path = args.model
    config.serve.rows = args.rows
    self.parts = parts = engine_parts(config)
    self.tok = parts.setup.tokenizer
    self.p = parts.shape.prompt_len
    self.problems = get_task(build(config).task, tokenizer=self.tok).eval_problems()
    self._engines: dict = {}

  def encode(self, problems):
    pairs = [encode_prompt(p, self.tok, self.p) for p in problems]
    return np.stack([t for t, _ in pairs]), np.stack([v for _, v in pairs])

  def engine(self, rule: UnmaskRule, temperature: float, max_tokens: int):
    cfg = self.parts.cfg
    b = cfg.block_size
    key = (rule, temperature, max_tokens)
    if key not in self._engines:
      dcfg = dataclasses.replace(cfg, rule=rule, temperature=temperature,
                                 gen_length=-(-max_tokens // b) * b)
      self._engines[key] = per_row.make_engine(self.parts.graphdef, dcfg, self.parts.shape.rows)
    return self._engines[key]

  def run(self, tokens, valid, key=None, rule=None, temperature=None, max_tokens=None):
    cfg = self.parts.cfg
    engine = self.engine(rule or cfg.rule, cfg.temperature if temperature is None else temperature,
                         max_tokens or cfg.gen_length)
    key = jax.random.key(0) if key is None else key
    return jax.block_until_ready(engine(self.parts.params, tokens, valid, key))


# ------------------------------------------------------------------------------ saturation

def generated(replies) -> int:
  return sum(r.body["usage"]["generated_tokens"] for r in replies if r.status == 200)


def saturation(args, url: str, off: Offline) -> dict:
  problems = off.problems[:args.prompts]
  bodies = [{"model": "tiny", "prompt": p.prompt} for p in problems]
  tokens, valid = off.encode(problems)
  off.run(tokens, valid)                                  # compile
  asyncio.run(closed_loop(url, bodies[:args.clients], args.clients))
  rounds = []
  for r in range(args.repeats):
    t0 = time.perf_counter()
    out = off.run(tokens, valid)
    offline_s = time.perf_counter() - t0
    wall, replies = asyncio.run(closed_loop(url, bodies, args.clients))
    ok = [x for x in replies if x.status == 200]
    texts = [off.tok.decode(t, stop_at_eos=True) for t in np.asarray(out.tokens)]
    same = sum(x.body["choices"][0]["text"] == t for x, t in zip(replies, texts))
    row = {"offline_tokens_per_s": int(np.sum(out.n_generated)) / offline_s,
           "served_tokens_per_s": generated(ok) / wall, "served_requests_per_s": len(ok) / wall,
           "served_wall_s": wall, "offline_wall_s": offline_s, "failed": len(replies) - len(ok),
           "texts_equal_offline": same, "requests": len(bodies)}
    row["ratio"] = row["served_tokens_per_s"] / row["offline_tokens_per_s"]
    rounds.append(row)
    print(f"  round {r}: served {row['served_tokens_per_s']:.0f} tok/s, offline "
          f"{row['offline_tokens_per_s']:.0f} tok/s, ratio {row['ratio']:.3f}, "
          f"{same}/{len(bodies)} texts equal", flush=True)
  med = lambda k: statistics.median(x[k] for x in rounds)
  return {"rounds": rounds, "ratio_median": med("ratio"),
          "served_tokens_per_s_median": med("served_tokens_per_s"),
          "offline_tokens_per_s_median": med("offline_tokens_per_s"),
          "served_requests_per_s_median": med("served_requests_per_s")}


# ------------------------------------------------------------------------- equal to alone

# a streamed request's fields: its usage comes in a last chunk only when asked (OpenAI's way)
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def streamed(body: dict, stream: bool = True) -> dict:
  """`body` streamed with its usage, or not streamed."""
  rest = {k: v for k, v in body.items() if k not in STREAM}
  return {**rest, **STREAM} if stream else {**rest, "stream": False}


def mixed_requests(off: Offline, n: int, rng: random.Random) -> list[dict]:
  rules = ["threshold_0.9", "threshold_0.7", "entropy_budget_0.5", "fixed_steps_4"]
  gen = off.parts.cfg.gen_length
  out = []
  for i in range(n):
    body = {"model": "tiny", "prompt": off.problems[i].prompt, "seed": rng.randrange(2**40),
            "temperature": rng.choice([0.0, 0.0, 0.7, 1.0]), "decoder": rng.choice(rules),
            "max_tokens": rng.choice([gen, gen, 16, 24])}
    out.append(streamed(body, rng.random() < 0.5))
  return out


async def concurrent_shuffled(url: str, bodies: list[dict], clients: int, rng) -> list[Reply]:
  order = list(range(len(bodies)))
  rng.shuffle(order)
  replies: list[Reply | None] = [None] * len(bodies)

  async def client(k):
    conn = Connection(url)
    await asyncio.sleep(rng.random() * 0.2)
    for i in order[k::clients]:
      replies[i] = await conn.post("/v1/completions", bodies[i])
    conn.close()

  await asyncio.gather(*[client(k) for k in range(clients)])
  return replies  # type: ignore[return-value]


def reply_text_usage(reply: Reply) -> tuple[str, dict]:
  if reply.body is not None:
    return reply.body["choices"][0]["text"], reply.body["usage"]
  text = "".join(c["choices"][0]["text"] for c in reply.chunks if c.get("choices"))
  return text, reply.chunks[-1]["usage"]


def equal_to_alone(args, url: str, off: Offline) -> dict:
  rng = random.Random(0)
  bodies = mixed_requests(off, args.equal, rng)
  replies = asyncio.run(concurrent_shuffled(url, bodies, 64, rng))
  mismatches = []
  for body, reply in zip(bodies, replies):
    text, usage = reply_text_usage(reply)
    problem = [p for p in off.problems[:args.equal] if p.prompt == body["prompt"]][0]
    tokens, valid = off.encode([problem])
    seed = body["seed"]
    key = per_row.request_keys(np.array([seed % 2**32], np.uint32),
                               np.array([seed // 2**32], np.uint32), np.array([0], np.int32))
    out = off.run(tokens, valid, key, UnmaskRule.parse(body["decoder"]), body["temperature"],
                  body["max_tokens"])
    ref_text = off.tok.decode(np.asarray(out.tokens[0])[:body["max_tokens"]], stop_at_eos=True)
    ref = (ref_text, int(out.nfe[0]), int(out.nfe_denoise[0]))
    got = (text, usage["forwards"], usage["forwards_denoise"])
    if got != ref:
      mismatches.append({"request": body, "served": got, "alone": ref})
  print(f"  {len(bodies) - len(mismatches)}/{len(bodies)} responses equal decoding alone "
        "(text and both forward counts)", flush=True)
  return {"requests": len(bodies), "equal": len(bodies) - len(mismatches),
          "mismatches": mismatches[:10]}


# ---------------------------------------------------------------------------------- open loop

async def open_loop(url: str, bodies: list[dict], rate: float, seconds: float, rng,
                    mix=None) -> tuple[float, list[tuple[dict, Reply]]]:
  """Poisson arrivals at `rate` requests/s for `seconds`; `mix(body, rng) -> (body, abandon)`
  changes a request (malformed, cancelled). -> (wall seconds to the last reply, replies)."""
  results: list[tuple[dict, Reply]] = []
  idle: list[Connection] = []
  tasks = []

  async def one(body, abandon):
    conn = idle.pop() if idle else Connection(url)
    try:
      reply = await conn.post("/v1/completions", body, abandon_after=abandon)
    except (ConnectionError, asyncio.IncompleteReadError) as e:
      reply = Reply(0, {"error": str(e)})
      conn.close()
    results.append((body, reply))
    if not reply.abandoned and conn._writer is not None:
      idle.append(conn)

  start = time.perf_counter()
  i = 0
  while time.perf_counter() - start < seconds:
    body = dict(bodies[i % len(bodies)])
    i += 1
    abandon = None
    if mix is not None:
      body, abandon = mix(body, rng)
    tasks.append(asyncio.ensure_future(one(body, abandon)))
    await asyncio.sleep(rng.expovariate(rate))
  await asyncio.gather(*tasks)
  return time.perf_counter() - start, results


def load_figures(wall: float, results: list[tuple[dict, Reply]]) -> dict:
  ok = [(b, r) for b, r in results if r.status == 200 and not r.abandoned]
  failed = [(b, r) for b, r in results if r.status != 200 or r.abandoned]
  usage = [reply_text_usage(r)[1] for _, r in ok]
  gen = sum(u["generated_tokens"] for u in usage)
  forwards = sum(u["forwards"] for u in usage)
  ttfb = [r.chunk_times[0] for _, r in ok if r.chunk_times]
  latency = [r.seconds for _, r in ok]
  failed_s = sum(r.seconds for _, r in failed)
  statuses: dict[str, int] = {}
  for _, r in results:
    key = "abandoned" if r.abandoned else str(r.status)
    statuses[key] = statuses.get(key, 0) + 1
  return {"requests": len(results), "ok": len(ok), "statuses": statuses,
          "clean_tokens_per_s": gen / wall,
          "completed_output_tokens_per_s": gen / (wall + failed_s),
          "ttfb_p50_s": percentile(ttfb, 50), "ttfb_p99_s": percentile(ttfb, 99),
          "latency_p50_s": percentile(latency, 50), "latency_p99_s": percentile(latency, 99),
          "queue_wait_p50_s": percentile([u["queue_seconds"] for u in usage], 50),
          "queue_wait_p99_s": percentile([u["queue_seconds"] for u in usage], 99),
          "tpf": gen / max(forwards, 1), "wall_s": wall}


def rates(args, url: str, off: Offline, saturated_rps: float) -> list[dict]:
  bodies = [streamed({"model": "tiny", "prompt": p.prompt}) for p in off.problems[:2048]]
  out = []
  for fraction in [float(x) for x in args.rates.split(",") if x]:
    rate = fraction * saturated_rps
    wall, results = asyncio.run(open_loop(url, bodies, rate, args.rate_seconds,
                                          random.Random(1)))
    row = {"fraction_of_saturation": fraction, "rate_rps": rate, **load_figures(wall, results)}
    out.append(row)
    print(f"  {rate:.1f} req/s: clean {row['clean_tokens_per_s']:.0f} tok/s, first block p50 "
          f"{row['ttfb_p50_s'] * 1e3:.0f} ms p99 {row['ttfb_p99_s'] * 1e3:.0f} ms, latency p50 "
          f"{row['latency_p50_s'] * 1e3:.0f} ms p99 {row['latency_p99_s'] * 1e3:.0f} ms",
          flush=True)
  return out


# --------------------------------------------------------------------------------------- soak

BAD_BODIES = [b"{not json", {"model": "tiny", "prompt": "bob", "foo": 1},
              {"model": "tiny", "prompt": "bob", "max_tokens": 10**6},
              {"model": "tiny", "prompt": "bob " * 500}, {"model": "nope", "prompt": "bob"},
              {"model": "tiny", "prompt": "bob", "decoder": "threshold_x"},
              {"model": "tiny", "prompt": "bob", "n": True}, {"model": "tiny"}]


def soak_mix(body: dict, rng: random.Random):
  roll = rng.random()
  if roll < 0.1:
    return rng.choice(BAD_BODIES), None
  if roll < 0.2:
    return streamed(body), 1                     # cancelled after its first block
  if roll < 0.3:
    return dict(streamed(body, False), n=2), None
  return body, None


def soak(args, server: ServerProcess, off: Offline, saturated_rps: float) -> dict:
  bodies = [streamed({"model": "tiny", "prompt": p.prompt}, i % 2 == 0)
            for i, p in enumerate(off.problems[:2048])]
  rss: list[tuple[float, int]] = []
  start = time.perf_counter()

  async def sample_rss():
    while True:
      rss.append((time.perf_counter() - start, server.rss_bytes()))
      await asyncio.sleep(5)

  async def run():
    sampler = asyncio.ensure_future(sample_rss())
    wall, results = await open_loop(server.url, bodies, args.soak_rate * saturated_rps,
                                    args.soak, random.Random(2), soak_mix)
    sampler.cancel()
    return wall, results

  wall, results = asyncio.run(run())
  figures = load_figures(wall, results)
  server_errors = [(b, r.body) for b, r in results if r.status >= 500 or r.status == 0]
  ids = [r.body["id"] for _, r in results if r.status == 200 and r.body]
  ids += [r.chunks[0]["id"] for _, r in results if r.status == 200 and r.chunks]
  answered_once = len(ids) == len(set(ids)) == sum(r.status == 200 for _, r in results)
  after = [x for x in rss if x[0] > min(60.0, args.soak / 4)]
  slope = (np.polyfit([t for t, _ in after], [m for _, m in after], 1)[0] * 60 / 2**20
           if len(after) > 2 else float("nan"))
  out = {**figures, "seconds": args.soak, "server_errors": len(server_errors),
         "server_error_examples": server_errors[:5], "every_request_answered_once": answered_once,
         "rss_mib": [(round(t), round(m / 2**20, 1)) for t, m in rss],
         "rss_slope_mib_per_min_after_warmup": slope,
         "drain": drain_under_load(server, bodies)}
  print(f"  soak {args.soak:.0f} s: {figures['requests']} requests {figures['statuses']}, "
        f"5xx {len(server_errors)}, answered once {answered_once}, RSS "
        f"{rss[0][1] / 2**20:.0f} -> {rss[-1][1] / 2**20:.0f} MiB "
        f"(slope {slope:.2f} MiB/min), drain {out['drain']}", flush=True)
  return out


def drain_under_load(server: ServerProcess, bodies: list[dict]) -> dict:
  """SIGTERM while requests are in flight: they finish, later ones get 503, exit status 0."""
  async def run():
    conns = [Connection(server.url) for _ in range(16)]
    flight = [asyncio.ensure_future(c.post("/v1/completions", streamed(bodies[i], False)))
              for i, c in enumerate(conns)]
    await asyncio.sleep(0.05)
    server._proc.send_signal(15)                # SIGTERM  # noqa: SLF001
    await asyncio.sleep(0.05)
    late = []
    for i in range(4):
      try:
        late.append((await Connection(server.url).post("/v1/completions", bodies[i])).status)
      except (ConnectionError, OSError):
        late.append("refused")
    done = await asyncio.gather(*flight, return_exceptions=True)
    return [getattr(r, "status", repr(r)) for r in done], late

  in_flight, late = asyncio.run(run())
  code = server.wait_exit(120)
  return {"in_flight_statuses": sorted(set(map(str, in_flight))), "late_statuses": late,
          "exit_status": code}


def main():
  args = parse_args()
  off = Offline(args)
  results = {"about": __doc__.split("\n\n")[0], "device": str(jax.devices()[0]),
             "cores": os.cpu_count(), "rows": args.rows, "iterations_per_call": args.iterations,
             "model": args.model, "clients": args.clients,
             "server_command": "python launch/serve.py " + " ".join(server_args(args))}
  with ServerProcess(server_args(args)) as server:
    print("saturated, closed loop:", flush=True)
    results["saturation"] = sat = saturation(args, server.url, off)
    print("equal to decoding alone:", flush=True)
    results["equal_to_alone"] = equal_to_alone(args, server.url, off)
    print("open loop (Poisson arrivals, streamed):", flush=True)
    results["open_loop"] = rates(args, server.url, off, sat["served_requests_per_s_median"])
    if args.soak:
      print("soak:", flush=True)
      results["soak"] = soak(args, server, off, sat["served_requests_per_s_median"])
  print(f"wrote {_common.write_json(args.out, results)}")
  print(f"served_over_offline: {sat['ratio_median']:.3f}")


if __name__ == "__main__":
  main()
