"""DiffusionGemma test models: the perturbed tiny random model whose rollout the exact replay
tests capture (sliding window shorter than the prompt, three canvases, left-padded prompts, two
responses per prompt), its prompts, each captured step's logits recomputed through the
sampler's path; and a small MoE config."""
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from orl_jax.models.diffusion_gemma import sampler
from orl_jax.models.diffusion_gemma.config import FULL, SLIDING, AttentionSpec, DiffusionGemmaConfig
from orl_jax.models.diffusion_gemma.model import DiffusionGemma, init_cache
from orl_jax.replay.plan import SRC_STATE
from orl_jax.sharding import path_name

RTOL = 1e-4        # of the largest logit (docs/method.md#rollout-with-exact-state-capture)
CANVAS, PROMPT, GROUP, N_CANVASES, STEPS = 8, 8, 2, 3, 4
CFG = DiffusionGemmaConfig(
    vocab_size=64, d_model=32, n_heads=2, mlp_dim=32, n_experts=4, top_k=2, expert_dim=8,
    layers=(AttentionSpec(SLIDING, head_dim=16, n_kv_heads=2),
            AttentionSpec(FULL, head_dim=16, n_kv_heads=1, rope_type="proportional",
                          rope_theta=1e6, rope_fraction=0.25)),
    sliding_window=5, canvas_length=CANVAS, eos_ids=(63,), pad_id=0, attention_impl="xla")
SAMPLER = sampler.SamplerConfig(n_canvases=N_CANVASES, max_steps=STEPS, eos_ids=(63,),
                                pad_id=0, top_k=8, confidence_threshold=0.0)


def perturbed_model(cfg=CFG, seed=0):
  """Random init plus noise on every parameter (norm scales, router scales and layer scalars
  away from 1); the self-conditioning MLP gets less, so its z-chain stays contracting."""
  model = DiffusionGemma(cfg, rngs=nnx.Rngs(seed))
  state = nnx.state(model, nnx.Param)
  leaves = jax.tree_util.tree_leaves_with_path(state)
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  flat = {}
  for (path, x), k in zip(leaves, keys):
    name = path_name(path)
    if name.endswith("layer_scalar"):
      flat[name] = 0.5 + jax.random.uniform(k, x.shape)
    else:
      std = 0.09 if name.startswith("self_conditioning.mlp") else 0.3
      flat[name] = x + std * jax.random.normal(k, x.shape)
  nnx.update(model, jax.tree_util.tree_map_with_path(lambda p, _: flat[path_name(p)], state))
  return model


def rollout_prompts():
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, 62, (2, PROMPT)).astype(np.int32)
  valid = np.ones((2, PROMPT), bool)
  valid[1, :3] = False                     # left padding
  tokens[1, :3] = 0
  return jnp.asarray(tokens), jnp.asarray(valid)


def rollout_logits(model, traj):
  """[B, S, C, V] each captured step's logits, recomputed through the sampler's path."""
  b = traj.responses.shape[0]
  cap = traj.capture
  reps = lambda x: jnp.repeat(x, GROUP, axis=0)
  cache = init_cache(model.cfg, b, PROMPT + N_CANVASES * CANVAS)
  cache = model.commit_forward(reps(traj.prompt_tokens), cache, reps(traj.prompt_valid)).cache
  out = []
  for ci in range(N_CANVASES):
    for s in range(STEPS):
      i = ci * STEPS + s
      out.append(model.decode_forward(cap.block_tokens[:, i], cache, cap.z[:, i]).logits)
    cache = model.commit_forward(traj.responses[:, ci * CANVAS:(ci + 1) * CANVAS], cache).cache
  return np.stack([np.asarray(x) for x in out], axis=1)


def state_tokens(plan):
  rows, cols = np.nonzero(np.asarray(plan.src_type) == SRC_STATE)
  return (rows, cols, np.asarray(plan.src_resp)[rows, cols],
          np.asarray(plan.src_state)[rows, cols], np.asarray(plan.src_pos)[rows, cols])


# `release_26b_a4b` keyword arguments of a small MoE DiffusionGemma (f32)
SMALL_MOE = dict(vocab_size=40, d_model=16, n_heads=2, mlp_dim=24, n_experts=4, top_k=2,
                 expert_dim=8, sliding_window=3, canvas_length=6, dtype="float32",
                 param_dtype="float32",
                 layers=(AttentionSpec(SLIDING, 8, 1),
                         AttentionSpec(FULL, 16, 1, "proportional", 1e6, 0.25)))
