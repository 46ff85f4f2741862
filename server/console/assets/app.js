// The operator console's page: a token kept in sessionStorage (no cookies),
// sent as Authorization: Bearer on every call of the JSON API under /api/.
"use strict";

const TOKEN_KEY = "idem-console-token";
const $ = (id) => document.getElementById(id);
const state = { auth: true, charts: null, timer: null, queueToken: "", record: null };

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

async function api(path, body) {
  const headers = { "Accept": "application/json" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  const init = { headers, method: body === undefined ? "GET" : "POST", cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new ApiError(res.status, data.code || "", data.message || res.statusText);
  return data;
}

function show(id) {
  for (const s of ["login", "overview", "queue", "record"]) $(s).hidden = s !== id;
  for (const [link, page] of [["nav-overview", "overview"], ["nav-queue", "queue"]]) {
    if (page === id || (id === "record" && page === "queue")) $(link).setAttribute("aria-current", "page");
    else $(link).removeAttribute("aria-current");
  }
}

function fail(err) {
  if (err instanceof ApiError && (err.status === 401 || err.status === 403)) return signIn(err);
  $("error").textContent = err.message;
}

// 401: no token or an unknown one; 403: a token that is not an operator's.
function signIn(err) {
  stopOverview();
  $("nav").hidden = true;
  $("who").hidden = true;
  $("login-error").textContent = !err ? "" :
    err.status === 403 ? "Refused: " + err.message + ". The console needs an operator token." :
    token() ? "Refused: this token is not known to the sidecar." : "";
  sessionStorage.removeItem(TOKEN_KEY);
  show("login");
  $("token").focus();
}

async function start() {
  try {
    const session = await api("/api/session");
    state.auth = session.auth;
    $("principal").textContent = session.auth ? "Signed in as " + session.principal : "No authentication (loopback)";
    $("sign-out").hidden = !session.auth;
    $("nav").hidden = false;
    $("who").hidden = false;
    $("login-error").textContent = "";
    route();
  } catch (err) {
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) signIn(token() ? err : null);
    else $("error").textContent = err.message;
  }
}

function route() {
  $("error").textContent = "";
  const hash = location.hash || "#/overview";
  if (hash.startsWith("#/record?")) {
    stopOverview();
    const q = new URLSearchParams(hash.slice("#/record?".length));
    return openRecord({ tenant: q.get("tenant") || "", operation: q.get("operation") || "", key: q.get("key") || "" });
  }
  if (hash.startsWith("#/queue")) {
    stopOverview();
    show("queue");
    return loadQueue(false);
  }
  show("overview");
  startOverview();
}

// ---- Overview ----

const COLORS = ["#0b57d0", "#b3261e", "#146c2e", "#7d5700", "#6750a4", "#006a6a", "#5f6368"];

function lineChart(canvas, labels) {
  return new Chart(canvas, {
    type: "line",
    data: { labels: [], datasets: labels.map((label, i) => ({
      label, data: [], borderColor: COLORS[i % COLORS.length], backgroundColor: COLORS[i % COLORS.length],
      pointRadius: 0, borderWidth: 2, stepped: false, spanGaps: false })) },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false,
      scales: { x: { ticks: { maxTicksLimit: 6, color: "#4a4a4a" } }, y: { beginAtZero: true, ticks: { color: "#4a4a4a" } } },
      plugins: { legend: { display: labels.length > 1, labels: { color: "#1a1a1a" } } },
    },
  });
}

function makeCharts() {
  const c = {};
  for (const canvas of document.querySelectorAll("canvas[data-chart]")) {
    const name = canvas.dataset.chart;
    const labels = { latency: ["p50", "p99"], waiters: ["waiting"], inflight: ["in flight"], pool: ["in use"],
                     redis: ["closed (up)"], unknown: ["UNKNOWN"], begins: [] }[name];
    c[name] = lineChart(canvas, labels);
  }
  c.redis.options.scales.y.max = 1;
  c.redis.data.datasets[0].stepped = true;
  return c;
}

const num = (v) => (v < 0 ? null : v);

