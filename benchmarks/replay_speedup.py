"""Packed staircase replay vs naive replay: one ORL training step (forward, backward, optimizer
update) on the same captured states, same loss, measured side by side in one process.

Workload shaped like the paper's, not the tiny demo's: one shared prompt of 512 tokens
(few-shot context), G responses of 4 blocks of 32, every captured state replayed (4 denoising
steps per block, so 16 states per response), the tiny model's width (residual pathway off).
Both layouts come from `replay.build_plan` and train with the same model, ORL loss
(`losses.OrlObjective`, per-response normalised) and optimizer, through the same attention
implementation (the config's `auto`: the dense XLA path on CPU):

* naive  — every state its own row with its whole prefix: [prompt | clean blocks before it |
  state], 640 tokens;
* packed — staircase rows: a prompt copy, then whole responses (their clean blocks and all
  their states). `replay.row_len` is sized to hold k responses, for each k in
  `--responses-per-row`; the packed figure is the fastest k (all are recorded). Dense attention
  costs rows x row_len^2 whatever the staircase hides, so on CPU one response per row (the
  prompt shared by that response's 16 states, not across responses) is usually fastest; a
  block-sparse kernel (GPU/TPU) skips the hidden tiles and favours sharing it across more.

Gradient accumulation (`replay.micro_batches`, `train.state.make_train_step`): each layout
splits its rows into the fewest micro-batches that fit `--memory-gb` as XLA estimates it (the
compiled step on one micro-batch: temp + arguments + outputs, plus the rest of the batch), as a
user would; a count that still runs out of memory is recorded and the next is tried. As a check
of that choice each layout is also timed with `--check-factor` times as many micro-batches
(`speedup_best_measured` uses each layout's faster count). Timing: the median of `--repeats`
steps after one warm-up step, the steps of all variants of one G interleaved (one step of each
in turn), since the machine may be shared with other work whose load changes: only the ratio
of the layouts within one G of one run is meaningful. The last line printed is the headline
`replay_speedup_G16: X` (naive / packed seconds at G = 16, largest micro-batches that fit).

  python benchmarks/replay_speedup.py [--groups 8 16 24] [--responses-per-row 1 2] [--repeats 3]
"""
import argparse
import dataclasses
import statistics
import time

import _common  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np

from configs import tiny
from orl_jax.decode.capture import masked_positions
from orl_jax.config import build as run_config
from orl_jax.config import derive as config_lib
from orl_jax import sharding as sharding_lib
from orl_jax.models.decoded import Capture, DecodeOutput, trajectories
from orl_jax.config.sections import Loss
from orl_jax.losses import LossConfig, OrlObjective
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.train.state import create_train_state, make_train_step
from orl_jax.optimizer import optimizer_of
from pallas_kernels.staircase_attention import staircase_visible

PROMPT, BLOCK, N_BLOCKS, STEPS = 512, 32, 4, 4
STATES = N_BLOCKS * STEPS                      # per response
CLEAN_AND_STATES = (N_BLOCKS - 1 + STATES) * BLOCK   # a response's tokens in a packed row


def set_workload(prompt: int, n_blocks: int, steps: int) -> None:
  """A smaller workload than the paper-like one (device_check.py's CPU smoke run)."""
  global PROMPT, N_BLOCKS, STEPS, STATES, CLEAN_AND_STATES
  PROMPT, N_BLOCKS, STEPS = prompt, n_blocks, steps
  STATES = N_BLOCKS * STEPS
  CLEAN_AND_STATES = (N_BLOCKS - 1 + STATES) * BLOCK


