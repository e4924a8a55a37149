"""Peak memory of the ORL and SFT losses (value and gradient) over a 126k vocabulary, with and
without chunking the head statistics over tokens (`loss.vocab_chunk`).

Nothing is executed: each step is lowered from abstract inputs and compiled, and XLA's
`memory_analysis()` reports its temporary (activation) and argument bytes. Values are equal
either way (tests/replay/test_chunked_losses.py); only the peak changes.

  python benchmarks/vocab_memory.py [--tokens 4096] [--vocab 126464] [--chunk 512]
"""
import argparse
import os

import _common  # noqa: F401
import jax
import jax.numpy as jnp
from flax import nnx

from orl_jax.config.sections import Loss
from orl_jax.losses import LossConfig, orl_loss
from orl_jax.models import ModelConfig, Transformer
from orl_jax.data.pipeline import SftExample
from orl_jax.packed_batch import ReplayBatch
from orl_jax.residual import Residual
from orl_jax.losses import sft_loss
from pallas_kernels.staircase_attention import TokenMeta

OUT = os.path.join(_common.ROOT, "benchmarks", "results", "vocab_memory.json")


def compiled_memory(fn, *args) -> dict:
  m = jax.jit(fn).lower(*args).compile().memory_analysis()
  return {"temp_bytes": int(m.temp_size_in_bytes), "argument_bytes": int(m.argument_size_in_bytes),
          "output_bytes": int(m.output_size_in_bytes),
          "peak_bytes": int(m.temp_size_in_bytes + m.argument_size_in_bytes
                            + m.output_size_in_bytes)}


def abstract_replay_batch(rows, row_len, d_model, k=16) -> ReplayBatch:
  i32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.int32)
  f32 = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
  rt = (rows, row_len)
  s = 64
  return ReplayBatch(
      tokens=i32(*rt), positions=i32(*rt), meta=TokenMeta(*(i32(*rt),) * 5),
      residual=Residual(f32(*rt, d_model), f32(*rt)), targets=i32(*rt),
      masked=jax.ShapeDtypeStruct(rt, jnp.bool_), rollout_entropy=f32(*rt),
      topk_ids=i32(*rt, k), topk_logprobs=f32(*rt, k), state_slot=i32(*rt), resp_slot=i32(*rt),
      pair_a=i32(s), pair_b=i32(s), pair_resp=i32(s),
      pair_valid=jax.ShapeDtypeStruct((s,), jnp.bool_), state_resp=i32(s), n_responses=i32(),
      rollout_step=i32())


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--tokens", type=int, default=4096, help="tokens per step (rows x row_len)")
  parser.add_argument("--vocab", type=int, default=126464, help="LLaDA-8B's vocabulary")
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--chunk", type=int, default=512)
  parser.add_argument("--out", default=OUT)
  args = parser.parse_args()
  cfg = ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=1, n_heads=4,
                    n_kv_heads=4, head_dim=args.d_model // 4, mlp_dim=2 * args.d_model,
                    mask_id=args.vocab - 1, qk_norm=False, residual_mode="adapter",
                    attention_impl="xla")
  graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))),
                               nnx.Param)
  rows, row_len = 4, args.tokens // 4
  batch = abstract_replay_batch(rows, row_len, args.d_model)
  # SFT rows are [prompt | clean blocks | noised response]: choose parts that sum to row_len.
  p = row_len // 4
  n = (row_len - p + 32) // 2 // 32 * 32
  sft_in = SftExample(prompt_tokens=jax.ShapeDtypeStruct((rows, p), jnp.int32),
                      prompt_valid=jax.ShapeDtypeStruct((rows, p), jnp.bool_),
                      response=jax.ShapeDtypeStruct((rows, n), jnp.int32))
  report = {"vocab": args.vocab, "tokens": args.tokens, "d_model": args.d_model,
            "chunk": args.chunk, "device": str(jax.devices()[0]), "jax": jax.__version__,
            "logits_f32_bytes": args.tokens * args.vocab * 4, "losses": {}}
  for loss_name in ("orl", "sft"):
    for chunk in (0, args.chunk):
      if loss_name == "orl":
        lcfg = LossConfig.from_section(Loss(gate_entropy=0.0, vocab_chunk=chunk))
        fn = lambda prm, b, lcfg=lcfg: jax.value_and_grad(
            lambda q: orl_loss(nnx.merge(graphdef, q), b, lcfg), has_aux=True)(prm)
        mem = compiled_memory(fn, params, batch)
      else:
        fn = lambda prm, b, chunk=chunk: jax.value_and_grad(
            lambda q: sft_loss(nnx.merge(graphdef, q), b, jax.random.key(0), block_size=32,
                               mask_id=cfg.mask_id, vocab_chunk=chunk), has_aux=True)(prm)
        mem = compiled_memory(fn, params, sft_in)
      report["losses"].setdefault(loss_name, {})[f"chunk_{chunk}"] = mem
      print(f"{loss_name} loss+grad, vocab_chunk={chunk:>5}: temp {mem['temp_bytes'] / 2**30:7.3f} "
            f"GiB, peak {mem['peak_bytes'] / 2**30:7.3f} GiB")
  orl = report["losses"]["orl"]
  ratio = orl["chunk_0"]["peak_bytes"] / orl[f"chunk_{args.chunk}"]["peak_bytes"]
  report["orl_peak_reduction"] = ratio
  _common.write_json(args.out, report)
  print(f"wrote {args.out}")
  print(f"orl_peak_memory_reduction: {ratio:.2f}")


if __name__ == "__main__":
  main()
