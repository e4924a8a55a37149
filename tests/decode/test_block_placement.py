"""Decoding as each family's authors do (issue 27,
docs/decoding.md#decoding-as-each-models-authors-do): block placement, commit comparison, stopping
and forward counts, against the official `generate` loops restated in
`tests/support/official_generate.py` and driven by independent float64 models on tiny random
directories (LLaDA2: the numpy forward of tests/support/llada2.py over the official tensors;
SDAR / QwenDLM: transformers' Qwen3 forward with the block-causal mask).
Rerun under other CPU numerics (`numerics`): the decodes against the official loops and the
replays; not the placement of integer prompts, the comparison on literal scores, the table."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

from orl_jax.decode.config import DecodeConfig
from orl_jax.decode.lockstep import lockstep_decoder
from orl_jax.decode.placement import place_prompts
from orl_jax.decode.per_row import make_engine
from orl_jax.models import hf_read
from orl_jax.models.transformer import ModelConfig
from orl_jax.unmasking import UnmaskRule, select_commits
from tests.support import official_generate as official
from tests.support.helpers import TINY, tiny_qwen3
from tests.support.llada2 import reference_forward, write_llada2_dir

MARGIN = 1e-4    # decisions closer than this to a tie could go either way in float32 (our
                 # float32 probabilities differ from the float64 reference by < 6e-6 here)
HEAD_SCALE = 6.0  # sharper random heads: the threshold often commits several tokens a step


def _left_pad(prompts, width: int, pad: int = 0):
  """([B, width] int32 tokens, [B, width] bool validity) of left-padded prompts."""
  tokens = np.full((len(prompts), width), pad, np.int32)
  valid = np.zeros((len(prompts), width), bool)
  for i, p in enumerate(prompts):
    tokens[i, width - len(p):], valid[i, width - len(p):] = p, True
  return tokens, valid


def _decode(path, family, cfg, dcfg, prompts, width: int, engine_rows: int = 0):
  """Our decoder (or, with `engine_rows`, the per-row engine) on the directory at `path`."""
  graphdef, params = hf_read.load_model_params(path, family, cfg)
  tokens, valid = _left_pad(prompts, width)
  run = (make_engine(graphdef, dcfg, engine_rows) if engine_rows
         else lockstep_decoder(graphdef, dcfg))
  return jax.device_get(run(params, tokens, valid, jax.random.key(0)))


def _assert_row_is_official(out, row: int, ref: official.Generated, response=None):
  """Row `row` of our output against an official run: the response through its first EOS and
  both forward counts (the authors' = denoising forwards; the paper's = + one per block)."""
  response = ref.tokens if response is None else response
  n = int(out.n_generated[row])
  np.testing.assert_array_equal(out.tokens[row, :n], response, err_msg=f"row {row}")
  assert n == len(response), (row, n, len(response))
  assert int(out.nfe_denoise[row]) == ref.denoise, (row, int(out.nfe_denoise[row]), ref.denoise)
  assert int(out.nfe[row]) == ref.denoise + ref.blocks, (row, int(out.nfe[row]), ref)


# ----------------------------------------------------------------------------- placement


def test_place_prompts_shifts_each_row_by_its_lead():
  tokens, valid = _left_pad([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4], [1, 2]], 8)
  placed = jax.device_get(place_prompts(jnp.asarray(tokens), jnp.asarray(valid), 4, 99,
                                        "absolute"))
  np.testing.assert_array_equal(placed.lead, [3, 0, 2])
  # complete blocks end at P = 8; the last `lead` tokens open the first decoded block
  np.testing.assert_array_equal(placed.valid, [[0, 0, 0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1, 1],
                                               [0] * 8])
  np.testing.assert_array_equal(placed.tokens[0, 4:], [1, 2, 3, 4])
  np.testing.assert_array_equal(placed.head, [[5, 6, 7, 99], [99] * 4, [1, 2, 99, 99]])
  end = place_prompts(jnp.asarray(tokens), jnp.asarray(valid), 4, 99, "prompt_end")
  np.testing.assert_array_equal(end.tokens, tokens)
  np.testing.assert_array_equal(end.lead, [0, 0, 0])


def test_threshold_comparison_is_the_familys():
  """A candidate exactly at tau commits under ">=" (Fast-dLLM) and not under ">" (LLaDA2,
  SDAR); the at-least-one fallback is the same."""
  rule = UnmaskRule("threshold", 0.5)
  masked = jnp.array([[True, True, True]])
  conf = jnp.array([[0.5, 0.25, 0.75]])
  ent = jnp.zeros_like(conf)
  ge = select_commits(rule, masked, conf, ent, ">=")
  gt = select_commits(rule, masked, conf, ent, ">")
  np.testing.assert_array_equal(ge, [[True, False, True]])
  np.testing.assert_array_equal(gt, [[False, False, True]])
  low = jnp.array([[0.5, 0.25, 0.125]])       # nothing above tau: the most confident alone
  np.testing.assert_array_equal(select_commits(rule, masked, low, ent, ">"),
                                [[True, False, False]])


# ----------------------------------------------------------------------------- LLaDA2


def _llada2_dir(path: str, seed: int):
  """A random tiny LLaDA2 directory (official names) with a sharper head and expert biases a
  whole unit apart: routing then has no near-ties (sigmoid scores differ by less than 1), so
  a float32 decode can follow the float64 reference over hundreds of forwards (the router
  itself is checked in tests/models/test_llada2.py). -> (float64 tensors, config.json,
  ModelConfig)."""
  t = write_llada2_dir(path, seed=seed, n_layers=2)
  t["lm_head.weight"] = (HEAD_SCALE * t["lm_head.weight"]).astype(np.float32)
  t["model.layers.1.mlp.gate.expert_bias"] = np.arange(8, 0, -1).astype(np.float32)
  save_file(t, os.path.join(path, "model.safetensors"))
  with open(os.path.join(path, "config.json")) as f:
    hf_json = json.load(f)
  cfg = ModelConfig(**hf_read.architecture_from_hf(hf_json, "llada2_moe"),
                    mask_id=hf_json["mask_token_id"])
  return {k: np.asarray(v, np.float64) for k, v in t.items()}, hf_json, cfg


@pytest.fixture(scope="module")
def llada2(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("llada2"))
  t, hf_json, cfg = _llada2_dir(path, seed=3)
  return path, t, hf_json, cfg


def _prompts(n_tokens, seed: int, vocab: int = 256, low: int = 3):
  rng = np.random.default_rng(seed)
  return [rng.integers(low, vocab, n).tolist() for n in n_tokens]


def _llada2_official(llada2, prompt, block, **kw):
  _, t, hf_json, cfg = llada2
  ref = official.llada2_generate(lambda x: reference_forward(t, hf_json, x, block)[0], prompt,
                                 block_length=block, mask_id=cfg.mask_id, **kw)
  assert ref.margin > MARGIN, f"a near-tie ({ref.margin:.1e}): pick another seed"
  return ref


@pytest.mark.numerics
def test_llada20_prompts_of_any_length_decode_as_the_official_generate(llada2):
  """Block 16, 48 new tokens, threshold 0.9, greedy, fp32: prompts of 23, 16 and 9 tokens in
  one left-padded batch give each the official tokens and forward counts (the 23-token prompt
  shares its second block with the first 9 generated tokens; the 9-token one its first)."""
  path, _, _, cfg = llada2
  prompts = _prompts([23, 16, 9], seed=0)
  dcfg = DecodeConfig(gen_length=48, block_size=16, mask_id=cfg.mask_id, eos_id=299,
                      rule=UnmaskRule("threshold", 0.9), block_placement="absolute",
                      commit_compare=">", eos_early_stop=True)
  out = _decode(path, "llada2_moe", cfg, dcfg, prompts, 32)
  refs = [_llada2_official(llada2, p, 16, gen_length=48, threshold=0.9, eos_id=299)
          for p in prompts]
  for row, ref in enumerate(refs):
    _assert_row_is_official(out, row, ref)
  assert refs[0].blocks == 4 and refs[1].blocks == 3     # 23 + 48 tokens span 5 blocks of 16
  assert refs[0].forwards < 57        # the threshold committed several tokens in some step
  engine = _decode(path, "llada2_moe", cfg, dcfg, prompts, 32, engine_rows=2)
  for row, ref in enumerate(refs):
    _assert_row_is_official(engine, row, ref)


@pytest.mark.numerics
def test_llada20_gen256_block32_decodes_as_the_official_generate(llada2):
  """The issue's long case: 256 new tokens in blocks of 32 after a 45-token prompt (the
  prompt's second block holds 13 prompt tokens and 19 generated ones), fp32."""
  path, _, _, cfg = llada2
  prompt = _prompts([45], seed=3)[0]
  dcfg = DecodeConfig(gen_length=256, block_size=32, mask_id=cfg.mask_id, eos_id=299,
                      rule=UnmaskRule("threshold", 0.9), block_placement="absolute",
                      commit_compare=">")
  out = _decode(path, "llada2_moe", cfg, dcfg, [prompt], 64)
  ref = _llada2_official(llada2, prompt, 32, gen_length=256, threshold=0.9, eos_id=299)
  _assert_row_is_official(out, 0, ref)
  assert ref.blocks == 9 and len(ref.tokens) == 256


