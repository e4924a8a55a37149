"""Real DLM families from local HF checkpoints (docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm):
loaders, export, parity.

Qwen3 parity runs transformers (torch CPU) as the independent reference; LLaDA parity runs a
numpy forward written from the published architecture that never calls our JAX code. Install
the test-only references with: pip install torch==2.13.0 transformers==5.24.0

Rerun under other CPU numerics (`numerics`): the residual modes, whose fresh adapter must give
exactly the base model's logits (two programs); the parities are dense and compare within
tolerances, the rest are loaders' bits and errors.
"""
import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from orl_jax.data.hf_tokenizer import TokenizerError, byte_level_tokenizer, check_model_vocab
from orl_jax.models import ModelConfig
from orl_jax.models import hf_read, hf_write
from orl_jax.residual import Residual
from pallas_kernels.staircase_attention import KIND_PROMPT, make_meta
from tests.support.helpers import tiny_qwen3
from tests.support.hf import llada_cfg, write_llada_dir


T = 12


def _meta_causal(b_rows, t):
  """Causal attention as staircase metadata: one token per block (block = position)."""
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b_rows, t))
  return pos, make_meta(jnp.full((b_rows, t), KIND_PROMPT), pos)


def _meta_block_causal(b_rows, t, b):
  pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b_rows, t))
  return pos, make_meta(jnp.full((b_rows, t), KIND_PROMPT), pos // b)


def _qwen3_cfg(tied: bool, **kw) -> ModelConfig:
  cfg = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                    mlp_dim=128, mask_id=95, rope_theta=1e6, norm_eps=1e-6, qk_norm=True,
                    tie_embeddings=tied)
  return dataclasses.replace(cfg, **kw)


