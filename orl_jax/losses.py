"""ORL losses on a replayed batch (DESIGN §2.6): gated CE, adjacent entropy contraction (AEC) and
the capped reverse KL anchor. Every term is averaged per response, then over responses, using
global segment sums over the batch, so the packing of states into rows never changes the loss.
"""
from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp

from orl_jax.replay import ReplayBatch
from orl_jax.vocab_chunks import token_stats

_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class LossConfig:
  gate_entropy: float = 0.0   # tau_gate: CE on masked positions with rollout entropy >= this
  aec_rho: float = 0.25       # required relative contraction per step
  conf_entropy: float = 0.1   # tau_conf: KL anchor where the rollout entropy is below this
  kl_cap: float = 1.0         # c
  w_aec: float = 1.0          # lambda_AEC
  w_kl: float = 1.0           # lambda_KL
  vocab_chunk: int = 0        # tokens per chunk of the head statistics (0 = all at once)


def _segment_sum(values, ids, n):
  """Sum of `values` per id in [0, n); ids outside (e.g. -1) are dropped."""
  ids = jnp.where((ids >= 0) & (ids < n), ids, n)
  return jnp.zeros((n,), jnp.float32).at[ids.reshape(-1)].add(
      values.reshape(-1).astype(jnp.float32), mode="drop")


def per_response_mean(values, weight, resp_ids, n):
  """Mean over responses (that have any weight) of each response's weighted mean of `values`.
  Returns (mean, number of responses that contributed)."""
  num = _segment_sum(values * weight, resp_ids, n)
  den = _segment_sum(weight, resp_ids, n)
  has = den > 0
  per_resp = jnp.where(has, num / jnp.where(has, den, 1.0), 0.0)
  count = jnp.sum(has)
  return jnp.sum(per_resp) / jnp.maximum(count, 1), count


def gated_ce(nll, masked, rollout_entropy, resp_slot, n, gate: float):
  gate_mask = (masked & (rollout_entropy >= gate)).astype(jnp.float32)
  return per_response_mean(nll, gate_mask, resp_slot, n)


def capped_reverse_kl(logp, topk_ids, topk_logprobs, masked, rollout_entropy, resp_slot, n,
                      conf_entropy: float, cap: float):
  """min(c, KL(q || p_rollout)) over the stored top-K support plus one bucket for the rest."""
  lq = jnp.take_along_axis(logp, topk_ids, axis=-1)                     # [..., K]
  return capped_reverse_kl_at(lq, topk_logprobs, masked, rollout_entropy, resp_slot, n,
                              conf_entropy, cap)


def capped_reverse_kl_at(lq, topk_logprobs, masked, rollout_entropy, resp_slot, n,
                         conf_entropy: float, cap: float):
  """`capped_reverse_kl` from lq [..., K], the replayed log-probabilities at the top-K ids."""
  q = jnp.exp(lq)
  p = jnp.exp(topk_logprobs)
  q_rest = jnp.clip(1.0 - jnp.sum(q, -1), _EPS, 1.0)
  p_rest = jnp.clip(1.0 - jnp.sum(p, -1), _EPS, 1.0)
  kl = jnp.sum(q * (lq - topk_logprobs), -1) + q_rest * (jnp.log(q_rest) - jnp.log(p_rest))
  capped = jnp.minimum(cap, kl)
  where = (masked & (rollout_entropy < conf_entropy)).astype(jnp.float32)
  value, count = per_response_mean(capped, where, resp_slot, n)
  return value, count, kl


def state_entropies(entropy, masked, state_slot, n_states):
  """Mean replayed normalized entropy over each state's masked positions: [n_states]."""
  m = masked.astype(jnp.float32)
  num = _segment_sum(entropy * m, state_slot, n_states)
  den = _segment_sum(m, state_slot, n_states)
  return num / jnp.maximum(den, 1.0), den > 0


def aec(h_state, pair_a, pair_b, pair_resp, pair_valid, n, rho: float):
  """[max(0, H_{k+1} - (1 - rho) * sg(H_k))]^2, averaged per response then over responses."""
  h_a = jax.lax.stop_gradient(h_state[pair_a])
  h_b = h_state[pair_b]
  hinge = jnp.maximum(0.0, h_b - (1.0 - rho) * h_a)
  value, count = per_response_mean(hinge ** 2, pair_valid.astype(jnp.float32), pair_resp, n)
  active = jnp.sum((hinge > 0) & pair_valid) / jnp.maximum(jnp.sum(pair_valid), 1)
  return value, count, active


def orl_loss(model, batch: ReplayBatch, cfg: LossConfig):
  """Returns (loss, metrics). The head statistics are computed `cfg.vocab_chunk` tokens at a
  time when that is > 0 (same values, no [R, T, V] array; see vocab_chunks.py)."""
  hidden, _, norm_ratio = model.hidden_states(batch.tokens, batch.positions, batch.meta,
                                              residual=batch.residual)
  stats = token_stats(model.head, hidden, batch.targets, batch.topk_ids, chunk=cfg.vocab_chunk)
  entropy, nll = stats.entropy, stats.nll
  n = batch.state_resp.shape[0]   # response slots <= state slots
  ce, n_ce = gated_ce(nll, batch.masked, batch.rollout_entropy, batch.resp_slot, n,
                      cfg.gate_entropy)
  kl, n_kl, kl_raw = capped_reverse_kl_at(stats.logp_at, batch.topk_logprobs, batch.masked,
                                       batch.rollout_entropy, batch.resp_slot, n,
                                       cfg.conf_entropy, cfg.kl_cap)
  h_state, _ = state_entropies(entropy, batch.masked, batch.state_slot, n)
  l_aec, n_aec, hinge_active = aec(h_state, batch.pair_a, batch.pair_b, batch.pair_resp,
                                   batch.pair_valid, n, cfg.aec_rho)
  loss = ce + cfg.w_aec * l_aec + cfg.w_kl * kl
  m = batch.masked.astype(jnp.float32)
  metrics = {
      "loss_ce": ce, "loss_aec": l_aec, "loss_rkl": kl,
      "aec_hinge_active": hinge_active, "responses_ce": n_ce, "responses_kl": n_kl,
      "responses_aec": n_aec,
      "replay_entropy": jnp.sum(entropy * m) / jnp.maximum(jnp.sum(m), 1),
      "replay_token_acc": jnp.sum((stats.argmax == batch.targets) * m)
                          / jnp.maximum(jnp.sum(m), 1),
      "residual_norm_ratio": norm_ratio,
  }
  return loss, metrics
