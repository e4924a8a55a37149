"""Decode tokens/s: the jitted block decoder on the tiny model, and a 60M LLaDA against Fast-dLLM.

`--model=tiny` (default): the jitted decoder vs a naive decoder that returns to the host every
step. Both use the same model, prompts and greedy rule, and must produce identical tokens
(checked). The naive decoder runs the same jitted pieces (prefill, one denoising step, commit
forward) from a Python loop and reads the block back to the host after every step to decide
whether to go on — the way a straightforward port of a PyTorch sampler works.

`--model=llada60m`: a random 60M LLaDA (d512, 8 layers, 8 heads, MLP 1536, vocabulary 32k)
written once under the official tensor names; our decoder reads it through `model.path`, the
PyTorch port of Fast-dLLM (benchmarks/peers/fast_dllm.py) from the same files. Greedy,
threshold 0.9, prompts of 24-32 tokens left-padded to 32, 32 new tokens, blocks of 8. Ours in
each `decode.cache` x `decode.schedule` the DecodeConfig has (others are skipped, and said so),
`per_row` also with refill (a queue of REFILL x batch prompts on `batch` rows), the peer's plain
and dual-cache decoders; batches 1, 16, 64; compile excluded (ahead-of-time), medians of
`--repeats` rounds in which every decoder runs once (a shared machine's drift falls on all);
beside each figure the memory-bandwidth and FLOP bounds on this machine
(measured when the run starts), and the share of tokens equal to the exact decoder's.
`--model=blockcausal60m`: the same tensors with block-causal attention (ours only: exact KV
cache on and off, per_row without and with refill).

  python benchmarks/decode_throughput.py [--batch 64] [--rule threshold_0.9] [--repeats 3]
  python benchmarks/decode_throughput.py --model=llada60m [--batches 1,16,64] [--repeats 3]
  python benchmarks/decode_throughput.py --model=llada60m --batches 64 --caches=dual \
      --peer_modes=dual    # one cache mode a side (the first mode run is the "exact" reference)
"""
import argparse
import dataclasses
import os
import tempfile

import _common  # noqa: F401
import _roofline
import jax
import jax.numpy as jnp
import numpy as np

from configs import tiny
from orl_jax import residual as residual_lib
from orl_jax.models import params_io
from orl_jax.data.pipeline import encode_prompts
from orl_jax.decode import block_sampler
from orl_jax.decode import build as decode_build
from orl_jax.decode.canvas import block_layout, prompt_layout
from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.step import propose
from orl_jax.models import build
from orl_jax.models.transformer import init_cache
from orl_jax.setup.build import build_setup, initial_params
from orl_jax.unmasking import UnmaskRule, select_commits
from pallas_kernels.staircase_attention import KIND_CLEAN, KIND_STATE
from flax import nnx


