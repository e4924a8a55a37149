"""The playground (`GET /`, docs/serving.md#the-playground) in headless Chromium, on the server
the docs start with two models (`--models`): the page loads, one prompt streams to both
models with each forward's commits drawn on its canvas, both panes finish with the answer and
forward count the API gives for the same request, and a screenshot is written to the test's
folder. Needs Debian's chromium and Playwright's Python package (`make browser` installs both
and runs this file); without them it fails, it does not skip."""
import json
import os
import urllib.error
import urllib.request

import pytest
from playwright.sync_api import sync_playwright

from orl_jax.serve.process import ServerProcess
from tests.support.serve import tiny_problems

pytestmark = [pytest.mark.slow, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
# offline and quiet: no sandbox (containers), no GPU, no network of its own, a fresh profile
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
# the docs' command (docs/serving.md#the-playground)
PLAYGROUND_SERVE = ["--config=configs/tiny.py:eval",
                    "--models=base=assets/tiny_base,warmup=assets/tiny_warmup",
                    "--config.serve.iterations_per_call=1"]


@pytest.fixture(scope="module")
def server():
  with ServerProcess(PLAYGROUND_SERVE) as s:
    yield s


def _request(url: str, path: str, body=None):
  """(status, JSON) of a GET (no body) or a POST."""
  data = None if body is None else json.dumps(body).encode()
  req = urllib.request.Request(url + path, data=data, headers={"Content-Type":
                                                               "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=300) as r:
      return r.status, json.load(r)
  except urllib.error.HTTPError as e:
    return e.code, json.load(e)


def test_two_models_behind_one_port(server):
  status, models = _request(server.url, "/v1/models")
  assert status == 200 and [m["id"] for m in models["data"]] == ["base", "warmup"]
  status, body = _request(server.url, "/v1/completions", {"model": "orl", "prompt": "bob"})
  assert status == 404, body
  assert body["error"]["message"] == ("model 'orl' is not served here; GET /v1/models lists "
                                      "'base', 'warmup'")
  prompt = tiny_problems()[2].prompt
  for name in ("base", "warmup"):
    status, body = _request(server.url, "/v1/completions", {"model": name, "prompt": prompt})
    assert status == 200 and body["model"] == name and body["choices"][0]["text"], body
    assert body["system_fingerprint"] == f"orl-{name}-v1"


def test_the_page_streams_the_prompt_to_both_models_until_both_finish(server, tmp_path):
  assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: `make browser` installs it"
  prompt = tiny_problems()[0].prompt
  with sync_playwright() as p:
    browser = p.chromium.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": 1300, "height": 560})
    page = browser.new_page()
    errors: list = []
    page.on("pageerror", lambda error: errors.append(error))
    page.goto(server.url + "/")
    page.wait_for_selector("body[data-state=ready]", timeout=60_000)
    assert page.eval_on_selector_all(".pane", "ps => ps.map(p => p.dataset.model)") == [
        "base", "warmup"]
    page.fill("#prompt", prompt)
    page.click("#send")
    page.wait_for_selector(".pane[data-state=streaming]", timeout=300_000)
    page.wait_for_selector("body[data-state=answered]", timeout=300_000)
    shot = tmp_path / "playground.png"
    page.screenshot(path=str(shot), full_page=True)
    panes = page.eval_on_selector_all(".pane", """ps => ps.map(p => ({
        state: p.dataset.state, forwards: Number(p.dataset.forwards),
        updates: Number(p.dataset.updates), text: p.querySelector('.text').textContent,
        masked: p.querySelectorAll('.cell.masked').length,
        steps: [...p.querySelectorAll('.cell.committed')].map(c => Number(c.dataset.forward))
    }))""")
    browser.close()
  assert not errors, errors
  for name, pane in zip(("base", "warmup"), panes):
    _, api = _request(server.url, "/v1/completions", {"model": name, "prompt": prompt,
                                                      "seed": 0})
    assert pane["state"] == "done", pane
    assert pane["text"] == api["choices"][0]["text"]
    assert pane["forwards"] == api["usage"]["forwards"]
    # streamed: one update per forward that committed something, the canvas filled in
    # several of them, none after the last
    assert 2 <= pane["updates"] == len(set(pane["steps"])), pane
    assert pane["masked"] == 0 and max(pane["steps"]) <= pane["forwards"], pane
  assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
