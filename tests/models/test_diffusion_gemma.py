"""DiffusionGemma (docs/models.md#diffusiongemma) against transformers 5.24 as the independent
reference.

The HF model is the tiny random config of transformers' own DiffusionGemma tests (2 text layers
sliding + full, `per_layer_config` for the full layer, 4 experts top-2) with a 1-layer vision
tower; every parameter and `layer_scalar` buffer is perturbed away from its initial value so
that norms, scalars and router scales all matter. Parity runs in f32; tolerances are relative to
the largest reference logit. The sampler trace feeds both implementations the same noise (torch's
RNG cannot be matched): `torch.multinomial` and the sampler's uniform canvases are patched to
read it.

Rerun under other CPU numerics (`numerics`): the parities and the sampler (routed expert ids,
token ids, accepted positions and forward counts of two programs), the entropy-bound acceptance
(XLA's cumulative sum against numpy's) and the expert-axis split (expert ids across meshes).

Install the references with: pip install torch==2.13.0 transformers==5.24.0
"""
import json
import os
import shutil
import textwrap
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from orl_jax.models.diffusion_gemma import sampler
from orl_jax.models.diffusion_gemma import model as dg
from tests.support import diffusion_gemma_dirs as dg_hf
from orl_jax.models.diffusion_gemma.config import (FULL, SLIDING, AttentionSpec,
                                                   DiffusionGemmaConfig, release_26b_a4b)
from orl_jax.sharding import path_name
from tests.support.diffusion_gemma import SMALL_MOE

LOGIT_RTOL = 5e-5   # max |Δ| / max |logit| (f32; measured ~1e-5)
TEXT_CONFIG = {
    "vocab_size": 99, "hidden_size": 32, "num_attention_heads": 2, "num_key_value_heads": 2,
    "intermediate_size": 32, "hidden_act": "gelu", "max_position_embeddings": 512,
    "initializer_range": 0.02, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "moe_intermediate_size": 8, "num_experts": 4, "num_hidden_layers": 2,
    "layer_types": ["sliding_attention", "full_attention"],
    "per_layer_config": {1: {"head_dim": 16, "num_key_value_heads": 2}},
    "top_k_experts": 2, "use_bidirectional_attention": "vision"}
VISION_CONFIG = {"image_size": 20, "patch_size": 5, "num_channels": 3, "hidden_size": 16,
                 "num_key_value_heads": 1, "num_hidden_layers": 1, "num_attention_heads": 4,
                 "intermediate_size": 37, "initializer_range": 0.02}
CANVAS = 16
SMALL_WINDOW = 5   # < the prompts below, so sliding layers drop cached tokens


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def torch_mod():
  return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory, torch_mod):
  """{window: HF directory}: the perturbed tiny model with the default window (512) and with a
  window smaller than the prompt (same weights)."""
  torch = torch_mod
  transformers = pytest.importorskip("transformers")
  cfg = transformers.DiffusionGemmaConfig(text_config=TEXT_CONFIG, vision_config=VISION_CONFIG,
                                          image_token_id=4, boi_token_id=5, eoi_token_id=6,
                                          canvas_length=CANVAS)
  torch.manual_seed(0)
  model = transformers.DiffusionGemmaForBlockDiffusion(cfg).eval()
  gen = torch.Generator().manual_seed(1)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.add_(_perturbation(name) * torch.randn(p.shape, generator=gen))
    for name, b in model.named_buffers():
      if name.endswith("layer_scalar"):
        b.copy_(0.5 + torch.rand(b.shape, generator=gen))
  base = str(tmp_path_factory.mktemp("dg") / "window512")
  model.save_pretrained(base)
  small = base.replace("window512", f"window{SMALL_WINDOW}")
  shutil.copytree(base, small)
  with open(os.path.join(small, "config.json")) as f:
    config = json.load(f)
  config["text_config"]["sliding_window"] = SMALL_WINDOW
  with open(os.path.join(small, "config.json"), "w") as f:
    json.dump(config, f)
  return {512: base, SMALL_WINDOW: small}


def _perturbation(name: str) -> float:
  """Std of the noise added to a parameter. The self-conditioning MLP gets less: with it at 0.3
  the step-to-step map z -> z' amplifies differences ~15x per step (measured), so f32 rounding
  alone makes any two implementations part ways after a few steps; at 0.09 the map contracts
  (~0.5x) while self-conditioning still moves the logits by ~50%."""
  return 0.09 if "self_conditioning" in name and name.endswith("proj.weight") else 0.3


