"""The web playground served at `/`: one self-contained page (no CDN, no external file) that streams a
completion from `/v1/completions` and shows each token's probability on hover (tinted by it: pale = likely).

It keeps its settings in the page only; with `--api-key` the key is typed into the page's key field.
"""

PLAYGROUND_HTML = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpt2 playground</title>
<style>
  :root { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #1d1d1f; background: #f6f6f4; }
  body { max-width: 980px; margin: 0 auto; padding: 24px; }
  h1 { font-size: 20px; margin: 0 0 4px; }
  .sub { color: #666; font-size: 13px; margin-bottom: 16px; }
  textarea { width: 100%; box-sizing: border-box; min-height: 120px; font: 15px/1.5 ui-monospace, Menlo, monospace;
             padding: 10px; border: 1px solid #ccc; border-radius: 8px; background: #fff; }
  .controls { display: flex; flex-wrap: wrap; gap: 18px; align-items: end; margin: 12px 0; }
  label { font-size: 13px; color: #444; display: flex; flex-direction: column; gap: 4px; }
  input[type=number], input[type=password] { width: 110px; padding: 4px 6px; border: 1px solid #ccc;
                                             border-radius: 6px; }
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
  #status { font-size: 13px; color: #666; margin-top: 8px; min-height: 1.2em; }
  #status.error { color: #b3261e; }
  #tip { position: fixed; pointer-events: none; background: #222; color: #fff; font: 12px/1.4 ui-monospace, monospace;
         padding: 6px 8px; border-radius: 6px; white-space: pre; display: none; z-index: 10; }
</style>
</head>
<body>
<h1>gpt2 playground</h1>
<div class="sub">Model <b id="model">…</b> · streamed from <code>/v1/completions</code> · hover a token for its
probability</div>
<textarea id="prompt" spellcheck="false">The meaning of life is</textarea>
<div class="controls">
  <label>temperature <output id="temperature-value">1.0</output>
    <input id="temperature" type="range" min="0" max="2" step="0.05" value="1"></label>
  <label>top-p <output id="top-p-value">1.00</output>
    <input id="top-p" type="range" min="0.05" max="1" step="0.05" value="1"></label>
  <label>max tokens <input id="max-tokens" type="number" min="1" max="1024" value="64"></label>
  <label>seed <input id="seed" type="number" placeholder="random"></label>
  <label>API key <input id="api-key" type="password" placeholder="(none)"></label>
  <button id="generate">Generate</button>
  <button id="stop" class="secondary" disabled>Stop</button>
</div>
<div id="output"></div>
<div id="status"></div>
<div id="tip"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let model = null;
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setStatus(text, isError) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

async function loadModel() {
  try {
    const response = await fetch("/v1/models", { headers: headers() });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error ? body.error.message : response.statusText);
    model = body.data[0].id;
    $("model").textContent = model;
    setStatus("");
  } catch (err) {
    $("model").textContent = "?";
    setStatus("Could not list the models: " + err.message, true);
  }
}

for (const [id, digits] of [["temperature", 2], ["top-p", 2]]) {
  const show = () => { $(id + "-value").textContent = Number($(id).value).toFixed(digits); };
  $(id).addEventListener("input", show);
  show();
}
$("api-key").addEventListener("change", loadModel);

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
    return lines.join("\\n");
  }).join("\\n");
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
  if (!model) await loadModel();
  if (!model) return;
  const out = $("output");
  out.textContent = "";
  const promptSpan = document.createElement("span");
  promptSpan.className = "prompt";
  promptSpan.textContent = $("prompt").value;
  out.appendChild(promptSpan);
  const body = {
    model: model,
    prompt: $("prompt").value,
    max_tokens: Number($("max-tokens").value) || 64,
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    logprobs: 5,
    stream: true,
    stream_options: { include_usage: true },
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  controller = new AbortController();
  $("generate").disabled = true;
  $("stop").disabled = false;
  setStatus("generating…");
  const started = performance.now();
  let pending = [];  // tokens whose text has not been shown yet (held back by the server)
  let finish = null, usage = null;
  try {
    const response = await fetch("/v1/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
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
      while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") continue;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
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
      }
    }
    const seconds = (performance.now() - started) / 1000;
    const n = usage ? usage.completion_tokens : 0;
    setStatus("done (" + (finish || "?") + "): " + n + " tokens in " + seconds.toFixed(2) + " s");
  } catch (err) {
    if (err.name === "AbortError") setStatus("stopped");
    else setStatus("Error: " + err.message, true);
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
loadModel();
</script>
</body>
</html>
"""
