"""The OpenAI API as this server speaks it: request bodies (validated: an unknown field, a
value of the wrong type or out of range is a 400 with one sentence), responses, stream chunks
and error bodies. docs/serving.md lists what is supported.

DLM extensions, all in one place: the request field `decoder` (the unmasking rule,
`threshold_<tau>` | `entropy_budget_<gamma>` | `fixed_steps_<k>`; default: the config's), the
request field `orl_denoise` (a streamed request's chunks also carry each forward's commits, in
`orl_denoise` of their choice: `denoise_chunk`), and in `usage` the forward counts and TPF
(`usage_dict`).
"""
from __future__ import annotations

import itertools
import os
import time
from typing import Any, Literal, TypeVar, Union

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from orl_jax.unmasking import UnmaskRule


class RequestError(ValueError):
  """A request the server cannot serve: HTTP `status` and one sentence."""

  def __init__(self, message: str, status: int = 400, param: str | None = None,
               kind: str = "invalid_request_error", code: str | None = None):
    super().__init__(message)
    self.status, self.param, self.kind, self.code = status, param, kind, code


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
  """OpenAI's error JSON."""
  return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class StreamOptions(BaseModel):
  """`stream_options`: `include_usage` true adds a last chunk with `choices: []` and the usage."""
  model_config = ConfigDict(extra="forbid", strict=True)
  include_usage: bool | None = None


class _Request(BaseModel):
  model_config = ConfigDict(extra="forbid", strict=True)

  model: str
  n: int = Field(1, ge=1, le=16)
  seed: int | None = Field(None, ge=0, lt=2**64)
  stop: Union[str, list[str], None] = None
  stream: bool = False
  stream_options: StreamOptions | None = None
  temperature: float | None = Field(None, ge=0.0, le=2.0)
  top_p: float | None = None
  user: str | None = None
  decoder: str | None = None          # DLM extension: the unmasking rule of this request
  orl_denoise: bool = False           # DLM extension: stream each forward's commits too
  # accepted only at the values that change nothing (the engine has no such feature)
  frequency_penalty: float | None = None
  presence_penalty: float | None = None
  logit_bias: dict[str, float] | None = None
  logprobs: Any = None

  def stop_strings(self) -> tuple[str, ...]:
    stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
    if len(stops) > 4:
      raise RequestError("stop takes at most 4 strings", param="stop")
    return tuple(s for s in stops if s)

  def check_unsupported(self) -> None:
    """One sentence for a feature this engine does not have, at a value that would need it."""
    if self.top_p not in (None, 1, 1.0):
      raise RequestError("top_p is not supported by this engine (it samples from the whole "
                         "distribution at `temperature`): leave it out or set it to 1",
                         param="top_p")
    for name in ("frequency_penalty", "presence_penalty"):
      if getattr(self, name) not in (None, 0, 0.0):
        raise RequestError(f"{name} is not supported by this engine: leave it out or set it "
                           "to 0", param=name)
    if self.logit_bias:
      raise RequestError("logit_bias is not supported by this engine", param="logit_bias")
    if self.logprobs not in (None, False, 0):
      raise RequestError("logprobs are not supported: a diffusion LM commits tokens in parallel, "
                         "in no left-to-right order (leave logprobs out)", param="logprobs")
    if self.orl_denoise and not self.stream:
      raise RequestError("orl_denoise streams each forward's commits: set stream to true",
                         param="orl_denoise")
    if self.stream_options is not None and not self.stream:
      raise RequestError("stream_options is only allowed when stream is true",
                         param="stream_options")

  @property
  def include_usage(self) -> bool:
    """A streamed response ends with a usage chunk (OpenAI's `stream_options.include_usage`)."""
    return bool(self.stream_options and self.stream_options.include_usage)

  def rule(self, block_size: int | None = None) -> UnmaskRule | None:
    """The request's decoder setting (`decoder`, in its rule's range: `UnmaskRule.parse`), or
    None for the engine's default."""
    if self.decoder is None:
      return None
    try:
      return UnmaskRule.parse(self.decoder, block_size)
    except ValueError as e:
      raise RequestError(str(e), param="decoder") from None


