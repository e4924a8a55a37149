"""The run config's rules and conversions: `validate(run)` checks a `RunConfig` (the rules that
span fields and sections; `orl_jax.config.build.build` calls it), with one message per problem
naming the fields; `model_config`, `moe_config`, `decode_config` (with `family_rules`),
`replay_config`, `loss_config` and `optimizer_config` turn its sections into the frozen
dataclasses used in jit, each in one place (a family with its own sampler converts its own
settings in its folder: DiffusionGemma's `sampler_config`).
"""
from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any

from orl_jax.config.sections import ChunkBy, Mode, RunConfig, TrainMode
from orl_jax.data.tiny_task import TinyTaskConfig
from orl_jax.losses import KL_REFERENCES, LossConfig
from orl_jax.decode.config import CACHE_MODES, PLACEMENTS, SCHEDULES
from orl_jax.decode.from_run import family_rules
from orl_jax.errors import ConfigError, required
from orl_jax.models import families
from orl_jax.models.moe import MoEConfig, RUNTIME_FIELDS
from orl_jax.models.transformer import ModelConfig
from orl_jax.optimizer import OptimizerConfig
from orl_jax.replay.plan import LAYOUTS as REPLAY_LAYOUTS, ReplayConfig
from orl_jax.residual import MODES as RESIDUAL_MODES
from orl_jax.unmasking import COMMIT_COMPARES, RULES, UnmaskRule
from pallas_kernels.staircase_attention import IMPLS

TRAIN_MODES: tuple[str, ...] = typing.get_args(TrainMode)   # what `train()` runs
MODES: tuple[str, ...] = typing.get_args(Mode)               # and "eval"
ATTENTION_LAYOUTS = families.ATTENTION_LAYOUTS
CHUNK_BY: tuple[str, ...] = typing.get_args(ChunkBy)


# decode.* fields a config may leave unset (None) for its family's generation defaults to fill
# (`orl_jax.config.build.build`); every block decoder reads them
FILLED_BY_FAMILY = ("gen_length", "rule_value", "max_steps_per_block")


def validate(config: RunConfig) -> None:
  """Raises ConfigError listing every inconsistency found."""
  errors: list[str] = [f"{name}={value} must be a finite number"   # before rules comparing them
                       for name, value in _non_finite(config.to_dict())]
  if errors:
    raise ConfigError(f"invalid config: {'; '.join(errors)}")
  m, d, t = config.model, config.decode, config.train
  for field in FILLED_BY_FAMILY:
    required(getattr(d, field), f"decode.{field}")
  gen_length = required(d.gen_length, "decode.gen_length")
  check = lambda cond, msg: None if cond else errors.append(msg)
  check(t.mode in MODES, f"train.mode={t.mode!r} must be one of {MODES}")
  check(m.attention in ATTENTION_LAYOUTS,
        f"model.attention={m.attention!r} must be one of {ATTENTION_LAYOUTS}")
  check(m.residual.mode in RESIDUAL_MODES,
        f"model.residual.mode={m.residual.mode!r} must be one of {RESIDUAL_MODES}")
  check(m.attention_impl in IMPLS,
        f"model.attention_impl={m.attention_impl!r} must be one of {IMPLS}")
  for field in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim"):
    check(getattr(m, field) > 0, f"model.{field}={getattr(m, field)} must be positive")
  errors += _moe_errors(config)
  check(m.n_kv_heads <= 0 or m.n_heads % m.n_kv_heads == 0,
        f"model.n_heads={m.n_heads} must be a multiple of model.n_kv_heads={m.n_kv_heads}")
  check(d.rule in RULES, f"decode.rule={d.rule!r} must be one of {RULES}")
  if d.rule in RULES:
    try:       # the parser of a request's and eval.settings' decoder names, and its ranges
      UnmaskRule.parse(f"{d.rule}_{d.rule_value}", d.block_size or None)
    except ValueError as e:
      errors.append(f"decode.rule_value={d.rule_value} for decode.rule={d.rule!r}: "
                    f"{str(e).split(': ', 1)[-1]}")
  check(d.block_size > 0 and gen_length % d.block_size == 0,
        f"decode.gen_length={gen_length} must be a positive multiple of "
        f"decode.block_size={d.block_size}")
  check(config.task.prompt_len % d.block_size == 0,
        f"task.prompt_len={config.task.prompt_len} must be a multiple of "
        f"decode.block_size={d.block_size} (prompts are left-padded to a block boundary)")
  sv = config.serve
  check(sv.rows >= 1 and sv.iterations_per_call >= 1 and sv.waiting_slots >= 0
        and sv.prompt_pool >= 0 and sv.max_waiting >= 1 and sv.watch_seconds > 0,
        f"serve.rows={sv.rows}, serve.iterations_per_call={sv.iterations_per_call}, "
        f"serve.max_waiting={sv.max_waiting} and serve.watch_seconds={sv.watch_seconds} must be "
        f"positive, serve.waiting_slots={sv.waiting_slots} and serve.prompt_pool="
        f"{sv.prompt_pool} >= 0")
  limits = ("max_body_bytes", "header_timeout", "body_timeout", "idle_timeout", "drain_timeout")
  bad = [f"serve.{k}={getattr(sv, k)}" for k in limits if not getattr(sv, k) > 0]
  check(not bad, f"{', '.join(bad)} must be positive")
  check(config.loss.vocab_chunk >= 0,
        f"loss.vocab_chunk={config.loss.vocab_chunk} must be >= 0 (0 = off)")
  try:
    families.get(m.hf_family)     # the registry's rule and message
  except ValueError as e:
    errors.append(str(e))
  check(not m.path or not m.init_from or m.path == m.init_from,
        f"model.path={m.path!r} and model.init_from={m.init_from!r} "
        "both give weights; set model.path only")
  check(d.temperature >= 0, f"decode.temperature={d.temperature} must be >= 0")
  errors += _schedule_errors(config)
  errors += _rules_errors(config)
  errors += _editing_errors(config)
  errors += _cache_errors(config)
  errors += _run_errors(config)
  errors += _replay_errors(config)
  for label in config.eval.settings:
    try:
      UnmaskRule.parse(label, config.decode.block_size or None)
    except ValueError as e:
      errors.append(f"eval.settings: {e}")
  if len(errors) == 1:
    raise ConfigError(f"invalid config: {errors[0]}")
  if errors:
    raise ConfigError("invalid config:\n  - " + "\n  - ".join(errors))