def naive_decode(graphdef, params, prompts, valid, dcfg):
  """Host-driven loop: one jitted call per step, a device->host read after each."""
  model_cfg = nnx.merge(graphdef, params).cfg
  b, n, p = dcfg.block_size, dcfg.gen_length, prompts.shape[1]
  rows = prompts.shape[0]

  @jax.jit
  def prefill(params, prompts, valid):
    model = nnx.merge(graphdef, params)
    pos, meta = prompt_layout(valid, b)
    cache = init_cache(model.cfg, rows, p + n)
    return model(prompts, pos, meta, cache=cache, cache_mode="write", cache_offset=0).cache

  @jax.jit
  def step(params, tokens, res, cache, start, active):
    model = nnx.merge(graphdef, params)
    pos, meta = block_layout(rows, start, b, KIND_STATE)
    logits = model(tokens, pos, meta, residual=res, cache=cache, cache_mode="read").logits
    cand, conf, ent = propose(logits, None, 0.0)
    masked = tokens == dcfg.mask_id
    need = active & jnp.any(masked, -1)
    commit = select_commits(dcfg.rule, masked, conf, ent) & need[:, None]
    new = jnp.where(commit, cand, tokens)
    nxt = residual_lib.residual_from_logits(logits, model.embedding_table,
                                            embed_scale=model.cfg.embed_scale,
                                            temperature=model.cfg.residual_temperature,
                                            dtype=model.cfg.compute_dtype)
    still = (new == dcfg.mask_id)[..., None]
    nxt = residual_lib.Residual(jnp.where(still, nxt.z, 0), jnp.where(still[..., 0], nxt.alpha, 0))
    return new, nxt, need

  @jax.jit
  def commit_forward(params, tokens, cache, start):
    model = nnx.merge(graphdef, params)
    pos, meta = block_layout(rows, start, b, KIND_CLEAN)
    return model(tokens, pos, meta, cache=cache, cache_mode="write", cache_offset=start).cache

  cache = prefill(params, prompts, valid)
  finished = np.zeros((rows,), bool)
  nfe = np.zeros((rows,), np.int32)
  out = np.full((rows, n), dcfg.eos_id, np.int32)
  for j in range(dcfg.n_blocks):
    if finished.all():
      break
    start = p + j * b
    active = ~finished
    tokens = jnp.asarray(np.where(active[:, None], dcfg.mask_id, dcfg.eos_id).repeat(b, 1))
    res = residual_lib.zero_residual(rows, b, model_cfg.d_model, model_cfg.compute_dtype)
    for _ in range(dcfg.steps_bound):
      tokens, res, need = step(params, tokens, res, cache, start, jnp.asarray(active))
      need = np.asarray(need)              # host sync every step
      nfe += need
      if not (active & (np.asarray(tokens) == dcfg.mask_id).any(-1)).any():
        break
    host = np.asarray(tokens)
    host = np.where(host == dcfg.mask_id, dcfg.eos_id, host)
    out[:, j * b:(j + 1) * b] = np.where(active[:, None], host, out[:, j * b:(j + 1) * b])
    eos_here = active & (host == dcfg.eos_id).any(-1)
    needs_commit = active & ~eos_here & (j < dcfg.n_blocks - 1)
    if needs_commit.any():
      cache = commit_forward(params, jnp.asarray(host), cache, start)
      nfe += needs_commit
    finished |= eos_here
  first = np.where((out == dcfg.eos_id).any(-1), (out == dcfg.eos_id).argmax(-1), n - 1)
  out = np.where(np.arange(n)[None] > first[:, None], dcfg.eos_id, out)
  return out, nfe, first + 1


def run_tiny(args):
  """The tiny model: the jitted decoder against the host-driven loop (identical tokens)."""
  config = tiny.get_config("eval")
  s = build_setup(config)
  graphdef, params = initial_params(s)
  used = "random init"
  if os.path.exists(os.path.join(args.params, params_io.META_FILE)):
    params, _ = params_io.load_params(args.params, params)
    used = args.params
  tok = s.tokenizer
  problems = s.task.eval_problems()[:args.batch]
  prompts, valid = encode_prompts(problems, tok, config.task.prompt_len)
  setting = dict(mask_id=tok.mask_id, eos_id=tok.eos_id, rule=UnmaskRule.parse(args.rule),
                 temperature=0.0)
  dcfg = block_sampler.block_decode_config(config, s.model_cfg, "evaluate", **setting)
  jitted = decode_build.make_decoder(config, s.model_cfg, graphdef, "evaluate", **setting)
  key = jax.random.key(0)

  def run_jitted():
    return jax.block_until_ready(jitted(params, prompts, valid, key))

  ref = run_jitted()  # compile + warm-up
  naive_out = naive_decode(graphdef, params, prompts, valid, dcfg)  # compile + warm-up
  same = (np.array_equal(np.asarray(ref.tokens), naive_out[0])
          and np.array_equal(np.asarray(ref.nfe_engine), naive_out[1]))
  if not same:
    raise SystemExit("jitted and naive decoders disagree; the comparison would be meaningless")
  n_tokens = int(np.asarray(ref.n_generated).sum())
  t_jit, all_jit = _common.median_time(run_jitted, args.repeats)
  t_naive, all_naive = _common.median_time(
      lambda: naive_decode(graphdef, params, prompts, valid, dcfg), args.repeats)
  result = {
      "batch": args.batch, "rule": args.rule, "params": used,
      "device": jax.devices()[0].device_kind,
      "generated_tokens": n_tokens, "nfe_mean": float(np.asarray(ref.nfe).mean()),
      "jitted_seconds_median": t_jit, "naive_seconds_median": t_naive,
      "jitted_tokens_per_s": n_tokens / t_jit, "naive_tokens_per_s": n_tokens / t_naive,
      "speedup": t_naive / t_jit, "jitted_runs": all_jit, "naive_runs": all_naive,
      "outputs_identical": same,
  }
  result["bounds"] = {str(b): tiny_bound(s, graphdef, params, jitted, dcfg, (prompts, valid), b,
                                         args.repeats) for b in args.batches}
  _common.write_json(args.out, result)
  print(f"batch {args.batch}, {args.rule}, params: {used}, {n_tokens} tokens, "
        f"NFE {result['nfe_mean']:.1f}")
  print(f"jitted: {result['jitted_tokens_per_s']:.0f} tok/s   naive: "
        f"{result['naive_tokens_per_s']:.0f} tok/s")
  print(f"decode_speedup_jitted_vs_naive: {result['speedup']:.2f}")


