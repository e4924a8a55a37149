"""What a sampler is (docs/decoding.md#one-denoising-step,
docs/method.md#rollout-with-exact-state-capture, docs/decoding.md#two-forward-counts): the one
interface every decoder sits behind.

A model family's registry entry names its sampler factory (`Family.sampler`, called with the
run config and the model config; None: the block-diffusion samplers of
`orl_jax.decode.block_sampler`), and `orl_jax.decode.build.make_decoder` builds every decoder
through it, so callers never ask which family or which kind of sampler they hold. A `Sampler`
is three narrower roles, each what one kind of caller reads:

* `Decoders` (evaluation, the decode launcher, the ORL rollout, the tokenizer's set-up): which
  decoder serves each purpose (`decoder`: "evaluate", "decode"; `rollout`: the per-shard
  rollout that `make_decoder` jits data-parallel), whether evaluation decodes a queue
  (`queued`) and whether undecided positions hold a mask token (`needs_mask_token`: the
  tokenizer must have one);
* `CaptureLayout` (replay, SFT, the trajectory page): what a captured state means — the
  positions a step left unresolved (`unresolved`: the losses train there), the context stream
  of packed replay rows (`replay_context`) and where a response's first block starts
  (`block_placement`; its prompt lead is `orl_jax.decode.placement.prompt_lead`);
* `Sizing` (the dry run, the compile command): the block decoder's config whose one forward is
  sized and priced (`forward_config`).

A family folder implements it without importing the decoders (`tests/project/test_architecture.py`):
the protocols are structural, so a family's class needs no import of this module.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
  import jax

  from orl_jax.decode.config import DecodeConfig
  from orl_jax.models.decoded import DecodeOutput, Trajectories
  from orl_jax.unmasking import UnmaskRule

PURPOSES = ("evaluate", "decode", "rollout")
# The context stream of packed replay rows (`orl_jax.replay.plan.CONTEXTS`) and where a
# response's first block sits (`orl_jax.decode.config.PLACEMENTS`)
ReplayContext = Literal["block", "token"]
BlockPlacement = Literal["prompt_end", "absolute"]


class RolloutFn(Protocol):
  """One shard's rollout (`orl_jax.decode.trajectories.lockstep_trajectories`' signature): the
  `group_size` responses of each prompt, decoded with `cfg` (the config `Sampler.rollout` returns
  with it) by `model`, every state captured."""

  def __call__(self, model: Any, prompt_tokens: jax.Array, prompt_valid: jax.Array,
               key: jax.Array, cfg: Any, group_size: int,
               rollout_step: jax.Array | int) -> Trajectories:
    ...


class DecodeFn(Protocol):
  """A jitted decoder: `(params, prompt_tokens [B, P], prompt_valid [B, P], key)`."""

  def __call__(self, params: Any, prompt_tokens: jax.Array, prompt_valid: jax.Array,
               key: jax.Array) -> DecodeOutput:
    ...


class Decoders(Protocol):
  """The decoders of one model: what evaluation, the decode launcher and the rollout build."""

  @property
  def needs_mask_token(self) -> bool:
    """Undecided positions hold a mask token (else random tokens): the tokenizer needs one."""
    ...

  @property
  def queued(self) -> bool:
    """"evaluate" decodes a queue of prompts on `n_rows` rows (the per-row engine)."""
    ...

  def decoder(self, graphdef, purpose: str, *, mask_id: int, eos_id: int,
              rule: UnmaskRule | None = None, temperature: float | None = None,
              n_rows: int = 0) -> DecodeFn:
    """Jitted `(params, prompt_tokens [B, P], prompt_valid [B, P], key) ->
    models.decoded.DecodeOutput` for "evaluate" (no capture; `queued`: over a queue decoded on
    `n_rows` rows) or "decode" (every state captured)."""
    ...

  def rollout(self, *, mask_id: int, eos_id: int, mesh=None) -> tuple[RolloutFn, object]:
    """(one shard's rollout with exact state capture, the config it decodes with)."""
    ...


class CaptureLayout(Protocol):
  """What a captured state means: what replay, the SFT layout and the trajectory page read."""

  @property
  def replay_context(self) -> ReplayContext:
    """The context stream of packed replay rows (`ReplayConfig.context`)."""
    ...

  @property
  def block_placement(self) -> BlockPlacement:
    """Where the first block sits; the SFT layout trains what the sampler decodes, and the
    prompt tokens that open a row's first block follow from it
    (`orl_jax.decode.placement.prompt_lead`)."""
    ...

  def unresolved(self, state_tokens: jax.Array, commit: jax.Array, mask_id: int) -> jax.Array:
    """[...] bool: the positions of captured states (`Capture.block_tokens`, `Capture.commit`)
    that the step left undecided — the positions the losses train (`ReplayBatch.masked`)."""
    ...


class Sizing(Protocol):
  """What the dry run sizes and the compile command prices."""

  def forward_config(self, purpose: str, *, mask_id: int, eos_id: int) -> DecodeConfig | None:
    """The block decoder's config for `purpose`, whose capture the dry run sizes and whose one
    forward the compile command prices; None: a sampler sized and priced whole (its rollout
    traced abstractly)."""
    ...


class Sampler(Decoders, CaptureLayout, Sizing, Protocol):
  """The decoders of one model and what their captures mean (module docstring); built by
  `Family.sampler(config, model_cfg)` (`model_cfg` may be None where no model config exists
  yet: the tokenizer's set-up)."""
