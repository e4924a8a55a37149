"""Denoising trajectories: decode prompts with a model and show which token settled at which
step (docs/decoding.md), on a page or in a notebook.

`decode_model(config, name, path)` decodes with a model's weights and keeps every committed
token's step (`Decoded`); `page(decoded)` is the HTML of one or more models side by side (Base
vs ORL), `write_page(path, decoded)` writes it. `launch/decode.py` and the notebook call these.

On the page each response is a row of tokens; a token's colour and number give the denoising
step (counted over the whole response) at which it was committed, on one colour scale for the
whole page (its legend at the top); a thick line marks where a block ends. Each model's header
names its weights, its decoder rule and its forwards and TPF, counted both ways.
"""
from __future__ import annotations

import dataclasses
import html
import math
import os
from typing import Sequence

import numpy as np

from orl_jax.data.tokenizer import token_text
from orl_jax.metrics import TPF_COUNT


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


@dataclasses.dataclass
class Decoded:
  """One model's responses to the same problems."""
  name: str
  path: str
  rule_label: str
  prompts: list[str]          # the model input text of each problem (chat template applied)
  texts: list[str]            # responses, through the first EOS
  tokens: np.ndarray          # [n, gen_length] response tokens
  steps: np.ndarray           # [n, gen_length] step at which each token was committed
  nfe: np.ndarray             # [n] forwards, one commit forward per decoded block included
  nfe_denoise: np.ndarray     # [n] denoising forwards only (the authors' count)
  n_generated: np.ndarray     # [n] tokens through the first EOS
  scores: list[float]         # verifier scores (NaN: a prompt without an answer)
  tokenizer: object
  block_size: int = 0         # tokens of a block (0: no block lines on the page)
  lead: np.ndarray | None = None   # [n] prompt tokens opening each row's first block

  def tpf(self, i: int) -> tuple[float, float]:
    """Row `i`'s tokens per forward, the paper's count and the authors' count."""
    n = float(self.n_generated[i])
    return n / max(float(self.nfe[i]), 1.0), n / max(float(self.nfe_denoise[i]), 1.0)

  def lines(self) -> list[str]:
    """What the launcher prints for this model."""
    out = [f"== {self.name} ({self.path}), decoder {self.rule_label}; forwards: paper's count "
           "(denoising + 1 commit per block; TPF) / authors' count (denoising only)"]
    if hasattr(self.tokenizer, "origins_text"):
      out.append(f"  special tokens: {self.tokenizer.origins_text()}")
    for i, (prompt, text, score) in enumerate(zip(self.prompts, self.texts, self.scores)):
      tail = "" if math.isnan(score) else f", score {score:.0f}"
      paper, authors = self.tpf(i)
      out.append(f"  {prompt}\n    -> {text}   [NFE paper {int(self.nfe[i])} / denoising "
                 f"{int(self.nfe_denoise[i])}, TPF {paper:.2f} / {authors:.2f}{tail}]")
    return out


def decode_model(config, name: str, path: str, prompts: Sequence[str] | None = None,
                 num: int = 4, overridden: frozenset = frozenset()) -> Decoded:
  """Decodes `prompts` (or the first `num` evaluation problems of `config.task`) with the
  weights at `path`, as `config` sets the decoder. A Hugging Face directory gives the family and
  every shape (its config.json); a params folder (or a run's work directory) gives what it was
  trained with (`trained_run`), except the fields in `overridden`."""
  import jax
  from orl_jax import sharding
  from orl_jax.storage import trained_run
  from orl_jax.decode import build as decode_build, placement
  from orl_jax.setup.build import build_setup, initial_params
  from orl_jax.unmasking import UnmaskRule
  s = build_setup(trained_run.model_config_for(config, path, overridden), prompts=prompts)
  cfg = s.config
  problems = s.task.eval_problems() if prompts else s.task.eval_problems()[:num]
  tok = s.tokenizer
  tokens, valid = _encode(problems, tok, cfg.task.prompt_len)
  rule = UnmaskRule(cfg.decode.rule, float(cfg.decode.rule_value or 0))
  graphdef, params = initial_params(s)
  ids = dict(mask_id=tok.mask_id, eos_id=tok.eos_id)
  run = decode_build.make_decoder(cfg, s.model_cfg, graphdef, "decode", rule=rule, **ids)
  with sharding.tracing_mesh(s.mesh):
    out = jax.device_get(run(params, tokens, valid, jax.random.key(0)))
  texts = [tok.decode(t, stop_at_eos=True) for t in out.tokens]
  lead = np.asarray(placement.prompt_lead(
      valid, cfg.decode.block_size, decode_build.sampler_of(cfg, s.model_cfg).block_placement))
  return Decoded(
      name=name, path=path, rule_label=rule.label, prompts=[p.prompt for p in problems],
      texts=texts, tokens=np.asarray(out.tokens),
      steps=commit_steps(out.capture, len(problems), cfg.decode.block_size,
                         int(np.asarray(out.tokens).shape[1]), lead),
      nfe=np.asarray(out.nfe), nfe_denoise=np.asarray(out.nfe_denoise),
      n_generated=np.asarray(out.n_generated),
      scores=list(s.task.verifier.score_batch(problems, texts)), tokenizer=tok,
      block_size=int(cfg.decode.block_size), lead=lead)