def _non_finite(tree: Any, prefix: str = "") -> list[tuple[str, float]]:
  """(dotted name, value) of every float in a config's nested dict that is NaN or infinite
  (`--config.train.lr=1e400` reads as inf): no setting means anything there."""
  if isinstance(tree, dict):
    return [found for key, value in tree.items() for found in _non_finite(value, f"{prefix}{key}.")]
  if isinstance(tree, (list, tuple)):
    return [found for i, value in enumerate(tree) for found in _non_finite(value, f"{prefix}{i}.")]
  if isinstance(tree, float) and not math.isfinite(tree):
    return [(prefix[:-1], tree)]
  return []


def _run_errors(config: RunConfig) -> list[str]:
  """The train, eval, checkpoint, ORL, loss-reference and data-mesh settings' problems."""
  errors = []
  m, t = config.model, config.train
  check = lambda cond, msg: None if cond else errors.append(msg)
  check(t.batch_size > 0, f"train.batch_size={t.batch_size} must be positive")
  errors += optimizer_config(config).errors()
  check(t.log_every > 0, f"train.log_every={t.log_every} must be positive")
  check(config.eval.batch_size > 0, f"eval.batch_size={config.eval.batch_size} must be positive")
  n_eval = _tiny_eval_size(config.task, errors) if config.task.name == "tiny" else None
  check(config.eval.n_problems >= 0,
        f"eval.n_problems={config.eval.n_problems} must be >= 0 (0 = the whole evaluation set)")
  check(n_eval is None or config.eval.n_problems <= n_eval,
        f"eval.n_problems={config.eval.n_problems} must be at most task.tiny.n_eval={n_eval} "
        "(the size of the tiny task's evaluation set; 0 = all of it)")
  check(config.checkpoint.every >= 0,
        f"checkpoint.every={config.checkpoint.every} must be >= 0 (0 = only the final step "
        "and an interrupted run's)")
  check(config.checkpoint.keep > 0, f"checkpoint.keep={config.checkpoint.keep} must be positive")
  if t.mode == "orl":
    o = config.orl
    check(o.group_size > 0, f"orl.group_size={o.group_size} must be positive (rollouts per "
          "prompt)")
    check(o.prompts_per_step > 0, f"orl.prompts_per_step={o.prompts_per_step} must be positive")
    check(o.chunk_by in CHUNK_BY, f"orl.chunk_by={o.chunk_by!r} must be one of {CHUNK_BY}")
    check(o.rollout_segment_iterations >= 0,
          f"orl.rollout_segment_iterations={o.rollout_segment_iterations} must be >= 0 (0 = the "
          "per-row rollout in one program)")
    split, size = (("group_size", o.group_size) if o.chunk_by == "samples" else
                   ("prompts_per_step", o.prompts_per_step))
    check(o.rollout_chunks > 0 and size % o.rollout_chunks == 0,
          f"orl.rollout_chunks={o.rollout_chunks} must be positive and divide orl.{split}="
          f"{size} (orl.chunk_by={o.chunk_by!r}: each chunk rolls out as many "
          f"{'responses a prompt' if o.chunk_by == 'samples' else 'prompts'})")
    check(o.max_staleness in (0, 1),
          f"orl.max_staleness={o.max_staleness} must be 0 (on-policy) or 1 (the next rollout "
          "drawn before the update: docs/training.md#one-step-of-lag)")
  if t.mode == "residual_warmup":
    check(m.residual.mode == "adapter",
          f"train.mode='residual_warmup' trains the adapter: model.residual.mode must be "
          f"'adapter', got {m.residual.mode!r}")
    p_self = t.self_condition_probability
    check(0 < p_self <= 1, f"train.self_condition_probability={p_self} must be in (0, 1]")
  kl_ref = config.loss.kl_reference
  check(kl_ref in KL_REFERENCES,
        f"loss.kl_reference={kl_ref!r} must be one of {KL_REFERENCES}")
  n_data = config.mesh.data
  if n_data > 0:
    check(t.batch_size % n_data == 0,
          f"train.batch_size={t.batch_size} must be divisible by mesh.data={n_data}")
  return errors


