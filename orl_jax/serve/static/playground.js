// The playground (docs/serving.md#the-playground): one prompt to every served model, each
// streamed with `orl_denoise`, whose chunks carry one forward's commits:
//   choices[0].orl_denoise = {forwards, length, block_size, lead, mask_id, eos_id,
//                             commits: [[position, token id, token text], ...]}
// No build step and nothing fetched from elsewhere: this file is served as it is.
"use strict";

const $ = (id) => document.getElementById(id);
const panes = new Map();     // model name -> its pane's elements and state

function makePane(name) {
  const pane = document.createElement("section");
  pane.className = "pane";
  pane.dataset.model = name;
  pane.dataset.state = "idle";
  const title = document.createElement("h2");
  title.textContent = name;
  const status = document.createElement("div");
  status.className = "status";
  const canvas = document.createElement("div");
  canvas.className = "canvas";
  const text = document.createElement("div");
  text.className = "text";
  pane.append(title, status, canvas, text);
  $("panes").append(pane);
  panes.set(name, {pane, title, status, canvas, text, cells: [], length: 0});
}

// Blue for the first forward to red for the last a response can take (`scale`: its positions
// and blocks, a forward each at most), on a log scale: most tokens come early.
function colour(forward, scale) {
  const x = Math.log(Math.max(1, forward)) / Math.log(Math.max(2, scale));
  const hue = 220 * (1 - Math.min(1, x));
  return `hsl(${hue.toFixed(0)}, 75%, 78%)`;
}

function drawCanvas(p, d) {
  p.length = d.length;
  p.scale = d.length + Math.ceil((d.length + d.lead) / d.block_size);
  p.canvas.replaceChildren();
  p.cells = [];
  for (let i = 0; i < d.length; i++) {
    const cell = document.createElement("span");
    cell.className = "cell masked";
    if ((i + d.lead) % d.block_size === 0 && i > 0) cell.classList.add("block-start");
    cell.textContent = "?";
    p.canvas.append(cell);
    p.cells.push(cell);
  }
}

function commit(p, d) {
  if (p.cells.length !== d.length) drawCanvas(p, d);
  for (const [pos, id, text] of d.commits) {
    const cell = p.cells[pos];
    cell.className = cell.className.replace(/\b(masked|committed|eos)\b/g, "").trim();
    if (pos > 0 && (pos + d.lead) % d.block_size === 0) cell.classList.add("block-start");
    if (id === d.mask_id) {
      cell.classList.add("masked");
      cell.style.background = "";
      cell.textContent = "?";
      continue;
    }
    cell.classList.add("committed");
    if (id === d.eos_id) cell.classList.add("eos");
    cell.textContent = id === d.eos_id ? "eos" : (text.trim() === "" ? "\u2423" : text);
    const step = document.createElement("sup");
    step.textContent = d.forwards;
    cell.append(step);
    cell.dataset.forward = d.forwards;
    cell.title = `token ${id}, committed at forward ${d.forwards}`;
    cell.style.background = colour(d.forwards, p.scale);
  }
  p.pane.dataset.forwards = d.forwards;
  p.pane.dataset.updates = Number(p.pane.dataset.updates || 0) + 1;
  p.status.textContent = `forward ${d.forwards}`;
}

function finish(p, usage, reason) {
  const eos = p.cells.findIndex((c) => c.classList.contains("eos"));
  if (eos >= 0) p.cells.slice(eos + 1).forEach((c) => c.classList.add("after-end"));
  p.pane.dataset.state = "done";
  p.pane.dataset.forwards = usage.forwards;
  p.status.textContent = `finished (${reason}): ${usage.forwards} forwards, ` +
    `${usage.generated_tokens} tokens, TPF ${usage.tpf.toFixed(2)}`;
}

function fail(p, message) {
  p.pane.dataset.state = "error";
  p.status.textContent = message;
}

function onChunk(p, chunk) {
  if (chunk.error) { fail(p, chunk.error.message); return; }
  const choice = chunk.choices[0];
  if (!choice) return;
  if (choice.orl_denoise) commit(p, choice.orl_denoise);
  const text = choice.text ?? (choice.delta && choice.delta.content) ?? "";
  p.text.textContent += text;
  if (choice.finish_reason && chunk.usage) finish(p, chunk.usage, choice.finish_reason);
}

async function ask(name, body, key) {
  const p = panes.get(name);
  p.pane.dataset.state = "waiting";
  p.pane.dataset.updates = 0;
  p.pane.querySelectorAll(".badge").forEach((b) => b.remove());
  p.status.textContent = "waiting for the engine";
  p.text.textContent = "";
  p.canvas.replaceChildren();
  p.cells = [];
  const headers = {"Content-Type": "application/json"};
  if (key) headers["Authorization"] = `Bearer ${key}`;
  const route = $("chat").checked ? "/v1/chat/completions" : "/v1/completions";
  const request = {...body, model: name};
  try {
    const response = await fetch(route, {method: "POST", headers, body: JSON.stringify(request)});
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      fail(p, `${response.status}: ${error.error ? error.error.message : response.statusText}`);
      return;
    }
    p.pane.dataset.state = "streaming";
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = event.replace(/^data: /, "");
        if (data !== "[DONE]") onChunk(p, JSON.parse(data));
      }
    }
    if (p.pane.dataset.state === "streaming") fail(p, "the stream ended without a finish");
  } catch (e) {
    fail(p, String(e));
  }
}

function markFewest() {
  const done = [...panes.values()].filter((p) => p.pane.dataset.state === "done");
  if (done.length < 2 || done.length !== panes.size) return;
  const counts = done.map((p) => Number(p.pane.dataset.forwards));
  const fewest = Math.min(...counts);
  if (counts.every((n) => n === fewest)) return;     // a tie: no pane is ahead
  for (const p of done) {
    if (Number(p.pane.dataset.forwards) !== fewest) continue;
    const badge = document.createElement("span");
    badge.className = "badge";
    badge.textContent = "fewest forwards";
    p.title.append(badge);
  }
}

async function send(event) {
  event.preventDefault();
  const body = {stream: true, orl_denoise: true, seed: Number($("seed").value || 0)};
  const prompt = $("prompt").value;
  if ($("chat").checked) body.messages = [{role: "user", content: prompt}];
  else body.prompt = prompt;
  if ($("decoder").value.trim()) body.decoder = $("decoder").value.trim();
  if ($("max_tokens").value) body.max_tokens = Number($("max_tokens").value);
  $("send").disabled = true;
  document.body.dataset.state = "asking";
  await Promise.all([...panes.keys()].map((name) => ask(name, body, $("key").value)));
  markFewest();
  $("send").disabled = false;
  document.body.dataset.state = "answered";
}

async function start() {
  const key = $("key").value;
  const headers = key ? {"Authorization": `Bearer ${key}`} : {};
  const response = await fetch("/v1/models", {headers});
  if (!response.ok) {
    $("message").textContent = `GET /v1/models: ${response.status} (this server may need an ` +
      "API key: enter it above)";
    return;
  }
  const models = (await response.json()).data.map((m) => m.id);
  models.forEach(makePane);
  $("message").textContent = `serving ${models.join(", ")}`;
  document.body.dataset.state = "ready";
}

$("ask").addEventListener("submit", (event) => {
  if (panes.size) send(event); else event.preventDefault();
});
$("key").addEventListener("change", () => { if (!panes.size) start(); });
start();
