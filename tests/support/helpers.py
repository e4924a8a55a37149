"""Small shared builders for tests."""
import contextlib
import dataclasses
import glob
import os
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orl_jax.decode.capture import masked_positions
from orl_jax.models import ModelConfig, Transformer
from orl_jax.replay import gather_batch
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                TokenMeta)

# The block decoder's rules of our tiny family (`families.OURS.decode`), for configs built by hand
TINY_RULES = dict(block_placement="prompt_end", commit_compare=">=")
TINY = ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                   mlp_dim=64, mask_id=1, qk_norm=True)
TINY_BLOCK = 4   # the block size the tests decode TINY with
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_qwen3(transformers, tied: bool, max_position_embeddings: int = 128):
  """A random tiny transformers Qwen3ForCausalLM (eager attention: it takes float masks)."""
  cfg = transformers.Qwen3Config(
      vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      num_key_value_heads=2, head_dim=16, intermediate_size=128, rms_norm_eps=1e-6,
      rope_theta=1e6, tie_word_embeddings=tied, max_position_embeddings=max_position_embeddings)
  cfg._attn_implementation = "eager"
  return transformers.Qwen3ForCausalLM(cfg).eval()


def tiny_model(seed=0, **overrides):
  cfg = dataclasses.replace(TINY, **overrides)
  return Transformer(cfg, rngs=nnx.Rngs(seed))


def live_adapter(model, scale: float, seed: int):
  """`model` with its residual adapter's zero-initialised output projection set to random
  N(0, scale^2) values, so a step's z changes the logits (a live pathway). -> model."""
  import jax
  st = nnx.state(model, nnx.Param)
  k = st["adapter"]["down_proj"]["kernel"]
  k[...] = scale * jax.random.normal(jax.random.key(seed), k[...].shape)
  nnx.update(model, st)
  return model


def replayed_vs_captured(graphdef, params, traj, plan):
  """(replayed log-probs at the captured top-K ids, captured log-probs, batch) at state tokens."""
  batch = gather_batch(traj, plan, mask_id=TINY.mask_id, unresolved=masked_positions)
  model = nnx.merge(graphdef, params)
  logits = model(batch.tokens, batch.positions, batch.meta, residual=batch.residual).logits
  logp = jax.nn.log_softmax(logits, -1)
  is_state = np.asarray(plan.state_slot) >= 0
  replayed = np.asarray(jnp.take_along_axis(logp, batch.topk_ids, -1))[is_state]
  return replayed, np.asarray(batch.topk_logprobs)[is_state], batch