@pytest.fixture(scope="module")
def qwen3_dirs(tmp_path_factory):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  out = {}
  for tied in (False, True):
    torch.manual_seed(int(tied))
    model = tiny_qwen3(transformers, tied)
    with torch.no_grad():  # norms away from 1 so a mixed-up norm cannot pass
      for name, p in model.named_parameters():
        if "norm" in name:
          p.add_(0.2 * torch.randn_like(p))
    path = str(tmp_path_factory.mktemp(f"qwen3_tied{int(tied)}"))
    model.save_pretrained(path)
    ids = torch.randint(0, 96, (2, T), generator=torch.Generator().manual_seed(5))
    pos = torch.arange(T)
    block_mask = torch.where((pos // 4)[None, :] <= (pos // 4)[:, None], 0.0, float("-inf"))
    with torch.no_grad():
      causal = model(ids).logits.numpy()
      block = model(ids, attention_mask=block_mask[None, None].expand(2, 1, T, T)).logits.numpy()
    out[tied] = (path, ids.numpy(), causal, block)
  return out


def _load(path, family, cfg):
  graphdef, params = hf_read.load_model_params(path, family, cfg)
  return nnx.merge(graphdef, params)


@pytest.mark.parametrize("tied", [False, True])
def test_qwen3_parity_causal_and_block_causal(qwen3_dirs, tied):
  path, ids, causal_ref, block_ref = qwen3_dirs[tied]
  model = _load(path, "qwen3", _qwen3_cfg(tied))
  pos, meta = _meta_causal(2, T)
  causal = np.asarray(model(jnp.asarray(ids), pos, meta).logits)
  pos, meta = _meta_block_causal(2, T, 4)
  block = np.asarray(model(jnp.asarray(ids), pos, meta).logits)
  d_causal, d_block = np.abs(causal - causal_ref).max(), np.abs(block - block_ref).max()
  print(f"qwen3 tied={tied} parity max|d| causal={d_causal:.2e} block_causal={d_block:.2e}")
  assert d_causal <= 1e-4 and d_block <= 1e-4
  assert np.abs(block_ref - causal_ref).max() > 1e-2   # the two masks really differ


def test_qwen3_config_json_is_read(qwen3_dirs):
  path = qwen3_dirs[False][0]
  arch = hf_read.architecture_from_hf(hf_read.read_hf_config(path), "qwen3")
  assert arch["rope_theta"] == 1e6 and arch["n_kv_heads"] == 2 and arch["head_dim"] == 16
  with pytest.raises(hf_read.CheckpointError, match="model.n_layers=3"):
    hf_read.check_architecture(_qwen3_cfg(False, n_layers=3), path, "qwen3")


# ----------------------------------------------------------------------------- LLaDA


def _numpy_llada_forward(t, ids, cfg):
  """LLaDA-8B in float64 numpy: RMSNorm (eps 1e-5), half-split RoPE (theta 5e5),
  full bidirectional attention, SwiGLU with ff_proj = gate (SiLU) and up_proj linear, untied
  head `model.transformer.ff_out`."""
  f64 = lambda name: t[name].astype(np.float64)
  rms = lambda x, wt: x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.norm_eps) * wt
  silu = lambda x: x / (1 + np.exp(-x))
  nh, dh = cfg.n_heads, cfg.head_dim
  b_rows, n = ids.shape
  x = f64("model.transformer.wte.weight")[ids]
  inv = 1.0 / (cfg.rope_theta ** (np.arange(0, dh // 2) * 2.0 / dh))
  ang = np.arange(n)[:, None] * inv[None]                           # [T, dh/2]
  cos, sin = np.cos(ang)[None, :, None], np.sin(ang)[None, :, None]

  def rope(u):                                                      # [B, T, H, dh]
    u1, u2 = u[..., :dh // 2], u[..., dh // 2:]
    return np.concatenate([u1 * cos - u2 * sin, u2 * cos + u1 * sin], -1)

  for i in range(cfg.n_layers):
    p = f"model.transformer.blocks.{i}."
    h = rms(x, f64(p + "attn_norm.weight"))
    q = rope((h @ f64(p + "q_proj.weight").T).reshape(b_rows, n, nh, dh))
    k = rope((h @ f64(p + "k_proj.weight").T).reshape(b_rows, n, nh, dh))
    v = (h @ f64(p + "v_proj.weight").T).reshape(b_rows, n, nh, dh)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
    s = np.exp(s - s.max(-1, keepdims=True))
    s = s / s.sum(-1, keepdims=True)
    a = np.einsum("bhqk,bkhd->bqhd", s, v).reshape(b_rows, n, nh * dh)
    x = x + a @ f64(p + "attn_out.weight").T
    h = rms(x, f64(p + "ff_norm.weight"))
    g = silu(h @ f64(p + "ff_proj.weight").T) * (h @ f64(p + "up_proj.weight").T)
    x = x + g @ f64(p + "ff_out.weight").T
  x = rms(x, f64("model.transformer.ln_f.weight"))
  return x @ f64("model.transformer.ff_out.weight").T


def test_llada_parity_with_numpy_reference(tmp_path):
  cfg = llada_cfg()
  tensors = write_llada_dir(str(tmp_path / "llada"), cfg)
  ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, T))
  ref = _numpy_llada_forward(tensors, ids, cfg)
  model = _load(str(tmp_path / "llada"), "llada", cfg)
  pos = jnp.broadcast_to(jnp.arange(T), (2, T))
  meta = make_meta(jnp.full((2, T), KIND_PROMPT), 0)        # the decoder's bidirectional canvas
  ours = np.asarray(model(jnp.asarray(ids), pos, meta).logits)
  delta = np.abs(ours - ref).max()
  print(f"llada parity max|d|={delta:.2e}")
  assert delta <= 1e-4


def test_llada_bf16_load_export_load_round_trip_is_exact(tmp_path):
  import ml_dtypes
  cfg = llada_cfg(param_dtype="bfloat16", dtype="bfloat16", residual_mode="adapter",
                  residual_hidden=16)
  write_llada_dir(str(tmp_path / "a"), cfg, dtype=ml_dtypes.bfloat16)
  graphdef, params = hf_read.load_model_params(str(tmp_path / "a"), "llada", cfg)
  # a live adapter so that its separate file is checked too
  flat = hf_read.flat_params(params)
  assert flat["embed.embedding"].dtype == jnp.bfloat16
  hf_write.export_hf(str(tmp_path / "b"), params, cfg, "llada", max_shard_bytes=20_000)
  assert os.path.isfile(tmp_path / "b" / hf_read.INDEX_FILE)
  assert os.path.isfile(tmp_path / "b" / hf_read.ADAPTER_FILE)
  _, again = hf_read.load_model_params(str(tmp_path / "b"), "llada", cfg)
  a, b = hf_read.flat_params(params), hf_read.flat_params(again)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
  # and the exported base weights are byte-identical to the originals
  from safetensors.numpy import load_file
  orig = load_file(str(tmp_path / "a" / "model.safetensors"))
  files = {f for f in os.listdir(tmp_path / "b") if f.startswith("model-")}
  exported = {}
  for f in files:
    exported.update(load_file(str(tmp_path / "b" / f)))
  assert orig.keys() == exported.keys()
  for k in orig:
    np.testing.assert_array_equal(orig[k], exported[k], err_msg=k)


def test_loader_lists_missing_unexpected_and_misshaped(tmp_path):
  cfg = llada_cfg()
  tensors = write_llada_dir(str(tmp_path / "x"), cfg)
  del tensors["model.transformer.blocks.1.up_proj.weight"]
  tensors["model.transformer.extra.weight"] = np.zeros((3,), np.float32)
  tensors["model.transformer.blocks.0.q_proj.weight"] = np.zeros((5, 48), np.float32)
  save_file(tensors, str(tmp_path / "x" / "model.safetensors"))
  with pytest.raises(hf_read.CheckpointError) as e:
    hf_read.load_model_params(str(tmp_path / "x"), "llada", cfg)
  msg = str(e.value)
  assert "missing tensors ['model.transformer.blocks.1.up_proj.weight']" in msg
  assert "unexpected tensors ['model.transformer.extra.weight']" in msg
  assert "model.transformer.blocks.0.q_proj.weight: file (5, 48)" in msg
  with pytest.raises(hf_read.CheckpointError, match="config.json not found"):
    hf_read.load_model_params(str(tmp_path / "nowhere"), "llada", cfg)


@pytest.mark.numerics
@pytest.mark.parametrize("family", ["llada", "qwen3"])
@pytest.mark.parametrize("mode", ["none", "rcd", "adapter"])
def test_residual_modes_on_loaded_models(tmp_path, qwen3_dirs, family, mode):
  if family == "llada":
    cfg = llada_cfg(residual_mode=mode, residual_hidden=16)
    path = str(tmp_path / "l")
    write_llada_dir(path, cfg)
  else:
    cfg = _qwen3_cfg(False, residual_mode=mode, residual_hidden=16)
    path = qwen3_dirs[False][0]
  model = _load(path, family, cfg)
  base = _load(path, family, dataclasses.replace(cfg, residual_mode="none"))
  ids = jnp.full((2, T), cfg.mask_id).at[:, :4].set(3)
  pos, meta = _meta_block_causal(2, T, 4)
  z = 0.5 * jax.random.normal(jax.random.key(0), (2, T, cfg.d_model))
  res = Residual(z, jnp.full((2, T), 0.5))
  out = model(ids, pos, meta, residual=res)
  ref = base(ids, pos, meta)
  assert np.all(np.isfinite(np.asarray(out.logits)))
  diff = np.abs(np.asarray(out.logits - ref.logits)).max()
  if mode in ("none", "adapter"):   # a freshly attached adapter starts out as the base model
    assert diff == 0.0
  else:
    assert diff > 1e-3 and float(out.residual_norm_ratio) > 0


def test_tokenizer_and_model_must_agree():
  tok = byte_level_tokenizer()
  check_model_vocab(tok, 260, tok.mask_id)
  with pytest.raises(TokenizerError, match="model's vocabulary"):
    check_model_vocab(tok, 200, tok.mask_id)
  with pytest.raises(TokenizerError, match="mask_id"):
    check_model_vocab(tok, 300, 7)


_SHARDED_LOAD = """
import jax
jax.config.update("jax_num_cpu_devices", 4)
import numpy as np
from orl_jax import sharding
from orl_jax.models import build, hf_read
from tests.support.hf import llada_cfg, write_llada_dir
cfg = llada_cfg()
tensors = write_llada_dir(PATH, cfg)
mesh = sharding.make_mesh(data=1, fsdp=2, tensor=2)
_, abstract = build.abstract_params(cfg)
sh = sharding.tree_shardings(abstract, mesh)
_, params = hf_read.load_model_params(PATH, "llada", cfg, shardings=sh)
flat = hf_read.flat_params(params)
q = flat["layers.0.attn.q_proj.kernel"]
assert q.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor"), q.sharding.spec
assert q.addressable_shards[0].data.shape == (24, 24)
np.testing.assert_array_equal(np.asarray(q), tensors["model.transformer.blocks.0.q_proj.weight"].T)
e = flat["embed.embedding"]
assert e.sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
np.testing.assert_array_equal(np.asarray(e), tensors["model.transformer.wte.weight"])
print("SHARDED_OK")
"""


def test_load_straight_into_fsdp_tensor_shardings(tmp_path):
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  code = _SHARDED_LOAD.replace("PATH", repr(str(tmp_path / "l")))
  out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root), timeout=300)
  assert out.returncode == 0 and "SHARDED_OK" in out.stdout, out.stderr[-3000:]
