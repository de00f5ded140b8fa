// Retention explorer: plain browser JavaScript, no libraries and no build step.
// It talks to the same HTTP API as any client (GET /models, GET /models/{name}, then POST to the model's
// route with explain=true) and draws everything itself (inline SVG). Each model's route and input fields
// come from GET /models, so a task the page has never heard of is listed, sent and shown too: a form of
// one input per field and its response as a table (the generic view).
"use strict";

// The tasks with a form and a result view of their own are those whose face ships one (VIEWS, from
// explorer/views.js, each task's own script: its result's title, whether it asks a question, its
// text box's label, how it shades an explanation and shows an answer); any other task served gets the
// generic ones.
const GENERIC_TITLE = "Result";
// Response fields every task's answer carries beside its own (the generic view leaves them out).
const ENVELOPE = ["model", "usage", "explanations"];
const SAMPLE_TEXT =
  "The film opens slowly, but the second half is a triumph: sharp writing, a score that never " +
  "intrudes, and a lead performance that carries every scene. I left the cinema smiling.";

const state = { models: [], model: null, manifest: null, running: false, again: false, last: null };
const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, message, retryAfter) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

// ------------------------------------------------------------------ HTTP
function authHeaders() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path, body) {
  const init = { headers: { ...authHeaders() } };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "cannot reach the server", null);
  }
  let payload = null;
  try {
    payload = await response.json();
  } catch (err) {
    payload = null;
  }
  if (!response.ok) {
    const message = payload && payload.error && payload.error.message ? payload.error.message : response.statusText;
    throw new ApiError(response.status, message, response.headers.get("Retry-After"));
  }
  return payload;
}

