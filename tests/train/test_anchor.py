"""The capped reverse-KL anchor to the frozen reference (docs/method.md#the-losses), pinned on a
hand-computed case: value, gradient and the per-update diagnostics, against float64 numpy.

Five positions over a vocabulary of 4, two responses: response 0 holds a position near the
reference, one far past the cap and one where the reference is not confident (outside the
entropy gate); response 1 holds one near position and one that is not masked. The policy's
logits are the parameters (the head is the identity), so the gradient is d/d logits."""
import math

import jax
import jax.numpy as jnp
import numpy as np

from orl_jax import losses
from orl_jax.vocab_chunks import token_stats

CAP, CONF = 1.0, 0.1
RESP = np.array([0, 0, 0, 1, 1])
MASKED = np.array([True, True, True, True, False])
# the frozen reference: confident (normalized entropy ~0.07 < 0.1) but at position 2
P_REF = np.array([[0.985, 0.005, 0.005, 0.005],
                  [0.985, 0.005, 0.005, 0.005],
                  [0.40, 0.30, 0.20, 0.10],
                  [0.005, 0.005, 0.985, 0.005],
                  [0.985, 0.005, 0.005, 0.005]])
# the policy: near the reference (0, 3), far from it (1: KL ~5 > cap), anything (2, 4)
Q = np.array([[0.90, 0.05, 0.03, 0.02],
              [0.01, 0.97, 0.01, 0.01],
              [0.10, 0.20, 0.30, 0.40],
              [0.02, 0.03, 0.92, 0.03],
              [0.25, 0.25, 0.25, 0.25]])


def _hand():
  """The formula in float64: per position KL(q || p_ref) = sum_v q_v log(q_v / p_v), its
  gradient in the logits q_j (log(q_j / p_j) - KL); min(c, KL) where masked and the reference's
  H / log V < tau_conf; a mean per response, then over the responses that have any."""
  kl = np.sum(Q * np.log(Q / P_REF), -1)
  grad_kl = Q * (np.log(Q / P_REF) - kl[:, None])
  h_ref = -np.sum(P_REF * np.log(P_REF), -1) / math.log(4)
  where = MASKED & (h_ref < CONF)
  assert list(where) == [True, True, False, True, False] and kl[1] > CAP > max(kl[0], kl[3])
  value, grad = 0.0, np.zeros_like(Q)
  responses = [r for r in set(RESP) if where[RESP == r].any()]
  for r in responses:
    at = where & (RESP == r)
    value += np.mean(np.minimum(CAP, kl[at])) / len(responses)
    below = at & (kl < CAP)          # past the cap the term is constant: no gradient
    grad[below] += grad_kl[below] / at.sum() / len(responses)
  return kl, h_ref, where, value, grad


def _anchor(logits):
  """The anchor as `orl_loss` builds it for kl_reference='initial'."""
  ident = lambda h: h
  ref_logits = jnp.log(jnp.asarray(P_REF, jnp.float32))[None]
  stats = token_stats(ident, logits[None], jnp.zeros((1, 5), jnp.int32), ref_head=ident,
                      ref_hidden=ref_logits)
  ref_entropy = token_stats(ident, ref_logits, jnp.zeros((1, 5), jnp.int32)).entropy
  value, count = losses.capped_kl_to_reference(
      stats.kl_ref, jnp.asarray(MASKED)[None], ref_entropy, jnp.asarray(RESP)[None], 2,
      conf_entropy=CONF, cap=CAP)
  return value, (count, stats.kl_ref[0], ref_entropy[0])


def test_anchor_value_and_gradient_match_the_hand_computed_formula():
  kl, h_ref, _, value, grad = _hand()
  logits = jnp.log(jnp.asarray(Q, jnp.float32))
  (got, (count, got_kl, got_h)), got_grad = jax.value_and_grad(_anchor, has_aux=True)(logits)
  np.testing.assert_allclose(np.asarray(got_kl), kl, rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(got_h), h_ref, rtol=1e-5)
  assert int(count) == 2
  assert math.isclose(float(got), value, rel_tol=1e-5)
  np.testing.assert_allclose(np.asarray(got_grad), grad, rtol=1e-4, atol=1e-7)
  # past the cap, outside the gate and off the masked positions: no gradient at all
  assert not np.asarray(got_grad)[[1, 2, 4]].any()


def test_anchor_diagnostics_match_the_hand_computed_shares():
  kl, _, where, _, _ = _hand()
  d = losses.anchor_diagnostics(jnp.asarray(kl, jnp.float32), jnp.asarray(where, jnp.float32),
                                jnp.asarray(MASKED), CAP, MASKED.sum(), where.sum())
  expected = {"anchor_gate_share": 3 / 4,                    # 3 of the 4 masked positions
              "anchor_cap_share": 1 / 3,                     # position 1 of the 3 anchored
              "anchor_kl_uncapped": (kl[0] + kl[1] + kl[3]) / 3,
              "kl_ref_masked": kl[:4].mean()}                # gate or not, masked only
  assert set(d) == set(expected)
  for k, v in expected.items():
    assert math.isclose(float(d[k]), v, rel_tol=1e-6), k
