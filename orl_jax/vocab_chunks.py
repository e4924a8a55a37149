"""Per-token statistics of the LM head over large vocabularies, in chunks of tokens.

A 126k-157k vocabulary makes `[tokens, V]` f32 logits the largest array of a training step
(16 rows x 4096 tokens x 126464 x 4 B = 33 GB). `token_stats` computes everything the losses
need from the logits — the target's negative log-likelihood, the normalized entropy, the
argmax, and log-probabilities at given ids (the rollout's top-K) — `chunk` tokens at a time:
`lax.map` over chunks of the final hidden states with the head inside `jax.checkpoint`, so the
backward pass recomputes one chunk's logits at a time instead of keeping all of them.
`chunk = 0` computes the same statistics on the whole batch at once (the reference).
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp


class TokenStats(NamedTuple):
  nll: jax.Array              # [R, T] -log softmax(logits)[target], f32
  entropy: jax.Array          # [R, T] normalized entropy H / log V, f32
  argmax: jax.Array           # [R, T] int32 most likely token
  logp_at: jax.Array | None   # [R, T, K] log-probabilities at the requested ids (or None)
  kl_ref: jax.Array | None = None   # [R, T] KL(q || p_ref) over the full vocabulary (or None)


def _log_probs(logits):
  return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)


def reverse_kl(logq, logp_ref):
  """KL(q || p_ref) = sum_v q_v (log q_v - log p_ref_v) over the last axis, f32.

  The value is the KL; the gradient (w.r.t. q only: the reference is a constant) is written
  as sum_v dq_v (log q_v - log p_ref_v), the exact gradient since sum_v q_v dlog q_v = d(sum q)
  = 0. Unlike autodiff of the plain formula it carries no rounding residue of sum(q) - 1, so it
  vanishes wherever q equals the reference bit for bit."""
  diff = jax.lax.stop_gradient(logq - logp_ref)
  return jnp.sum(jnp.exp(logq) * diff, -1)


def _stats(logits, targets, ids, ref_logits=None):
  """Statistics of f32 logits [..., V]; the one formula both paths use."""
  logp = _log_probs(logits)
  nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
  entropy = -jnp.sum(jnp.exp(logp) * logp, -1) / math.log(logp.shape[-1])
  argmax = jnp.argmax(logp, -1).astype(jnp.int32)
  logp_at = None if ids is None else jnp.take_along_axis(logp, ids, axis=-1)
  kl_ref = None
  if ref_logits is not None:
    kl_ref = reverse_kl(logp, jax.lax.stop_gradient(_log_probs(ref_logits)))
  return TokenStats(nll, entropy, argmax, logp_at, kl_ref)


def token_stats(head: Callable[[jax.Array], jax.Array], hidden, targets, ids=None, *,
                chunk: int = 0, ref_head: Callable | None = None,
                ref_hidden: jax.Array | None = None) -> TokenStats:
  """Head statistics for hidden states [R, T, D] (`head` maps [1, n, D] -> [1, n, V] logits).

  Args:
    head: the model's output head (`model.head`).
    hidden: final-normed hidden states [R, T, D].
    targets: [R, T] int32 token whose NLL is returned.
    ids: optional [R, T, K] int32 ids whose log-probabilities are returned.
    chunk: tokens per chunk; 0 = all at once.
    ref_head, ref_hidden: a frozen reference's head and final hidden states [R, T, D]; when
      given, `kl_ref` = KL(q || p_ref) per token over the whole vocabulary (no gradient reaches
      the reference), computed chunk by chunk like the rest.
  """
  r, t, d = hidden.shape
  with_ref = ref_head is not None
  if with_ref and ref_hidden is None:
    raise ValueError("token_stats: ref_head needs ref_hidden")
  if chunk <= 0 or chunk >= r * t:
    return _stats(head(hidden), targets, ids,
                  ref_head(ref_hidden) if ref_head is not None else None)
  n = r * t
  n_chunks = -(-n // chunk)
  pad = n_chunks * chunk - n

  def split(x):  # [R, T, ...] -> [n_chunks, chunk, ...] (zero-padded)
    x = x.reshape((n,) + x.shape[2:])
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((n_chunks, chunk) + x.shape[1:])

  @jax.checkpoint
  def one(args):
    h, tgt, at, h_ref = args
    s = _stats(head(h[None])[0], tgt, at, ref_head(h_ref[None])[0] if with_ref else None)
    empty = jnp.zeros((), jnp.float32)
    return s._replace(logp_at=empty if at is None else s.logp_at,
                      kl_ref=empty if h_ref is None else s.kl_ref)

  chunks = (split(hidden), split(targets), None if ids is None else split(ids),
            split(ref_hidden) if with_ref else None)
  out = jax.lax.map(one, chunks)
  merge = lambda x: x.reshape((n_chunks * chunk,) + x.shape[2:])[:n].reshape((r, t) + x.shape[2:])
  return TokenStats(merge(out.nll), merge(out.entropy), merge(out.argmax),
                    None if ids is None else merge(out.logp_at),
                    merge(out.kl_ref) if with_ref else None)
