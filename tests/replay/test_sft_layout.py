import jax
import jax.numpy as jnp
import numpy as np

from orl_jax.packed_batch import noise_blocks, sft_batch
from pallas_kernels.staircase_attention import (KIND_CLEAN, KIND_PAD, KIND_PROMPT, KIND_STATE,
                                                staircase_visible)


def test_noise_masks_at_least_one_token_per_block():
  resp = jnp.arange(2, 2 + 4 * 16).reshape(4, 16)
  for seed in range(20):
    noised, masked, t = noise_blocks(jax.random.key(seed), resp, block_size=4, mask_id=1)
    per_block = np.asarray(masked).reshape(4, 4, 4).sum(-1)
    assert per_block.min() >= 1
    np.testing.assert_array_equal(np.asarray(noised) == 1, np.asarray(masked))
    assert np.all((np.asarray(t) > 0) & (np.asarray(t) <= 1))


def test_sft_row_layout_and_visibility():
  b, p, n = 2, 8, 8
  prompt = jnp.full((b, p), 5)
  valid = jnp.arange(p)[None] >= jnp.array([0, 3])[:, None]
  resp = jnp.arange(10, 10 + n)[None].repeat(b, 0)
  pb = sft_batch(jax.random.key(0), prompt, valid, resp, block_size=4, mask_id=1)
  c = n - 4                                                       # no clean copy of the last block
  assert pb.tokens.shape == (b, p + c + n)
  pos = np.asarray(pb.positions[0])
  np.testing.assert_array_equal(pos[p:p + c], pos[p + c:p + c + c])  # states reuse block positions
  vis = np.asarray(staircase_visible(pb.meta, pb.meta))[0]
  kind, blk = np.asarray(pb.meta.kind[0]), np.asarray(pb.meta.block[0])
  for q in np.where(kind == KIND_STATE)[0]:
    seen_clean = {int(blk[k]) for k in np.where(vis[q] & (kind == KIND_CLEAN))[0]}
    assert seen_clean == set(range(p // 4, blk[q]))                # only earlier clean blocks
  # the loss touches masked state tokens only, normalised by the response length
  w = np.asarray(pb.ce_weight)
  assert np.all(w[:, :p + c] == 0)
  masked = np.asarray(pb.tokens[:, p + c:]) == 1
  assert np.all((w[:, p + c:] > 0) == masked)
  assert np.all(w[:, p + c:][masked] >= 1.0 / n)


def test_sft_row_places_blocks_as_the_family_decodes_them():
  """Absolute placement (LLaDA2, SDAR): a 7-token prompt's last 3 tokens open the first block,
  clean and never masked or trained; the response follows them, the last block runs 3 tokens
  past it (EOS); a 4-token prompt's response starts on a block boundary. Every state sees the
  prompt's complete blocks and the clean blocks before its own."""
  b, p, n, eos = 4, 8, 8, 3
  prompt = jnp.arange(20, 20 + p)[None].repeat(2, 0)
  valid = jnp.arange(p)[None] >= jnp.array([1, 4])[:, None]
  resp = jnp.arange(40, 40 + n)[None].repeat(2, 0)
  pb = sft_batch(jax.random.key(0), prompt, valid, resp, block_size=b, mask_id=1, eos_id=eos,
                 placement="absolute")
  width = n + b                                                  # one more block
  c = width - b
  assert pb.tokens.shape == (2, p + c + width)
  tok, tgt = np.asarray(pb.tokens), np.asarray(pb.targets)
  np.testing.assert_array_equal(tok[0, 4:p], [21, 22, 23, 24])   # its complete block
  np.testing.assert_array_equal(np.asarray(pb.meta.kind[0, :p]),
                                [KIND_PAD] * 4 + [KIND_PROMPT] * 4)
  blocks0 = [25, 26, 27] + list(range(40, 40 + n)) + [eos] * 1
  np.testing.assert_array_equal(tgt[0, p + c:], blocks0)          # row 0: lead 3
  np.testing.assert_array_equal(tgt[1, p + c:], list(range(40, 40 + n)) + [eos] * b)
  np.testing.assert_array_equal(tok[0, p:p + 3], [25, 26, 27])    # clean block 0
  np.testing.assert_array_equal(tok[0, p + c:p + c + 3], [25, 26, 27])   # state: never masked
  w = np.asarray(pb.ce_weight)
  assert np.all(w[0, p + c:p + c + 3] == 0) and np.all(w[:, :p + c] == 0)
  masked = tok[:, p + c:] == 1
  assert np.all((w[:, p + c:] > 0) == masked)
  assert masked.reshape(2, -1, b)[1].sum(-1).min() >= 1          # every block of row 1 trains
  vis = np.asarray(staircase_visible(pb.meta, pb.meta))[0]
  kind, blk = np.asarray(pb.meta.kind[0]), np.asarray(pb.meta.block[0])
  for q in np.where(kind == KIND_STATE)[0]:
    seen_clean = {int(blk[k]) for k in np.where(vis[q] & (kind == KIND_CLEAN))[0]}
    assert seen_clean == set(range(p // b, blk[q]))
    assert vis[q, 4:p].all() and not vis[q, :4].any()             # the complete prompt block
