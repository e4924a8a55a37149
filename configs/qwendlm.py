"""QwenDLM: a block-diffusion conversion of Qwen3-4B
(docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm): block-causal, tied embeddings, mask <|MASK|>
(151669, our choice, as SDAR), block size 32 (our choice).

Launch lines:
  python launch/train.py --config=configs/qwendlm.py --config.model.path=/path/QwenDLM-4B \
      --config.task.path=my_train.jsonl
  python launch/train.py --config=configs/qwendlm.py:debug    # tiny random model, 2 ORL steps
  python launch/decode.py --config=configs/qwendlm.py --config.model.path=/path/QwenDLM-4B \
      --prompt="What is 7 * 8?"

With `model.path` a Hugging Face directory, its config.json decides every shape.

Variants: "4b" (default), "debug".
"""
from configs import dlm_common, tiny


VARIANTS = ("4b", "debug")


def get_config(arg: str | None = None):
  arg = arg or "4b"
  if arg not in VARIANTS:
    raise tiny.unknown_variant("configs/qwendlm.py", VARIANTS, arg)
  c = dlm_common.real_base("qwen3")
  dlm_common.set_shapes(c, d_model=2560, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
                        mlp_dim=9728, vocab_size=151936, rope_theta=1e6, norm_eps=1e-6,
                        qk_norm=True, tie_embeddings=True)
  c.task.chat = "qwen3"
  c.task.prompt_len = 512
  c.decode.block_size = 32
  c.decode.gen_length = 256
  c.orl.prompts_per_step, c.orl.group_size = 8, 16
  c.orl.rollout_rule, c.orl.rollout_rule_value = "entropy_budget", 0.5
  c.replay.row_len, c.replay.n_rows = 4096, 16
  c.replay.max_states, c.replay.max_responses = 512, 128
  c.workdir = "work_dirs/qwendlm"
  if arg == "debug":
    dlm_common.debug_overrides(c, block_size=8, workdir="work_dirs/qwendlm_debug")
  return c
