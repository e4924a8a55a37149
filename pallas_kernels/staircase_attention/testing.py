"""Random packed staircase rows for kernel tests and benchmarks (the layout of
docs/method.md#replay-states-packing-staircase-attention).

A row is `[group | group | ... | pad]`, each prompt group being
`[left pad | prompt | resp 1: clean blocks | resp 1: states | resp 2: clean | resp 2: states ...]`.
A state of block j has `block = j` and a row-unique `state_id`. Positions (RoPE) are irrelevant
to attention masks, so they are not produced.
"""
from __future__ import annotations

import numpy as np

from pallas_kernels.staircase_attention.meta import (KIND_CLEAN, KIND_PAD, KIND_PROMPT,
                                                     KIND_STATE, TokenMeta)


def prompt_group(segment: int, prompt_len: int, block_size: int, response_blocks: list[int],
                 states_per_block: list[list[int]], first_state_id: int,
                 left_pad: int = 0) -> tuple[np.ndarray, int]:
  """One prompt group as int32 [T, 5] metadata rows (TokenMeta field order).

  `prompt_len + left_pad` must be a block multiple (the response starts on a block boundary);
  `states_per_block[r][j]` states are captured for block j of response r.
  Returns the rows and the next free state id.
  """
  if (left_pad + prompt_len) % block_size:
    raise ValueError("left_pad + prompt_len must be a multiple of block_size")
  rows = [(-1, -1, KIND_PAD, 0, -1)] * left_pad
  rows += [(segment, -1, KIND_PROMPT, (left_pad + t) // block_size, -1)
           for t in range(prompt_len)]
  first_block = (left_pad + prompt_len) // block_size
  state_id = first_state_id
  for r, n_blocks in enumerate(response_blocks):
    rows += [(segment, r, KIND_CLEAN, first_block + j, -1)
             for j in range(n_blocks) for _ in range(block_size)]
    for j in range(n_blocks):
      for _ in range(states_per_block[r][j]):
        rows += [(segment, r, KIND_STATE, first_block + j, state_id)] * block_size
        state_id += 1
  return np.asarray(rows, np.int32).reshape(-1, 5), state_id


def stack_rows(rows: list[np.ndarray], seq_len: int) -> TokenMeta:
  """Pads each [T_i, 5] row to seq_len with KIND_PAD and stacks them into a [B, T] TokenMeta."""
  pad = np.asarray([(-1, -1, KIND_PAD, 0, -1)], np.int32)
  full = [np.concatenate([r, np.repeat(pad, seq_len - len(r), axis=0)]) for r in rows]
  fields = np.stack(full)  # [B, T, 5]
  columns = [np.ascontiguousarray(fields[..., f]) for f in range(5)]
  # numpy fields where TokenMeta's annotations say jax.Array: they are read as arrays
  return TokenMeta(*columns)  # type: ignore[arg-type]


def random_packed_meta(rng: np.random.Generator, batch: int, seq_len: int, block_size: int, *,
                       max_prompt_blocks: int = 2, max_responses: int = 3,
                       max_response_blocks: int = 2, max_states: int = 2,
                       fill: float = 1.0) -> TokenMeta:
  """Random rows of prompt groups, packed first-fit until `fill * seq_len`; the tail is pad.

  `fill < 1` leaves trailing pad (fully padded query tiles when the tail spans a tile).
  """
  rows = []
  for _ in range(batch):
    row, state_id, segment = np.zeros((0, 5), np.int32), 0, 0
    budget = int(fill * seq_len)
    for _attempt in range(64):
      prompt_blocks = int(rng.integers(1, max_prompt_blocks + 1))
      left_pad = int(rng.integers(0, block_size)) if rng.random() < 0.5 else 0
      n_resp = int(rng.integers(1, max_responses + 1))
      blocks = [int(rng.integers(1, max_response_blocks + 1)) for _ in range(n_resp)]
      states = [[int(rng.integers(0, max_states + 1)) for _ in range(n)] for n in blocks]
      group, next_id = prompt_group(segment, prompt_blocks * block_size - left_pad, block_size,
                                    blocks, states, state_id, left_pad=left_pad)
      if len(row) + len(group) > budget:
        continue
      row, state_id, segment = np.concatenate([row, group]), next_id, segment + 1
    rows.append(row)
  return stack_rows(rows, seq_len)