def _load_hf(path):
  import transformers
  return transformers.DiffusionGemmaForBlockDiffusion.from_pretrained(path).eval()


def _max_rel(ours, ref):
  ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
  return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


# ----------------------------------------------------------------------------- config


def test_config_from_hf_resolves_per_layer_shapes(hf_dirs):
  cfg = dg_hf.read_config(hf_dirs[512])
  assert [s.kind for s in cfg.layers] == [SLIDING, FULL]
  assert (cfg.layers[0].head_dim, cfg.layers[0].n_kv_heads) == (256, 2)   # global head_dim
  assert (cfg.layers[1].head_dim, cfg.layers[1].n_kv_heads) == (16, 2)    # per_layer_config
  assert cfg.layers[1].rope_type == "proportional" and cfg.layers[1].rope_fraction == 0.25
  assert cfg.final_softcap == 30.0 and cfg.eos_ids == (2,) and cfg.canvas_length == CANVAS
  assert DiffusionGemmaConfig.from_hf(cfg.to_hf()) == cfg


def test_release_shapes_match_a_gemma4_style_config():
  """The released checkpoint's config.json names full-layer shapes with `global_head_dim` /
  `num_global_key_value_heads` instead of `per_layer_config`."""
  text = {"vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
          "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8,
          "head_dim": 256, "global_head_dim": 512, "num_global_key_value_heads": 2,
          "attention_k_eq_v": True, "sliding_window": 1024, "num_experts": 128,
          "top_k_experts": 8, "moe_intermediate_size": 704, "eos_token_id": [1, 106]}
  cfg = DiffusionGemmaConfig.from_hf({"model_type": "diffusion_gemma", "text_config": text},
                                     dtype="bfloat16", param_dtype="bfloat16")
  assert dataclasses_equal_but_passthrough(cfg, release_26b_a4b())
  assert [i for i, s in enumerate(cfg.layers) if s.kind == FULL] == [5, 11, 17, 23, 29]


def dataclasses_equal_but_passthrough(a, b):
  import dataclasses
  return dataclasses.replace(a, hf_passthrough="") == dataclasses.replace(b, hf_passthrough="")


@pytest.mark.parametrize("field,value,needle", [
    ("attention_bias", True, "attention_bias"),
    ("use_bidirectional_attention", "all", "use_bidirectional_attention"),
    ("num_experts", None, "num_experts")])
def test_unsupported_config_json_is_named(field, value, needle):
  text = dict(TEXT_CONFIG, **{field: value})
  with pytest.raises(ValueError, match=needle):
    DiffusionGemmaConfig.from_hf({"model_type": "diffusion_gemma", "text_config": text})


def test_transformers_reads_our_config_json_the_same_way():
  transformers = pytest.importorskip("transformers")
  ours = release_26b_a4b()
  theirs = transformers.DiffusionGemmaConfig(**ours.to_hf()).text_config
  for i, spec in enumerate(ours.layers):
    layer = theirs.per_layer_config[i]
    assert (layer.head_dim, layer.num_key_value_heads) == (spec.head_dim, spec.n_kv_heads)
  assert theirs.layer_types == [s.kind for s in ours.layers]
  assert theirs.sliding_window == ours.sliding_window


# ----------------------------------------------------------------------------- model pieces


def test_proportional_rope_rotates_a_fraction_of_the_whole_head():
  spec = AttentionSpec(FULL, head_dim=512, n_kv_heads=2, rope_type="proportional",
                       rope_theta=1e6, rope_fraction=0.25)
  inv = dg.rope_inv_freq(spec)
  assert inv.shape == (256,) and np.count_nonzero(inv) == 64
  # exponents over the whole head (2i / 512), not over the rotated 128 dims
  np.testing.assert_allclose(inv[1], 1e6 ** (-2 / 512), rtol=1e-6)


