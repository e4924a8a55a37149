"""The training losses. SFT (docs/method.md#the-losses): `sft_loss`, the 1/t-weighted masked
CE in the staircase layout. ORL on a replayed batch (docs/method.md#the-losses): gated CE, adjacent
entropy contraction (AEC) and the capped reverse KL anchor. Every term is averaged per response,
then over responses, using global segment sums over the batch, so the packing of states into rows
never changes the loss.

The anchor's reference (`LossConfig.kl_reference`): "initial" (default) is the frozen model ORL
started from, replayed without gradient on the same rows with the same captured residuals
(`attach_reference`), KL over the full vocabulary, gated where *it* is confident. "rollout" (an
ablation) compares with the rollout's own top-K distribution: with one update per fresh rollout
and exact replay, q equals that distribution where the term is evaluated, so the term and its
gradient are zero up to rounding.

Gradient accumulation: `OrlObjective` also computes the loss of one row micro-batch with the
per-response normalisers of the whole update (`LossTotals`, data only), so the micro-batch
losses sum to the full-batch loss and their gradients to its gradient. AEC pairs that cross
micro-batches take the earlier state's entropy from the carried `AecCarry`.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct

from orl_jax.packed_batch import ReplayBatch, layer_routes, sft_batch, split_rows
from orl_jax.vocab_chunks import token_stats

# loss.kl_reference: the anchor's frozen reference (docs/method.md#the-losses)
KlReference = Literal["initial", "rollout"]
KL_REFERENCES: tuple[str, ...] = typing.get_args(KlReference)

_EPS = 1e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class LossConfig:
  """The ORL loss settings: the `loss` section's fields, with no defaults of their own (the
  section, `orl_jax.config.sections.Loss`, holds them; `from_section` builds one from it)."""
  gate_entropy: float   # tau_gate: CE on masked positions with rollout entropy >= this
  aec_rho: float        # required relative contraction per step
  conf_entropy: float   # tau_conf: KL anchor where the rollout entropy is below this
  kl_cap: float         # c
  w_aec: float          # lambda_AEC
  w_kl: float           # lambda_KL
  vocab_chunk: int      # tokens per chunk of the head statistics (0 = all at once)
  kl_reference: KlReference  # "initial" (frozen start model) | "rollout" (ablation)
  term_grad_norms: bool      # log each term's gradient norm (one more backward per term)

  @classmethod
  def from_section(cls, section) -> "LossConfig":
    """The LossConfig of a `loss` section (`orl_jax.config.sections.Loss`: a run's, or
    `Loss(**changes)` for the defaults with `changes`)."""
    return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)})

  @property
  def uses_reference(self) -> bool:
    """The anchor needs the frozen reference model (its forward is skipped when w_kl = 0)."""
    return self.w_kl > 0 and self.kl_reference == "initial"


def sft_loss(model, batch, key, *, block_size: int, mask_id: int, vocab_chunk: int = 0,
             residual_fn=None, eos_id: int = 0, placement: str = "prompt_end"):
  """1/t-weighted masked CE in the staircase layout, blocks placed as `placement` places them
  (`packed_batch.sft_batch`); the head statistics go `vocab_chunk` tokens at a time when that is > 0
  (same value, no [R, T, V] logits). `residual_fn(model, packed, batch, key)` supplies the
  residual fed at the noised tokens (offline RCD, the residual warm-up); None for plain SFT.
  `batch`: a `data.pipeline.SftExample` of [B, ...] rows."""
  pb = sft_batch(key, batch.prompt_tokens, batch.prompt_valid, batch.response,
                 block_size=block_size, mask_id=mask_id, eos_id=eos_id, placement=placement)
  residual = (None if residual_fn is None
              else residual_fn(model, pb, batch, jax.random.fold_in(key, 1)))
  hidden, _, norm_ratio = model.hidden_states(pb.tokens, pb.positions, pb.meta,
                                              residual=residual)
  stats = token_stats(model.head, hidden, pb.targets, chunk=vocab_chunk)
  nll = stats.nll
  total = jnp.sum(nll * pb.ce_weight)
  masked = pb.ce_weight > 0
  acc = stats.argmax == pb.targets
  metrics = {"masked_nll": jnp.sum(nll * masked) / jnp.sum(masked),
             "masked_acc": jnp.sum(acc * masked) / jnp.sum(masked)}
  if residual is not None:
    metrics["residual_norm_ratio"] = norm_ratio
  return total / pb.tokens.shape[0], metrics


def _segment_sum(values, ids, n):
  """Sum of `values` per id in [0, n); ids outside (e.g. -1) are dropped."""
  ids = jnp.where((ids >= 0) & (ids < n), ids, n)
  return jnp.zeros((n,), jnp.float32).at[ids.reshape(-1)].add(
      values.reshape(-1).astype(jnp.float32), mode="drop")


def per_response_mean(values, weight, resp_ids, n, den=None):
  """Mean over responses (that have any weight) of each response's weighted mean of `values`.
  Returns (mean, number of responses that contributed). `den` [n]: the per-response weight
  mass when the rows here are part of a larger batch (default: the sum of `weight` here)."""
  num = _segment_sum(values * weight, resp_ids, n)
  den = _segment_sum(weight, resp_ids, n) if den is None else den
  has = den > 0
  per_resp = jnp.where(has, num / jnp.where(has, den, 1.0), 0.0)
  count = jnp.sum(has)
  return jnp.sum(per_resp) / jnp.maximum(count, 1), count


def ce_positions(masked, rollout_entropy, gate: float):
  """Weight of the gated CE: masked positions whose rollout entropy is >= tau_gate."""
  return (masked & (rollout_entropy >= gate)).astype(jnp.float32)


def kl_positions(masked, confidence_entropy, conf_entropy: float):
  """Weight of the KL anchor: masked positions where the reference (the frozen model, or the
  rollout for kl_reference='rollout') was confident."""
  return (masked & (confidence_entropy < conf_entropy)).astype(jnp.float32)


def anchor_entropy(batch: ReplayBatch, cfg: LossConfig):
  """The entropy that gates the anchor: the frozen reference's, or the rollout's."""
  if cfg.kl_reference == "initial":
    if batch.ref_entropy is None:
      raise ValueError("kl_reference='initial': attach the reference first (attach_reference)")
    return batch.ref_entropy
  return batch.rollout_entropy


def attach_reference(batch: ReplayBatch, reference, cfg: LossConfig) -> ReplayBatch:
  """`batch` with the frozen reference's final hidden states and normalized entropies on its
  rows: one no-gradient forward on the same replayed rows with the same captured residuals.
  An MoE reference routes with its own (frozen) router, never with the policy's captured
  routes: the anchor is the starting model's distribution, not the policy's experts."""
  if reference is None:
    raise ValueError("loss.kl_reference='initial' needs the frozen reference model (the train "
                     "state's `reference`, created when the loss uses it)")
  hidden, _, _ = reference.hidden_states(batch.tokens, batch.positions, batch.meta,
                                         residual=batch.residual)
  hidden = jax.lax.stop_gradient(hidden)
  stats = token_stats(reference.head, hidden, batch.targets, chunk=cfg.vocab_chunk)
  return dataclasses.replace(batch, ref_hidden=hidden,
                             ref_entropy=jax.lax.stop_gradient(stats.entropy))


def capped_kl_to_reference(kl, masked, ref_entropy, resp_slot, n, conf_entropy: float,
                           cap: float, den=None):
  """min(c, KL(q || p_ref)) per position, where the reference is confident; per response."""
  capped = jnp.minimum(cap, kl)
  where = kl_positions(masked, ref_entropy, conf_entropy)
  value, count = per_response_mean(capped, where, resp_slot, n, den)
  return value, count


def gated_ce(nll, masked, rollout_entropy, resp_slot, n, gate: float, den=None):
  gate_mask = ce_positions(masked, rollout_entropy, gate)
  return per_response_mean(nll, gate_mask, resp_slot, n, den)


def capped_reverse_kl(logp, topk_ids, topk_logprobs, masked, rollout_entropy, resp_slot, n,
                      conf_entropy: float, cap: float):
  """min(c, KL(q || p_rollout)) over the stored top-K support plus one bucket for the rest."""
  lq = jnp.take_along_axis(logp, topk_ids, axis=-1)                     # [..., K]
  return capped_reverse_kl_at(lq, topk_logprobs, masked, rollout_entropy, resp_slot, n,
                              conf_entropy, cap)


def capped_reverse_kl_at(lq, topk_logprobs, masked, rollout_entropy, resp_slot, n,
                         conf_entropy: float, cap: float, den=None):
  """`capped_reverse_kl` from lq [..., K], the replayed log-probabilities at the top-K ids."""
  q = jnp.exp(lq)
  p = jnp.exp(topk_logprobs)
  q_rest = jnp.clip(1.0 - jnp.sum(q, -1), _EPS, 1.0)
  p_rest = jnp.clip(1.0 - jnp.sum(p, -1), _EPS, 1.0)
  kl = jnp.sum(q * (lq - topk_logprobs), -1) + q_rest * (jnp.log(q_rest) - jnp.log(p_rest))
  capped = jnp.minimum(cap, kl)
  where = kl_positions(masked, rollout_entropy, conf_entropy)
  value, count = per_response_mean(capped, where, resp_slot, n, den)
  return value, count, kl


def state_entropies(entropy, masked, state_slot, n_states):
  """Mean replayed normalized entropy over each state's masked positions: [n_states]."""
  m = masked.astype(jnp.float32)
  num = _segment_sum(entropy * m, state_slot, n_states)
  den = _segment_sum(m, state_slot, n_states)
  return num / jnp.maximum(den, 1.0), den > 0


