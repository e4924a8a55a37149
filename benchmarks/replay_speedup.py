"""Packed staircase replay vs naive replay: one training step (forward, backward, update) on
the same captured states, same loss, measured side by side in one process.

Workload shaped like the paper's, not the tiny demo's: one shared prompt of 512 tokens
(few-shot context), G responses of 4 blocks of 32, every captured state replayed (4 denoising
steps per block), the tiny model's width. The naive layout gives every state its own row with
its whole prefix ([prompt | clean blocks before it | state]); the packed layout shares one
prompt copy per row segment under the staircase mask.

  python benchmarks/replay_speedup.py [--groups 8 16 24] [--row-len 2048] [--repeats 3]
"""
import argparse

import _common  # noqa: F401
import jax
import jax.numpy as jnp
import numpy as np

from configs import tiny
from orl_jax import config as config_lib
from orl_jax import sharding as sharding_lib
from orl_jax.decoding import Capture
from orl_jax.losses import LossConfig, orl_loss
from orl_jax.replay import ReplayConfig, build_plan, gather_batch
from orl_jax.rollout import Trajectories
from orl_jax.train.state import create_train_state, make_optimizer, make_train_step

PROMPT, BLOCK, N_BLOCKS, STEPS = 512, 32, 4, 4


def synthetic_trajectories(group: int, model_cfg, rng: np.random.Generator):
  """One prompt, `group` responses; every block decoded in STEPS steps (8 tokens per step)."""
  v, d, k = model_cfg.vocab_size, model_cfg.d_model, 16
  n = BLOCK * N_BLOCKS
  s = N_BLOCKS * STEPS
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
  cap = Capture(canvas=jnp.asarray(canvas), block=jnp.asarray(block), step=jnp.asarray(step),
                z=jnp.asarray(z), alpha=jnp.asarray(ent), entropy=jnp.asarray(ent),
                topk_ids=top_ids, topk_logprobs=top_lp,
                commit=jnp.zeros((group, s, BLOCK), bool), valid=jnp.ones((group, s), bool),
                n_states=jnp.full((group,), s, jnp.int32), overflow=jnp.zeros((group,), bool))
  prompt = rng.integers(5, v, (1, PROMPT)).astype(np.int32)
  return Trajectories(prompt_tokens=jnp.asarray(prompt), prompt_valid=jnp.ones((1, PROMPT), bool),
                      responses=jnp.asarray(responses), nfe=jnp.zeros((group,), jnp.int32),
                      n_generated=jnp.full((group,), n, jnp.int32),
                      finished=jnp.ones((group,), bool), capture=cap,
                      rollout_step=jnp.asarray(0, jnp.int32))