function drawVitals(vitals) {
  const c = state.charts;
  const labels = vitals.samples.map((s) => new Date(s.at).toLocaleTimeString([], { hour12: false }));
  const set = (chart, series) => {
    chart.data.labels = labels;
    series.forEach((data, i) => { chart.data.datasets[i].data = data; });
    chart.update("none");
  };
  const outcomes = [...new Set(vitals.samples.flatMap((s) => Object.keys(s.begins_per_second)))].sort();
  if (outcomes.length === 0) outcomes.push("ACQUIRED");
  const begins = c.begins;
  while (begins.data.datasets.length < outcomes.length) {
    const i = begins.data.datasets.length;
    begins.data.datasets.push({ label: "", data: [], borderColor: COLORS[i % COLORS.length],
                                backgroundColor: COLORS[i % COLORS.length], pointRadius: 0, borderWidth: 2 });
  }
  outcomes.forEach((o, i) => { begins.data.datasets[i].label = o.toLowerCase(); });
  begins.options.plugins.legend.display = true;
  set(begins, outcomes.map((o) => vitals.samples.map((s) => s.begins_per_second[o] || 0)));
  set(c.latency, [vitals.samples.map((s) => (s.begin_p50_seconds < 0 ? null : s.begin_p50_seconds * 1000)),
                  vitals.samples.map((s) => (s.begin_p99_seconds < 0 ? null : s.begin_p99_seconds * 1000))]);
  set(c.waiters, [vitals.samples.map((s) => num(s.waiters))]);
  set(c.inflight, [vitals.samples.map((s) => num(s.calls_in_flight))]);
  set(c.pool, [vitals.samples.map((s) => num(s.pg_in_use))]);
  $("pool-note").hidden = vitals.samples.some((s) => s.pg_in_use >= 0) || vitals.samples.length === 0;
  set(c.redis, [vitals.samples.map((s) => num(s.redis_up))]);
  $("redis-note").hidden = vitals.samples.some((s) => s.redis_up >= 0) || vitals.samples.length === 0;
  set(c.unknown, [vitals.samples.map((s) => num(s.unknown_records))]);
}

async function tick() {
  try {
    drawVitals(await api("/api/vitals"));
  } catch (err) {
    fail(err);
  }
}

function startOverview() {
  if (!state.charts) state.charts = makeCharts();
  if (state.timer) return;
  tick();
  state.timer = setInterval(tick, 1000);
}

function stopOverview() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

// ---- UNKNOWN queue ----

function age(timestamp) {
  if (!timestamp) return "";
  let s = Math.max(0, Math.round((Date.now() - Date.parse(timestamp)) / 1000));
  const parts = [];
  for (const [unit, n] of [["d", 86400], ["h", 3600], ["m", 60]]) {
    if (s >= n) { parts.push(Math.floor(s / n) + unit); s %= n; }
  }
  if (parts.length < 2) parts.push(s + "s");
  return parts.join(" ");
}

function recordHash(key) {
  return "#/record?" + new URLSearchParams(key).toString();
}

async function loadQueue(more) {
  const form = $("filters");
  const body = { status: "STATUS_UNKNOWN", tenant: form.tenant.value.trim(),
                 operation: form.operation.value.trim(), page_size: 200 };
  if (form.age.value) body.older_than = form.age.value;
  if (more) body.page_token = state.queueToken;
  try {
    const page = await api("/api/list", body);
    const rows = $("queue-rows");
    if (!more) rows.textContent = "";
    for (const r of page.records || []) {
      const tr = document.createElement("tr");
      tr.dataset.testid = "record-row";
      const link = document.createElement("a");
      link.href = recordHash(r.key);
      link.textContent = r.key.key;
      const cells = [link, r.key.tenant, r.key.operation, String(r.attempt), age(r.updated_at)];
      for (const c of cells) {
        const td = document.createElement("td");
        if (typeof c === "string") td.textContent = c; else td.appendChild(c);
        tr.appendChild(td);
      }
      tr.dataset.tenant = r.key.tenant;
      tr.dataset.operation = r.key.operation;
      rows.appendChild(tr);
    }
    state.queueToken = page.next_page_token || "";
    $("queue-more").hidden = !state.queueToken;
    countQueue();
  } catch (err) {
    fail(err);
  }
}