def aec(h_state, pair_a, pair_b, pair_resp, pair_valid, n, rho: float, *, h_source=None,
        den=None, n_pairs=None):
  """[max(0, H_{k+1} - (1 - rho) * sg(H_k))]^2, averaged per response then over responses.

  For a micro-batch of a larger update: `h_source` gives H_k (states trained in earlier
  micro-batches included), `den` [n] the pairs per response and `n_pairs` the pairs of the
  whole update (the denominator of the returned fraction of active hinges)."""
  h_a = jax.lax.stop_gradient((h_state if h_source is None else h_source)[pair_a])
  h_b = h_state[pair_b]
  hinge = jnp.maximum(0.0, h_b - (1.0 - rho) * h_a)
  value, count = per_response_mean(hinge ** 2, pair_valid.astype(jnp.float32), pair_resp, n, den)
  n_pairs = jnp.sum(pair_valid) if n_pairs is None else n_pairs
  active = jnp.sum((hinge > 0) & pair_valid) / jnp.maximum(n_pairs, 1)
  return value, count, active


@struct.dataclass
class LossTotals:
  """Per-response normalisers and metric denominators over all rows of one update (data only:
  no parameter enters them), shared by every micro-batch of a gradient-accumulation step."""
  ce_weight: jax.Array    # [n] gated-CE positions per response slot
  kl_weight: jax.Array    # [n] KL-anchor positions per response slot
  aec_pairs: jax.Array    # [n] valid AEC pairs per response slot
  n_pairs: jax.Array      # scalar: valid AEC pairs
  n_masked: jax.Array     # scalar: masked state positions
  n_carried: jax.Array    # scalar: masked positions that carry a residual (z != 0)

  def response_counts(self) -> dict:
    """Responses that contribute to each term (the metrics of a whole update)."""
    return {"responses_ce": jnp.sum(self.ce_weight > 0),
            "responses_kl": jnp.sum(self.kl_weight > 0),
            "responses_aec": jnp.sum(self.aec_pairs > 0)}