def _tiny_eval_size(task, errors: list[str]) -> int | None:
  """The tiny task's evaluation-set size (`task.tiny.n_eval`, else TinyTaskConfig's default);
  None, the problem appended to `errors`, when `task.tiny` is not a valid TinyTaskConfig."""
  try:
    return TinyTaskConfig(**task.tiny).n_eval
  except (TypeError, ValueError) as e:
    errors.append(f"task.tiny: {e}")
    return None


def _moe_errors(config: RunConfig) -> list[str]:
  """The model.moe section's problems (MoEConfig.validate's, and the expert mesh axis)."""
  errors = []
  try:
    moe = moe_config(config)
    if moe is not None and moe.expert_parallel and moe.impl != "ragged":   # names the mesh
      raise ValueError(f"mesh.expert={config.mesh.expert} splits the MoE experts, which needs "
                       f"the ragged (dropless) expert compute: set model.moe.impl='ragged' "
                       f"(got {moe.impl!r}), or mesh.expert=1 to keep the experts whole")
    if moe is not None:
      moe.validate()
  except (TypeError, ValueError) as e:
    errors.append(str(e))
  else:
    if config.mesh.expert > 1 and moe is None:
      errors.append(f"mesh.expert={config.mesh.expert} splits MoE experts, but the model is "
                    "dense (model.moe.n_experts = 0): set mesh.expert=1")
  return errors


def _replay_errors(config: RunConfig) -> list[str]:
  """The replay section's problems, caught at start-up rather than after the first rollout."""
  r, d, t = config.replay, config.decode, config.train
  if r is None:
    return []
  errors = []
  check = lambda cond, msg: None if cond else errors.append(msg)
  n_data = config.mesh.data
  check(r.n_rows > 0 and r.row_len > 0,
        f"replay.n_rows={r.n_rows} and replay.row_len={r.row_len} must be positive")
  micro = r.micro_batches
  shards = (n_data * config.mesh.fsdp * config.mesh.expert
            if n_data > 0 and config.mesh.fsdp > 0 else 1)
  check(micro >= 1 and r.n_rows % (micro * shards) == 0,
        f"replay.micro_batches={micro} must be >= 1 and divide replay.n_rows={r.n_rows}"
        + (f" per data shard (mesh.data x mesh.fsdp x mesh.expert = {shards})"
           if shards > 1 else ""))
  layout = r.layout
  check(layout in REPLAY_LAYOUTS,
        f"replay.layout={layout!r} must be one of {REPLAY_LAYOUTS}")
  # a state of the last block replays with the prompt and every clean block before it (the
  # canvas layout: with the masked blocks after it), so a row must hold prompt + response
  # (absolute placement: one block more, the one the prompt's last tokens share)
  try:
    absolute = family_rules(config)["block_placement"] == "absolute"
  except (ConfigError, ValueError):   # a family with its own sampler, or an unknown one
    absolute = False                  # (named by its own check): no block decoder here
  need = (config.task.prompt_len + required(d.gen_length, "decode.gen_length")
          + (d.block_size if absolute else 0))
  check(t.mode != "orl" or r.row_len >= need,
        f"replay.row_len={r.row_len} cannot hold a prompt (task.prompt_len="
        f"{config.task.prompt_len}) plus a state of the last block with its context "
        f"(decode.gen_length={d.gen_length}): raise replay.row_len to at least {need}")
  return errors