def test_decoder_sees_the_last_window_minus_one_cached_tokens():
  cfg = release_26b_a4b(layers=(AttentionSpec(SLIDING, 8, 1), AttentionSpec(FULL, 8, 1)),
                        sliding_window=4, n_heads=2, dtype="float32", param_dtype="float32")
  cache = dg.init_cache(cfg, 1, 16)._replace(valid=jnp.arange(16)[None] < 10,
                                              length=jnp.int32(10))
  sliding = dg.decode_visibility(cfg, cfg.layers[0], cache, 3)[0, 0]
  full = dg.decode_visibility(cfg, cfg.layers[1], cache, 3)[0, 0]
  assert np.flatnonzero(sliding).tolist() == [7, 8, 9, 16, 17, 18]
  assert np.flatnonzero(full).tolist() == list(range(10)) + [16, 17, 18]
  commit = dg.commit_visibility(cfg, cfg.layers[0], cache, 2)[0]   # tokens at 8 and 9
  assert np.flatnonzero(commit[1]).tolist() == [6, 7, 8, 9]


@pytest.mark.numerics
def test_entropy_bound_accepts_the_lowest_entropy_prefix():
  rng = np.random.default_rng(0)
  h = rng.exponential(0.05, (4, 12)).astype(np.float32)
  got = np.asarray(sampler.entropy_bound_accept(jnp.asarray(h), 0.1))
  for row, acc in zip(h, got):
    order = np.argsort(row, kind="stable")
    keep = np.cumsum(row[order]) - row[order] <= 0.1
    want = np.zeros_like(acc)
    want[order[keep]] = True
    assert (acc == want).all() and acc.any()


def test_finalize_pads_after_eos_and_finished_rows():
  cfg = sampler.SamplerConfig(eos_ids=(2,), pad_id=0)
  argmax = jnp.asarray([[5, 2, 7, 2], [5, 6, 7, 8], [2, 3, 3, 3]])
  tokens, finished = sampler.finalize_canvas(argmax, jnp.asarray([False, False, True]), cfg)
  assert np.asarray(tokens).tolist() == [[5, 2, 0, 0], [5, 6, 7, 8], [0, 0, 0, 0]]
  assert np.asarray(finished).tolist() == [True, False, True]


# ----------------------------------------------------------------------------- parity


def _prompts(rng, b, p):
  return rng.integers(7, 99, (b, p)).astype(np.int64)   # no pad/eos/image tokens


@pytest.mark.numerics
@pytest.mark.parametrize("window", [512, SMALL_WINDOW])
def test_logits_match_transformers(hf_dirs, torch_mod, window):
  """Commit-forward (encoder prefill) logits, and one decoder step without and with
  self-conditioning, with a left-padded row."""
  torch = torch_mod
  tm = _load_hf(hf_dirs[window])
  model, _ = dg_hf.load_dir(hf_dirs[window])
  rng = np.random.default_rng(window)
  b, p = 3, 9
  prompt, canvas = _prompts(rng, b, p), rng.integers(7, 99, (b, CANVAS))
  valid = np.ones((b, p), bool)
  valid[0, :2] = False
  sc_logits = (3.0 * rng.standard_normal((b, CANVAS, 99))).astype(np.float32)
  mask = torch.tensor(valid)
  dec_mask = torch.cat([mask, torch.ones(b, CANVAS, dtype=torch.bool)], dim=1)
  with torch.no_grad():
    plain = tm(input_ids=torch.tensor(prompt), attention_mask=mask,
               decoder_input_ids=torch.tensor(canvas), decoder_attention_mask=dec_mask)
    conditioned = tm(input_ids=torch.tensor(prompt), attention_mask=mask,
                     decoder_input_ids=torch.tensor(canvas), decoder_attention_mask=dec_mask,
                     self_conditioning_logits=torch.tensor(sc_logits))
    enc = tm.lm_head(plain.encoder_last_hidden_state).float()
    enc = (torch.tanh(enc / 30.0) * 30.0).numpy()
  committed = model.commit_forward(jnp.asarray(prompt), dg.init_cache(model.cfg, b, p),
                                   jnp.asarray(valid))
  ours_enc = np.asarray(model.head(committed.hidden))
  assert _max_rel(ours_enc[valid], enc[valid]) < LOGIT_RTOL
  ours_plain = model.decode_forward(jnp.asarray(canvas), committed.cache).logits
  assert _max_rel(ours_plain, plain.logits.numpy()) < LOGIT_RTOL
  z = model.soft_embedding(jnp.asarray(sc_logits))
  ours_sc = model.decode_forward(jnp.asarray(canvas), committed.cache, z).logits
  assert _max_rel(ours_sc, conditioned.logits.numpy()) < LOGIT_RTOL
  # the conditioning matters far beyond the tolerance (the test can tell them apart)
  assert _max_rel(ours_plain, conditioned.logits.numpy()) > 100 * LOGIT_RTOL