function countQueue() {
  const rows = [...$("queue-rows").children];
  const groups = new Map();
  for (const tr of rows) {
    const g = tr.dataset.tenant + " / " + tr.dataset.operation;
    groups.set(g, (groups.get(g) || 0) + 1);
  }
  $("queue-count").textContent = rows.length === 0 ? "No UNKNOWN records match." :
    (state.queueToken ? "More than " : "") + rows.length + " UNKNOWN record" + (rows.length === 1 ? "" : "s") + ".";
  const list = $("queue-groups");
  list.textContent = "";
  for (const [g, n] of [...groups].sort()) {
    const li = document.createElement("li");
    li.textContent = g + ": " + n;
    list.appendChild(li);
  }
}

// ---- A record ----

function bytesOf(base64) {
  const raw = atob(base64 || "");
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// JSON pretty-printed, text as text, anything else as hex.
function renderBody(snapshot) {
  const bytes = bytesOf(snapshot.body);
  const type = (snapshot.content_type || "").toLowerCase();
  let text = null;
  try { text = new TextDecoder("utf-8", { fatal: true }).decode(bytes); } catch (e) { text = null; }
  if (text !== null && type.includes("json")) {
    try { return { kind: "JSON", text: JSON.stringify(JSON.parse(text), null, 2) }; } catch (e) { /* as text */ }
  }
  const printable = text !== null && !/[\u0000-\u0008\u000e-\u001f]/.test(text);
  if (printable && (type.startsWith("text/") || type.includes("json") || type.includes("xml") || type === "")) {
    return { kind: "text", text };
  }
  const hex = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const line = [...bytes.slice(i, i + 16)].map((b) => b.toString(16).padStart(2, "0")).join(" ");
    hex.push(i.toString(16).padStart(8, "0") + "  " + line);
  }
  return { kind: "hex", text: hex.join("\n") };
}

function field(dl, name, value) {
  const dt = document.createElement("dt");
  dt.textContent = name;
  const dd = document.createElement("dd");
  dd.textContent = value === undefined || value === "" ? "—" : String(value);
  dl.append(dt, dd);
}

const statusName = (s) => (s || "").replace(/^STATUS_/, "");

async function openRecord(key) {
  show("record");
  $("confirm").hidden = true;
  $("resolve-message").textContent = "";
  try {
    const [got, history] = await Promise.all([api("/api/get", { key }), api("/api/history", { key, page_size: 1000 })]);
    state.record = got.record;
    drawRecord(got.record);
    drawHistory(history.entries || [], 0);
  } catch (err) {
    fail(err);
  }
}

function drawRecord(r) {
  $("record-title").textContent = "Record " + r.key.key;
  const dl = $("record-fields");
  dl.textContent = "";
  field(dl, "tenant", r.key.tenant);
  field(dl, "operation", r.key.operation);
  field(dl, "key", r.key.key);
  field(dl, "status", statusName(r.status));
  field(dl, "attempt", r.attempt);
  field(dl, "fencing token", r.fencing_token);
  field(dl, "request hash", [...bytesOf(r.request_hash)].map((b) => b.toString(16).padStart(2, "0")).join(""));
  field(dl, "retryable", r.retryable);
  field(dl, "created", r.created_at);
  field(dl, "updated", r.updated_at);
  field(dl, "lease expires", r.lease_expires_at);
  field(dl, "expires", r.expires_at);
  field(dl, "resolved by", r.resolved_by);
  field(dl, "resolve reason", r.resolve_reason);
  const box = $("record-result");
  box.textContent = "";
  // A FAILED resolution without a result stores an empty one.
  if (!r.result || (!r.result.code && !r.result.body && !r.result.content_type)) {
    box.textContent = "No result.";
  } else {
    const meta = document.createElement("dl");
    meta.className = "fields";
    field(meta, "code", r.result.code);
    field(meta, "content type", r.result.content_type);
    for (const [k, v] of Object.entries(r.result.headers || {})) field(meta, "header " + k, v);
    const body = renderBody(r.result);
    field(meta, "body", body.kind + ", " + bytesOf(r.result.body).length + " bytes");
    const pre = document.createElement("pre");
    pre.textContent = body.text;
    box.append(meta, pre);
  }
  $("resolve-box").hidden = r.status !== "STATUS_UNKNOWN";
}