def tiny_bound(s, graphdef, params, jitted, dcfg, problems, batch: int, repeats: int) -> dict:
  """The jitted decoder on the first `batch` problems: tok/s and its shares of the machine's
  FLOP and bandwidth bounds (`bound_figures`; the peaks timed in the same rounds), with XLA's
  count of one step beside ours."""
  prompts, valid = (x[:batch] for x in problems)
  key = jax.random.key(0)
  run = lambda: jax.block_until_ready(jitted(params, prompts, valid, key))
  res = run()                                                      # compile + warm-up
  times = interleaved_times({"jitted": run, **_roofline.peak_runs()}, repeats)
  hw = _roofline.peaks({k: v[0] for k, v in times.items() if k.startswith("peak/")})
  seconds, runs = times["jitted"]
  m, p = s.model_cfg, prompts.shape[1]
  kind = decode_kind(m, dict(kv_cache=dcfg.kv_cache))
  tokens = int(np.asarray(res.n_generated).sum())
  fig = dict(tokens_per_s=tokens / seconds, seconds_median=seconds, runs=runs, hardware=hw,
             generated_tokens=tokens, nfe_per_row=float(np.asarray(res.nfe).mean()),
             **bound_figures(hw, our_work(m, dcfg, kind, res, p), seconds, tokens),
             xla_step_check=xla_step_check(graphdef, params, dcfg, prompts, valid, m, kind, p))
  print(f"batch {batch:3d} jitted {fig['tokens_per_s']:8.0f} tok/s  {bound_line(fig)}; a step: "
        f"XLA's count / ours {fig['xla_step_check']['xla_over_counted']:.3f}", flush=True)
  return fig


# ------------------------------------------------------------------ 60M: ours vs Fast-dLLM

SIZE_60M = dict(d_model=512, n_layers=8, n_heads=8, mlp_dim=1536, vocab_size=32000)
SIZE_SMALL = dict(d_model=128, n_layers=2, n_heads=4, mlp_dim=384, vocab_size=4096)  # --small
PROMPT_LEN, MIN_PROMPT, GEN, BLOCK, THRESHOLD = 32, 24, 32, 8, 0.9
# Random head scale. Measured: the tiny test LLaDA then commits 1-1.7 tokens per forward at
# threshold 0.9; the 60M one still commits one per forward (its confidences stay below 0.9).
HEAD_SCALE = 8.0
# The per-row engine (decode.schedule=per_row) decodes without the approximate caches: the
# batch's own prompts on as many rows (no refill), and a queue of REFILL x batch prompts on
# `batch` rows (a row whose response ended takes the next prompt).
REFILL = 4
OUR_MODES = [dict(cache=c, schedule="lockstep") for c in ("none", "prefix", "dual")] + [
    dict(cache="none", schedule="per_row"), dict(cache="none", schedule="per_row", refill=REFILL)]


