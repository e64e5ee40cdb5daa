"""The web playground served at `/`: one self-contained page (no CDN, no external file, no build step) with two
views over the same sampling controls.

- Completion: streams a completion from `/v1/completions` and shows each token's probability on hover (tinted by
  it: pale = likely).
- Chat (`/#chat`): a conversation with a system prompt, streamed from `/v1/chat/completions`, so the server renders
  it in the model's chat template (gpt2.tokenizer.chat). The page keeps the history and sends it whole each turn;
  Stop aborts the fetch (the server cancels the sequence when the connection closes) and keeps the reply so far.

The controls are the API's fields: temperature, top_p, top_k, presence_penalty, frequency_penalty, max_tokens,
seed, and a JSON schema sent as OpenAI's `response_format: {"type": "json_schema", ...}`. Model text is only
ever written into the page as text (textContent / text nodes), never parsed as HTML. The page keeps its settings
in itself; with `--api-key` the key is typed into the page's key field.
"""

PLAYGROUND_HTML = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpt2 playground</title>
<style>
  :root { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; background: #f6f6f4; }
  body { max-width: 980px; margin: 0 auto; padding: 24px; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  .sub { color: #666; font-size: 13px; margin-bottom: 12px; }
  textarea { width: 100%; box-sizing: border-box; min-height: 120px; font: 15px/1.5 ui-monospace, Menlo, monospace;
             padding: 10px; border: 1px solid #ccc; border-radius: 8px; background: #fff; }
  .tabs { display: flex; gap: 4px; margin: 12px 0; border-bottom: 1px solid #ccc; }
  .tabs button { background: transparent; color: #444; border-radius: 8px 8px 0 0; padding: 6px 16px; }
  .tabs button[aria-selected=true] { background: #fff; color: #1d1d1f; border: 1px solid #ccc; border-bottom: 0;
                                     margin-bottom: -1px; }
  .controls { display: flex; flex-wrap: wrap; gap: 14px; align-items: end; margin: 12px 0; }
  .actions { display: flex; gap: 10px; margin: 10px 0; }
  label { font-size: 13px; color: #444; display: flex; flex-direction: column; gap: 4px; }
  input[type=number], input[type=password] { width: 76px; padding: 4px 6px; border: 1px solid #ccc;
                                             border-radius: 6px; }
  details { font-size: 13px; color: #444; margin-bottom: 8px; }
  details textarea { min-height: 90px; font-size: 13px; margin-top: 6px; }
  output { font-variant-numeric: tabular-nums; }
  button { padding: 8px 18px; border: 0; border-radius: 8px; background: #2458d6; color: #fff; font-size: 15px;
           cursor: pointer; }
  button.secondary { background: #888; }
  button:disabled { opacity: 0.5; cursor: default; }
  #output { white-space: pre-wrap; font: 15px/1.6 ui-monospace, Menlo, monospace; background: #fff;
            border: 1px solid #ccc; border-radius: 8px; padding: 12px; min-height: 160px; }
  #output .prompt { color: #777; }
  #output .tok { border-radius: 3px; }
  #output .tok:hover { outline: 1px solid #2458d6; }
  #system { min-height: 48px; }
  #message { min-height: 64px; }
  #chat-log { display: flex; flex-direction: column; gap: 10px; margin: 12px 0; }
  .msg { max-width: 85%; border-radius: 10px; padding: 8px 12px; border: 1px solid #ddd; background: #fff; }
  .msg.user { align-self: flex-end; background: #e8efff; border-color: #c9d6f5; }
  .msg .role { font-size: 11px; color: #777; text-transform: uppercase; letter-spacing: 0.04em; }
  .msg .content { white-space: pre-wrap; overflow-wrap: anywhere; font: 15px/1.5 ui-monospace, Menlo, monospace; }
  .msg.streaming .content::after { content: "▍"; color: #2458d6; }
  .status { font-size: 13px; color: #666; margin-top: 8px; min-height: 1.2em; }
  .status.error { color: #b3261e; }
  #tip { position: fixed; pointer-events: none; background: #222; color: #fff; font: 12px/1.4 ui-monospace, monospace;
         padding: 6px 8px; border-radius: 6px; white-space: pre; display: none; z-index: 10; }
</style>
</head>
<body>
<h1>gpt2 playground</h1>
<div class="sub">Model <b id="model">…</b></div>
<div class="tabs" role="tablist">
  <button id="tab-completion" role="tab" data-view="completion">Completion</button>
  <button id="tab-chat" role="tab" data-view="chat">Chat</button>
</div>
<div class="controls">
  <label>temperature <output id="temperature-value">1.0</output>
    <input id="temperature" type="range" min="0" max="2" step="0.05" value="1"></label>
  <label>top-p <output id="top-p-value">1.00</output>
    <input id="top-p" type="range" min="0.05" max="1" step="0.05" value="1"></label>
  <label>top-k <input id="top-k" type="number" min="1" placeholder="off"></label>
  <label>presence penalty <input id="presence-penalty" type="number" min="-2" max="2" step="0.1" value="0"></label>
  <label>frequency penalty <input id="frequency-penalty" type="number" min="-2" max="2" step="0.1" value="0"></label>
  <label>max tokens <input id="max-tokens" type="number" min="1" max="1024" value="64"></label>
  <label>seed <input id="seed" type="number" placeholder="random"></label>
  <label>API key <input id="api-key" type="password" placeholder="(none)"></label>
</div>
<details id="schema-box">
  <summary>JSON schema (the reply follows it; empty: free text)</summary>
  <textarea id="json-schema" spellcheck="false"
            placeholder='{"type": "object", "properties": {"answer": {"type": "integer"}}}'></textarea>
</details>

<section id="completion-view" role="tabpanel">
  <div class="sub">streamed from <code>/v1/completions</code> · hover a token for its probability · Ctrl+Enter
  generates</div>
  <textarea id="prompt" spellcheck="false">The meaning of life is</textarea>
  <div class="actions">
    <button id="generate">Generate</button>
    <button id="stop" class="secondary" disabled>Stop</button>
  </div>
  <div id="output"></div>
  <div id="status" class="status"></div>
</section>

<section id="chat-view" role="tabpanel" hidden>
  <div class="sub">streamed from <code>/v1/chat/completions</code>: the server renders the conversation in the model's
  chat template · Enter sends, Shift+Enter starts a new line</div>
  <label>system prompt <textarea id="system" spellcheck="false" placeholder="(none)"></textarea></label>
  <div id="chat-log" aria-live="polite"></div>
  <textarea id="message" spellcheck="false" placeholder="Message"></textarea>
  <div class="actions">
    <button id="send">Send</button>
    <button id="chat-stop" class="secondary" disabled>Stop</button>
    <button id="new-chat" class="secondary">New chat</button>
  </div>
  <div id="chat-status" class="status"></div>
</section>
<div id="tip"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let model = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setStatus(id, text, isError) {
  $(id).textContent = text;
  $(id).className = isError ? "status error" : "status";
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
    model = body.data[0].id;
    $("model").textContent = model;
    for (const id of ["status", "chat-status"]) setStatus(id, "");
  } catch (err) {
    $("model").textContent = "?";
    for (const id of ["status", "chat-status"]) setStatus(id, "Could not list the models: " + err.message, true);
  }
}

// ------------------------------------------------------------------------------------ tabs
function showView(view) {
  for (const tab of document.querySelectorAll(".tabs button")) {
    const shown = tab.dataset.view === view;
    tab.setAttribute("aria-selected", String(shown));
    $(tab.dataset.view + "-view").hidden = !shown;
  }
  history.replaceState(null, "", view === "chat" ? "#chat" : location.pathname + location.search);
}
for (const tab of document.querySelectorAll(".tabs button")) {
  tab.addEventListener("click", () => showView(tab.dataset.view));
}
showView(location.hash === "#chat" ? "chat" : "completion");

// ------------------------------------------------------------------------------------ shared controls
for (const [id, digits] of [["temperature", 2], ["top-p", 2]]) {
  const show = () => { $(id + "-value").textContent = Number($(id).value).toFixed(digits); };
  $(id).addEventListener("input", show);
  show();
}
$("api-key").addEventListener("change", loadModel);

// The sampling fields of a request, as the API names them; an Error naming the control that is wrong.
function samplingFields() {
  const fields = {
    max_tokens: Number($("max-tokens").value) || 64,
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    presence_penalty: Number($("presence-penalty").value),
    frequency_penalty: Number($("frequency-penalty").value),
  };
  if ($("top-k").value !== "") fields.top_k = Number($("top-k").value);
  if ($("seed").value !== "") fields.seed = Number($("seed").value);
  const schemaText = $("json-schema").value.trim();
  if (schemaText) {
    let schema;
    try { schema = JSON.parse(schemaText); } catch (err) {
      throw new Error("the JSON schema is not valid JSON (" + err.message + "); fix it or empty the box");
    }
    if (schema === null || typeof schema !== "object" || Array.isArray(schema)) {
      throw new Error("the JSON schema must be a JSON object, such as {\"type\": \"object\"}");
    }
    fields.response_format = { type: "json_schema", json_schema: { name: "playground", schema: schema } };
  }
  return fields;
}

// POST `body` to `url` and hand each server-sent event's chunk to `onChunk`, until the stream ends; throws the
// server's error message (or an AbortError when `signal` aborts).
async function streamChunks(url, body, signal, onChunk) {
  const response = await fetch(url, {
    method: "POST", headers: headers(), body: JSON.stringify(body), signal: signal,
  });
  if (!response.ok) {
    const error = await response.json().catch(() => ({}));
    throw new Error(error.error ? error.error.message : response.status + " " + response.statusText);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") continue;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      onChunk(chunk);
    }
  }
}

function summary(finish, usage, started) {
  const seconds = (performance.now() - started) / 1000;
  const n = usage ? usage.completion_tokens : 0;
  const prompt = usage ? " · prompt " + usage.prompt_tokens + " tokens" : "";
  return "done (" + (finish || "?") + "): " + n + " tokens in " + seconds.toFixed(2) + " s" + prompt;
}

// ------------------------------------------------------------------------------------ completion
let controller = null;

function tint(p) {  // likely tokens pale, unlikely ones strong
  const alpha = Math.min(0.55, (1 - p) * 0.55).toFixed(3);
  return "rgba(226, 120, 40, " + alpha + ")";
}

function percent(p) {  // small probabilities keep two significant digits
  return p >= 0.0001 ? (p * 100).toFixed(2) + "%" : (p * 100).toExponential(1) + "%";
}

function describe(tokens) {
  return tokens.map((t) => {
    const lines = [JSON.stringify(t.token) + "  p = " + percent(t.p)];
    for (const [alt, lp] of t.top) lines.push("   " + JSON.stringify(alt).padEnd(16) + percent(Math.exp(lp)));
    return lines.join("\n");
  }).join("\n");
}

function addPiece(text, tokens) {
  const span = document.createElement("span");
  span.textContent = text;
  if (tokens.length) {
    const p = tokens.reduce((acc, t) => acc * t.p, 1);
    span.className = "tok";
    span.style.background = tint(p);
    span.dataset.tip = describe(tokens);
  }
  $("output").appendChild(span);
}

$("output").addEventListener("mousemove", (event) => {
  const tip = $("tip");
  const target = event.target;
  if (target.dataset && target.dataset.tip) {
    tip.textContent = target.dataset.tip;
    tip.style.display = "block";
    tip.style.left = (event.clientX + 12) + "px";
    tip.style.top = (event.clientY + 14) + "px";
  } else {
    tip.style.display = "none";
  }
});
$("output").addEventListener("mouseleave", () => { $("tip").style.display = "none"; });

async function generate() {
  if (controller) return;
  if (!model) await loadModel();
  if (!model) return;
  let fields;
  try { fields = samplingFields(); } catch (err) { setStatus("status", err.message, true); return; }
  const out = $("output");
  out.textContent = "";
  const promptSpan = document.createElement("span");
  promptSpan.className = "prompt";
  promptSpan.textContent = $("prompt").value;
  out.appendChild(promptSpan);
  const body = {
    model: model, prompt: $("prompt").value, ...fields, logprobs: 5, stream: true,
    stream_options: { include_usage: true },
  };
  controller = new AbortController();
  $("generate").disabled = true;
  $("stop").disabled = false;
  setStatus("status", "generating…");
  const started = performance.now();
  let pending = [];  // tokens whose text has not been shown yet (held back by the server)
  let finish = null, usage = null;
  try {
    await streamChunks("/v1/completions", body, controller.signal, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const lp = choice.logprobs;
        if (lp) {
          lp.tokens.forEach((token, i) => {
            const top = Object.entries(lp.top_logprobs[i] || {});
            pending.push({ token: token, p: Math.exp(lp.token_logprobs[i]), top: top });
          });
        }
        if (choice.text) { addPiece(choice.text, pending); pending = []; }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
    setStatus("status", summary(finish, usage, started));
  } catch (err) {
    if (err.name === "AbortError") setStatus("status", "stopped");
    else setStatus("status", "Error: " + err.message, true);
  } finally {
    $("generate").disabled = false;
    $("stop").disabled = true;
    controller = null;
  }
}

$("generate").addEventListener("click", generate);
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) generate();
});

// ------------------------------------------------------------------------------------ chat
const conversation = [];  // the turns so far, {role: "user" | "assistant", content}; the system prompt is read per turn
let chatController = null;

// A message's box in the log; returns its content element (text goes in as text, never as HTML).
function addMessage(role, text) {
  const box = document.createElement("div");
  box.className = "msg " + role;
  box.dataset.role = role;
  const label = document.createElement("div");
  label.className = "role";
  label.textContent = role;
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  box.append(label, content);
  $("chat-log").appendChild(box);
  box.scrollIntoView({ block: "end" });
  return content;
}

async function send() {
  const text = $("message").value;
  if (chatController || !text.trim()) return;
  if (!model) await loadModel();
  if (!model) return;
  let fields;
  try { fields = samplingFields(); } catch (err) { setStatus("chat-status", err.message, true); return; }
  const system = $("system").value;
  const turn = { role: "user", content: text };
  const messages = [...(system.trim() ? [{ role: "system", content: system }] : []), ...conversation, turn];
  const body = { model: model, messages: messages, ...fields, stream: true, stream_options: { include_usage: true } };
  conversation.push(turn);
  const question = addMessage("user", text).parentNode;
  const reply = addMessage("assistant", "");
  reply.parentNode.classList.add("streaming");
  $("message").value = "";
  chatController = new AbortController();
  $("send").disabled = true;
  $("chat-stop").disabled = false;
  setStatus("chat-status", "generating…");
  const started = performance.now();
  let answer = "", finish = null, usage = null;
  try {
    await streamChunks("/v1/chat/completions", body, chatController.signal, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const piece = choice.delta && choice.delta.content;
        if (piece) { answer += piece; reply.append(piece); }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    });
    conversation.push({ role: "assistant", content: answer });
    setStatus("chat-status", summary(finish, usage, started));
  } catch (err) {
    if (err.name === "AbortError") {  // stopped: the reply so far stays in the conversation, as shown
      if (reply.isConnected) conversation.push({ role: "assistant", content: answer });  // (not after New chat)
      setStatus("chat-status", "stopped");
    } else {  // the turn did not happen: take it back, the message returns to the box
      conversation.pop();
      question.remove();
      reply.parentNode.remove();
      $("message").value = text;
      setStatus("chat-status", "Error: " + err.message, true);
    }
  } finally {
    reply.parentNode.classList.remove("streaming");
    $("send").disabled = false;
    $("chat-stop").disabled = true;
    chatController = null;
  }
}

$("send").addEventListener("click", send);
$("chat-stop").addEventListener("click", () => { if (chatController) chatController.abort(); });
$("new-chat").addEventListener("click", () => {
  if (chatController) chatController.abort();
  conversation.length = 0;
  $("chat-log").textContent = "";
  setStatus("chat-status", "");
});
$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
loadModel();
</script>
</body>
</html>
"""