class _HFRecorder:
  """Patches a transformers DiffusionGemma so that `generate` reads `noise` and records the
  canvas fed to every decoder forward and every accepted set."""

  def __init__(self, tm, noise: sampler.SamplerNoise):
    import torch
    self.torch, self.tm, self.noise = torch, tm, jax.tree.map(np.asarray, noise)
    self.canvas_idx, self.step, self.in_canvas = -1, -1, False
    self.fed, self.accepted = [], []

  def encoder_forward(self, orig):
    def run(*args, **kwargs):
      self.canvas_idx, self.step, self.in_canvas = self.canvas_idx + 1, -1, False
      return orig(*args, **kwargs)
    return run

  def decoder_forward(self, orig):
    def run(*args, **kwargs):
      self.step += 1
      self.in_canvas = True
      self.fed.append((self.canvas_idx, self.step, kwargs["decoder_input_ids"].numpy().copy()))
      return orig(*args, **kwargs)
    return run

  def multinomial(self, probs, num_samples):
    u = self.torch.tensor(self.noise.uniform[self.canvas_idx, self.step]).reshape(-1, 1)
    cdf = self.torch.cumsum(probs, dim=-1)
    idx = (cdf <= u * cdf[:, -1:]).sum(dim=-1).clamp(max=probs.shape[-1] - 1)
    return idx[:, None]

  def initialize_canvas(self, sampler_self, batch_size, device):
    source = self.noise.renoise[self.canvas_idx, self.step] if self.in_canvas else \
        self.noise.initial[self.canvas_idx]
    return self.torch.tensor(source, dtype=self.torch.long)

  def accept_canvas(self, orig):
    def run(sampler_self, *args, **kwargs):
      out = orig(sampler_self, *args, **kwargs)
      self.accepted.append(sampler_self.accepted_token_mask.numpy().copy())
      return out
    return run


def _hf_generate(tm, prompt, noise, cfg: sampler.SamplerConfig):
  from transformers.models.diffusion_gemma import generation_diffusion_gemma as gen
  rec = _HFRecorder(tm, noise)
  tm.forward = rec.decoder_forward(tm.forward)
  tm.model.encoder.forward = rec.encoder_forward(tm.model.encoder.forward)
  eb = gen.EntropyBoundSampler
  fresh_canvas = lambda s, batch_size, device: rec.initialize_canvas(s, batch_size, device)
  with mock.patch("torch.multinomial", rec.multinomial), \
      mock.patch.object(eb, "initialize_canvas", fresh_canvas), \
      mock.patch.object(eb, "accept_canvas", rec.accept_canvas(eb.accept_canvas)):
    out = tm.generate(input_ids=rec.torch.tensor(prompt),
                      decoder_input_ids=rec.torch.tensor(np.asarray(noise.initial[0])),
                      max_new_tokens=cfg.n_canvases * CANVAS, max_denoising_steps=cfg.max_steps,
                      t_min=cfg.t_min, t_max=cfg.t_max,
                      stability_threshold=cfg.stability_threshold,
                      confidence_threshold=cfg.confidence_threshold,
                      eos_token_id=list(cfg.eos_ids), pad_token_id=cfg.pad_id)
  return out, rec


def _run_both(hf_dir, cfg: sampler.SamplerConfig, seed: int, b: int = 3, p: int = 7):
  """transformers' `generate` and our sampler on the same prompts and injected noise ->
  (theirs, its recorder, ours, our trace as numpy, prompt length)."""
  tm = _load_hf(hf_dir)
  model, _ = dg_hf.load_dir(hf_dir)
  rng = np.random.default_rng(seed)
  prompt = _prompts(rng, b, p)
  shape = (cfg.n_canvases, cfg.max_steps, b, CANVAS)
  noise = sampler.SamplerNoise(
      initial=jnp.asarray(rng.integers(0, 99, (cfg.n_canvases, b, CANVAS)), jnp.int32),
      uniform=jnp.asarray(rng.random(shape), jnp.float32),
      renoise=jnp.asarray(rng.integers(0, 99, shape), jnp.int32))
  out, rec = _hf_generate(tm, prompt, noise, cfg)
  graphdef, state = nnx.split(model)
  ours = sampler.make_generator(graphdef, cfg)(state, jnp.asarray(prompt, jnp.int32),
                                               jax.random.key(0), noise=noise)
  return out, rec, ours, jax.tree.map(np.asarray, ours.trace), p


