"""The Fast-dLLM peer of the decode benchmark (benchmarks/peers/fast_dllm.py) on a tiny random
LLaDA directory: its forward and plain decoder agree with ours on identical weights, and its
caches behave as Fast-dLLM's design says. Needs torch (test/benchmark only):
pip install torch==2.13.0
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.peers import llada_dir
from orl_jax.decode import from_run
from orl_jax.decode.lockstep import lockstep_decoder
from orl_jax.unmasking import UnmaskRule
from pallas_kernels.staircase_attention import KIND_PAD, KIND_PROMPT, make_meta
from tests.support.helpers import greedy_threshold_margin
from flax import nnx

# compares token ids, forward counts or signs: rerun under other CPU numerics (make test-other-cpu)
pytestmark = pytest.mark.numerics

torch = pytest.importorskip("torch")
fast_dllm = pytest.importorskip("benchmarks.peers.fast_dllm")

P, N, B = 32, 32, 8       # prompt (left-padded), new tokens, block
VOCAB = 512


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
  # head_scale 8: confident enough that the threshold often commits several tokens per step
  return llada_dir.write_random_llada(str(tmp_path_factory.mktemp("llada")), d_model=64,
                                      n_layers=2, n_heads=4, mlp_dim=96, vocab_size=VOCAB,
                                      seed=0, head_scale=8.0)


@pytest.fixture(scope="module")
def prompts():
  return llada_dir.random_prompts(3, P, 24, VOCAB, seed=1)   # lengths 24, 25, 26


def _peer(path):
  torch.set_num_threads(2)
  return fast_dllm.LLaDA.from_dir(path)


def _peer_decode(peer, name, ids, valid, **kw):
  x, nfe = fast_dllm.DECODERS[name](
      peer, torch.as_tensor(ids).long(), steps=kw.get("steps", N), gen_length=N,
      block_length=B, mask_id=llada_dir.MASK_ID, threshold=kw.get("threshold", 0.9),
      prompt_valid=torch.as_tensor(valid))
  return x[:, P:].numpy(), nfe


def _forwards(tiny_dir, graphdef, params, ids, valid):
  """(ours, the peer's) logits of the prompts, [B, P, V] each."""
  model = nnx.merge(graphdef, params)
  pos = jnp.broadcast_to(jnp.arange(P), ids.shape)
  meta = make_meta(jnp.where(jnp.asarray(valid), KIND_PROMPT, KIND_PAD), 0, segment=0)
  ours = np.asarray(model(jnp.asarray(ids), pos, meta).logits)
  with torch.inference_mode():
    theirs, _ = _peer(tiny_dir)(torch.as_tensor(ids).long(), key_valid=torch.as_tensor(valid))
  return ours, theirs.numpy()


def _forward_difference(tiny_dir, graphdef, params, ids, valid) -> float:
  ours, theirs = _forwards(tiny_dir, graphdef, params, ids, valid)
  return float(np.abs(np.where(valid[..., None], ours - theirs, 0)).max())   # padding ignored


def test_peer_forward_matches_ours_on_the_same_directory(tiny_dir, prompts):
  ids, valid = prompts
  graphdef, params, _ = llada_dir.load_ours(tiny_dir)
  ours, theirs = _forwards(tiny_dir, graphdef, params, ids, valid)
  delta = np.abs(np.where(valid[..., None], ours - theirs, 0)).max()   # padding is ignored
  print(f"peer forward max|d|={delta:.2e} of max|logit|={np.abs(theirs).max():.1f}")
  assert delta <= 1e-5 * np.abs(theirs).max()


def test_peer_plain_decoder_gives_our_tokens_and_nfe(tiny_dir, prompts):
  """Greedy, threshold 0.9: the peer's plain decoder (one prompt at a time, as batch 1 runs)
  and ours (the batch at once) commit the same tokens in the same number of forwards. The two
  forwards differ by rounding (torch vs XLA, up to 1e-5 of the logits' scale, the first test);
  every decision of our decode is checked to have a margin far above that, so no near tie, and
  no CPU's rounding, decides the comparison."""
  ids, valid = prompts
  graphdef, params, s = llada_dir.load_ours(tiny_dir, gen_length=N, block_size=B)
  dcfg = from_run.decode_config(s.config, mask_id=llada_dir.MASK_ID, eos_id=llada_dir.EOS_ID,
                                  rule=UnmaskRule("threshold", 0.9), temperature=0.0)
  dcfg = dataclasses.replace(dcfg, capture_states=N)          # every step: one per token at most
  run = lockstep_decoder(graphdef, dcfg)
  out = jax.device_get(run(params, jnp.asarray(ids), jnp.asarray(valid), jax.random.key(0)))
  delta = _forward_difference(tiny_dir, graphdef, params, ids, valid)
  for r in range(ids.shape[0]):
    assert not out.capture.overflow[r]
    margin = greedy_threshold_margin(out.capture, r, llada_dir.MASK_ID, 0.9)
    print(f"row {r}: smallest decision margin {margin:.2e}, forwards differ by {delta:.2e}")
    assert margin > 50 * delta, f"row {r}: a near tie (margin {margin:.2e} vs {delta:.2e})"
  peer = _peer(tiny_dir)
  nfe_peer = []
  for r in range(ids.shape[0]):
    tokens, nfe = _peer_decode(peer, "plain", ids[r:r + 1], valid[r:r + 1])
    assert llada_dir.EOS_ID not in tokens   # so both decode every block (ours stops at EOS)
    np.testing.assert_array_equal(np.asarray(out.tokens[r]), tokens[0], err_msg=f"row {r}")
    nfe_peer.append(nfe)
  print(f"NFE ours {np.asarray(out.nfe).tolist()} peer {nfe_peer}")
  assert np.asarray(out.nfe).tolist() == nfe_peer
  assert min(nfe_peer) < N     # the threshold committed several tokens in some step


def test_peer_caches_are_exact_while_the_canvas_is_unchanged(tiny_dir, prompts):
  """Fast-dLLM's caches are approximate only because the canvas changes after they are built:
  right after the whole-canvas forward that builds them, the dual cache's block forward and the
  prefix cache's suffix forward give that forward's logits (here the middle block)."""
  ids, valid = prompts
  peer = _peer(tiny_dir)
  x = torch.cat([torch.as_tensor(ids).long(),
                 torch.full((ids.shape[0], N), llada_dir.MASK_ID, dtype=torch.long)], 1)
  x[:, P:P + B] = torch.as_tensor(ids[:, -B:]).long()   # a committed first block
  key_valid = torch.cat([torch.as_tensor(valid), torch.ones(ids.shape[0], N, dtype=torch.bool)], 1)
  start, end = P + B, P + 2 * B
  with torch.inference_mode():
    full, past = peer(x, use_cache=True, key_valid=key_valid)
    replace = torch.zeros_like(x, dtype=torch.bool)
    replace[:, start:end] = True
    dual, _ = peer(x[:, start:end], past_key_values=past, use_cache=True,
                   replace_position=replace, key_valid=key_valid)
    _, past = peer(x, use_cache=True, key_valid=key_valid)
    prefix_past = [(k[:, :, :start], v[:, :, :start]) for k, v in past]
    prefix, _ = peer(x[:, start:], past_key_values=prefix_past, use_cache=True,
                     key_valid=key_valid)
  scale = full.abs().max().item()
  assert (dual - full[:, start:end]).abs().max().item() <= 1e-5 * scale
  assert (prefix - full[:, start:]).abs().max().item() <= 1e-5 * scale


def test_peer_caches_equal_plain_when_every_block_takes_one_step(tiny_dir, prompts):
  """With the fixed schedule of one step per block (steps = number of blocks), every block is
  decided by the whole-canvas forward that (re)builds the caches: prefix and dual cache decode
  exactly as the plain decoder, in one forward per block."""
  ids, valid = prompts
  peer = _peer(tiny_dir)
  runs = {name: _peer_decode(peer, name, ids, valid, steps=N // B, threshold=None)
          for name in ("plain", "prefix", "dual")}
  for name in ("prefix", "dual"):
    np.testing.assert_array_equal(runs[name][0], runs["plain"][0], err_msg=name)
    assert runs[name][1] == runs["plain"][1] == N // B


@pytest.mark.slow  # ~1 CPU-minute: compiles our decoder at two batch sizes
def test_decode_benchmark_small_llada_runs_end_to_end(tmp_path):
  """benchmarks/decode_throughput.py --model=llada60m --small: every figure with its bounds,
  ours (cache none) and the peer's plain decoder identical, the headline last."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  out_json = tmp_path / "d.json"
  out = subprocess.run(
      [sys.executable, "benchmarks/decode_throughput.py", "--model=llada60m", "--small",
       "--batches=1,2", "--repeats=1", f"--weights={tmp_path / 'w'}", f"--out={out_json}"],
      cwd=root, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
      timeout=1800)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-1].startswith("decode_dual_vs_peer_dual_batch1: ")
  report = json.loads(out_json.read_text())
  for batch in ("1", "2"):
    figures = report["batches"][batch]
    assert {"ours/none/lockstep", "peer/plain", "peer/dual"} <= set(figures)
    assert figures["peer/plain"]["tokens_agree_with_exact"] == 1.0
    assert figures["hardware"]["matmul_gflop_s"] > 0 < figures["hardware"]["bandwidth_gb_s"]
    for name, fig in figures.items():
      if name == "hardware":
        continue
      assert fig["tokens_per_s"] > 0 and fig["flop_bound_tok_s"] > 0
      assert fig["bandwidth_bound_tok_s"] > 0
      assert fig["flop_bound_fraction"] > 0 and fig["bandwidth_bound_fraction"] > 0
      if "xla_step_check" in fig:      # our lock-step decoders: the count is XLA's within 10%
        assert 0.95 < fig["xla_step_check"]["xla_over_counted"] < 1.1, name