@struct.dataclass
class AecCarry:
  """Replayed entropies of the states trained by earlier micro-batches (stop-gradient)."""
  h_state: jax.Array      # [n] mean normalized entropy per state slot
  seen: jax.Array         # [n] bool: the state was in an earlier micro-batch

  @classmethod
  def empty(cls, n: int) -> "AecCarry":
    return cls(jnp.zeros((n,), jnp.float32), jnp.zeros((n,), bool))


def _n_carried(batch: ReplayBatch):
  """Masked positions that consume a residual (z is zero off state tokens and on cold starts)."""
  if batch.residual is None:
    raise ValueError("the ORL losses read the replayed residual: the batch has none")
  return jnp.sum(batch.masked & jnp.any(batch.residual.z != 0, axis=-1))


def loss_totals(batch: ReplayBatch, cfg: LossConfig) -> LossTotals:
  """Needs the reference attached when `cfg.uses_reference`."""
  n = batch.state_resp.shape[0]
  seg = lambda w, ids: _segment_sum(w, ids, n)
  kl_where = (kl_positions(batch.masked, anchor_entropy(batch, cfg), cfg.conf_entropy)
              if cfg.w_kl > 0 else jnp.zeros(batch.masked.shape, jnp.float32))
  return LossTotals(
      ce_weight=seg(ce_positions(batch.masked, batch.rollout_entropy, cfg.gate_entropy),
                    batch.resp_slot),
      kl_weight=seg(kl_where, batch.resp_slot),
      aec_pairs=seg(batch.pair_valid.astype(jnp.float32), batch.pair_resp),
      n_pairs=jnp.sum(batch.pair_valid), n_masked=jnp.sum(batch.masked),
      n_carried=_n_carried(batch))