def _assert_same_run(out, rec, ours, trace, p, cfg):
  """Same canvas fed to every decoder forward, same accepted sets, same tokens, same TPF."""
  steps_run = trace.active.any(axis=-1)                                # [N, S]
  assert len(rec.fed) == int(steps_run[:len({c for c, _, _ in rec.fed})].sum())
  for (c, s, fed), accepted in zip(rec.fed, rec.accepted):
    assert steps_run[c, s]
    np.testing.assert_array_equal(trace.canvas[c, s], fed, err_msg=f"canvas {c} step {s}")
    np.testing.assert_array_equal(trace.accepted[c, s], accepted, err_msg=f"canvas {c} step {s}")
  hf_tokens = out.sequences.numpy()[:, p:]
  np.testing.assert_array_equal(np.asarray(ours.tokens)[:, :hf_tokens.shape[1]], hf_tokens)
  n_valid = (hf_tokens != cfg.pad_id).sum(-1)
  np.testing.assert_allclose(n_valid / np.asarray(ours.decoder_forwards),
                             out.tokens_per_forward.numpy(), rtol=1e-6)
  return hf_tokens


@pytest.mark.numerics
@pytest.mark.parametrize("window,stability,confidence", [(512, 1, 0.005),
                                                         (SMALL_WINDOW, 0, 1.5)])
def test_sampler_trace_matches_transformers(hf_dirs, window, stability, confidence):
  """Same noise -> same canvas at every step, same accepted sets, same outputs and forward
  counts. The second case stops on confidence alone (the random model's argmax canvas never
  settles within 8 steps), and its rows stop early, at different steps."""
  pytest.importorskip("transformers")
  cfg = sampler.SamplerConfig(n_canvases=2, max_steps=8, stability_threshold=stability,
                              confidence_threshold=confidence, eos_ids=(2,), pad_id=0)
  out, rec, ours, trace, p = _run_both(hf_dirs[window], cfg, seed=3)
  _assert_same_run(out, rec, ours, trace, p, cfg)
  if stability == 0:   # the early stop really happened, and not for every row at once
    first = trace.active[0].sum(axis=0)
    assert first.min() < cfg.max_steps and len(set(first.tolist())) > 1


# (EOS ids, noise seed) -> the canvas holding each row's first EOS (3 canvases of 16; ids
# 7.. are frequent argmaxes of the random model, so rows end early, where and when the
# injected noise makes them)
EARLY_ENDS = {"all rows in canvas 0": (tuple(range(7, 17)), 3, [0, 0, 0]),
              "rows in canvases 0 and 1": (tuple(range(7, 14)), 5, [0, 1, 0])}