def _first_new_token(response, start: int) -> int:
  """The first token of `response` from index `start` on that does not occur before it (so
  that, taken as EOS, it ends the response there)."""
  for i in range(start, len(response)):
    if response[i] not in response[:i]:
      return int(response[i])
  raise AssertionError("no new token to stop at: pick another seed")


def _eos_of(llada2, prompt, **kw):
  """A token the official decode first generates in its second decoded block (used as EOS,
  so the stopping rules have something to act on)."""
  ref = _llada2_official(llada2, prompt, 16, eos_id=-1, **kw)
  return _first_new_token(ref.tokens, 16 - len(prompt) % 16)


@pytest.mark.numerics
@pytest.mark.parametrize("eos_early_stop", [False, True])
def test_llada21_editing_and_eos_stop_decode_as_the_official_generate(llada2, eos_early_stop):
  """LLaDA2.1 with dllm's editing preset (threshold 0.95, edit 0.9, 16 post steps): a
  23-token prompt whose shared block's prompt tokens are never edited; EOS in the second
  block; without eos_early_stop (the official default) every block is still decoded."""
  path, _, _, cfg = llada2
  prompt = _prompts([23], seed=2)[0]
  kw = dict(gen_length=48, threshold=0.95, version="2.1", editing_threshold=0.9,
            max_post_steps=16)
  eos = _eos_of(llada2, prompt, **kw)
  ref = _llada2_official(llada2, prompt, 16, eos_id=eos, eos_early_stop=eos_early_stop, **kw)
  dcfg = DecodeConfig(gen_length=48, block_size=16, mask_id=cfg.mask_id, eos_id=eos,
                      rule=UnmaskRule("threshold", 0.95), edit_threshold=0.9,
                      max_post_edit_steps=16, block_placement="absolute", commit_compare=">",
                      eos_early_stop=eos_early_stop)
  out = _decode(path, "llada2_moe", cfg, dcfg, [prompt], 32)
  _assert_row_is_official(out, 0, ref)
  assert ref.blocks == (2 if eos_early_stop else 4)
  assert len(ref.tokens) < 48 and ref.tokens[-1] == eos


