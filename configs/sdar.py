"""SDAR-4B / SDAR-8B: Qwen3-based block-diffusion LMs
(docs/models.md#llada2x-mini-llada-8b-sdar-qwendlm): block-causal, block size 4, mask <|MASK|>
(151669), no logit shift, untied head.

Launch lines:
  python launch/train.py --config=configs/sdar.py:4b --config.model.path=/path/SDAR-4B-Chat \
      --config.task.path=my_train.jsonl
  python launch/train.py --config=configs/sdar.py:8b --config.dry_run=True
  python launch/eval.py  --config=configs/sdar.py:4b --config.task.name=gsm8k \
      --config.eval.compare=/path/SDAR-4B-Chat:base,work_dirs/sdar/hf:orl
  python launch/train.py --config=configs/sdar.py:debug       # tiny random SDAR, 2 ORL steps (CPU)
  python launch/decode.py --config=configs/sdar.py --config.model.path=/path/SDAR-4B-Chat \
      --prompt="What is 7 * 8?"

With `model.path` a Hugging Face directory (model_type sdar or qwen3), its config.json decides
every shape; the values below are for sizing and random-init runs.

Variants: "4b" (default), "8b", "debug".
"""
from configs import dlm_common, tiny


VARIANTS = ("4b", "8b", "debug")


def get_config(arg: str | None = None):
  arg = arg or "4b"
  if arg not in VARIANTS:
    raise tiny.unknown_variant("configs/sdar.py", VARIANTS, arg)
  hub_id = "" if arg == "debug" else f"JetLM/SDAR-{arg.upper()}-Chat"
  c = dlm_common.real_base("qwen3", hub_id=hub_id)
  if arg in ("4b", "debug"):
    dlm_common.set_shapes(c, d_model=2560, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
                          mlp_dim=9728, vocab_size=151936, rope_theta=1e6, norm_eps=1e-6,
                          qk_norm=True, tie_embeddings=False)
  elif arg == "8b":
    dlm_common.set_shapes(c, d_model=4096, n_layers=36, n_heads=32, n_kv_heads=8, head_dim=128,
                          mlp_dim=12288, vocab_size=151936, rope_theta=1e6, norm_eps=1e-6,
                          qk_norm=True, tie_embeddings=False)
  c.model.hf_model_type = "sdar"   # an export declares SDAR's own classes (auto_map)
  c.task.chat = "qwen3"
  c.task.prompt_len = 512
  c.decode.block_size = 4
  c.decode.gen_length = 256
  c.orl.prompts_per_step, c.orl.group_size = 8, 16
  c.orl.rollout_rule, c.orl.rollout_rule_value = "entropy_budget", 0.5
  c.replay.row_len, c.replay.n_rows = 4096, 16
  c.replay.max_states, c.replay.max_responses = 1024, 128
  c.workdir = f"work_dirs/sdar_{arg}"
  if arg == "debug":
    dlm_common.debug_overrides(c, block_size=4, workdir="work_dirs/sdar_debug")
  return c