def random_packed_meta(rng: np.random.Generator, length: int, block_size: int):
  """A random packed row: several segments, each `[prompt | (clean blocks | states) per response]`,
  then padding. Returns numpy TokenMeta fields of shape [length]."""
  tokens = []  # (segment, response, kind, block, state_id) per token
  segment, state_counter = 0, 0
  while True:
    n_prompt_blocks = int(rng.integers(1, 3))
    n_resp = int(rng.integers(1, 4))
    n_blocks = int(rng.integers(1, 4))
    need = n_prompt_blocks * block_size + n_resp * n_blocks * block_size * 3
    if len(tokens) + need > length:
      break
    pad_front = int(rng.integers(0, block_size))
    for i in range(n_prompt_blocks * block_size):
      kind = KIND_PAD if i < pad_front else KIND_PROMPT
      tokens.append((segment, -1, kind, i // block_size, -1))
    for r in range(n_resp):
      for j in range(n_blocks):
        tokens += [(segment, r, KIND_CLEAN, n_prompt_blocks + j, -1)] * block_size
      for j in range(n_blocks):
        for _ in range(int(rng.integers(1, 3))):
          if len(tokens) + block_size > length:
            break
          tokens += [(segment, r, KIND_STATE, n_prompt_blocks + j, state_counter)] * block_size
          state_counter += 1
    segment += 1
  tokens = tokens[:length] + [(0, -1, KIND_PAD, 0, -1)] * (length - len(tokens))
  seg, res, kind, blk, sid = (np.asarray(col, np.int32) for col in zip(*tokens))
  return TokenMeta(segment=seg, response=res, kind=kind, block=blk, state_id=sid)


def brute_force_visible(meta: TokenMeta) -> np.ndarray:
  """The staircase rule (docs/method.md#replay-states-packing-staircase-attention) written as
  literally as possible, one (q, k) pair at a time."""
  n = len(meta.kind)
  out = np.zeros((n, n), bool)
  ctx = (KIND_PROMPT, KIND_CLEAN)
  for q in range(n):
    for k in range(n):
      kq, kk = meta.kind[q], meta.kind[k]
      if kq == KIND_PAD or kk == KIND_PAD or meta.segment[q] != meta.segment[k]:
        continue
      if not (kk == KIND_PROMPT or meta.response[k] == meta.response[q]):
        continue
      if kq in ctx and kk in ctx:
        out[q, k] = meta.block[k] <= meta.block[q]
      elif kq == KIND_STATE and kk in ctx:
        out[q, k] = meta.block[k] < meta.block[q]
      elif kq == KIND_STATE and kk == KIND_STATE:
        out[q, k] = meta.state_id[q] == meta.state_id[k]
  return out


def random_token_causal_meta(rng: np.random.Generator, length: int, canvas: int):
  """A random packed row of the DiffusionGemma layout: segments `[prompt | per response: its
  committed canvases, then states of later canvases]`, then padding. Context tokens carry
  `block = position` (the token-causal stream), a state's block is its canvas's first
  position. Returns (numpy TokenMeta [length], positions [length], canvas start [length])."""
  tokens = []  # (segment, response, kind, block, state_id, position, canvas start) per token
  segment, state_counter = 0, 0
  while True:
    p = int(rng.integers(1, 3)) * canvas + int(rng.integers(0, canvas))
    n_resp, n_canvases = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    if len(tokens) + p + n_resp * n_canvases * canvas * 2 > length:
      break
    pad_front = int(rng.integers(0, 3))
    for i in range(p):
      tokens.append((segment, -1, KIND_PAD if i < pad_front else KIND_PROMPT, i, -1, i, -1))
    for r in range(n_resp):
      last = int(rng.integers(0, n_canvases))          # states of canvases 0..last
      for j in range(last):
        for i in range(canvas):
          at = p + j * canvas + i
          tokens.append((segment, r, KIND_CLEAN, at, -1, at, -1))
      for j in sorted(rng.choice(last + 1, size=int(rng.integers(1, last + 2)))):
        first = p + j * canvas
        for i in range(canvas):
          tokens.append((segment, r, KIND_STATE, first, state_counter, first + i, first))
        state_counter += 1
    segment += 1
  tokens = tokens[:length] + [(0, -1, KIND_PAD, 0, -1, 0, -1)] * (length - len(tokens))
  seg, res, kind, blk, sid, pos, start = (np.asarray(col, np.int32) for col in zip(*tokens))
  meta = TokenMeta(segment=seg, response=res, kind=kind, block=blk, state_id=sid)
  return meta, pos, start


def brute_force_token_causal_visible(meta: TokenMeta, positions, canvas_start,
                                     window: int = 0) -> np.ndarray:
  """The DiffusionGemma rule from positions, one (q, k) pair at a time: a context (prompt or
  clean) query sees context keys at positions <= its own, on sliding layers only the last
  `window` of them (itself included; transformers' encoder); a state sees the committed
  context before its canvas, on sliding layers only its last `window - 1` tokens (the
  decoder's sliding cache), and its own canvas bidirectionally."""
  n = len(meta.kind)
  out = np.zeros((n, n), bool)
  ctx = (KIND_PROMPT, KIND_CLEAN)
  for q in range(n):
    for k in range(n):
      kq, kk = meta.kind[q], meta.kind[k]
      if kq == KIND_PAD or kk == KIND_PAD or meta.segment[q] != meta.segment[k]:
        continue
      if not (kk == KIND_PROMPT or meta.response[k] == meta.response[q]):
        continue
      if kq in ctx and kk in ctx:
        out[q, k] = positions[k] <= positions[q] and (
            not window or positions[k] > positions[q] - window)
      elif kq == KIND_STATE and kk in ctx:
        out[q, k] = positions[k] < canvas_start[q] and (
            not window or positions[k] >= canvas_start[q] - (window - 1))
      elif kq == KIND_STATE and kk == KIND_STATE:
        out[q, k] = meta.state_id[q] == meta.state_id[k]
  return out


def orl_smoke_config(workdir, steps=4):
  """The tiny config's smoke shapes as a short ORL run from a random model (every response
  trains), logging every step and checkpointing every 2."""
  from configs import tiny
  c = tiny.get_config("smoke")
  c.update(c.demo.stages.orl.to_dict())
  c.workdir = str(workdir)
  c.model.init_from = ""                 # a random model: every response is trained on below
  c.orl.min_reward = 0.0
  c.orl.prompts_per_step, c.orl.group_size = 2, 3
  c.replay.row_len, c.replay.n_rows, c.replay.max_states, c.replay.max_responses = 128, 8, 48, 6
  c.train.steps, c.train.warmup_steps, c.train.log_every = steps, 1, 1
  c.checkpoint.every = 2
  return c


KILLED_ORL_STEPS = 6   # the ORL run tests/train/test_checkpoint_recovery.py kills and resumes


class SimulatedCrash(RuntimeError):
  """A test's kill at a chosen point of an ORL iteration."""


@contextlib.contextmanager
def crash_before_update_at(iteration: int):
  """ORL runs inside end iteration `iteration` (0-based) right after its rollout snapshot is
  written, before its update: a kill between rollout and update (a kill during the write is a
  real SIGKILL: tests/train/test_snapshot_kill.py). A seam outside the production loop: it wraps
  `orl.snapshot`."""
  from unittest import mock
  from orl_jax.train import orl
  save = orl.snapshot

  def save_then_crash(steps, it, rolled):
    seconds = save(steps, it, rolled)
    if it == iteration:
      if steps.snapshots is not None:
        steps.snapshots.wait()
      raise SimulatedCrash(f"simulated kill between rollout and update at iteration {it}")
    return seconds

  with mock.patch.object(orl, "snapshot", save_then_crash):
    yield


def resumes_bit_exactly_after_a_crash(cfg, tmp_path, iteration: int,
                                      straight: str | None = None) -> list[dict]:
  """Runs `cfg(workdir)` straight through (unless `straight` names the params folder of such a
  run already made), and again killed between rollout and update of `iteration` then resumed;
  asserts both end with identical parameters and returns the resumed run's metrics rows."""
  import pytest
  from safetensors.numpy import load_file
  from orl_jax.metrics import read_jsonl
  from orl_jax.train.entry import train
  if straight is None:
    straight = train(cfg(tmp_path / "a"), progress=False)
  with pytest.raises(SimulatedCrash), crash_before_update_at(iteration):
    train(cfg(tmp_path / "b"), progress=False)
  resumed = train(cfg(tmp_path / "b"), progress=False)
  a = load_file(os.path.join(straight, "params.safetensors"))
  b = load_file(os.path.join(resumed, "params.safetensors"))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  return read_jsonl(str(tmp_path / "b" / "metrics.jsonl"))


def killed_orl_config(workdir):
  c = orl_smoke_config(workdir, steps=KILLED_ORL_STEPS)     # logs every step, checkpoints every 2
  c.checkpoint.save_rollouts = True
  return c


def _largest(pattern):
  return max(glob.glob(pattern, recursive=True), key=os.path.getsize)


# Each kind of file in an Orbax step folder whose damage stops a restore.
CHECKPOINT_FILE_KINDS = {
    "array data": lambda d: _largest(f"{d}/state/ocdbt.process_0/d/*"),
    "_METADATA": lambda d: f"{d}/state/_METADATA",
    "OCDBT manifest": lambda d: f"{d}/state/manifest.ocdbt",
    "array metadata": lambda d: f"{d}/state/array_metadatas/process_0",
    "grain state": lambda d: f"{d}/data/process_0-of-1.json",
}


def truncate_half(path):
  """Cuts a file to half its size (a damaged copy, a full disk)."""
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def tensorboard_scalars(logdir: str, tag: str) -> list[int]:
  """Steps of `tag` as TensorBoard shows them: event files in order, and a session START at
  step s (tensorboardX's `purge_step`) hides the events of earlier files at steps >= s."""
  from tensorboardX.proto import event_pb2
  steps = []
  for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      if event.HasField("session_log") and event.session_log.status == event.session_log.START:
        steps = [s for s in steps if s < event.step]
      elif event.HasField("summary") and any(v.tag == tag for v in event.summary.value):
        steps.append(event.step)
  return steps


def greedy_threshold_margin(capture, row: int, mask_id: int, threshold: float) -> float:
  """The smallest margin, in log-probability, of any decision a greedy threshold decode of
  `row` took, from its captured steps: each masked position's best token over its second, each
  masked position's confidence against the threshold, and, in a step where no position reached
  the threshold, the most confident position over the next one (the one the rule commits).
  Two computations whose log-probabilities differ by less than half of it decode alike; a test
  comparing such decodes asserts it is far above their difference, so no near tie decides it."""
  import jax
  capture = jax.device_get(capture)
  margins = []
  for s in np.nonzero(capture.valid[row])[0]:
    masked = capture.block_tokens[row, s] == mask_id
    best = capture.topk_logprobs[row, s][masked]                 # [masked, K] best first
    margins += list(best[:, 0] - best[:, 1])
    margins += list(np.abs(best[:, 0] - np.log(threshold)))
    if not np.any(best[:, 0] >= np.log(threshold)) and len(best) > 1:
      top = np.sort(best[:, 0])[::-1]
      margins.append(top[0] - top[1])
  return float(min(margins))


def run_on_4_cpu_devices(script: str, ok: str) -> str:
  """Runs `script` in its own process with 4 fake CPU devices; its stdout must say `ok`."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
  assert ok in out.stdout, out.stdout + out.stderr[-4000:]
  return out.stdout