def anchor_diagnostics(kl, where, masked, cap: float, n_masked, n_anchored) -> dict:
  """What the anchor sees, per update (docs/method.md#metrics), from the per-position uncapped
  KL `kl` to its reference and its positions `where` (`kl_positions`): the share of masked
  positions the entropy gate anchors, the share of anchored positions at the cap (where the
  capped term has no gradient), the uncapped KL averaged over the anchored positions and over
  every masked position (the policy's drift from the reference, gated or not). Position means
  over `n_masked` / `n_anchored`, the update's counts, so micro-batch shares add up."""
  m = masked.astype(jnp.float32)
  kl = jax.lax.stop_gradient(kl)
  n_masked, n_anchored = jnp.maximum(n_masked, 1), jnp.maximum(n_anchored, 1)
  return {"anchor_gate_share": jnp.sum(where) / n_masked,
          "anchor_cap_share": jnp.sum(where * (kl >= cap)) / n_anchored,
          "anchor_kl_uncapped": jnp.sum(where * kl) / n_anchored,
          "kl_ref_masked": jnp.sum(m * kl) / n_masked}


def _anchor_term(stats, batch: ReplayBatch, cfg: LossConfig, n: int, kl_den, totals):
  """(capped anchor, responses it covers, `anchor_diagnostics`; no diagnostics without an
  anchor: no reference to measure against)."""
  if cfg.uses_reference:
    kl_pos, gate_entropy = stats.kl_ref, batch.ref_entropy
    kl, n_kl = capped_kl_to_reference(kl_pos, batch.masked, gate_entropy, batch.resp_slot, n,
                                      cfg.conf_entropy, cfg.kl_cap, kl_den)
  elif cfg.w_kl > 0:
    gate_entropy = batch.rollout_entropy
    kl, n_kl, kl_pos = capped_reverse_kl_at(stats.logp_at, batch.topk_logprobs, batch.masked,
                                            gate_entropy, batch.resp_slot, n,
                                            cfg.conf_entropy, cfg.kl_cap, kl_den)
  else:   # no anchor: no reference forward, no term
    return jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), {}
  where = kl_positions(batch.masked, gate_entropy, cfg.conf_entropy)
  if totals is None:
    n_masked, n_anchored = jnp.sum(batch.masked), jnp.sum(where)
  else:
    n_masked, n_anchored = totals.n_masked, jnp.sum(totals.kl_weight)
  return kl, n_kl, anchor_diagnostics(kl_pos, where, batch.masked, cfg.kl_cap, n_masked,
                                      n_anchored)