def measure(group: int, row_len: int, repeats: int, config, s_cfg):
  rng = np.random.default_rng(group)
  traj = synthetic_trajectories(group, s_cfg, rng)
  n_states = group * N_BLOCKS * STEPS
  mesh = sharding_lib.make_mesh()
  optimizer = make_optimizer(config.train, 1.0)
  lcfg = LossConfig(conf_entropy=0.9)
  out = {}
  for layout in ("packed", "naive"):
    per_row = PROMPT + N_BLOCKS * BLOCK if layout == "naive" else row_len
    n_rows = n_states if layout == "naive" else n_states  # generous; trimmed below
    rcfg = ReplayConfig(row_len=per_row, n_rows=n_rows, max_states=n_states,
                        max_responses=group, layout=layout)
    plan, stats = build_plan(prompt_valid=np.ones((1, PROMPT), bool),
                             capture_valid=np.ones((group, n_states // group), bool),
                             capture_block=np.asarray(traj.capture.block),
                             eligible=np.ones((group,), bool), group_size=group,
                             block_size=BLOCK, cfg=rcfg, rng=np.random.default_rng(0))
    assert stats["states_dropped"] == 0 and stats["states_packed"] == n_states
    used = stats["rows_used"]
    plan = jax.tree.map(lambda x: x[:used] if x.ndim == 2 and x.shape[0] == n_rows else x, plan)
    batch = gather_batch(traj, plan, mask_id=s_cfg.mask_id, block_size=BLOCK)
    graphdef, state, state_sh = create_train_state(s_cfg, optimizer, mesh, 0)
    repl = sharding_lib.replicated(mesh)
    step = make_train_step(graphdef, optimizer, lambda m, b, k: orl_loss(m, b, lcfg), mesh,
                           state_sh, jax.tree.map(lambda _: repl, batch))
    key = jax.random.key(0)
    try:
      state, metrics = step(state, batch, key)          # compile + warm-up
      loss = float(metrics["loss"])
    except jax.errors.JaxRuntimeError as e:             # e.g. naive rows exceed host memory
      if "RESOURCE_EXHAUSTED" not in str(e):
        raise
      out[layout] = {"error": str(e).splitlines()[0][:200], "rows": used, "row_len": per_row,
                     "tokens": used * per_row}
      continue
    holder = {"state": state}

    def run():
      holder["state"], m = step(holder["state"], batch, key)
      jax.block_until_ready(m)

    t, runs = _common.median_time(run, repeats)
    out[layout] = {"seconds_median": t, "runs": runs, "rows": used, "row_len": per_row,
                   "tokens": used * per_row, "loss_first_step": loss,
                   "replay_efficiency": stats["replay_efficiency"]}
  ok = all("seconds_median" in out[k] for k in ("packed", "naive"))
  out["speedup"] = (out["naive"]["seconds_median"] / out["packed"]["seconds_median"]) if ok else None
  out["loss_abs_diff"] = (abs(out["naive"]["loss_first_step"] - out["packed"]["loss_first_step"])
                          if ok else None)
  out["states"] = n_states
  return out


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--groups", type=int, nargs="+", default=[8, 16, 24])
  ap.add_argument("--row-len", type=int, default=2048)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--out", default="benchmarks/results/replay_speedup.json")
  args = ap.parse_args()
  config = tiny.get_config("sft")
  from orl_jax.data.tokenizer import tiny_tokenizer
  tok = tiny_tokenizer()
  s_cfg = config_lib.model_config(config, vocab_size=tok.vocab_size, mask_id=tok.mask_id)
  results = {"device": jax.devices()[0].device_kind, "prompt_len": PROMPT, "block": BLOCK,
             "blocks": N_BLOCKS, "steps_per_block": STEPS, "row_len": args.row_len,
             "attention_impl": s_cfg.attention_impl, "by_group": {}}
  print(f"{'G':>4} {'states':>7} {'naive s':>9} {'packed s':>9} {'speedup':>8} {'|dloss|':>9}")
  fmt = lambda r, k: (f"{r[k]['seconds_median']:>9.3f}" if "seconds_median" in r[k]
                      else f"{'OOM':>9}")
  for g in args.groups:
    r = measure(g, args.row_len, args.repeats, config, s_cfg)
    results["by_group"][str(g)] = r
    speed = f"{r['speedup']:>8.2f}" if r["speedup"] else f"{'-':>8}"
    diff = f"{r['loss_abs_diff']:>9.2e}" if r["loss_abs_diff"] is not None else f"{'-':>9}"
    print(f"{g:>4} {r['states']:>7} {fmt(r, 'naive')} {fmt(r, 'packed')} {speed} {diff}")
  _common.write_json(args.out, results)
  # headline: G = 16 when both layouts ran there, else the largest G where both ran
  done = [g for g in args.groups if results["by_group"][str(g)]["speedup"]]
  g = 16 if 16 in done else (max(done) if done else None)
  if g is None:
    print("replay_speedup: none (no group size ran both layouts)")
  else:
    print(f"replay_speedup_G{g}: {results['by_group'][str(g)]['speedup']:.2f}")


if __name__ == "__main__":
  main()