def _encode(problems, tokenizer, prompt_len: int):
  from orl_jax.config import derive as config_lib
  from orl_jax.data.pipeline import encode_prompts
  try:
    return encode_prompts(problems, tokenizer, prompt_len)
  except ValueError as e:    # a prompt longer than task.prompt_len: one line, no traceback
    raise config_lib.ConfigError(str(e)) from None


# ----------------------------------------------------------------------------------- the page

_STYLE = """
body{font-family:sans-serif;font-size:14px;margin:16px}
td{vertical-align:top;padding:6px} th{text-align:left;padding:6px;font-weight:normal}
.t{display:inline-block;margin:1px 0;padding:1px 3px;border-radius:3px;white-space:pre;
   font-family:monospace;font-size:13px}
.t sub{font-size:10px;color:#222;margin-left:1px;font-family:sans-serif}
.end{border-right:3px solid #000;margin-right:4px}
.legend{display:flex;align-items:center;gap:6px;margin:8px 0}
.swatch{width:22px;height:14px;display:inline-block;border-radius:2px}
.note{color:#444;max-width:70em}
"""


def _colour(step: int, n_steps: int) -> str:
  if step < 0:
    return "#eeeeee"
  x = step / max(n_steps - 1, 1)
  r, g, b = int(60 + 195 * x), int(170 - 90 * x), int(240 - 200 * x)
  return f"rgb({r},{g},{b})"


def _legend(n_steps: int) -> str:
  marks = sorted({0, n_steps // 4, n_steps // 2, (3 * n_steps) // 4, n_steps - 1})
  swatches = "".join(f"<span class='swatch' style='background:{_colour(k, n_steps)}'></span>"
                     f"<span>{k}</span>" for k in marks if k >= 0)
  return (f"<div class='legend'><b>step a token was committed:</b>{swatches}"
          f"<span class='swatch' style='background:{_colour(-1, n_steps)}'></span>"
          "<span>never (after the end)</span><span class='t end'> </span>"
          "<span>end of a block</span></div>")


def _header(d: Decoded) -> str:
  nfe, denoise = int(np.sum(d.nfe)), int(np.sum(d.nfe_denoise))
  n = int(np.sum(d.n_generated))
  return (f"<th><b>{html.escape(d.name)}</b><br><small>{html.escape(d.path)}<br>decoder "
          f"{html.escape(d.rule_label)}; forwards {nfe} (paper's count) / {denoise} (authors': "
          f"denoising only); TPF {n / max(nfe, 1):.2f} / {n / max(denoise, 1):.2f}"
          "</small></th>")


def _cell(d: Decoded, i: int, n_steps: int) -> str:
  eos = getattr(d.tokenizer, "eos_id", None)
  lead = 0 if d.lead is None else int(d.lead[i])
  cells = []
  for pos, (tok, st) in enumerate(zip(d.tokens[i], d.steps[i])):
    end = d.block_size and (pos + lead + 1) % d.block_size == 0
    cls = "t end" if end else "t"
    cells.append(f"<span class='{cls}' style='background:{_colour(int(st), n_steps)}'>"
                 f"{html.escape(token_text(d.tokenizer, tok))}"
                 f"<sub>{int(st) if st >= 0 else ''}</sub></span>")
    if eos is not None and tok == eos:
      break
  paper, authors = d.tpf(i)
  return (f"<td>{''.join(cells)}<br><small>forwards {int(d.nfe[i])} / {int(d.nfe_denoise[i])}"
          f", TPF {paper:.2f} / {authors:.2f}</small></td>")


def page(decoded: Sequence[Decoded]) -> str:
  """The HTML page of every model's trajectories, side by side, on one colour scale."""
  n_steps = max(int(np.max(d.steps)) + 1 for d in decoded)
  parts = ["<html><head><meta charset='utf-8'><title>Denoising trajectories</title>",
           f"<style>{_STYLE}</style></head><body>", "<h3>Denoising trajectories</h3>",
           f"<p class='note'>Each token is coloured and numbered by the denoising step at which "
           f"it was committed. Forwards and TPF are given twice: the paper's count / the "
           f"authors' count (denoising forwards only). {html.escape(TPF_COUNT)}.</p>",
           _legend(n_steps), "<table border=1 cellspacing=0><tr><th>prompt</th>"]
  parts += [_header(d) for d in decoded]
  parts.append("</tr>")
  for i, prompt in enumerate(decoded[0].prompts):
    parts.append(f"<tr><td style='white-space:pre-wrap'>{html.escape(prompt)}</td>")
    parts += [_cell(d, i, n_steps) for d in decoded]
    parts.append("</tr>")
  parts.append("</table></body></html>")
  return "\n".join(parts)


def write_page(path: str, decoded: Sequence[Decoded]) -> str:
  """Writes `page(decoded)` to `path`; returns its absolute path."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(page(decoded))
  return os.path.abspath(path)
