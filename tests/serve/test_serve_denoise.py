"""The playground's server side (docs/serving.md#the-playground): a request that asks for the
denoising (`orl_denoise`) gets canvas events that show each forward's commits, in the order and
groups the offline per-row engine's capture records them, ending on the response the request
returns; several models behind one port (`playground.front`, `--models`): each request
answered by the model it names, the page open, the API keyed."""
import dataclasses
import json
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from orl_jax.apps.trajectory_view import commit_steps
from orl_jax.decode import per_row
from orl_jax.decode.config import DecodeConfig
from orl_jax.serve.engine import BlockEngine, EngineShape
from orl_jax.serve.load import parse_models
from orl_jax.serve import keys
from orl_jax.serve.app import Served
from orl_jax.serve.metrics import ServerMetrics
from orl_jax.serve.playground import front, named_model
from orl_jax.serve.scheduler import Request, Scheduler
from orl_jax.errors import ConfigError
from orl_jax.sharding import make_mesh
from orl_jax.unmasking import RULES, UnmaskRule
from tests.serve import test_serve_scheduler as scripted
from tests.support.helpers import TINY, TINY_BLOCK, TINY_RULES, live_adapter, tiny_model

# compares token ids and commit order with an offline decode: rerun under other numerics
pytestmark = pytest.mark.numerics

P, GEN, EOS = 8, 12, 5


class Words:
  """Token i reads as `w<i>` (the scheduler needs decode and eos_id)."""
  eos_id, mask_id = EOS, TINY.mask_id

  def decode(self, ids, skip_special=True, stop_at_eos=False):
    del skip_special, stop_at_eos
    return " ".join(f"w{int(i)}" for i in ids)


def _events(engine, prompt, rule, denoise):
  """The events of one request through a running scheduler."""
  scheduler = Scheduler(engine, Words(), max_waiting=4)
  scheduler.start()
  events, done = [], threading.Event()

  def emit(event):
    events.append(event)
    if event.kind in ("done", "error"):
      done.set()
  scheduler.submit(Request(list(prompt), GEN, rule, 0.0, 3, emit, denoise=denoise))
  try:
    assert done.wait(300), events
  finally:
    scheduler.stop(timeout=30)
  return events


def test_canvas_events_are_the_offline_commit_steps_one_forward_each():
  model = live_adapter(tiny_model(3, residual_mode="adapter", attention="block_causal"), 0.05, 9)
  graphdef, params = nnx.split(model)
  rule = UnmaskRule("threshold", 0.3)
  cfg = DecodeConfig(gen_length=GEN, block_size=TINY_BLOCK, mask_id=TINY.mask_id, eos_id=EOS,
                     rule=rule, **TINY_RULES)
  # three iterations a call: the scheduler runs one a call while the request wants the canvas
  engine = BlockEngine(graphdef, params, model.cfg, cfg, EngineShape(2, 2, P, 3),
                       make_mesh(devices=jax.devices()[:1]))
  prompt = np.asarray(jax.random.randint(jax.random.key(1), (6,), 3, TINY.vocab_size))
  plain = _events(engine, prompt, rule, denoise=False)
  events = _events(engine, prompt, rule, denoise=True)
  assert [e for e in events if e.kind != "canvas"] == plain       # the same answer
  canvases = [e.canvas for e in events if e.kind == "canvas"]
  forwards = [c["forwards"] for c in canvases]
  assert forwards == sorted(set(forwards)) and len(forwards) > 2, forwards

  # the offline engine's capture: the step at which each response position was committed
  tokens = np.zeros((1, P), np.int32)
  valid = np.zeros((1, P), bool)
  tokens[0, P - len(prompt):], valid[0, P - len(prompt):] = prompt, True
  key = per_row.request_keys(np.array([3], np.uint32), np.array([0], np.uint32),
                             np.array([0], np.int32))
  run = per_row.make_engine(graphdef, dataclasses.replace(cfg, capture_states=32), 2)
  out = jax.device_get(run(params, tokens, valid, key))
  steps = commit_steps(out.capture, 1, TINY_BLOCK, GEN)[0]
  offline = [set(np.flatnonzero(steps == k).tolist()) for k in range(int(steps.max()) + 1)]
  assert [{p for p, _, _ in c["commits"]} for c in canvases] == offline

  # replayed, the commits are the response the offline engine decodes
  canvas = np.full(GEN, TINY.mask_id)
  for c in canvases:
    for p, token, text in c["commits"]:
      canvas[p] = token
      assert text == f"w{token}"
  decoded = np.asarray(out.tokens[0])
  end = int(np.argmax(decoded == EOS)) + 1 if (decoded == EOS).any() else GEN
  np.testing.assert_array_equal(canvas[:end], decoded[:end])
  usage = next(e for e in events if e.kind == "done").usage
  assert forwards[-1] <= usage["forwards_engine"]