function explainError(err) {
  if (!(err instanceof ApiError)) return `Unexpected error: ${err.message}`;
  if (err.status === 0) return "The server cannot be reached. Is it running?";
  if (err.status === 401) return "401 Unauthorized: the server needs its API key. Enter the right key above and try again.";
  if (err.status === 429) {
    const wait = err.retryAfter ? ` Retry in ${err.retryAfter} s.` : "";
    return `429 Too Many Requests: the server is overloaded (${err.message}).${wait}`;
  }
  if (err.status === 413) return `413: the input is too large (${err.message}).`;
  if (err.status >= 400 && err.status < 500) return `${err.status}: ${err.message}`;
  return `${err.status}: the server failed (${err.message}).`;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

// ------------------------------------------------------------------ models
async function loadModels() {
  showError("");
  try {
    const listing = await api("models");
    state.models = listing.models;
  } catch (err) {
    showError(explainError(err));
    return;
  }
  const select = $("model");
  select.replaceChildren();
  for (const model of state.models) {
    const option = document.createElement("option");
    option.value = model.name;
    option.textContent = `${model.name} (${model.task})${model.explain ? "" : " - exported without survival depth"}`;
    option.disabled = !model.explain || !model.route;
    select.appendChild(option);
  }
  const usable = state.models.find((m) => m.explain && m.route);
  select.disabled = !usable;
  if (!usable) {
    showError("No loaded model can explain: re-export a model to get its survival depth.");
    return;
  }
  select.value = usable.name;
  await selectModel();
}

async function selectModel() {
  const name = $("model").value;
  state.model = state.models.find((m) => m.name === name) || null;
  state.manifest = null;
  $("run").disabled = true; // until this model's manifest is here
  delete document.body.dataset.model;
  if (!state.model) return;
  let detail;
  try {
    detail = await api(`models/${encodeURIComponent(name)}`);
  } catch (err) {
    showError(explainError(err));
    return;
  }
  if ($("model").value !== name) return; // another model was picked meanwhile: its call wins
  state.manifest = detail.manifest;
  const task = state.model.task;
  $("task").textContent = `task: ${task}, ${state.manifest.schedule.num_points} layers, default ρ ${state.model.default_rho}`;
  const view = VIEWS[task];
  $("question-row").hidden = !(view && view.question);
  $("text-row").hidden = !view;
  $("text-label").textContent = (view && view.textLabel) || "Text";
  buildFields(view ? [] : state.model.fields, state.model.list_fields || []);
  $("result-title").textContent = view ? view.title : GENERIC_TITLE;
  $("run").disabled = false;
  state.last = null;
  drawCharts();
  document.body.dataset.model = name; // ready for this model
}

// ------------------------------------------------------------------ a request
// The generic form: one text box per input field the server lists for the model's route; a list field
// (a reranker's passages) takes one item per line.
function buildFields(fields, listFields) {
  const box = $("fields");
  box.replaceChildren();
  for (const name of fields) {
    const row = element("div", undefined, "row stacked");
    const label = element("label", listFields.includes(name) ? `${name} (one per line)` : name);
    const input = element("textarea");
    input.id = `field-${name}`;
    input.rows = listFields.includes(name) ? 5 : 2;
    input.spellcheck = false;
    input.dataset.field = name;
    input.dataset.list = String(listFields.includes(name));
    label.htmlFor = input.id;
    row.append(label, input);
    box.appendChild(row);
  }
  box.hidden = fields.length === 0;
}

function fieldValues() {
  const values = {};
  for (const input of $("fields").querySelectorAll("textarea")) {
    values[input.dataset.field] =
      input.dataset.list === "true"
        ? input.value.split("\n").map((line) => line.trim()).filter((line) => line.length > 0)
        : input.value;
  }
  return values;
}

// The body is built from the input fields the server lists for the route (GET /models), for every task:
// a field with a box of the dedicated views (text, question, context) reads that box, any other the
// generic form's. No table of bodies per task here.
const FIELD_BOXES = { text: "text", context: "text", question: "question" };

function requestBody(rho) {
  const generic = fieldValues();
  const values = {};
  for (const name of state.model.fields) {
    values[name] = name in generic ? generic[name] : $(FIELD_BOXES[name]).value;
  }
  return { ...values, rho, explain: true };
}

async function run() {
  if (!state.model) return;
  if (state.running) {
    state.again = true; // one more run with the latest ρ once this one is back
    return;
  }
  state.running = true;
  document.body.dataset.state = "busy";
  const task = state.model.task;
  const rho = Number($("rho").value);
  // Relative to the page, as every call here (a server behind a path prefix works unchanged).
  const path = `${state.model.route.replace(/^\//, "")}?model=${encodeURIComponent(state.model.name)}`;
  const request = requestBody(rho);
  const begin = performance.now();
  try {
    const body = await api(path, request);
    showError("");
    state.last = { body, task, rho, request, roundTrip: performance.now() - begin };
    render();
  } catch (err) {
    showError(explainError(err));
  } finally {
    state.running = false;
    document.body.dataset.runs = String(Number(document.body.dataset.runs) + 1);
    document.body.dataset.state = "idle";
  }
  if (state.again) {
    state.again = false;
    run();
  }
}

// ------------------------------------------------------------------ rendering
function depthColor(depth, layers) {
  const share = layers > 0 ? depth / layers : 1;
  const lightness = 96 - 58 * share; // kept to the end: dark blue; dropped at once: almost white
  return { background: `hsl(214, 75%, ${lightness}%)`, color: lightness < 60 ? "white" : "#1d2330" };
}

function drawLegend(layers) {
  const legend = $("legend");
  legend.replaceChildren(document.createTextNode("layers entered:"));
  for (let depth = 0; depth <= layers; depth++) {
    const swatch = document.createElement("span");
    const colors = depthColor(depth, layers);
    swatch.className = "swatch";
    swatch.style.background = colors.background;
    swatch.style.color = colors.color;
    swatch.textContent = String(depth);
    legend.appendChild(swatch);
  }
}

// The text with one span per token (data-depth), whatever lies between tokens as plain text.
function shade(container, title, text, tokens, layers, answer) {
  container.replaceChildren();
  if (title) {
    const heading = document.createElement("span");
    heading.className = "segment-title";
    heading.textContent = title;
    container.appendChild(heading);
  }
  let cursor = 0;
  for (const token of tokens) {
    if (token.start < cursor) continue; // never overlap (offsets come sorted)
    if (token.start > cursor) container.appendChild(document.createTextNode(text.slice(cursor, token.start)));
    const span = document.createElement("span");
    const colors = depthColor(token.depth, layers);
    span.className = "tok";
    span.dataset.depth = String(token.depth);
    span.style.background = colors.background;
    span.style.color = colors.color;
    span.title = `stayed in ${token.depth} of ${layers} layers`;
    if (answer && token.start >= answer.start && token.end <= answer.end && answer.end > answer.start) {
      span.classList.add("answer");
    }
    span.textContent = text.slice(token.start, token.end);
    container.appendChild(span);
    cursor = token.end;
  }
  if (cursor < text.length) container.appendChild(document.createTextNode(text.slice(cursor)));
}

// The text a segment's offsets index: the request field of its name, item i of a list field for
// "name[i]", or the explanation's own document (a text the codec built: /summarize's).
function segmentText(segment, request, explanation) {
  const item = /^(.+)\[(\d+)\]$/.exec(segment);
  if (item && Array.isArray(request[item[1]])) return request[item[1]][Number(item[2])];
  if (typeof request[segment] === "string") return request[segment];
  return segment === "document" ? explanation.document : null;
}

// Every segment of the input, in the order the explanation gives them, each shaded under its name.
function renderSegments(explanation, request, layers) {
  const box = $("shaded");
  box.replaceChildren();
  const segments = [...new Set(explanation.tokens.map((t) => t.segment))];
  for (const segment of segments) {
    const text = segmentText(segment, request, explanation);
    if (text == null) continue;
    const part = element("div", undefined, "segment");
    part.dataset.segment = segment;
    shade(part, segment, text, explanation.tokens.filter((t) => t.segment === segment), layers, null);
    box.appendChild(part);
  }
}

function renderTokens(body, task, request) {
  const explanation = body.explanations[0];
  const layers = explanation.num_layers;
  drawLegend(layers);
  const of = (segment) => explanation.tokens.filter((t) => t.segment === segment);
  const view = VIEWS[task];
  $("question-shaded").hidden = !(view && view.question);
  if (view) {
    view.shade(explanation, body, of, layers);
  } else {
    renderSegments(explanation, request, layers);
  }
}

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined) node.textContent = text;
  if (className) node.className = className;
  return node;
}