def _rules_errors(config: RunConfig) -> list[str]:
  """decode.block_placement / commit_compare: "auto" (the family's) or a known value."""
  d, errors = config.decode, []
  placement, compare = d.block_placement, d.commit_compare
  if placement not in ("auto",) + PLACEMENTS:
    errors.append(f"decode.block_placement={placement!r} must be one of "
                  f"{('auto',) + PLACEMENTS}")
  if compare not in ("auto",) + COMMIT_COMPARES:
    errors.append(f"decode.commit_compare={compare!r} must be one of "
                  f"{('auto',) + COMMIT_COMPARES}")
  if placement == "absolute" and config.model.attention == "bidirectional":
    errors.append("decode.block_placement='absolute' places blocks of a block-causal model; "
                  "model.attention='bidirectional' (LLaDA-8B) starts its blocks at the prompt's "
                  "end: set decode.block_placement='auto' or 'prompt_end'")
  return errors


def _editing_errors(config: RunConfig) -> list[str]:
  """LLaDA2.1 token editing (decode.*) and MoE route capture (orl.capture_routes)."""
  d, errors = config.decode, []
  check = lambda cond, msg: None if cond else errors.append(msg)
  check(0.0 <= d.edit_threshold <= 1.0,
        f"decode.edit_threshold={d.edit_threshold} must be in [0, 1] (1.0 = no token editing)")
  check(d.max_post_edit_steps >= 0,
        f"decode.max_post_edit_steps={d.max_post_edit_steps} must be >= 0")
  check(d.max_post_edit_steps <= 0 or d.edit_threshold < 1.0,
        f"decode.max_post_edit_steps={d.max_post_edit_steps} adds editing steps, but "
        "decode.edit_threshold=1.0 never edits: lower decode.edit_threshold (dllm 0.9, SGLang "
        "0.0) or set decode.max_post_edit_steps=0")
  check(not config.orl.capture_routes or config.model.attention != "bidirectional",
        f"orl.capture_routes needs a model decoded through a KV cache (model.attention="
        f"{config.model.attention!r} replays whole canvases and captures no routes)")
  return errors


def _schedule_errors(config: RunConfig) -> list[str]:
  """decode.schedule: a known value; orl.rollout_rows: rows of the per-row engine, at most one
  per rollout response."""
  schedule, o, errors = config.decode.schedule, config.orl, []
  if schedule not in SCHEDULES:
    errors.append(f"decode.schedule={schedule!r} must be one of {SCHEDULES}")
  chunks = o.rollout_chunks if o.rollout_chunks > 0 else 1
  rows, n_responses = o.rollout_rows, o.prompts_per_step * o.group_size // chunks
  of_chunk = f" / orl.rollout_chunks={chunks}" if chunks > 1 else ""
  if rows < 0:
    errors.append(f"orl.rollout_rows={rows} must be >= 0 (0 = one row per rollout response)")
  elif rows and schedule != "per_row":
    errors.append(f"orl.rollout_rows={rows} sets the rows of the per-row engine, but "
                  f"decode.schedule={schedule!r}: set decode.schedule='per_row' or "
                  "orl.rollout_rows=0")
  elif rows > n_responses:
    errors.append(f"orl.rollout_rows={rows} exceeds the {n_responses} responses of a rollout "
                  f"(orl.prompts_per_step={o.prompts_per_step} x orl.group_size="
                  f"{o.group_size}{of_chunk}): set orl.rollout_rows <= {n_responses} "
                  "(0 = one per response)")
  return errors


def _cache_errors(config: RunConfig) -> list[str]:
  """decode.cache: Fast-dLLM's approximate caches exist for bidirectional canvases only, and
  ORL rollouts must decode exactly (their captured states are replayed)."""
  cache, attention = config.decode.cache, config.model.attention
  if cache == "none":
    return []
  if cache not in CACHE_MODES:
    return [f"decode.cache={cache!r} must be one of {CACHE_MODES}"]
  errors = []
  if attention != "bidirectional":
    errors.append(f"decode.cache={cache!r} caches a bidirectional canvas, but model.attention="
                  f"{attention!r} already decodes through its exact KV cache: set "
                  "decode.cache='none'")
  if config.train.mode == "orl":
    errors.append(f"decode.cache={cache!r} is approximate: ORL rollouts capture what each step "
                  "consumed and the packed replay must reproduce it, which only "
                  "decode.cache='none' does: set decode.cache='none' for train.mode='orl' "
                  "(evaluate with the cache in a separate train.mode='eval' run)")
  if config.decode.schedule == "per_row":
    errors.append(f"decode.cache={cache!r} runs with the lock-step decoder only: set "
                  "decode.schedule='lockstep' (the per-row engine decodes without a cache)")
  return errors