def test_models_flag_and_the_model_a_body_names():
  assert parse_models("base=a/b, orl=c") == [("base", "a/b"), ("orl", "c")]
  for bad, words in [("base=a,base=b", "names a model twice"), ("a/b", "is not NAME=DIR"),
                     ("=a", "is not NAME=DIR"), (",", "--models is empty")]:
    with pytest.raises(ConfigError, match=words):
      parse_models(bad)
  assert named_model(b'{"model": "orl", "prompt": "x"}') == "orl"
  for body in (b'{"model": 3}', b"[1]", b"{not json", b"[" * 100 + b"]" * 100, b"\xff"):
    assert named_model(body) is None


class _Scripted(scripted.ScriptedEngine):
  """The scheduler tests' scripted engine (one block a call), for any iteration count."""

  def dispatch(self, entries, cancel, iterations=None):
    return super().dispatch(entries, cancel)


class _Words(scripted.Words):
  def decode(self, ids, skip_special=True, stop_at_eos=False):
    return super().decode(ids)


def _served(name: str, script: dict, access=keys.OPEN) -> Served:
  engine = _Scripted(script=script)
  scheduler = Scheduler(engine, _Words(), max_waiting=8)
  scheduler.start()
  return Served(name, _Words(), "none", scheduler, ServerMetrics(engine.shape.rows),
                UnmaskRule(), 0.0, True, RULES, 8, engine.cfg.gen_length, access=access,
                block_size=None, max_body_bytes=1 << 20)


def test_two_models_behind_one_port_each_answers_the_requests_that_name_it():
  from starlette.testclient import TestClient
  access = keys.Access(api_keys=("k",), admin_keys=(), reload_root="", key_probes=False)
  models = [_served("base", {5: 2}, access), _served("orl", {5: 6}, access)]
  client = TestClient(front(models))
  auth = {"Authorization": "Bearer k"}
  try:
    page = client.get("/")
    assert page.status_code == 200 and "playground.js" in page.text      # open: no key
    assert "orl_denoise: true" in client.get("/playground.js").text
    assert client.get("/v1/models").status_code == 401
    assert [m["id"] for m in client.get("/v1/models", headers=auth).json()["data"]] == [
        "base", "orl"]
    texts = {}
    for name in ("base", "orl"):
      body = client.post("/v1/completions", headers=auth,
                         json={"model": name, "prompt": "w5 w6"}).json()
      assert body["model"] == name, body
      texts[name] = body["choices"][0]["text"]
    assert texts == {"base": "w5 w6", "orl": "w5 w6 w7 w8 w9 w10"}       # each its script
    unknown = client.post("/v1/completions", headers=auth, json={"model": "x", "prompt": "w5"})
    assert unknown.status_code == 404 and unknown.json()["error"]["message"] == (
        "model 'x' is not served here; GET /v1/models lists 'base', 'orl'")
    assert client.post("/v1/completions", json={"model": "orl", "prompt": "w5"}
                       ).status_code == 401
    missing = client.post("/v1/completions", headers=auth, json={"prompt": "w5"})
    assert missing.status_code == 400 and "missing field 'model'" in missing.text
    refused = client.post("/v1/completions", headers=auth,
                          json={"model": "orl", "prompt": "w5", "orl_denoise": True})
    assert refused.status_code == 400 and "set stream to true" in refused.text
    with client.stream("POST", "/v1/chat/completions", headers=auth, json={
        "model": "orl", "messages": [{"role": "user", "content": "w5"}], "stream": True,
        "orl_denoise": True}) as stream:
      chunks = [json.loads(line[6:]) for line in stream.iter_lines()
                if line.startswith("data: {")]
    canvases = [c["choices"][0]["orl_denoise"] for c in chunks
                if "orl_denoise" in c["choices"][0]]
    # a scripted engine shows no block in progress: its canvas arrives when the choice ends
    assert [[p for p, _, _ in c["commits"]] for c in canvases] == [list(range(8))]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == texts["orl"]
  finally:
    for m in models:
      m.scheduler.stop(timeout=10)