class CompletionRequest(_Request):
  """POST /v1/completions."""
  prompt: Union[str, list[str], list[int], list[list[int]]]
  max_tokens: int | None = Field(None, ge=1)
  echo: bool = False
  best_of: int | None = None
  suffix: str | None = None

  def prompts(self) -> list[Union[str, list[int]]]:
    """The prompts, one per element (a string or token ids)."""
    p = self.prompt
    if isinstance(p, str):
      return [p]
    if not p:
      raise RequestError("prompt is empty", param="prompt")
    if all(isinstance(x, int) for x in p):
      return [list(p)]                                 # type: ignore[arg-type]
    return list(p)                                     # type: ignore[arg-type]

  def check_unsupported(self) -> None:
    super().check_unsupported()
    if self.echo:
      raise RequestError("echo is not supported by this engine", param="echo")
    if self.best_of not in (None, 1):
      raise RequestError("best_of is not supported by this engine: use n", param="best_of")
    if self.suffix:
      raise RequestError("suffix (infilling) is not supported by this engine", param="suffix")


class ChatMessage(BaseModel):
  model_config = ConfigDict(extra="forbid", strict=True)
  role: Literal["system", "user", "assistant"]
  content: Union[str, list[dict[str, Any]]]     # a string, or parts of type text (`text`)
  name: str | None = None

  def text(self, where: str) -> str:
    """The message's text: its string, or its parts' texts joined by newlines (as vLLM joins
    them); a part of another type than `text` is a RequestError naming it."""
    if isinstance(self.content, str):
      return self.content
    texts = []
    for j, part in enumerate(self.content):
      kind = part.get("type")
      if kind != "text":
        raise RequestError(f"{where}.content.{j}: content parts of type {_short(kind)} are not "
                           "supported by this engine (only type 'text')",
                           param=f"{where}.content")
      if set(part) != {"type", "text"} or not isinstance(part["text"], str):
        raise RequestError(f'{where}.content.{j}: a text part is {{"type": "text", "text": '
                           f'STRING}} (got {_short(part)})', param=f"{where}.content")
      texts.append(part["text"])
    return "\n".join(texts)


class ChatRequest(_Request):
  """POST /v1/chat/completions."""
  messages: list[ChatMessage] = Field(min_length=1)
  max_tokens: int | None = Field(None, ge=1)
  max_completion_tokens: int | None = Field(None, ge=1)
  tools: Any = None
  tool_choice: Any = None
  response_format: Any = None

  def check_unsupported(self) -> None:
    super().check_unsupported()
    for name in ("tools", "tool_choice", "response_format"):
      if getattr(self, name) is not None:
        raise RequestError(f"{name} is not supported by this engine", param=name)

  def turns(self) -> list[tuple[str, str]]:
    """(role, text) of each message (`ChatMessage.text`)."""
    return [(m.role, m.text(f"messages.{i}")) for i, m in enumerate(self.messages)]

  @property
  def token_limit(self) -> int | None:
    return self.max_completion_tokens or self.max_tokens


RequestT = TypeVar("RequestT", bound=_Request)


def parse(model: type[RequestT], body: Any) -> RequestT:
  """The request, or RequestError with one sentence naming the first bad field."""
  if not isinstance(body, dict):
    raise RequestError("the request body must be a JSON object")
  # null is the field left out, as OpenAI reads it; a required field cannot be left out
  for k, v in body.items():
    if v is None and _required(model, k):
      raise RequestError(f"field {k!r} is required and cannot be null", param=k)
  body = {k: v for k, v in body.items() if v is not None or k not in model.model_fields}
  try:
    request = model.model_validate(body)
  except pydantic.ValidationError as e:
    err = e.errors()[0]
    where = ".".join(str(x) for x in err["loc"]) or "body"
    if err["type"] == "extra_forbidden":
      raise RequestError(f"unknown field {where!r}: see docs/serving.md for the fields this "
                         "server takes", param=where) from None
    if err["type"] == "missing":
      raise RequestError(f"missing field {where!r}", param=where) from None
    raise RequestError(f"field {where!r}: {err['msg']} (got {_short(err.get('input'))})",
                       param=where) from None
  request.check_unsupported()
  return request