# ----------------------------------------------------------------------------- SDAR, QwenDLM


# (tied head, torch seed, prompt seed): seeds whose greedy decodes have no near-tie, stop early
# in the first prompt and commit several tokens in some step
QWEN3_CASES = {"sdar": (False, 7, 5), "qwendlm": (True, 10, 4)}


@pytest.fixture(scope="module", params=list(QWEN3_CASES))
def qwen3(request, tmp_path_factory):
  """A random tiny Qwen3 directory (SDAR: untied head; QwenDLM: tied) and its float64
  transformers forward with SDAR's block-causal mask. Layer weights x4 (a tied random Qwen3
  otherwise echoes its input token) and the final norm x15 (confident enough to commit
  several tokens a step)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  tied, torch_seed, prompt_seed = QWEN3_CASES[request.param]
  torch.manual_seed(torch_seed)
  model = tiny_qwen3(transformers, tied, max_position_embeddings=256)
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name:
        p.add_(0.2 * torch.randn_like(p))
      elif "layers" in name:
        p.mul_(4.0)
    model.model.norm.weight.mul_(15.0)
  path = str(tmp_path_factory.mktemp("qwen3"))
  model.save_pretrained(path)
  model = model.double()
  cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                    mlp_dim=128, mask_id=95, rope_theta=1e6, norm_eps=1e-6, qk_norm=True,
                    tie_embeddings=tied)

  def logits_fn(x):
    mask = official.block_causal_mask(len(x), 4)
    bias = torch.where(torch.as_tensor(mask), 0.0, float("-inf")).double()[None, None]
    with torch.no_grad():
      out = model(torch.as_tensor(x)[None], attention_mask=bias,
                  position_ids=torch.arange(len(x))[None])
    return out.logits[0].numpy()

  return path, cfg, logits_fn, prompt_seed


@pytest.mark.numerics
def test_sdar_and_qwendlm_decode_as_sdars_generate(qwen3):
  """SDAR's block_diffusion_generate (block 4, threshold 0.8, greedy, stop at a generated id):
  prompts of 7 and 10 tokens (3 and 2 prompt tokens in the first decoded block) in one batch
  give the official tokens; the official loop's forwards less its prefill are our paper's
  count (it also stores every block's K/V, the last included), its denoising ones our
  authors' count."""
  path, cfg, logits_fn, prompt_seed = qwen3
  prompts = _prompts([7, 10], seed=prompt_seed, vocab=95)
  kw = dict(gen_length=24, block_length=4, threshold=0.8, mask_id=cfg.mask_id)
  first = official.sdar_generate(logits_fn, prompts[0], stop_ids=[-1], **kw)
  stop = _first_new_token(first.tokens[len(prompts[0]):], 5)   # from the 3rd decoded block
  refs = [official.sdar_generate(logits_fn, p, stop_ids=[stop], **kw) for p in prompts]
  dcfg = DecodeConfig(gen_length=24, block_size=4, mask_id=cfg.mask_id, eos_id=stop,
                      rule=UnmaskRule("threshold", 0.8), block_placement="absolute",
                      commit_compare=">", eos_early_stop=True)
  out = _decode(path, "qwen3", cfg, dcfg, prompts, 12)
  for row, (p, ref) in enumerate(zip(prompts, refs)):
    assert ref.margin > MARGIN, f"a near-tie ({ref.margin:.1e}): pick another seed"
    response = ref.tokens[len(p):len(p) + 24]
    hit = np.flatnonzero(response == stop)
    response = response[:hit[0] + 1] if hit.size else response
    prefill = 1 if len(p) >= 4 else 0
    assert ref.forwards - prefill == ref.denoise + ref.blocks
    _assert_row_is_official(out, row, ref, response)
  assert refs[0].blocks < 7          # stopped after the block holding the stop id
  masks = [len(p) % 4 * -1 + 4 * r.blocks for p, r in zip(prompts, refs)]
  assert any(r.denoise < m for r, m in zip(refs, masks))   # some step committed several


# ----------------------------------------------------------------------------- rollouts, replay


def _tiny_rollout(schedule: str, edit_threshold: float = 1.0, post: int = 0):
  """A sampled rollout of the tiny block-causal model (live adapter) with absolute placement:
  prompts of 7 and 4 tokens (block 4: the first shares its last block with one generated
  token), 3 responses each."""
  from flax import nnx
  from orl_jax.decode.trajectories import make_trajectories, per_row_trajectories
  from tests.support.helpers import live_adapter, tiny_model
  graphdef, params = nnx.split(live_adapter(tiny_model(7, residual_mode="adapter"), 0.1, 3))
  dcfg = DecodeConfig(gen_length=12, block_size=4, mask_id=TINY.mask_id, eos_id=2,
                      rule=UnmaskRule("threshold", 0.2), temperature=1.0, capture_states=24,
                      block_placement="absolute", commit_compare=">",
                      edit_threshold=edit_threshold, max_post_edit_steps=post)
  prompts = jax.random.randint(jax.random.key(0), (2, 8), 3, TINY.vocab_size)
  valid = jnp.arange(8)[None] >= jnp.array([1, 4])[:, None]
  fn = per_row_trajectories if schedule == "per_row" else None
  traj = make_trajectories(graphdef, dcfg, 3, rollout_fn=fn)(params, prompts, valid,
                                                        jax.random.key(5), 0)
  return graphdef, params, jax.device_get(traj), np.asarray(prompts)


@pytest.mark.numerics
@pytest.mark.parametrize("schedule,edit", [("lockstep", 1.0), ("lockstep", 0.15),
                                           ("per_row", 1.0)])
def test_absolute_placement_rollouts_replay_exactly(schedule, edit):
  """The shared block's prompt tokens belong to every state of that block (and to its clean
  copy); the packed replay reproduces every captured step's log-probs to 1e-4."""
  from orl_jax.replay import ReplayConfig, build_plan
  from tests.support.helpers import replayed_vs_captured
  graphdef, params, traj, prompts = _tiny_rollout(schedule, edit, 2 if edit < 1 else 0)
  cap = traj.capture
  # prompt 0 (7 tokens): its first decoded block opens with its last 3 tokens, in every state
  first = cap.valid[0] & (cap.block[0] == 0)
  np.testing.assert_array_equal(cap.block_tokens[0][first][:, :3],
                                np.broadcast_to(prompts[0, 5:], (int(first.sum()), 3)))
  assert not cap.commit[0][first][:, :3].any()                # never committed or edited
  np.testing.assert_array_equal(cap.block_final[0, :3], prompts[0, 5:])
  np.testing.assert_array_equal(traj.prompt_valid[0], [0, 0, 0, 0, 1, 1, 1, 1])
  assert cap.block[cap.valid].max() <= 3                      # 3 + 12 tokens: 4 blocks at most
  if edit < 1:                                                # edit steps are states too
    assert np.any(cap.commit & (cap.block_tokens != TINY.mask_id) & cap.valid[..., None])
  plan, stats = build_plan(
      prompt_valid=traj.prompt_valid, capture_valid=cap.valid, capture_block=cap.block,
      eligible=np.ones(6, bool), group_size=3,
      cfg=ReplayConfig(row_len=160, n_rows=40, max_states=160, max_responses=8, block_size=4,
                       states_per_response=0, layout="packed", micro_batches=1),
      rng=np.random.default_rng(0))
  assert stats["states_dropped"] == 0 and stats["states_packed"] == int(cap.valid.sum())
  replayed, captured, _ = replayed_vs_captured(graphdef, params, traj, plan)
  np.testing.assert_allclose(replayed, captured, atol=1e-4)


@pytest.mark.numerics
def test_absolute_placement_moe_replay_with_captured_routes():
  """LLaDA2-shaped MoE rollout with absolute placement and route capture: the prompt's
  complete blocks, the shared block (state and clean) and every later block replay with the
  routes they were decoded with, to 1e-4."""
  from flax import nnx
  from orl_jax.decode.trajectories import make_trajectories
  from tests.support import moe_replay as moe
  from tests.support.llada2 import build_model, random_flat_params
  graphdef, params = nnx.split(build_model(moe.CFG, random_flat_params(moe.CFG, seed=4)))
  dcfg = DecodeConfig(gen_length=12, block_size=4, mask_id=moe.CFG.mask_id, eos_id=moe.EOS,
                      rule=UnmaskRule("threshold", 0.5), temperature=1.0, capture_states=24,
                      capture_routes=True, block_placement="absolute", commit_compare=">")
  prompts = jax.random.randint(jax.random.key(0), (2, 8), 3, moe.CFG.vocab_size)
  valid = jnp.arange(8)[None] >= jnp.array([1, 4])[:, None]
  traj = make_trajectories(graphdef, dcfg, moe.G)(params, prompts, valid, jax.random.key(5), 0)
  assert traj.capture.routes.clean.shape[1] == 16            # 4 blocks of 4
  batch, plan = moe.replay_batch(traj, np.asarray(traj.prompt_valid))
  err, _ = moe.replay_error(graphdef, params, batch, plan, with_routes=True)
  assert err <= 1e-4, err


def test_results_table_labels_both_forward_counts():
  """The table shows the paper's count (the headline) and the authors' beside it; results
  written before the authors' count was recorded still print."""
  from orl_jax import evaluate
  new = {"accuracy": 0.5, "tpf_mean": 2.0, "tpf_pooled": 2.0, "nfe_mean": 33.0,
         "tpf_pooled_denoise": 2.0625, "nfe_mean_denoise": 32.0, "tps": 10.0}
  old = {k: v for k, v in new.items() if "denoise" not in k}
  table = evaluate.format_table({"base": {"threshold_0.9": new}, "old": {"threshold_0.9": old}})
  lines = table.splitlines()
  assert "tpf_dn" in lines[0] and "nfe_dn" in lines[0]
  assert "2.06" in lines[2] and "32.0" in lines[2] and " - " in lines[3]
  assert "paper's count" in lines[-1] and "authors'" in lines[-1]
