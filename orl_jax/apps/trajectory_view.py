"""HTML view of denoising trajectories: which token settled at which step (DESIGN §3).

Each response is a row of tokens; a token's colour and superscript give the denoising step
(counted over the whole response) at which it was committed. Several models can be shown side
by side for the same prompts (e.g. Base vs ORL).
"""
from __future__ import annotations

import html

import numpy as np


def commit_steps(capture, n_rows: int, block_size: int, gen_length: int,
                 lead=None) -> np.ndarray:
  """[n_rows, gen_length] global step index at which each response token was committed (-1 =
  never, e.g. EOS fill after the end). lead: [n_rows] prompt tokens opening each row's first
  block (absolute placement, `decode.placement.prompt_lead`; None: 0)."""
  commit = np.asarray(capture.commit)[:n_rows]
  valid = np.asarray(capture.valid)[:n_rows]
  block = np.asarray(capture.block)[:n_rows]
  lead = np.zeros(n_rows, np.int64) if lead is None else np.asarray(lead)[:n_rows]
  out = np.full((n_rows, gen_length), -1, np.int32)
  for r in range(n_rows):
    for k in np.flatnonzero(valid[r]):
      pos = block[r, k] * block_size + np.flatnonzero(commit[r, k]) - lead[r]
      out[r, pos[pos < gen_length]] = k     # the last block may run past the response
  return out


def _colour(step: int, n_steps: int) -> str:
  if step < 0:
    return "#eeeeee"
  x = step / max(n_steps - 1, 1)
  r, g, b = int(60 + 195 * x), int(170 - 90 * x), int(240 - 200 * x)
  return f"rgb({r},{g},{b})"


def _forwards(i: int, nfe, nfe_denoise=None) -> str:
  """A response's forwards, each count named (DESIGN §2.2)."""
  text = f"forwards: {int(nfe[i])} (the paper's count: denoising + 1 commit per block)"
  if nfe_denoise is not None:
    text += f" / {int(nfe_denoise[i])} (the authors': denoising only)"
  return text


def render(prompts, columns: dict, tokenizer, eos_id: int) -> str:
  """columns: {model name: (tokens [n, N], steps [n, N], nfe [n][, nfe_denoise [n]])}: nfe
  counts the paper's way (one commit forward per decoded block), nfe_denoise the authors' way.
  Returns an HTML page."""
  parts = ["<html><head><meta charset='utf-8'><style>",
           "body{font-family:sans-serif;font-size:13px} td{vertical-align:top;padding:6px}",
           ".t{display:inline-block;margin:1px;padding:1px 3px;border-radius:3px}",
           "sup{font-size:8px;color:#333}</style></head><body>",
           "<h3>Denoising trajectories (colour and superscript = step a token was committed)</h3>",
           "<table border=1 cellspacing=0><tr><th>prompt</th>"]
  parts += [f"<th>{html.escape(name)}</th>" for name in columns]
  parts.append("</tr>")
  for i, prompt in enumerate(prompts):
    parts.append(f"<tr><td>{html.escape(prompt)}</td>")
    for tokens, steps, *counts in columns.values():
      n_steps = int(steps[i].max()) + 1
      cells = []
      for tok, st in zip(tokens[i], steps[i]):
        word = html.escape(tokenizer.decode([int(tok)], skip_special=False))
        cells.append(f"<span class='t' style='background:{_colour(int(st), n_steps)}'>"
                     f"{word}<sup>{int(st) if st >= 0 else ''}</sup></span>")
        if tok == eos_id:
          break
      parts.append(f"<td>{''.join(cells)}<br><small>{_forwards(i, *counts)}</small></td>")
    parts.append("</tr>")
  parts.append("</table></body></html>")
  return "\n".join(parts)
