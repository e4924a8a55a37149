"""What a block decoder is asked to do (docs/decoding.md#one-denoising-step): `DecodeConfig`, whose
fields are checked when it is made, and the allowed values of its cache and placement fields."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

from orl_jax.unmasking import COMMIT_COMPARES, UnmaskRule


# Bidirectional canvases (decode.cache): "none" forwards the whole canvas every step (exact);
# "prefix" and "dual" are Fast-dLLM's approximate caches, refreshed at every block start.
CacheMode = Literal["none", "prefix", "dual"]
CACHE_MODES: tuple[str, ...] = typing.get_args(CacheMode)


# Where the blocks sit (module docstring): at the prompt's end, or at absolute positions.
PLACEMENTS = ("prompt_end", "absolute")


# How rows of a batch step (decode.schedule): together (`orl_jax.decode.lockstep`), or each
# refilled from a queue as it finishes (`orl_jax.decode.per_row`).
Schedule = Literal["lockstep", "per_row"]
SCHEDULES: tuple[str, ...] = typing.get_args(Schedule)


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  gen_length: int                 # N, a multiple of block_size
  block_size: int                 # b
  mask_id: int
  eos_id: int
  # the commit rule: the run config's `decode.rule` + `decode.rule_value` (the family fills the
  # value), or a rollout's / an evaluation setting's own
  rule: UnmaskRule = dataclasses.field(kw_only=True)
  temperature: float = 0.0        # 0 = greedy; > 0 = Gumbel sampling at this temperature
  max_steps_per_block: int = 0    # safety bound; 0 -> block_size (every step commits >= 1)
  capture_states: int = 0         # > 0: record up to this many states per row (rollouts)
  top_k: int = 16                 # rollout statistics: top-K ids / log-probs per position
  kv_cache: bool = True           # False: block-causal steps re-forward the whole canvas with the
                                  # staircase mask (the reference the cached path is tested against)
  # LLaDA2.1 token editing (docs/models.md#llada21-token-editing): a step also rewrites committed
  # tokens of the block whose candidate differs with probability > edit_threshold (1.0 = never:
  # editing off), and a filled block takes up to max_post_edit_steps more steps, until one edits
  # nothing.
  edit_threshold: float = 1.0
  max_post_edit_steps: int = 0
  capture_routes: bool = False    # capture: the MoE expert ids of every forward (exact replay)
  # bidirectional families: none | prefix (later steps forward the block and what follows it
  # against the prefix K/V of the block-start forward) | dual (later steps forward only the
  # block against the prefix and suffix K/V of the block-start forward). Both approximate.
  cache: str = "none"
  # The vocabulary head (and the proposal) only at the block's masked positions: the smallest
  # of b, b/2, b/4, ... 1 slots that holds every row's (one lax.switch per step). Exact; off
  # where a step reads every position's logits (token editing, rollout capture).
  masked_head: bool = True
  # The authors' rules of the model's family (docs/decoding.md#decoding-as-each-models-authors-do):
  # where blocks sit (PLACEMENTS), how the threshold rule compares (COMMIT_COMPARES), and whether a
  # row stops after the block in which it committed EOS (False: it decodes all its blocks, as
  # LLaDA2.1's and Fast-dLLM's `generate` do by default; the response is cut at the first EOS either
  # way).
  # ("auto" in the run config: the family's; resolved by `decode.from_run.family_rules`)
  block_placement: str = dataclasses.field(kw_only=True)
  commit_compare: str = dataclasses.field(kw_only=True)
  eos_early_stop: bool = True

  def __post_init__(self):
    if self.gen_length % self.block_size:
      raise ValueError(f"decode.gen_length ({self.gen_length}) must be a multiple of "
                       f"decode.block_size ({self.block_size})")
    if not 0.0 <= self.edit_threshold <= 1.0:
      raise ValueError(f"decode.edit_threshold={self.edit_threshold} must be in [0, 1] "
                       "(1.0 = no token editing)")
    if self.max_post_edit_steps < 0:
      raise ValueError(f"decode.max_post_edit_steps={self.max_post_edit_steps} must be >= 0")
    if self.max_post_edit_steps and not self.editing:
      raise ValueError(f"decode.max_post_edit_steps={self.max_post_edit_steps} adds editing "
                       "steps, but decode.edit_threshold=1.0 never edits: lower "
                       "decode.edit_threshold (dllm 0.9, SGLang 0.0) or set "
                       "decode.max_post_edit_steps=0")
    if self.cache not in CACHE_MODES:
      raise ValueError(f"decode.cache={self.cache!r} must be one of {CACHE_MODES}")
    if self.cache != "none" and self.capture_states:
      raise ValueError(f"decode.cache={self.cache!r} is approximate: a rollout's captured "
                       "states could not be replayed exactly; rollouts use decode.cache='none'")
    if self.block_placement not in PLACEMENTS:
      raise ValueError(f"decode.block_placement={self.block_placement!r} must be one of "
                       f"{PLACEMENTS}")
    if self.commit_compare not in COMMIT_COMPARES:
      raise ValueError(f"decode.commit_compare={self.commit_compare!r} must be one of "
                       f"{COMMIT_COMPARES}")
    if self.capture_routes and not self.capture_states:
      raise ValueError("orl.capture_routes records routes with the captured states: it needs "
                       "capture_states > 0 (a rollout)")

  @property
  def editing(self) -> bool:
    return self.edit_threshold < 1.0

  @property
  def full_head(self) -> bool:
    """Every position of the block gets logits (editing rewrites committed tokens; capture
    records every position's statistics)."""
    return not self.masked_head or self.editing or self.capture_states > 0

  @property
  def n_blocks(self) -> int:
    return self.gen_length // self.block_size

  @property
  def max_blocks(self) -> int:
    """Blocks a row decodes at most: one more than N / b with absolute placement (the block
    the prompt's last tokens share with the first generated ones)."""
    return self.n_blocks + (self.block_placement == "absolute")

  @property
  def steps_bound(self) -> int:
    """Steps per block at most: the unmasking steps (each commits >= 1) plus the editing steps
    on the filled block."""
    return (self.max_steps_per_block or self.block_size) + self.max_post_edit_steps
