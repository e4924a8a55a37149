"""LLaDA-8B (Base / Instruct): fully bidirectional masked-diffusion LM (DESIGN §4).

Launch lines:
  python launch/train.py --config=configs/llada.py --config.model.hf_dir=/path/LLaDA-8B-Instruct \
      --config.task.path=my_train.jsonl
  python launch/train.py --config=configs/llada.py:8b-instruct --config.dry_run=True \
      --config.mesh.fsdp=8                                     # sizing table, allocates nothing
  python launch/eval.py  --config=configs/llada.py:8b-instruct --config.task.name=gsm8k \
      --config.eval.compare=/path/LLaDA-8B-Instruct:base,work_dirs/llada/hf:orl
  python launch/train.py --config=configs/llada.py:debug       # tiny random LLaDA, 2 ORL steps (CPU)

Variants (`get_config(arg)`):
  "8b-instruct" (default): LLaDA-8B-Instruct, chat template 'llada', EOS = <|eot_id|> (126348),
                the end of the assistant turn.
  "8b-base"   : LLaDA-8B-Base, no chat template, EOS = <|endoftext|> (126081).
  "debug"     : a tiny random bidirectional model of this family on the tiny task.
"""
from configs import dlm_common


def get_config(arg: str | None = None):
  arg = arg or "8b-instruct"
  c = dlm_common.real_base(family="bidirectional", hf_family="llada")
  dlm_common.set_shapes(c, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, head_dim=128,
                        mlp_dim=12288, vocab_size=126464, rope_theta=500000.0, norm_eps=1e-5,
                        qk_norm=False, tie_embeddings=False)
  # Special ids of LLaDA's tokenizer (DESIGN §4), written as ids so no spelling can go wrong.
  c.model.special_tokens.update(dict(mask="126336", eos="126348", pad="126081", bos="126080"))
  c.task.chat = "llada"
  c.task.prompt_len = 512
  c.decode.block_size = 32
  c.decode.gen_length = 256
  c.decode.rule, c.decode.rule_value = "threshold", 0.9
  c.orl.prompts_per_step, c.orl.group_size = 8, 8
  c.orl.rollout_rule, c.orl.rollout_rule_value = "entropy_budget", 0.5
  c.replay.row_len, c.replay.n_rows = 4096, 16
  c.replay.max_states, c.replay.max_responses = 256, 64
  c.workdir = "work_dirs/llada"
  if arg == "8b-instruct":
    pass
  elif arg == "8b-base":
    c.model.special_tokens.eos = "126081"
    c.task.chat = "none"
    c.workdir = "work_dirs/llada_base"
  elif arg == "debug":
    dlm_common.debug_overrides(c, block_size=8, workdir="work_dirs/llada_debug")
    c.model.special_tokens.update(dict(mask="", eos="", pad="", bos=""))
  else:
    raise ValueError(f"configs/llada.py has variants 8b-instruct, 8b-base, debug; got {arg!r}")
  return c