def moe_config(config: RunConfig) -> MoEConfig | None:
  """The `model.moe` section as a MoEConfig (None when absent or `n_experts` = 0: dense)."""
  moe = config.model.moe
  if moe is None or not moe.n_experts:
    return None
  return MoEConfig(**moe.to_dict(), expert_parallel=config.mesh.expert > 1)


def _with_moe_runtime(arch_moe: MoEConfig | None, config) -> MoEConfig | None:
  """config.json's MoE architecture with the run-time choices of `model.moe` (impl, ...);
  experts run expert-parallel exactly when the mesh has an expert axis."""
  moe = config.model.moe
  if arch_moe is None:
    return None
  runtime = {f: getattr(moe, f) for f in RUNTIME_FIELDS if hasattr(moe, f)}
  runtime["expert_parallel"] = config.mesh.expert > 1
  return dataclasses.replace(arch_moe, **runtime)


def model_config(config: RunConfig, *, vocab_size: int, mask_id: int,
                 arch: dict | None = None, hf_family: str | None = None) -> ModelConfig:
  """The ModelConfig of `config.model`. `arch` (a family's `architecture_from_hf` of the
  weights' config.json) replaces every architecture field; the run-time choices (dtypes,
  attention kernel, residual pathway, `model.moe.impl` ...) stay the config's."""
  m = config.model
  fields: dict[str, Any] = dict(
      vocab_size=vocab_size, d_model=m.d_model, n_layers=m.n_layers, n_heads=m.n_heads,
      n_kv_heads=m.n_kv_heads, head_dim=m.head_dim, mlp_dim=m.mlp_dim, mask_id=mask_id,
      rope_theta=m.rope_theta, rope_fraction=m.rope_fraction, norm_eps=m.norm_eps,
      qk_norm=m.qk_norm, tie_embeddings=m.tie_embeddings, embed_scale=m.embed_scale,
      attention=m.attention, dtype=m.dtype, param_dtype=m.param_dtype,
      attention_impl=m.attention_impl,
      residual_mode=m.residual.mode, residual_hidden=m.residual.hidden,
      residual_scale=m.residual.scale, residual_temperature=m.residual.temperature,
      moe=moe_config(config), first_k_dense=m.first_k_dense,
      norm_head=m.norm_head, remat=m.remat,
      hf_family=m.hf_family if hf_family is None else hf_family)
  if arch:
    fields.update(arch)
    fields["moe"] = _with_moe_runtime(arch.get("moe"), config)
  return ModelConfig(**fields)


def replay_config(config: RunConfig, n_shards: int, context: str = "block") -> ReplayConfig:
  """The replay plan's settings of a run (`replay.*`, the decode block and response length):
  bidirectional families always replay full canvases (their context cannot be shared);
  `n_shards`: the mesh's data shards; `context`: the sampler's context stream
  (`Sampler.replay_context`)."""
  r, d = config.replay, config.decode
  bidirectional = config.model.attention == "bidirectional"
  gen_length = required(d.gen_length, "decode.gen_length")
  return ReplayConfig(row_len=r.row_len, n_rows=r.n_rows, max_states=r.max_states,
                      max_responses=r.max_responses, block_size=d.block_size,
                      states_per_response=r.states_per_response,
                      layout="canvas" if bidirectional else r.layout, n_shards=n_shards,
                      response_blocks=gen_length // d.block_size,
                      micro_batches=r.micro_batches, context=context)


def loss_config(config: RunConfig) -> LossConfig:
  """The ORL loss settings of `loss.*`."""
  return LossConfig.from_section(config.loss)


def optimizer_config(config: RunConfig) -> OptimizerConfig:
  """The optimizer settings of a run: `train.*` and the residual pathway's learning-rate scale
  (`model.residual.lr_scale`)."""
  t = config.train
  return OptimizerConfig(lr=t.lr, steps=t.steps, warmup_steps=t.warmup_steps,
                         final_lr_fraction=t.final_lr_fraction, b1=t.b1, b2=t.b2,
                         weight_decay=t.weight_decay, grad_clip=t.grad_clip,
                         residual_lr_scale=config.model.residual.lr_scale,
                         freeze_base=bool(t.freeze_base))