// A number with four decimals, a list of numbers as such, anything else as JSON.
function formatValue(value) {
  if (typeof value === "number") return value.toFixed(4);
  if (Array.isArray(value) && value.every((v) => typeof v === "number")) {
    return value.map((v) => (Number.isInteger(v) ? String(v) : v.toFixed(4))).join(", ");
  }
  return JSON.stringify(value);
}

// The generic result view: every field of the task's answer (the envelope left out), one row each.
function renderFields(body, box) {
  const table = element("table");
  for (const [name, value] of Object.entries(body)) {
    if (ENVELOPE.includes(name) || value === null) continue;
    const row = element("tr");
    row.dataset.field = name;
    row.append(element("td", name, "muted"), element("td", formatValue(value)));
    table.appendChild(row);
  }
  box.appendChild(table);
}

function renderResult(body, task) {
  const box = $("result");
  box.replaceChildren();
  const view = VIEWS[task];
  if (view) {
    view.result(body, box);
  } else {
    renderFields(body, box);
  }
}

function renderUsage(usage, roundTrip) {
  const list = $("usage");
  list.replaceChildren();
  const work = usage.token_work_fraction;
  list.dataset.tokenWork = String(work);
  const rows = [
    ["ρ served", `${usage.rho_effective} (${usage.rho_reason})`],
    ["token-work", `${(100 * work).toFixed(1)}% of dense`],
    ["token-work saved", `${(100 * (1 - work)).toFixed(1)}%`],
    ["tokens read", `${usage.processed_tokens} of ${usage.input_tokens}${usage.truncated ? " (truncated)" : ""}`],
    ["kept per layer", usage.kept_tokens_per_layer.join(" → ")],
    ["latency", `${(1000 * usage.inference_time_s).toFixed(1)} ms inference, ${(1000 * usage.queue_time_s).toFixed(1)} ms queued`],
    ["round trip", `${roundTrip.toFixed(1)} ms (this browser)`],
  ];
  for (const [term, value] of rows) {
    list.append(element("dt", term), element("dd", value));
  }
  $("usage").querySelector("dd:nth-of-type(2)").id = "token-work";
}

