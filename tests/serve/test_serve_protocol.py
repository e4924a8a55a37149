"""The request schema as OpenAI's clients can tell it (orl_jax/serve/protocol.py), in process and
without a server: null is a field left out, `stream_options` as OpenAI takes it, chat content
as text parts. The same cases go over HTTP in tests/serve/test_serve_api.py."""
import pytest

from orl_jax.serve import protocol
from orl_jax.serve.protocol import ChatRequest, CompletionRequest, RequestError

OPTIONAL = ["n", "stream", "stream_options", "echo", "max_tokens", "temperature", "top_p",
            "stop", "seed", "logprobs", "user", "best_of", "suffix", "frequency_penalty",
            "presence_penalty", "logit_bias", "decoder"]


def _refused(model, body) -> str:
  with pytest.raises(RequestError) as e:
    protocol.parse(model, body)
  assert e.value.status == 400
  return str(e.value)


def test_null_is_the_field_left_out():
  plain = protocol.parse(CompletionRequest, {"model": "m", "prompt": "bob"})
  nulls = protocol.parse(CompletionRequest, {"model": "m", "prompt": "bob",
                                             **dict.fromkeys(OPTIONAL)})
  assert nulls == plain and (nulls.n, nulls.stream, nulls.echo) == (1, False, False)
  assert _refused(CompletionRequest, {"model": "m", "prompt": None}) == \
      "field 'prompt' is required and cannot be null"
  assert _refused(ChatRequest, {"model": "m", "messages": None}) == \
      "field 'messages' is required and cannot be null"
  assert "unknown field 'colour'" in _refused(CompletionRequest, {"model": "m", "prompt": "bob",
                                                                   "colour": None})


def test_stream_options_take_a_boolean_include_usage_with_a_stream_only():
  body = {"model": "m", "prompt": "bob", "stream": True}
  assert not protocol.parse(CompletionRequest, body).include_usage
  for value, asked in [(True, True), (False, False), (None, False)]:
    req = protocol.parse(CompletionRequest, {**body, "stream_options": {"include_usage": value}})
    assert req.include_usage is asked
  assert "stream_options.include_usage" in _refused(
      CompletionRequest, {**body, "stream_options": {"include_usage": "yes"}})
  assert "unknown field 'stream_options.colour'" in _refused(
      CompletionRequest, {**body, "stream_options": {"colour": True}})
  assert _refused(CompletionRequest, {**body, "stream": False, "stream_options": {}}) == \
      "stream_options is only allowed when stream is true"


def test_chat_content_parts_of_type_text_are_joined_and_others_named():
  parts = [{"type": "text", "text": "bob has 3 pens ."}, {"type": "text", "text": "how many ?"}]
  req = protocol.parse(ChatRequest, {"model": "m", "messages": [
      {"role": "system", "content": "be brief"}, {"role": "user", "content": parts}]})
  assert req.turns() == [("system", "be brief"), ("user", "bob has 3 pens .\nhow many ?")]
  for part, words in [({"type": "image_url", "image_url": {"url": "x"}},
                       "messages.0.content.1: content parts of type 'image_url' are not "
                       "supported by this engine (only type 'text')"),
                      ({"type": "text", "text": 3}, "messages.0.content.1: a text part is"),
                      ({"type": "text", "text": "x", "extra": 1}, "a text part is")]:
    req = protocol.parse(ChatRequest, {"model": "m", "messages": [
        {"role": "user", "content": [parts[0], part]}]})
    with pytest.raises(RequestError, match=words.replace("(", r"\(").replace(")", r"\)")):
      req.turns()


def test_a_streams_usage_chunk_keeps_the_id_and_has_no_choices():
  chunk = protocol.completion_chunk("cmpl-1", "m", "fp", 0, "text", None)
  usage = protocol.usage_chunk(chunk, {"completion_tokens": 3})
  assert usage == {**chunk, "choices": [], "usage": {"completion_tokens": 3}}