def synthetic_trajectories(group: int, model_cfg, rng: np.random.Generator):
  """One prompt, `group` responses; every block decoded in STEPS steps (8 tokens per step)."""
  v, d, k = model_cfg.vocab_size, model_cfg.d_model, 16
  n = BLOCK * N_BLOCKS
  s = STATES
  responses = rng.integers(5, v, (group, n)).astype(np.int32)
  canvas = np.zeros((group, s, BLOCK), np.int32)
  block = np.zeros((group, s), np.int32)
  step = np.zeros((group, s), np.int32)
  for r in range(group):
    for j in range(N_BLOCKS):
      order = rng.permutation(BLOCK)
      for t in range(STEPS):
        i = j * STEPS + t
        tokens = responses[r, j * BLOCK:(j + 1) * BLOCK].copy()
        tokens[order[t * BLOCK // STEPS:]] = model_cfg.mask_id   # still masked before step t
        canvas[r, i], block[r, i], step[r, i] = tokens, j, t
  z = rng.normal(size=(group, s, BLOCK, d)).astype(np.float32) * (step[..., None, None] > 0)
  logits = rng.normal(size=(group, s, BLOCK, v)).astype(np.float32) * 3
  logp = jax.nn.log_softmax(jnp.asarray(logits), -1)
  top_lp, top_ids = jax.lax.top_k(logp, k)
  ent = -jnp.sum(jnp.exp(logp) * logp, -1) / np.log(v)
  cap = Capture(block_tokens=jnp.asarray(canvas), block=jnp.asarray(block), step=jnp.asarray(step),
                z=jnp.asarray(z), alpha=jnp.asarray(ent), entropy=jnp.asarray(ent),
                topk_ids=top_ids, topk_logprobs=top_lp,
                commit=jnp.zeros((group, s, BLOCK), bool), valid=jnp.ones((group, s), bool),
                n_states=jnp.full((group,), s, jnp.int32), overflow=jnp.zeros((group,), bool))
  prompt = rng.integers(5, v, (1, PROMPT)).astype(np.int32)
  out = DecodeOutput(tokens=jnp.asarray(responses), nfe=jnp.zeros((group,), jnp.int32),
                     nfe_engine=jnp.zeros((group,), jnp.int32),
                     nfe_denoise=jnp.zeros((group,), jnp.int32),
                     n_generated=jnp.full((group,), n, jnp.int32),
                     finished=jnp.ones((group,), bool), capture=cap)
  return trajectories(out, jnp.asarray(prompt), jnp.ones((1, PROMPT), bool), 0)


def _plan(traj, group, layout, row_len, n_rows, micro_batches):
  cfg = ReplayConfig(row_len=row_len, n_rows=n_rows, max_states=group * STATES,
                     max_responses=group, block_size=BLOCK, states_per_response=0,
                     layout=layout, micro_batches=micro_batches)
  return build_plan(prompt_valid=np.ones((1, PROMPT), bool),
                    capture_valid=np.ones((group, STATES), bool),
                    capture_block=np.asarray(traj.capture.block), eligible=np.ones((group,), bool),
                    group_size=group, cfg=cfg, rng=np.random.default_rng(0))


def visible_pairs(plan) -> int:
  """Query-key pairs the staircase lets attend (dense attention computes rows x row_len^2)."""
  meta = plan.meta
  return int(sum(staircase_visible(type(meta)(*(f[r] for f in meta)),
                                   type(meta)(*(f[r] for f in meta)), xp=np).sum()
                 for r in range(meta.kind.shape[0])))


def _is_oom(e: Exception) -> bool:
  return "RESOURCE_EXHAUSTED" in str(e) or "Out of memory" in str(e)


def _nbytes(tree) -> int:
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def estimated_peak_bytes(s_cfg, optimizer, mesh, objective, batch, micro_batches, key) -> int:
  """XLA's memory analysis of the step on one micro-batch (temp + arguments + outputs), plus
  the rest of the batch and, with micro-batches, its split copy and the gradient sums."""
  rows = batch.tokens.shape[0] // micro_batches
  sub = batch.replace(**{f: jax.tree.map(lambda x: x[:rows], getattr(batch, f))
                         for f in batch.ROW_FIELDS})
  graphdef, state, state_sh = create_train_state(s_cfg, optimizer, mesh, 0)
  repl = sharding_lib.replicated(mesh)
  step = make_train_step(graphdef, optimizer, objective, mesh, state_sh,
                         jax.tree.map(lambda _: repl, sub))
  mem = step.lower(state, sub, key).compile().memory_analysis()
  extra = _nbytes(batch) - _nbytes(sub)
  if micro_batches > 1:
    extra += _nbytes(batch) + _nbytes(state.params)
  return int(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes
             + extra)


class Runner:
  """One layout's training step at one micro-batch count, warmed up and ready to time."""

  def __init__(self, traj, group, layout, row_len, rows, m, s_cfg, optimizer, mesh, objective):
    plan, _ = _plan(traj, group, layout, row_len, rows, m)
    self.batch = gather_batch(traj, plan, mask_id=s_cfg.mask_id, unresolved=masked_positions)
    graphdef, state, state_sh = create_train_state(s_cfg, optimizer, mesh, 0)
    repl = sharding_lib.replicated(mesh)
    self.step = make_train_step(graphdef, optimizer, objective, mesh, state_sh,
                                jax.tree.map(lambda _: repl, self.batch), micro_batches=m)
    self.key = jax.random.key(0)
    self.state, metrics = self.step(state, self.batch, self.key)   # compile + warm-up
    self.first_metrics = jax.device_get(metrics)
    self.runs = []

  def run_once(self):
    t0 = time.perf_counter()
    self.state, metrics = self.step(self.state, self.batch, self.key)
    jax.block_until_ready(metrics)
    self.runs.append(time.perf_counter() - t0)

  def result(self) -> dict:
    return {"seconds_median": statistics.median(self.runs), "runs": self.runs,
            "loss_first_step": float(self.first_metrics["loss"]),
            "aec_pairs_out_of_order": int(self.first_metrics.get("aec_pairs_out_of_order", 0))}


def prepare_layout(traj, group, layout, row_len, args, s_cfg, optimizer, mesh, objective):
  """(description, runners): the fewest micro-batches that fit the budget and, as a check of
  that choice, `args.check_factor` times as many; each runner is warmed up."""
  budget = int(args.memory_gb * 2**30)
  _, stats = _plan(traj, group, layout, row_len, group * STATES, 1)
  assert stats["states_dropped"] == 0 and stats["states_packed"] == group * STATES
  rows = stats["rows_used"]
  plan, _ = _plan(traj, group, layout, row_len, rows, 1)
  out = {"row_len": row_len, "rows": rows, "tokens": rows * row_len,
         "attention_pairs_dense": rows * row_len ** 2, "attention_pairs_visible":
         visible_pairs(plan), "micro_batch_trials": []}
  batch = gather_batch(traj, plan, mask_id=s_cfg.mask_id, unresolved=masked_positions)
  make = lambda m: Runner(traj, group, layout, row_len, rows, m, s_cfg, optimizer, mesh,
                          objective)
  for m in [d for d in range(1, rows + 1) if rows % d == 0]:
    trial = {"micro_batches": m, "rows_per_micro_batch": rows // m,
             "estimated_peak_bytes": estimated_peak_bytes(s_cfg, optimizer, mesh, objective,
                                                          batch, m, jax.random.key(0))}
    out["micro_batch_trials"].append(trial)
    if trial["estimated_peak_bytes"] > budget:
      trial["result"] = "over budget"
      continue
    try:
      runners = {"chosen": make(m)}
    except jax.errors.JaxRuntimeError as e:              # the estimate was low for this host
      if not _is_oom(e):
        raise
      trial["result"] = "out of memory: " + str(e).splitlines()[0][:160]
      continue
    trial["result"] = "ran"
    out.update(micro_batches=m, rows_per_micro_batch=rows // m,
               estimated_peak_bytes=trial["estimated_peak_bytes"])
    check = m * args.check_factor
    if args.check_factor > 1 and rows % check == 0:
      runners["check"] = make(check)
      out["check_more_micro_batches"] = {"micro_batches": check,
                                         "rows_per_micro_batch": rows // check}
    return out, runners
  out["error"] = f"no micro-batch count fits {budget / 2**30:.1f} GiB"
  return out, {}


def measure(group, args, s_cfg, optimizer, mesh, objective):
  """Every layout variant of this G, their timed steps interleaved (run 1 of each, run 2 of
  each, ...) so a change in the machine's load hits all of them alike."""
  rng = np.random.default_rng(group)
  traj = synthetic_trajectories(group, s_cfg, rng)
  variants = {}   # name -> (description, runners)
  for k in args.responses_per_row:
    if k <= group:
      variants[f"packed_{k}"] = prepare_layout(traj, group, "packed", PROMPT + k * CLEAN_AND_STATES,
                                               args, s_cfg, optimizer, mesh, objective)
  variants["naive"] = prepare_layout(traj, group, "naive", PROMPT + N_BLOCKS * BLOCK, args, s_cfg,
                                     optimizer, mesh, objective)
  for _ in range(args.repeats):
    for _, runners in variants.values():
      for runner in runners.values():
        runner.run_once()
  for desc, runners in variants.values():
    if "chosen" in runners:
      desc.update(runners["chosen"].result())
    if "check" in runners:
      desc["check_more_micro_batches"].update(runners["check"].result())
  out = {"states": group * STATES,
         "packed_by_responses_per_row": {name.split("_")[1]: desc
                                         for name, (desc, _) in variants.items()
                                         if name.startswith("packed")},
         "naive": variants["naive"][0]}
  for k, r in out["packed_by_responses_per_row"].items():
    print(f"  G={group} packed, {k} response(s)/row: " + _summary(r), flush=True)
  print(f"  G={group} naive: " + _summary(out["naive"]), flush=True)
  ran = {k: r for k, r in out["packed_by_responses_per_row"].items() if "seconds_median" in r}
  best = min(ran, key=lambda k: ran[k]["seconds_median"]) if ran else None
  out["packed_responses_per_row"] = int(best) if best else None
  out["packed"] = ran[best] if best else None
  ok = best is not None and "seconds_median" in out["naive"]
  out["speedup"] = out["naive"]["seconds_median"] / out["packed"]["seconds_median"] if ok else None
  out["loss_abs_diff"] = (abs(out["naive"]["loss_first_step"] - out["packed"]["loss_first_step"])
                          if ok else None)
  fastest = lambda r: min([r["seconds_median"]] + [r[c]["seconds_median"] for c in
                                                   ("check_more_micro_batches",) if c in r])
  out["speedup_best_measured"] = (fastest(out["naive"]) / min(fastest(r) for r in ran.values())
                                  if ok else None)
  return out


def _summary(r):
  if "seconds_median" not in r:
    return f"{r['rows']} rows x {r['row_len']}: {r['error']}"
  text = (f"{r['rows']} rows x {r['row_len']}, micro_batches={r['micro_batches']} "
          f"(~{r['estimated_peak_bytes'] / 2**30:.1f} GiB): {r['seconds_median']:.3f} s")
  if "check_more_micro_batches" in r:
    c = r["check_more_micro_batches"]
    text += f"; with {c['micro_batches']} micro-batches: {c['seconds_median']:.3f} s"
  return text


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--groups", type=int, nargs="+", default=[8, 16, 24])
  ap.add_argument("--responses-per-row", type=int, nargs="+", default=[1, 2],
                  help="packed replay.row_len = prompt + this many responses (clean + states)")
  ap.add_argument("--memory-gb", type=float, default=10.0,
                  help="largest XLA-estimated step footprint a micro-batch count may have")
  ap.add_argument("--check-factor", type=int, default=4,
                  help="also time each layout with this many times more micro-batches (1 = off)")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default="benchmarks/results/replay_speedup.json")
  args = ap.parse_args()
  config = tiny.get_config("sft")
  from orl_jax.data.tiny_task import tiny_tokenizer
  tok = tiny_tokenizer()
  typed = run_config.convert(config)
  s_cfg = config_lib.model_config(typed, vocab_size=tok.vocab_size, mask_id=tok.mask_id)
  mesh = sharding_lib.make_mesh()
  optimizer = optimizer_of(dataclasses.replace(config_lib.optimizer_config(typed),
                                               residual_lr_scale=1.0), s_cfg)
  objective = OrlObjective(LossConfig.from_section(
      Loss(gate_entropy=0.0, conf_entropy=0.9, kl_reference="rollout")))
  results = {"device": jax.devices()[0].device_kind, "backend": jax.default_backend(),
             "attention_impl": s_cfg.attention_impl, "prompt_len": PROMPT, "block": BLOCK,
             "blocks": N_BLOCKS, "steps_per_block": STEPS, "repeats": args.repeats,
             "memory_budget_gb": args.memory_gb, "responses_per_row": args.responses_per_row,
             "by_group": {}}
  for g in args.groups:
    results["by_group"][str(g)] = measure(g, args, s_cfg, optimizer, mesh, objective)
    _common.write_json(args.out, results)   # keep what finished if a later G dies
  print(f"{'G':>4} {'states':>7} {'naive s':>9} {'packed s':>9} {'resp/row':>8} {'speedup':>8} "
        f"{'best':>6} {'|dloss|':>9}")
  for g in args.groups:
    r = results["by_group"][str(g)]
    naive = (f"{r['naive']['seconds_median']:>9.3f}" if "seconds_median" in r["naive"]
             else f"{'-':>9}")
    packed = f"{r['packed']['seconds_median']:>9.3f}" if r["packed"] else f"{'-':>9}"
    per_row = f"{r['packed_responses_per_row']:>8}" if r["packed"] else f"{'-':>8}"
    speed = f"{r['speedup']:>8.2f}" if r["speedup"] else f"{'-':>8}"
    best = f"{r['speedup_best_measured']:>6.2f}" if r["speedup"] else f"{'-':>6}"
    diff = f"{r['loss_abs_diff']:>9.2e}" if r["loss_abs_diff"] is not None else f"{'-':>9}"
    print(f"{g:>4} {r['states']:>7} {naive} {packed} {per_row} {speed} {best} {diff}")
  print(f"wrote {args.out}")
  done = [g for g in args.groups if results["by_group"][str(g)]["speedup"]]
  if 16 in done:
    print(f"replay_speedup_G16: {results['by_group']['16']['speedup']:.2f}")
  else:  # say so rather than pass another G off as the headline
    print("replay_speedup_G16: none (G = 16 did not run both layouts; see the JSON)")


if __name__ == "__main__":
  main()