function render() {
  const { body, task, request, roundTrip } = state.last;
  renderTokens(body, task, request);
  renderResult(body, task);
  renderUsage(body.usage, roundTrip);
  drawCharts();
}

// ------------------------------------------------------------------ charts (inline SVG)
const SVG = "http://www.w3.org/2000/svg";
const BOX = { left: 44, right: 12, top: 12, bottom: 34, width: 360, height: 220 };

function svgNode(tag, attributes, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== undefined) node.textContent = text;
  return node;
}

// points: [{x, y}] with x = ρ in (0, 1]; marker: the chosen ρ; measured: an extra {x, y} dot.
function lineChart(svg, points, yLabel, marker, measured) {
  svg.replaceChildren();
  if (!points.length) {
    svg.appendChild(svgNode("text", { x: 180, y: 110, "text-anchor": "middle", class: "empty" }, yLabel));
    return;
  }
  const ys = points.map((p) => p.y).concat(measured ? [measured.y] : []);
  let low = Math.min(...ys);
  let high = Math.max(...ys);
  const pad = (high - low) * 0.1 || Math.abs(high) * 0.1 || 0.1;
  low -= pad;
  high += pad;
  const plotW = BOX.width - BOX.left - BOX.right;
  const plotH = BOX.height - BOX.top - BOX.bottom;
  const sx = (x) => BOX.left + x * plotW;
  const sy = (y) => BOX.top + (1 - (y - low) / (high - low)) * plotH;
  for (let i = 0; i <= 4; i++) {
    const y = low + ((high - low) * i) / 4;
    svg.appendChild(svgNode("line", { x1: BOX.left, x2: BOX.width - BOX.right, y1: sy(y), y2: sy(y), class: "grid" }));
    svg.appendChild(svgNode("text", { x: BOX.left - 4, y: sy(y) + 3, "text-anchor": "end" }, y.toFixed(2)));
  }
  for (let i = 0; i <= 5; i++) {
    const x = i / 5;
    svg.appendChild(svgNode("text", { x: sx(x), y: BOX.height - BOX.bottom + 13, "text-anchor": "middle" }, x.toFixed(1)));
  }
  svg.appendChild(svgNode("line", { x1: BOX.left, x2: BOX.left, y1: BOX.top, y2: BOX.height - BOX.bottom, class: "axis" }));
  svg.appendChild(svgNode("line", { x1: BOX.left, x2: BOX.width - BOX.right, y1: BOX.height - BOX.bottom, y2: BOX.height - BOX.bottom, class: "axis" }));
  svg.appendChild(svgNode("text", { x: BOX.left + plotW / 2, y: BOX.height - 4, "text-anchor": "middle" }, "ρ"));
  svg.appendChild(svgNode("text", { x: BOX.left + 4, y: BOX.top + 8 }, yLabel));
  const sorted = [...points].sort((a, b) => a.x - b.x);
  svg.appendChild(svgNode("polyline", { points: sorted.map((p) => `${sx(p.x)},${sy(p.y)}`).join(" "), class: "curve" }));
  for (const p of sorted) svg.appendChild(svgNode("circle", { cx: sx(p.x), cy: sy(p.y), r: 2.5, class: "dot" }));
  if (marker !== null) {
    const line = svgNode("line", { x1: sx(marker), x2: sx(marker), y1: BOX.top, y2: BOX.height - BOX.bottom, class: "marker" });
    line.dataset.rho = String(marker);
    svg.appendChild(line);
  }
  if (measured) svg.appendChild(svgNode("circle", { cx: sx(measured.x), cy: sy(measured.y), r: 4.5, class: "measured" }));
}