def _required(model: type[BaseModel], name: str) -> bool:
  field = model.model_fields.get(name)
  return field is not None and field.is_required()


def _short(value, limit: int = 60) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


_ID_PREFIX = os.urandom(6).hex()      # this server's; a counter numbers its responses
_ids = itertools.count()


def new_id(prefix: str) -> str:
  """A response id unique to this server process (`cmpl-...`, `chatcmpl-...`)."""
  return f"{prefix}-{_ID_PREFIX}{next(_ids):012x}"


def usage_dict(prompt_tokens: int, choices: list[dict], queue_seconds: float = 0.0) -> dict:
  """OpenAI's usage, summed over choices, with the DLM counts: `generated_tokens` (through the
  first EOS, the EOS included), `forwards` (the paper's count: denoising forwards + one commit
  forward per decoded block), `forwards_denoise` (the authors' count), `forwards_engine` (what
  the engine ran), `tpf` = generated_tokens / forwards and `tpf_denoise`; and `queue_seconds`,
  the request's wait from arrival to the engine taking it."""
  total = lambda k: sum(c[k] for c in choices)
  completion, generated, forwards = (total("completion_tokens"), total("generated"),
                                     total("forwards"))
  denoise = total("forwards_denoise")
  return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
          "total_tokens": prompt_tokens + completion, "generated_tokens": generated,
          "forwards": forwards, "forwards_denoise": denoise,
          "forwards_engine": total("forwards_engine"),
          "tpf": round(generated / max(forwards, 1), 4),
          "tpf_denoise": round(generated / max(denoise, 1), 4),
          "queue_seconds": round(queue_seconds, 4)}


def completion_body(rid: str, model: str, fingerprint: str, choices: list[dict],
                    usage: dict) -> dict:
  return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
          "system_fingerprint": fingerprint,
          "choices": [{"index": c["index"], "text": c["text"], "logprobs": None,
                       "finish_reason": c["finish_reason"]} for c in choices],
          "usage": usage}


def chat_body(rid: str, model: str, fingerprint: str, choices: list[dict], usage: dict) -> dict:
  return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
          "system_fingerprint": fingerprint,
          "choices": [{"index": c["index"], "logprobs": None,
                       "message": {"role": "assistant", "content": c["text"]},
                       "finish_reason": c["finish_reason"]} for c in choices],
          "usage": usage}


def completion_chunk(rid: str, model: str, fingerprint: str, index: int, text: str,
                     finish_reason: str | None = None) -> dict:
  return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
          "system_fingerprint": fingerprint,
          "choices": [{"index": index, "text": text, "logprobs": None,
                       "finish_reason": finish_reason}]}


def chat_chunk(rid: str, model: str, fingerprint: str, index: int, delta: dict,
               finish_reason: str | None = None) -> dict:
  return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()),
          "model": model, "system_fingerprint": fingerprint,
          "choices": [{"index": index, "delta": delta, "logprobs": None,
                       "finish_reason": finish_reason}]}


def usage_chunk(chunk: dict, usage: dict) -> dict:
  """A stream's usage chunk (`stream_options.include_usage`): `chunk`'s id, object and model,
  no choices, the request's usage."""
  return {**chunk, "choices": [], "usage": usage}


def denoise_chunk(chunk: dict, canvas: dict) -> dict:
  """A stream chunk (`completion_chunk` or `chat_chunk` of one choice, with no new text) that
  carries one forward's commits (`scheduler.Scheduler._canvas`) in its choice's
  `orl_denoise`."""
  chunk["choices"][0]["orl_denoise"] = canvas
  return chunk