@pytest.mark.numerics
@pytest.mark.parametrize("case", sorted(EARLY_ENDS))
def test_no_canvas_is_generated_after_every_row_finished(hf_dirs, case):
  """transformers stops generating canvases once every row has an EOS; so do we: the same
  tokens and forwards, no decoder or commit forward after the last row finished (the rest of
  the output is padding), and TPF's tokens counted as transformers counts them."""
  pytest.importorskip("transformers")
  from orl_jax.models.diffusion_gemma import trajectories as dg_trajectories
  eos, seed, ends = EARLY_ENDS[case]
  cfg = sampler.SamplerConfig(n_canvases=3, max_steps=4, eos_ids=eos, pad_id=0)
  out, rec, ours, trace, p = _run_both(hf_dirs[512], cfg, seed=seed)
  hf_tokens = _assert_same_run(out, rec, ours, trace, p, cfg)
  is_eos = np.isin(hf_tokens, eos)
  assert (np.argmax(is_eos, axis=1) // CANVAS).tolist() == ends and is_eos.any(axis=1).all()
  generated = max(ends) + 1                              # canvases transformers generated
  assert hf_tokens.shape[1] == generated * CANVAS < cfg.n_canvases * CANVAS
  assert int(ours.canvases_run) == generated
  assert not trace.active[generated:].any()              # no decoder forward after that
  # encoder forwards (the prefill and one commit per further canvas) = our commit forwards
  assert rec.canvas_idx + 1 == generated
  np.testing.assert_array_equal(np.asarray(ours.commit_forwards), generated)
  assert (np.asarray(ours.tokens)[:, generated * CANVAS:] == cfg.pad_id).all()
  counts = dg_trajectories.forward_counts(ours, cfg)
  np.testing.assert_array_equal(np.asarray(counts.n_generated),
                                (hf_tokens != cfg.pad_id).sum(-1))
  np.testing.assert_array_equal(np.asarray(counts.nfe_denoise),
                                np.asarray(ours.decoder_forwards))
  # the paper's count adds one commit forward per canvas a row decoded (through its EOS)
  np.testing.assert_array_equal(np.asarray(counts.nfe),
                                np.asarray(ours.decoder_forwards) + np.asarray(ends) + 1)


@pytest.mark.numerics
def test_sampler_runs_on_its_own_noise_in_jit(hf_dirs):
  model, _ = dg_hf.load_dir(hf_dirs[SMALL_WINDOW])
  cfg = sampler.SamplerConfig(n_canvases=2, max_steps=4, eos_ids=(2,))
  graphdef, state = nnx.split(model)
  run = sampler.make_generator(graphdef, cfg)
  prompt = jnp.asarray(_prompts(np.random.default_rng(5), 2, 6), jnp.int32)
  a, b = run(state, prompt, jax.random.key(1)), run(state, prompt, jax.random.key(1))
  c = run(state, prompt, jax.random.key(2))
  np.testing.assert_array_equal(a.tokens, b.tokens)
  assert not np.array_equal(a.trace.canvas, c.trace.canvas)
  assert a.trace.z.shape == (2, 4, 2, CANVAS, model.cfg.d_model)
  assert not np.asarray(a.trace.z[:, 0]).any() and np.asarray(a.trace.z[:, 1]).any()
  assert (np.asarray(a.commit_forwards) == 2).all()     # prefill + the first canvas


# ----------------------------------------------------------------------------- export


def test_export_loads_in_transformers_with_the_same_logits(hf_dirs, torch_mod, tmp_path):
  torch = torch_mod
  model, passthrough = dg_hf.load_dir(hf_dirs[SMALL_WINDOW])
  out = dg_hf.export_dir(str(tmp_path / "export"), model, passthrough)
  again, _ = dg_hf.load_dir(out)
  flat, flat_again = dg_hf.flat_params(model), dg_hf.flat_params(again)
  assert flat.keys() == flat_again.keys()
  assert all(np.array_equal(flat[k], flat_again[k]) for k in flat)
  original, exported = _load_hf(hf_dirs[SMALL_WINDOW]), _load_hf(out)
  rng = np.random.default_rng(7)
  prompt, canvas = torch.tensor(_prompts(rng, 2, 9)), torch.tensor(rng.integers(7, 99, (2, CANVAS)))
  with torch.no_grad():
    want = original(input_ids=prompt, decoder_input_ids=canvas).logits.numpy()
    got = exported(input_ids=prompt, decoder_input_ids=canvas).logits.numpy()
  np.testing.assert_array_equal(got, want)


def test_registry_loader_and_exporter_round_trip_through_transformers(hf_dirs, torch_mod,
                                                                     tmp_path):
  """What a run does with `model.path`: the family registry's sharded loader reads the
  directory (vision tower carried through), the exporter writes WORKDIR/hf, and transformers
  loads it with every tensor of its state dict bit-identical to the source model's (the fused
  stacked `gate_up_proj` rebuilt from our two expert parameters)."""
  from orl_jax.models import hf_read, hf_write
  torch = torch_mod
  src = hf_dirs[SMALL_WINDOW]
  cfg = dg_hf.read_config(src)
  assert hf_read.family_of(src) == "diffusion_gemma"
  _, params = hf_read.load_model_params(src, "diffusion_gemma", cfg)
  reference, _ = dg_hf.load_dir(src)
  want_flat = dg_hf.flat_params(reference)
  got_flat = {path_name(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)}
  assert got_flat.keys() == want_flat.keys()
  assert all(np.array_equal(got_flat[k], want_flat[k]) for k in want_flat)
  through = hf_read.read_passthrough(src, "diffusion_gemma")
  assert through and all(k.startswith("model.encoder.vision_tower.") or
                         k.startswith("model.encoder.embed_vision.") for k in through)
  out = hf_write.export_hf(str(tmp_path / "hf"), params, cfg, "diffusion_gemma",
                           passthrough=through)
  original, exported = _load_hf(src), _load_hf(out)
  want, got = original.state_dict(), exported.state_dict()
  assert want.keys() == got.keys()
  for k in want:
    assert torch.equal(want[k], got[k]), k


def test_missing_tensor_is_named(hf_dirs, tmp_path):
  from safetensors.numpy import load_file, save_file
  broken = tmp_path / "broken"
  shutil.copytree(hf_dirs[512], broken)
  tensors = load_file(str(broken / "model.safetensors"))
  del tensors["model.decoder.layers.1.router.per_expert_scale"]
  save_file(tensors, str(broken / "model.safetensors"))
  with pytest.raises(dg_hf.CheckpointError, match="layers.1.router.per_expert_scale"):
    dg_hf.load_dir(str(broken))


@pytest.mark.numerics
def test_ragged_experts_equal_dense_experts():
  """The dropless grouped (`ragged_dot`) expert compute with the GELU gate equals the dense
  oracle, through a whole commit forward and decoder step."""
  dense = dg.DiffusionGemma(release_26b_a4b(**SMALL_MOE), rngs=nnx.Rngs(0))
  ragged = dg.DiffusionGemma(release_26b_a4b(**SMALL_MOE, moe_impl="ragged"), rngs=nnx.Rngs(0))
  prompt = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 5)), jnp.int32)
  canvas = prompt[:, :3].repeat(2, axis=1)
  outs = []
  for model in (dense, ragged):
    cache = model.commit_forward(prompt, dg.init_cache(model.cfg, 2, 5)).cache
    outs.append(model.decode_forward(canvas, cache).logits)
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)