function qualityCurve(manifest) {
  const variant = manifest.variants && manifest.variants.fp32;
  return manifest.quality || (variant && variant.quality) || null;
}

// Token-work of one row of n real tokens against ρ, as the model's graph keeps them: asked of the server
// (GET /models/{name}/schedule, retention_core.schedule), which holds the one statement of the schedule.
// Kept per model and length; the chart is drawn again when a curve arrives.
const workCurves = new Map();

function workCurve(name, length) {
  const key = `${name}\n${length}`;
  if (workCurves.has(key)) return workCurves.get(key);
  workCurves.set(key, null); // asked: drawn when it comes
  api(`models/${encodeURIComponent(name)}/schedule?length=${length}`)
    .then((curve) => {
      workCurves.set(key, curve);
      if (state.model && state.model.name === name) drawCharts();
    })
    .catch(() => workCurves.delete(key)); // asked again at the next draw
  return null;
}

function drawCharts() {
  const manifest = state.manifest;
  if (!manifest) return;
  const rho = Number($("rho").value);

  const quality = qualityCurve(manifest);
  const qualityPoints = quality ? quality.points.map((p) => ({ x: p.rho, y: p.value })) : [];
  lineChart($("quality-chart"), qualityPoints, quality ? quality.metric : "no quality curve in the manifest", rho, null);
  $("quality-caption").textContent = quality
    ? `${quality.metric} vs ρ: ${quality.split} split, ${quality.num_examples} examples, ${quality.runtime} (manifest)`
    : "This model's manifest has no quality curve.";

  const speed = manifest.speed;
  const speedPoints = speed ? speed.points.map((p) => ({ x: p.rho, y: p.value })) : [];
  lineChart($("speed-chart"), speedPoints, speed ? "speed-up over ρ = 1" : "no speed curve in the manifest", rho, null);
  $("speed-caption").textContent = speed
    ? `speed-up vs ρ: batch ${speed.batch_size} × ${speed.sequence_length} tokens, ${speed.runtime}, measured at export on ${speed.machine.cpu || "the exporting machine"} (manifest)`
    : "This model's manifest has no speed curve (exported before it was measured).";

  const last = state.last;
  const tokens = last ? Math.max(2, Math.round(last.body.usage.processed_tokens / last.body.usage.rows)) : 128;
  const curve = state.model ? workCurve(state.model.name, tokens) : null;
  const workPoints = curve ? curve.rho.map((x, i) => ({ x, y: curve.token_work[i] })) : [];
  const measured = last ? { x: last.body.usage.rho_effective, y: last.body.usage.token_work_fraction } : null;
  lineChart($("work-chart"), workPoints, "token-work / dense", rho, measured);
  $("work-caption").textContent =
    `encoder token-work vs ρ for a row of ${tokens} tokens (the model's schedule, from the server)` +
    (measured ? "; dot: this request, as the server reported it" : "");
}

// ------------------------------------------------------------------ wiring
function onRho() {
  $("rho-value").textContent = Number($("rho").value).toFixed(2);
  drawCharts();
}

function init() {
  $("text").value = SAMPLE_TEXT;
  $("question").value = "How did the viewer feel?";
  $("load-models").addEventListener("click", loadModels);
  $("model").addEventListener("change", selectModel);
  $("run").addEventListener("click", run);
  $("rho").addEventListener("input", onRho);
  $("rho").addEventListener("change", () => {
    onRho();
    if (state.model && state.last) run(); // after a first run, moving ρ re-runs the request
  });
  $("api-key").addEventListener("keydown", (event) => {
    if (event.key === "Enter") loadModels();
  });
  onRho();
  // Nothing is fetched before the user asks: a server with an API key would answer 401 to a call
  // made before the key is typed.
}

// What the page shows, for scripts that record it (experiments/explorer_screenshot.py writes it beside
// the screenshot).
window.explorer = { state };

init();