def n_params(m) -> dict:
  """Parameter counts of a dense model config: body (layers), embedding, head."""
  attn = 4 * m.d_model * m.n_heads * m.head_dim
  body = m.n_layers * (attn + 3 * m.d_model * m.mlp_dim + 2 * m.d_model)
  return dict(body=body, embedding=m.vocab_size * m.d_model, head=m.vocab_size * m.d_model,
              total=body + 2 * m.vocab_size * m.d_model + m.d_model)


def decode_kind(m, mode: dict) -> str:
  """The `_roofline.decode_work` kind of one of our modes on model config `m`."""
  if m.attention == "bidirectional":
    return mode.get("cache", "none")
  return "kv" if mode.get("kv_cache", True) else "plain"


def blocks_decoded(dcfg, n_generated):
  """[B] blocks each row decoded: all of them, or (eos_early_stop) through its EOS's block."""
  n = np.asarray(n_generated)
  if not dcfg.eos_early_stop:
    return np.full(n.shape, dcfg.n_blocks)
  return np.clip(-(-n // dcfg.block_size), 1, dcfg.n_blocks)


def bound_figures(hw: dict, work: dict, seconds: float, tokens: int) -> dict:
  """The decode's shares of this machine's FLOP and bandwidth bounds (`_roofline.fractions`)
  and the tok/s each bound allows (the generated tokens over the least time the decode's FLOPs
  or bytes take at the measured peaks)."""
  frac = _roofline.fractions(work, seconds, hw)
  return dict(frac, flop_bound_tok_s=tokens * hw["matmul_gflop_s"] * 1e9 / work["flops"],
              bandwidth_bound_tok_s=tokens * hw["bandwidth_gb_s"] * 1e9 / work["bytes"],
              batch_forwards=work["batch_forwards"])


def our_work(m, dcfg, kind: str, res, prompt_len: int) -> dict:
  """`_roofline.decode_work` of one of our decodes from its DecodeOutput's forward counts (the
  per-row engine: its loop's iterations are the batch forwards)."""
  work = _roofline.decode_work(
      m, kind, prompt_len=prompt_len, gen=dcfg.gen_length, block=dcfg.block_size,
      denoise=res.nfe_denoise, ran=res.nfe_engine,
      n_blocks=blocks_decoded(dcfg, res.n_generated))
  if res.iterations is not None:
    extra = float(np.asarray(res.iterations)) - work["batch_forwards"]
    work = dict(work, batch_forwards=work["batch_forwards"] + extra,
                bytes=work["bytes"] + extra * _roofline.weight_bytes(m))
  return work


def peer_work(m, kind: str, nfe: float, batch: int) -> dict:
  """`_roofline.decode_work` of a Fast-dLLM decode: `nfe` forwards of the batch, every block,
  the head at every position its forward carries."""
  rows = np.full((batch,), nfe)
  return _roofline.decode_work(m, kind, prompt_len=PROMPT_LEN, gen=GEN, block=BLOCK,
                               denoise=rows, ran=rows, n_blocks=np.full((batch,), GEN // BLOCK),
                               full_head=True)


def xla_step_check(graphdef, params, dcfg, ids, valid, m, kind: str, prompt_len: int) -> dict:
  """One denoising step of the decode compiled alone (`lockstep.denoising_step`): XLA's FLOP
  count against `_roofline.forward_flops` of the same step with the head at every block
  position (XLA counts the masked head's `switch` at its widest branch)."""
  from orl_jax.decode import lockstep
  b, width = dcfg.block_size, prompt_len + dcfg.gen_length
  ids, valid = jnp.asarray(ids), jnp.asarray(valid)

  def step(state, ids, valid):
    model = nnx.merge(graphdef, state)
    cache, carry = lockstep.denoising_step_inputs(model, ids, valid, dcfg)
    return lockstep.denoising_step(model, ids, valid, jax.random.key(0), dcfg, cache, carry)

  xla = _roofline.xla_flops(jax.jit(step).lower(params, ids, valid).compile())
  if kind in ("none", "plain"):
    row = _roofline.forward_flops(m, width, width, b, b)
  elif kind in ("dual", "prefix"):
    n = b if kind == "dual" else dcfg.gen_length
    row = _roofline.forward_flops(m, n, width + n, b, b)
  else:
    row = _roofline.forward_flops(m, b, width, b)
  counted = row * ids.shape[0]
  return dict(xla_step_flops=xla, counted_step_flops=counted, xla_over_counted=xla / counted)


def supported_modes(modes) -> tuple[list, list]:
  """(modes DecodeConfig can express, skipped ones with the missing field)."""
  have = {f.name for f in dataclasses.fields(DecodeConfig)} | {"schedule", "refill"}
  ok, skipped = [], []
  for mode in modes:
    missing = [k for k, v in mode.items() if k not in have and v not in ("none", "lockstep")]
    (skipped if missing else ok).append((mode, missing))
  return [m for m, _ in ok], [dict(mode=m, missing=f) for m, f in skipped]


def prepare_ours(graphdef, params, config, ids, valid, n_rows: int = 0):
  """(run, DecodeOutput): our decoder of `config` (greedy, threshold 0.9;
  `decode_build.make_decoder`) compiled ahead of time (so compile is excluded) and run once.
  decode.schedule "per_row": the engine (orl_jax.decode.per_row) decoding the prompts as one
  queue on `n_rows` rows (0: one row per prompt)."""
  from benchmarks.peers import llada_dir
  args = (params, jnp.asarray(ids), jnp.asarray(valid), jax.random.key(0))
  run = decode_build.make_decoder(config, None, graphdef, "evaluate", mask_id=llada_dir.MASK_ID,
                              eos_id=llada_dir.EOS_ID, rule=UnmaskRule("threshold", THRESHOLD),
                              temperature=0.0, n_rows=n_rows or len(ids))
  compiled = run.lower(*args).compile()
  go = lambda: jax.block_until_ready(compiled(*args))
  return go, go()


def prepare_peer(peer, name: str, ids, valid):
  """(run, (tokens [B, N], batch NFE)): one Fast-dLLM decoder, run once."""
  import torch
  from benchmarks.peers import fast_dllm, llada_dir
  prompt, prompt_valid = torch.as_tensor(ids).long(), torch.as_tensor(valid)
  run = lambda: fast_dllm.DECODERS[name](
      peer, prompt, steps=GEN, gen_length=GEN, block_length=BLOCK, mask_id=llada_dir.MASK_ID,
      threshold=THRESHOLD, prompt_valid=prompt_valid)
  x, nfe = run()
  return run, (x[:, PROMPT_LEN:].numpy(), nfe)


def interleaved_times(runs: dict, repeats: int) -> dict:
  """{name: (median s, all runs)}: every run once per round, `repeats` rounds, so a change in
  the machine's speed (it may be shared) falls on every decoder alike."""
  times = {name: [] for name in runs}
  for _ in range(repeats):
    for name, run in runs.items():
      times[name].append(_common.median_time(run, 1)[0])
  return {name: (float(np.median(t)), t) for name, t in times.items()}


def config_for(s, mode: dict):
  """The run config of the benchmark in one of OUR_MODES (its decode.cache / decode.schedule)."""
  return s.config.replace(**{f"decode.{k}": mode[k] for k in ("cache", "schedule")})


def _figure(seconds, runs, tokens: int, nfe_row: float, bound: dict, agree=None) -> dict:
  fig = dict(tokens_per_s=tokens / seconds, seconds_median=seconds, runs=runs,
             generated_tokens=tokens, nfe_per_row=nfe_row, **bound)
  if agree is not None:
    fig["tokens_agree_with_exact"] = agree      # share of tokens equal to cache=none's
  return fig


def _eos_filled(tokens, eos_id: int):
  """Tokens after a row's first EOS become EOS (our decoder's output convention)."""
  is_eos = tokens == eos_id
  first = np.where(is_eos.any(-1), is_eos.argmax(-1), tokens.shape[1])
  return np.where(np.arange(tokens.shape[1])[None] > first[:, None], eos_id, tokens)


def _n_generated(tokens, eos_id: int):
  """[B] tokens through the first EOS (all of them without one)."""
  is_eos = tokens == eos_id
  return np.where(is_eos.any(-1), is_eos.argmax(-1) + 1, tokens.shape[1])


def bench_batch(ctx: dict, batch: int, repeats: int) -> dict:
  """Every mode of ctx (ours, then the peer's plain and dual decoders) at one batch size."""
  from benchmarks.peers import llada_dir
  m = ctx["model_cfg"]
  ids, valid = llada_dir.random_prompts(batch, PROMPT_LEN, MIN_PROMPT, m.vocab_size, seed=1)
  runs, results, meta = {}, {}, {}
  for mode in ctx["modes"]:
    config = config_for(ctx["setup"], mode)
    n_queue = batch * mode.get("refill", 1)         # refill: a longer queue on `batch` rows
    q_ids, q_valid = llada_dir.random_prompts(n_queue, PROMPT_LEN, MIN_PROMPT, m.vocab_size,
                                              seed=1)   # its first `batch` prompts are `ids`
    kind = decode_kind(m, mode)
    name = "ours/" + "/".join(f"{k}{v}" if k == "refill" else ("kv" if v else "recompute")
                              if isinstance(v, bool) else str(v) for k, v in mode.items())
    runs[name], results[name] = prepare_ours(ctx["graphdef"], ctx["params"], config, q_ids,
                                             q_valid, batch)
    meta[name] = (kind, n_queue, our_decode_config(config, m), mode["schedule"] == "lockstep")
  for peer_name in (ctx["peer_modes"] if ctx["peer"] is not None else ()):
    runs[f"peer/{peer_name}"], results[f"peer/{peer_name}"] = prepare_peer(
        ctx["peer"], peer_name, ids, valid)
    meta[f"peer/{peer_name}"] = (peer_name, batch, None, False)
  runs.update(_roofline.peak_runs())
  times = interleaved_times(runs, repeats)
  hw = _roofline.peaks({k: times.pop(k)[0] for k in list(times) if k.startswith("peak/")})
  out, exact, n_exact = {"hardware": hw}, None, 0
  for name, res in results.items():
    kind, n_queue, dcfg, lockstep = meta[name]
    if name.startswith("ours/"):
      toks, nfe = np.asarray(res.tokens), float(np.asarray(res.nfe).mean())
      tokens = int(np.asarray(res.n_generated).sum())
      work = our_work(m, dcfg, kind, res, PROMPT_LEN)
      if exact is None:             # the first mode is the exact one (cache none / kv)
        exact, n_exact = toks, tokens
    else:
      toks, nfe = _eos_filled(res[0], llada_dir.EOS_ID), float(res[1])
      tokens = n_exact or int(np.asarray(_n_generated(toks, llada_dir.EOS_ID)).sum())
      work = peer_work(m, kind, nfe, batch)
    out[name] = _figure(*times[name], tokens, nfe,
                        bound_figures(hw, work, times[name][0], tokens),
                        None if exact is None else float((toks[:batch] == exact).mean()))
    if lockstep:
      out[name]["xla_step_check"] = xla_step_check(ctx["graphdef"], ctx["params"], dcfg, ids,
                                                   valid, m, kind, PROMPT_LEN)
  print(f"batch {batch:3d} machine in these rounds: {hw['matmul_gflop_s']:.0f} GFLOP/s, "
        f"{hw['bandwidth_gb_s']:.1f} GB/s")
  for k, v in ((k, v) for k, v in out.items() if k != "hardware"):
    print(f"batch {batch:3d} {k:24s} {v['tokens_per_s']:9.1f} tok/s  NFE/row "
          f"{v['nfe_per_row']:5.1f}  {bound_line(v)}  agree "
          f"{v.get('tokens_agree_with_exact', float('nan')):.3f}", flush=True)
    if "xla_step_check" in v:
      print(f"          {k}: a step counted {v['xla_step_check']['counted_step_flops']:.3g} "
            f"FLOPs, XLA's cost analysis {v['xla_step_check']['xla_step_flops']:.3g} "
            f"(x{v['xla_step_check']['xla_over_counted']:.3f})")
  return out


def bound_line(fig: dict) -> str:
  """The decode's shares of the machine's bounds, as printed beside each figure."""
  return (f"{fig['gflop_s']:6.1f} GFLOP/s = {fig['flop_bound_fraction']:6.1%} of the FLOP "
          f"bound, {fig['gb_s']:6.2f} GB/s = {fig['bandwidth_bound_fraction']:6.1%} of the "
          "bandwidth bound")


def our_decode_config(config, m) -> DecodeConfig:
  """The DecodeConfig `prepare_ours` decodes with (greedy, threshold 0.9)."""
  from benchmarks.peers import llada_dir
  return block_sampler.block_decode_config(
      config, m, "evaluate", mask_id=llada_dir.MASK_ID, eos_id=llada_dir.EOS_ID,
      rule=UnmaskRule("threshold", THRESHOLD), temperature=0.0)


def setup_60m(args) -> dict:
  """The 60M LLaDA directory (written once), our params read from it, the peer, the modes."""
  from benchmarks.peers import llada_dir
  size = SIZE_SMALL if args.small else SIZE_60M
  tag = "small" if args.small else "60m"
  path = args.weights or os.path.join(tempfile.gettempdir(),
                                      f"orl_jax_llada{tag}_h{args.head_scale}")
  if not os.path.isfile(os.path.join(path, "config.json")):
    llada_dir.write_random_llada(path, seed=0, head_scale=args.head_scale, **size)
  graphdef, params, s = llada_dir.load_ours(path, gen_length=GEN, block_size=BLOCK)
  m, peer = s.model_cfg, None
  if args.model == "blockcausal60m":
    m = dataclasses.replace(m, attention="block_causal")
    graphdef, _ = build.abstract_params(m)        # same tensors, block-causal attention
    modes, skipped = supported_modes(
        [dict(kv_cache=kv, schedule="lockstep") for kv in (True, False)]
        + [dict(kv_cache=True, schedule="per_row"),     # the engine always uses the KV cache
           dict(kv_cache=True, schedule="per_row", refill=REFILL)])
  else:
    import torch
    from benchmarks.peers import fast_dllm
    torch.set_num_threads(args.threads)
    peer = fast_dllm.LLaDA.from_dir(path)
    modes, skipped = supported_modes(
        [m for m in OUR_MODES if args.caches == "all" or m["cache"] in args.caches.split(",")])
  modes = [dict(mode, refill=args.refill) if "refill" in mode else mode
           for mode in modes if args.refill or "refill" not in mode]
  for sk in skipped:
    print(f"skipped ours {sk['mode']}: DecodeConfig has no field {', '.join(sk['missing'])}")
  return dict(graphdef=graphdef, params=params, setup=s, model_cfg=m, peer=peer, modes=modes,
              peer_modes=tuple(args.peer_modes.split(",")),
              skipped=skipped, hw=_roofline.measure_peaks(), weights=path)


def ratios(batches: dict) -> dict:
  """ours / peer tokens-per-second, per batch and at each side's best batch."""
  rate = lambda b, k: batches[b][k]["tokens_per_s"] if k in batches[b] else float("nan")
  out = {}
  for ours in ("ours/none/lockstep", "ours/dual/lockstep"):
    for peer in ("peer/plain", "peer/dual"):
      name = f"{ours.split('/')[1]}_vs_{peer.replace('/', '_')}"
      for b in batches:
        out[f"{name}_batch{b}"] = rate(b, ours) / rate(b, peer)
      best = lambda k: max(rate(b, k) for b in batches)
      out[f"{name}_best_batch"] = best(ours) / best(peer)
  return out


def run_60m(args):
  ctx = setup_60m(args)
  m = ctx["model_cfg"]
  size = SIZE_SMALL if args.small else SIZE_60M
  result = dict(model=args.model, small=args.small, attention=m.attention, size=size,
                params=n_params(m), weights_dir_seed=0, head_scale=args.head_scale,
                hardware=ctx["hw"],
                threads=args.threads, prompt_len=[MIN_PROMPT, PROMPT_LEN], gen_length=GEN,
                block_size=BLOCK, threshold=THRESHOLD, repeats=args.repeats,
                device=jax.devices()[0].device_kind, skipped=ctx["skipped"], batches={})
  print(f"{args.model}: {n_params(m)['total'] / 1e6:.1f}M params; machine now: "
        f"{ctx['hw']['bandwidth_gb_s']:.1f} GB/s, {ctx['hw']['matmul_gflop_s']:.0f} GFLOP/s")
  tag = args.model.replace("llada", "") + ("_small" if args.small else "")
  out = args.out or f"benchmarks/results/decode_throughput_{tag}.json"
  for batch in args.batches:
    result["batches"][str(batch)] = bench_batch(ctx, batch, args.repeats)
    if ctx["peer"] is not None:
      result["ratios"] = ratios(result["batches"])
    _common.write_json(out, result)      # after every batch: a partial run still reports
  if ctx["peer"] is None:
    best = max(v["tokens_per_s"] for b in result["batches"].values() for k, v in b.items()
               if k != "hardware")
    print(f"decode_best_tokens_per_s: {best:.1f}")
    return
  r = result["ratios"]
  first = args.batches[0]
  print(f"decode_none_vs_peer_plain_batch{first}: {r[f'none_vs_peer_plain_batch{first}']:.2f}")
  print(f"decode_none_vs_peer_dual_batch{first}: {r[f'none_vs_peer_dual_batch{first}']:.2f}")
  print(f"decode_dual_vs_peer_dual_batch{first}: {r[f'dual_vs_peer_dual_batch{first}']:.2f}")


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--model", default="tiny", choices=("tiny", "llada60m", "blockcausal60m"))
  ap.add_argument("--batch", type=int, default=64, help="tiny: the batch")
  ap.add_argument("--batches", default="1,16,64",
                  help="the batch sizes (tiny: of the bound figures; the comparison is --batch)")
  ap.add_argument("--rule", default="threshold_0.9", help="tiny: the unmasking rule")
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--params", default="assets/tiny_base",
                  help="tiny: parameter folder (a random tiny model is used if it does not exist)")
  ap.add_argument("--weights", default="", help="60M: the LLaDA directory (written if absent)")
  ap.add_argument("--head_scale", type=float, default=HEAD_SCALE,
                  help="60M: scale of the random head (confidence, hence tokens per forward)")
  ap.add_argument("--small", action="store_true",
                  help="60M models: a 2-layer d128 model of the same layout instead (quick run)")
  ap.add_argument("--threads", type=int, default=2, help="60M: torch threads of the peer")
  ap.add_argument("--caches", default="all",
                  help="60M LLaDA: our decode.cache modes to run (comma list, or all)")
  ap.add_argument("--peer_modes", default="plain,dual", help="60M LLaDA: the peer's decoders")
  ap.add_argument("--refill", type=int, default=REFILL,
                  help="60M: per_row with refill decodes a queue of this many x batch prompts "
                       "(0: no refill mode)")
  ap.add_argument("--out", default="")
  args = ap.parse_args()
  args.batches = [int(b) for b in args.batches.split(",")]
  if args.model == "tiny":
    args.out = args.out or "benchmarks/results/decode_throughput.json"
    run_tiny(args)
  else:
    run_60m(args)


if __name__ == "__main__":
  main()