_EXPERT_AXIS_SCRIPT = textwrap.dedent("""
  import jax
  jax.config.update("jax_num_cpu_devices", 4)
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from orl_jax import sharding
  from orl_jax.models.diffusion_gemma import family, model as dg
  from orl_jax.models.diffusion_gemma.config import release_26b_a4b
  from tests.support.diffusion_gemma import SMALL_MOE

  cfg = release_26b_a4b(**SMALL_MOE, moe_impl="ragged")
  class Block(nnx.Module):       # the parameter paths of a layer's `moe.*`
    def __init__(self):
      self.moe = dg.MoE(cfg, nnx.Rngs(0))

  graphdef, params = nnx.split(Block())
  keys = jax.random.split(jax.random.key(1), 2)
  route_in, expert_in = (jax.random.normal(k, (2, 5, 16), jnp.float32) for k in keys)

  def loss(params, route_in, expert_in):
    y, ids = nnx.merge(graphdef, params).moe(route_in, expert_in)
    return jnp.sum(jnp.sin(y)), ids

  grad = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)
  want, want_ids = grad(params, route_in, expert_in)
  for sizes in (dict(expert=4), dict(data=2, expert=2)):
    mesh = sharding.make_mesh(**sizes)
    with jax.set_mesh(mesh):
      placed = jax.device_put(params, sharding.tree_shardings(params, mesh,
                                                              family.PARTITION_RULES))
      assert placed["moe"]["gate_proj"].sharding.spec[0] == "expert"
      text = jax.jit(grad).lower(placed, route_in, expert_in).as_text()
      got, ids = jax.jit(grad)(placed, route_in, expert_in)
    assert "all_to_all" in text, "the experts' tokens are not exchanged"
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      scale = float(jnp.max(jnp.abs(w))) + 1e-30
      assert float(jnp.max(jnp.abs(g - w))) <= 1e-5 * scale, sizes
  print("DG_EXPERT_AXIS_OK")
""")


@pytest.mark.numerics
def test_experts_split_over_the_expert_axis_equal_one_device():
  """With a mesh `expert` axis, DiffusionGemma's experts run where their weights are (tokens
  exchanged inside shard_map, 10 tokens padded to split over 4 devices): values, captured
  expert ids and gradients equal one device's."""
  from tests.support.helpers import run_on_4_cpu_devices
  run_on_4_cpu_devices(_EXPERT_AXIS_SCRIPT, "DG_EXPERT_AXIS_OK")