function drawHistory(entries, highlightFrom) {
  const ol = $("audit");
  ol.textContent = "";
  entries.forEach((e, i) => {
    const li = document.createElement("li");
    if (highlightFrom > 0 && i >= highlightFrom) li.className = "new";
    const when = document.createElement("span");
    when.className = "when";
    when.textContent = e.at + " ";
    const what = document.createElement("span");
    what.textContent = statusName(e.from) + " → " + statusName(e.to) + " by " + e.actor +
      (e.reason ? ": " + e.reason : "") + " (fencing token " + e.fencing_token + ")";
    li.append(when, what);
    ol.appendChild(li);
  });
}

function resolveRequest() {
  const to = $("resolve-to").value;
  const req = { key: state.record.key, to, reason: $("reason").value.trim(),
                expected_fencing_token: state.record.fencing_token };
  if (to === "STATUS_SUCCEEDED") {
    const body = new TextEncoder().encode($("result-body").value);
    let raw = "";
    for (const b of body) raw += String.fromCharCode(b);
    req.result = { code: Number($("result-code").value), content_type: $("result-type").value, body: btoa(raw) };
  } else {
    req.retryable = $("retryable").checked;
  }
  return req;
}

async function confirmResolve() {
  const req = resolveRequest();
  $("resolve-confirm").disabled = true;
  try {
    const before = $("audit").children.length;
    const resolved = await api("/api/resolve", req);
    const history = await api("/api/history", { key: req.key, page_size: 1000 });
    state.record = resolved.record;
    drawRecord(resolved.record);
    drawHistory(history.entries || [], before);
    $("confirm").hidden = true;
    $("reason").value = "";
    const last = (history.entries || [])[history.entries.length - 1];
    $("resolve-message").textContent = "Resolved to " + statusName(resolved.record.status) +
      (last ? "; audit row: " + statusName(last.from) + " → " + statusName(last.to) + " by " + last.actor : "") + ".";
    $("audit").focus();
  } catch (err) {
    $("confirm").hidden = true;
    if (err instanceof ApiError && (err.status === 401 || err.status === 403)) return fail(err);
    $("resolve-message").textContent = "Not resolved: " + err.message;
  } finally {
    $("resolve-confirm").disabled = false;
  }
}

function wire() {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    $("token").value = "";
    start();
  });
  $("sign-out").addEventListener("click", () => { sessionStorage.removeItem(TOKEN_KEY); signIn(null); });
  $("filters").addEventListener("submit", (e) => { e.preventDefault(); loadQueue(false); });
  $("queue-more").addEventListener("click", () => loadQueue(true));
  $("resolve-to").addEventListener("change", () => {
    const succeeded = $("resolve-to").value === "STATUS_SUCCEEDED";
    $("result-fields").hidden = !succeeded;
    $("failed-fields").hidden = succeeded;
  });
  $("resolve-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const reason = $("reason").value.trim();
    if (!reason) {
      $("resolve-message").textContent = "A reason is required.";
      $("reason").focus();
      return;
    }
    const k = state.record.key;
    $("confirm-text").textContent = "Resolve " + k.tenant + " / " + k.operation + " / " + k.key + " to " +
      statusName($("resolve-to").value) + ", because: \u201c" + reason + "\u201d? This is final and is kept in the audit history.";
    $("confirm").hidden = false;
    $("resolve-confirm").focus();
  });
  $("resolve-confirm").addEventListener("click", confirmResolve);
  $("resolve-cancel").addEventListener("click", () => { $("confirm").hidden = true; $("resolve").focus(); });
  $("audit").tabIndex = -1;
  window.addEventListener("hashchange", route);
  start();
}

document.addEventListener("DOMContentLoaded", wire);