def orl_loss(model, batch: ReplayBatch, cfg: LossConfig, totals: LossTotals | None = None,
             carry: AecCarry | None = None, reference=None):
  """Returns (loss, metrics). The head statistics are computed `cfg.vocab_chunk` tokens at a
  time when that is > 0 (same values, no [R, T, V] array; see vocab_chunks.py).

  `reference`: the frozen reference model (no gradient reaches it), needed when
  `cfg.uses_reference`; its forward runs here unless `batch` already carries it
  (`attach_reference`, as a gradient-accumulation step does once for all micro-batches).

  With `totals` (and `carry`), `batch` is one micro-batch of rows of a larger update: the loss
  and the metrics are its additive share of the update's (they sum over micro-batches), and
  the metrics gain `aec_carry` (the AecCarry for the next micro-batch) and
  `aec_pairs_out_of_order` (pairs whose earlier state comes in a later micro-batch: must be 0,
  see replay.order_rows_for_micro_batches).
  """
  if cfg.uses_reference and batch.ref_hidden is None:
    batch = attach_reference(batch, reference, cfg)
  hidden, _, norm_ratio = model.hidden_states(batch.tokens, batch.positions, batch.meta,
                                              residual=batch.residual,
                                              routes=layer_routes(batch))
  ref = dict(ref_head=reference.head, ref_hidden=batch.ref_hidden) if cfg.uses_reference else {}
  stats = token_stats(model.head, hidden, batch.targets, batch.topk_ids, chunk=cfg.vocab_chunk,
                      **ref)
  entropy, nll = stats.entropy, stats.nll
  n = batch.state_resp.shape[0]   # response slots <= state slots
  # the update's normalisers; None (a whole batch): each term normalises over the batch
  ce_den: jax.Array | None = None
  kl_den: jax.Array | None = None
  aec_den: jax.Array | None = None
  n_pairs: jax.Array | None = None
  if totals is not None:
    ce_den, kl_den = totals.ce_weight, totals.kl_weight
    aec_den, n_pairs = totals.aec_pairs, totals.n_pairs
  ce, n_ce = gated_ce(nll, batch.masked, batch.rollout_entropy, batch.resp_slot, n,
                      cfg.gate_entropy, ce_den)
  kl, n_kl, anchor_metrics = _anchor_term(stats, batch, cfg, n, kl_den, totals)
  h_state, _ = state_entropies(entropy, batch.masked, batch.state_slot, n)
  pair_valid, h_source, extra = batch.pair_valid, None, {}
  if totals is not None:  # micro-batch: pairs whose state k+1 is here; H_k here or carried
    here = _segment_sum(jnp.ones_like(batch.state_slot, jnp.float32), batch.state_slot, n) > 0
    carry = carry if carry is not None else AecCarry.empty(n)
    h_source = jnp.where(here, h_state, carry.h_state)
    pair_valid = pair_valid & here[batch.pair_b]
    extra = {"aec_carry": AecCarry(jax.lax.stop_gradient(h_source), carry.seen | here),
             "aec_pairs_out_of_order": jnp.sum(pair_valid & ~(here | carry.seen)[batch.pair_a])}
  l_aec, n_aec, hinge_active = aec(h_state, batch.pair_a, batch.pair_b, batch.pair_resp,
                                   pair_valid, n, cfg.aec_rho, h_source=h_source,
                                   den=aec_den, n_pairs=n_pairs)
  loss = ce + cfg.w_aec * l_aec + cfg.w_kl * kl
  m = batch.masked.astype(jnp.float32)
  n_masked = jnp.sum(m) if totals is None else totals.n_masked
  counts = {"responses_ce": n_ce, "responses_kl": n_kl, "responses_aec": n_aec}
  if totals is not None:  # this micro-batch's share of the mean over carrying positions
    norm_ratio = norm_ratio * _n_carried(batch) / jnp.maximum(totals.n_carried, 1)
    counts = totals.response_counts()
  metrics = {
      "loss_ce": ce, "loss_aec": l_aec, "loss_rkl": kl, "aec_hinge_active": hinge_active,
      # each term as it enters the objective (additive over micro-batches, like `loss`)
      "loss_aec_weighted": cfg.w_aec * l_aec, "loss_rkl_weighted": cfg.w_kl * kl,
      **counts,
      "replay_entropy": jnp.sum(entropy * m) / jnp.maximum(n_masked, 1),
      "replay_token_acc": jnp.sum((stats.argmax == batch.targets) * m)
                          / jnp.maximum(n_masked, 1),
      "residual_norm_ratio": norm_ratio,
      **anchor_metrics, **extra,
  }
  return loss, metrics


@dataclasses.dataclass(frozen=True)
class OrlObjective:
  """The ORL loss as a train-step objective: `objective(model, batch, key)` on a whole batch,
  and the gradient-accumulation protocol of `train.state.make_train_step(micro_batches > 1)`:
  `prepare` (what every micro-batch needs from the whole batch), `split` (rows into
  micro-batches) and `micro_loss` (one micro-batch's additive share of loss and metrics)."""
  cfg: LossConfig

  @property
  def grad_norm_terms(self) -> dict[str, str]:
    """{name: metric} of the terms whose gradient norms the train step logs as
    `grad_norm_<name>` (`loss.term_grad_norms`; each as it enters the objective, weighted),
    or {} when off."""
    if not self.cfg.term_grad_norms:
      return {}
    return {"ce": "loss_ce", "aec": "loss_aec_weighted", "anchor": "loss_rkl_weighted"}

  def __call__(self, model, batch: ReplayBatch, key, reference=None):
    del key
    return orl_loss(model, batch, self.cfg, reference=reference)

  def prepare(self, batch: ReplayBatch, reference=None):
    """(batch with the reference attached when the anchor uses it, totals, initial carry,
    metrics that are already final: the response counts)."""
    if self.cfg.uses_reference:
      batch = attach_reference(batch, reference, self.cfg)
    totals = loss_totals(batch, self.cfg)
    return batch, totals, AecCarry.empty(batch.state_resp.shape[0]), totals.response_counts()

  def split(self, batch: ReplayBatch, micro_batches: int, n_shards: int) -> ReplayBatch:
    return split_rows(batch, micro_batches, n_shards)

  def micro_loss(self, model, micro: ReplayBatch, key, totals: LossTotals, carry: AecCarry,
                 reference=None):
    """(loss share, (additive metrics, next carry))."""
    del key
    loss, metrics = orl_loss(model, micro, self.cfg, totals, carry, reference)
    carry = metrics.pop("aec_carry")
    for k in totals.response_counts():   # not additive: `prepare` returns them once
      metrics.pop(k)
    return loss, (metrics, carry)
