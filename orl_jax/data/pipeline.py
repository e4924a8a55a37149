"""Tokenisation of problems and the grain training pipeline (docs/scaling.md#meshes-and-sharding).

A training example is an `SftExample` (prompt_tokens [P], prompt_valid [P], response [N]): the
prompt is left-padded to `P` (a block multiple, so the response starts on a block boundary), the
response is the target followed by EOS and EOS-filled to `N`.
"""
from __future__ import annotations

from typing import Callable, Sequence

import grain
import jax
import numpy as np
from flax import nnx, struct

from orl_jax.problem import Problem


@struct.dataclass
class SftExample:
  """The input of an SFT-layout step (sft, residual_warmup, rcd_offline): one example, or a batch
  of them with a leading [B] axis on every array (the rows the step shards over the data axes)."""
  # numpy as loaded on the host, jax.Array once the batch is sharded onto the devices
  prompt_tokens: jax.Array | np.ndarray   # [B, P] int32, left-padded
  prompt_valid: jax.Array | np.ndarray    # [B, P] bool, False at the padding
  response: jax.Array | np.ndarray        # [B, N] int32 target tokens, EOS after them
  # offline RCD: the frozen reference model's parameters (an nnx.State, replicated, not
  # batched), added by the training loop; None in the other modes
  rcd_reference_params: nnx.State | None = None


def encode_prompt(problem: Problem, tokenizer, prompt_len: int) -> tuple[np.ndarray, np.ndarray]:
  ids = tokenizer.encode(problem.prompt)
  if len(ids) > prompt_len:
    raise ValueError(f"problem {problem.problem_id}: prompt has {len(ids)} tokens, more than "
                     f"task.prompt_len={prompt_len}; raise task.prompt_len (a multiple of the "
                     "block size) or shorten the prompt")
  tokens = np.full((prompt_len,), tokenizer.pad_id, np.int32)
  valid = np.zeros((prompt_len,), bool)
  if ids:
    tokens[-len(ids):] = ids
    valid[-len(ids):] = True
  return tokens, valid


def encode_response(problem: Problem, tokenizer, gen_length: int) -> np.ndarray:
  ids = tokenizer.encode(problem.target) + [tokenizer.eos_id]
  if len(ids) > gen_length:
    raise ValueError(f"problem {problem.problem_id}: target has {len(ids)} tokens with EOS, more "
                     f"than decode.gen_length={gen_length}")
  out = np.full((gen_length,), tokenizer.eos_id, np.int32)
  out[:len(ids)] = ids
  return out


def encode_example(problem: Problem, tokenizer, prompt_len: int, gen_length: int) -> SftExample:
  tokens, valid = encode_prompt(problem, tokenizer, prompt_len)
  return SftExample(prompt_tokens=tokens, prompt_valid=valid,
                    response=encode_response(problem, tokenizer, gen_length))


def encode_prompts(problems: Sequence[Problem], tokenizer, prompt_len: int):
  """Stacked [n, P] prompt tokens and validity for evaluation / rollouts."""
  pairs = [encode_prompt(p, tokenizer, prompt_len) for p in problems]
  return np.stack([t for t, _ in pairs]), np.stack([v for _, v in pairs])


def global_indices(batch_size: int, rows: Sequence[int] | None = None,
                   size: int = 2**31 - 1, shuffle_seed: int = -1) -> grain.MapDataset:
  """Problem indices of this process's `rows` of consecutive global batches (default: every
  row): element j of local batch k is problem `order[k * batch_size + rows[j]]`, where `order`
  is the identity (`shuffle_seed` < 0) or a seeded permutation of [0, size) (grain's index
  shuffle: any element in O(1), so a resumed stream needs only its position). The global
  stream is the same for any number of processes."""
  rows = tuple(range(batch_size)) if rows is None else tuple(int(r) for r in rows)
  local = len(rows)
  ds = grain.MapDataset.range(size // batch_size * local)
  ds = ds.map(lambda i: (i // local) * batch_size + rows[i % local])
  if shuffle_seed < 0:
    return ds
  order = grain.MapDataset.range(size).shuffle(seed=shuffle_seed)
  return ds.map(lambda i: order[int(i)])


def train_dataset(problem_at: Callable[[int], Problem], tokenizer, *, prompt_len: int,
                  gen_length: int, batch_size: int, rows: Sequence[int] | None = None,
                  size: int = 2**31 - 1, shuffle_seed: int = -1) -> grain.MapDataset:
  """This process's `rows` of global batches of `batch_size` encoded training problems.

  The stream is a pure function of the index, so the grain iterator state (one integer) is all
  a checkpoint needs for an exact resume.
  """
  ds = global_indices(batch_size, rows, size, shuffle_seed)
  ds = ds.map(lambda i: encode_example(problem_at(int(i)), tokenizer, prompt_len, gen_length))
  return ds.batch(batch_size if rows is None else len(rows), drop_remainder=True)


def prompt_dataset(problem_at: Callable[[int], Problem], *, batch_size: int,
                   rows: Sequence[int] | None = None, size: int = 2**31 - 1,
                   shuffle_seed: int = -1) -> grain.MapDataset:
  """This process's `rows` of global batches of problem indices for on-policy rollouts
  (problems are materialised by the loop)."""
  ds = global_indices(batch_size, rows, size, shuffle_seed)
  return ds.batch(batch_size if rows is None else len(rows), drop_remainder=True)
