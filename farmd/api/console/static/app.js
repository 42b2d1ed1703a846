// farm's web console: a single page that reads farmd through the console server's JSON API
// (POST /api/v1/{Service}/{Method}, protobuf canonical JSON) and draws it.
//
// Rules this file keeps, because the server sends a strict CSP and every API string is untrusted
// (model output, contributor text, environment names):
//   * the DOM is built with h() and text nodes only: never innerHTML or friends;
//   * no inline handlers or style attributes: listeners are added here, styles live in style.css;
//   * 64-bit integers arrive as strings: Number() them before arithmetic, show them as given.

import {linePlot, barPlot} from "./plot.js";

const TOKEN_KEY = "farm-token";
const WINDOW_KEY = "farm-history-window";
const STATUS_EVERY_MS = 2000;
const HISTORY_EVERY_MS = 5000;
const SLOW_EVERY_MS = 10000;
const DASH = "–";

// The Flag enum of trajectory.proto (UNSPECIFIED means "any" and is left out).
const FLAGS = [
  "FLAG_SANDBOX_VIOLATION", "FLAG_SUSPECTED_HACK", "FLAG_TIMEOUT", "FLAG_NO_ANSWER", "FLAG_UNPARSEABLE",
  "FLAG_INVALID_TEXT", "FLAG_VERIFIER_FAULT", "FLAG_TRUNCATED", "FLAG_QUARANTINED", "FLAG_WITHDRAWN",
  "FLAG_RED_TEAM_EXPLOIT", "FLAG_RED_TEAM_ESCAPE",
];
// The SubmissionState enum of intake.proto.
const SUBMISSION_STATES = [
  "SUBMISSION_STATE_CHECKING", "SUBMISSION_STATE_REJECTED", "SUBMISSION_STATE_IN_REVIEW",
  "SUBMISSION_STATE_APPROVED", "SUBMISSION_STATE_QUARANTINED",
];
const HISTORY_WINDOWS = [["900s", "15 min"], ["3600s", "1 h"], ["21600s", "6 h"], ["86400s", "24 h"]];

// =============================================================================================
// DOM helpers
// =============================================================================================

// h("a", {href: "#/farm", class: "x", on: {click: fn}}, "text", child, [more]) -> Element.
// Strings become text nodes (never parsed as HTML); null/undefined/false children are skipped.
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "on") {
      for (const [event, fn] of Object.entries(value)) el.addEventListener(event, fn);
    } else if (key === "class") {
      el.className = Array.isArray(value) ? value.filter(Boolean).join(" ") : value;
    } else if (key === "style" || key.toLowerCase().startsWith("on")) {
      // The CSP refuses both anyway; failing loudly here catches the mistake in development.
      throw new Error(`h(): attribute ${key} is not allowed`);
    } else if (["value", "checked", "disabled", "hidden", "selected", "open"].includes(key)) {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  appendAll(el, children);
  return el;
}

function appendAll(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

// Replace an element's children, with h()'s rules for children (arrays flattened, null skipped):
// the DOM's own replaceChildren would print "null" or "[object ...]".
function fill(el, ...children) {
  el.replaceChildren();
  return appendAll(el, children);
}

// Rebuild a polled section only when its data changed, so a poll every 2 s does not keep wiping the
// user's text selection or hover. `key` is anything JSON-able that decides what is drawn.
const drawnFrom = new WeakMap();

function update(el, key, build) {
  const json = JSON.stringify(key);
  if (drawnFrom.get(el) === json) return;
  drawnFrom.set(el, json);
  fill(el, build());
}

const $ = (sel, root = document) => root.querySelector(sel);

function link(href, ...children) {
  return h("a", {href}, ...children);
}

function pre(text, cls, id) {
  return h("pre", {class: cls, id}, text ?? "");
}

function section(title, ...children) {
  return h("section", {class: "card"}, title ? h("h2", {}, title) : null, ...children);
}

// A table: headers are strings (or [label, class]); each row is {cells: [...], attrs: {...}}.
function table(id, headers, rows, {empty = "none"} = {}) {
  const head = h("tr", {}, headers.map((hd) => {
    const [label, cls] = Array.isArray(hd) ? hd : [hd, null];
    return h("th", {class: cls}, label);
  }));
  const body = rows.map((row) => h("tr", row.attrs || {}, row.cells.map((c) => {
    if (c && typeof c === "object" && !(c instanceof Node) && "v" in c) return h("td", {class: c.cls, title: c.title}, c.v);
    return h("td", {}, c);
  })));
  return h("table", {id, class: "grid"}, h("thead", {}, head), h("tbody", {}, body),
    emptyFoot(headers.length, empty, rows.length === 0));
}

// "Nothing here" under an empty table, in its tfoot: the tbody holds data rows only, so counting
// `tbody tr` counts data.
function emptyFoot(columns, text, shown) {
  return h("tfoot", {class: "empty-foot", hidden: !shown}, h("tr", {class: "empty-row"}, h("td", {colspan: columns}, text)));
}

// A number cell (right-aligned, tabular figures).
const numCell = (v, title) => ({v, cls: "num", title});

// Key/value facts as a definition list.
function facts(pairs, cls = "facts") {
  return h("dl", {class: cls}, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? DASH)]));
}

// A headline number: the element with `id` carries the raw API value in data-value.
// `sub`: an optional small line under the value (the counts behind a rate, say).
function tile(id, label, raw, text, cls, sub) {
  return h("div", {id, class: ["tile", cls], "data-value": raw === undefined || raw === null ? "" : String(raw)},
    h("div", {class: "tile-label"}, label),
    h("div", {class: "tile-value", title: typeof text === "string" ? text : null}, text ?? (raw === undefined || raw === null ? DASH : String(raw))),
    sub ? h("div", {class: "tile-sub"}, sub) : null);
}

// An enum shown short ("NODE_STATE_CONNECTED" -> "connected"); the raw name stays in data-value/title.
function badge(raw, prefix, tone) {
  const text = enumShort(raw, prefix);
  return h("span", {class: ["badge", tone ? `tone-${tone}` : null], "data-value": raw ?? "", title: raw ?? ""}, text);
}

function enumShort(raw, prefix) {
  if (!raw) return DASH;
  const s = String(raw);
  return (prefix && s.startsWith(prefix) ? s.slice(prefix.length) : s).toLowerCase();
}

function flagBadges(flags) {
  if (!flags || !flags.length) return DASH;
  return h("span", {class: "flags"}, flags.map((f) => badge(f, "FLAG_", flagTone(f))));
}

function flagTone(flag) {
  if (/HACK|SANDBOX|ESCAPE|EXPLOIT|QUARANTINED|WITHDRAWN/.test(flag)) return "bad";
  return "warn";
}

// =============================================================================================
// Formatting (every formatter shows DASH for an absent optional field)
// =============================================================================================

const absent = (v) => v === undefined || v === null;
const toNum = (v) => (absent(v) || v === "" ? null : Number(v));

function fmtCount(v) {
  const n = toNum(v);
  return n === null || Number.isNaN(n) ? DASH : n.toLocaleString("en-US");
}

function fmtFloat(v, digits = 3) {
  const n = toNum(v);
  return n === null || Number.isNaN(n) ? DASH : n.toFixed(digits);
}

function fmtPct(v, digits = 1) {
  const n = toNum(v);
  return n === null || Number.isNaN(n) ? DASH : `${(n * 100).toFixed(digits)}%`;
}

function fmtBytes(v) {
  const n = toNum(v);
  if (n === null || Number.isNaN(n)) return DASH;
  let size = Math.abs(n);
  for (const unit of ["B", "kB", "MB", "GB", "TB"]) {
    if (size < 1000 || unit === "TB") return `${n < 0 ? "-" : ""}${unit === "B" ? size.toFixed(0) : size.toFixed(1)} ${unit}`;
    size /= 1000;
  }
  return DASH;
}

function ratio(a, b) {
  const den = toNum(b);
  return den ? toNum(a) / den : null;
}

// google.type.Money ({currency_code, units: "12", nanos}) -> dollars; null when absent.
function usdOf(m) {
  if (absent(m)) return null;
  return (toNum(m.units) ?? 0) + (toNum(m.nanos) ?? 0) / 1e9;
}

function fmtUsd(m) {
  const n = usdOf(m);
  if (n === null || Number.isNaN(n)) return DASH;
  // Box time costs fractions of a cent: show those with two significant digits, not as $0.00.
  return n !== 0 && Math.abs(n) < 0.01 ? `$${n.toPrecision(2)}` : `$${n.toFixed(2)}`;
}

// google.protobuf.Duration: "3.500s" -> 3.5.
function durationSeconds(d) {
  if (absent(d)) return null;
  const m = /^(-?\d+(?:\.\d+)?)s$/.exec(String(d));
  return m ? Number(m[1]) : null;
}

function fmtSeconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return DASH;
  const a = Math.abs(s);
  if (a < 1) return `${(s * 1000).toFixed(0)} ms`;
  if (a < 60) return `${s.toFixed(2)} s`;
  const t = Math.round(a);
  const [d, hr, mi, se] = [Math.floor(t / 86400), Math.floor(t / 3600) % 24, Math.floor(t / 60) % 60, t % 60];
  const p = (n) => String(n).padStart(2, "0");
  if (d) return `${d}d ${p(hr)}h`;
  if (hr) return `${hr}h ${p(mi)}m`;
  return `${mi}m ${p(se)}s`;
}

const fmtDuration = (d) => fmtSeconds(durationSeconds(d));

// google.protobuf.Timestamp (RFC3339, up to nanoseconds) -> seconds since the epoch.
function tsSeconds(ts) {
  if (absent(ts) || ts === "") return null;
  // Date.parse wants at most milliseconds: cut the fraction to three digits.
  const s = String(ts).replace(/(\.\d{3})\d+/, "$1");
  const t = Date.parse(s);
  return Number.isFinite(t) ? t / 1000 : null;
}

function fmtTime(ts) {
  const s = tsSeconds(ts);
  if (s === null) return DASH;
  const d = new Date(s * 1000);
  const p = (n) => String(n).padStart(2, "0");
  const text = `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
  return h("time", {datetime: String(ts), title: String(ts)}, text);
}

function fmtAgo(ts) {
  const s = tsSeconds(ts);
  if (s === null) return DASH;
  return `${fmtSeconds(Math.max(0, Date.now() / 1000 - s))} ago`;
}

function pretty(value) {
  if (absent(value)) return "";
  return JSON.stringify(value, null, 2);
}

// =============================================================================================
// The API
// =============================================================================================

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }

  get text() {
    return `${this.code}: ${this.message}`;
  }

  get refused() {
    return this.status === 401 || this.status === 403;
  }
}

// Thrown (and swallowed) when a reply arrives for a page the user has already left.
class Stale extends Error {}

function authHeaders() {
  const headers = {};
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

async function request(url, init) {
  let resp;
  try {
    resp = await fetch(url, {...init, cache: "no-store", credentials: "same-origin"});
  } catch (err) {
    throw new ApiError(0, "UNAVAILABLE", `cannot reach the console server (${err.message})`);
  }
  const text = await resp.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : {};
  } catch {
    data = null;
  }
  if (!resp.ok) {
    const code = (data && (data.code || data.reason)) || `HTTP_${resp.status}`;
    const message = (data && data.message) || text.slice(0, 300) || resp.statusText || "request failed";
    throw new ApiError(resp.status, String(code), String(message));
  }
  if (data === null || typeof data !== "object") {
    throw new ApiError(resp.status, "BAD_REPLY", "the console server did not answer with JSON");
  }
  return data;
}

function api(service, method, body = {}) {
  return request(`/api/v1/${service}/${method}`, {
    method: "POST",
    headers: {"Content-Type": "application/json", ...authHeaders()},
    body: JSON.stringify(body),
  });
}

// =============================================================================================
// The error banner: one element, id "error", text "CODE: message" of the latest unresolved error.
// Errors are kept per source (a call), so a later success of one call does not hide another's failure.
// =============================================================================================

const errors = new Map();

function setError(key, err) {
  const text = err instanceof ApiError ? err.text : `CONSOLE_ERROR: ${err && err.message ? err.message : err}`;
  errors.delete(key);
  errors.set(key, text);
  renderErrors();
}

function clearError(key) {
  if (errors.delete(key)) renderErrors();
}

function clearPageErrors() {
  for (const key of [...errors.keys()]) if (key !== "whoami") errors.delete(key);
  renderErrors();
}

function renderErrors() {
  const el = $("#error");
  const texts = [...errors.values()];
  el.textContent = texts.length ? texts[texts.length - 1] : "";
  el.hidden = texts.length === 0;
}

// =============================================================================================
// Who is calling
// =============================================================================================

let me = {credential: null, roles: [], farm_has_credentials: false, read_only: true};
let whoamiDone = Promise.resolve();

function refreshWhoami() {
  whoamiDone = (async () => {
    try {
      me = await request("/api/v1/whoami", {method: "GET", headers: authHeaders()});
      clearError("whoami");
    } catch (err) {
      me = {credential: null, roles: [], farm_has_credentials: true, read_only: false};
      setError("whoami", err);
    }
    renderWhoami();
  })();
  return whoamiDone;
}

function renderWhoami() {
  const el = $("#whoami");
  const roles = me.roles || [];
  let text;
  if (me.credential) text = `signed in as ${me.credential} (${roles.join(", ") || "no roles"})`;
  else if (!me.farm_has_credentials) text = "no credentials on this farm";
  else text = "not signed in";
  fill(el, text, me.read_only ? h("span", {class: "badge tone-warn", title: "this farm has no credentials, so the console may only read"}, "read-only") : null);
  $("#token").placeholder = sessionStorage.getItem(TOKEN_KEY) ? "token saved" : "bearer token";
}

// Whether the caller may take an action that needs one of `roles`; returns null, or why not.
function whyNot(roles) {
  if (me.read_only) return "read-only: this farm has no credentials, so the console may not change anything";
  const mine = me.roles || [];
  if (!roles.some((r) => mine.includes(r))) {
    const who = me.credential ? `${me.credential} (${mine.join(", ") || "no roles"})` : "you are not signed in and";
    return `${who} may not do this: it needs ${roles.join(" or ")}`;
  }
  return null;
}

// The node name and version in the header, when the caller may read GetStatus (silently otherwise).
function renderNodeInfo(status) {
  const el = $("#farm-node");
  el.replaceChildren(status ? `${status.node || "?"} · farmd ${status.version || "?"}` : "");
}

async function refreshNodeInfo() {
  try {
    renderNodeInfo(await api("FarmService", "GetStatus", {}));
  } catch {
    renderNodeInfo(null);
  }
}

// =============================================================================================
// Pages: a context per visit owns the page's polls and knows whether the page is still shown.
// =============================================================================================

class Poller {
  // Runs fn now and then every `ms`, never two at once; kick() runs it again as soon as it may.
  constructor(page, ms, fn) {
    Object.assign(this, {page, ms, fn, timer: null, busy: false, again: false, stopped: false, first: true});
  }

  async tick() {
    if (this.stopped || !this.page.alive) return;
    if (this.busy) {
      this.again = true;
      return;
    }
    clearTimeout(this.timer);
    this.busy = true;
    const started = Date.now();
    try {
      // A hidden tab skips its polls (but a page's first load always runs).
      if (this.first || !document.hidden) await this.fn();
    } catch (err) {
      if (!(err instanceof Stale) && !(err instanceof ApiError)) console.error(err);
    } finally {
      this.busy = false;
      this.first = false;
    }
    if (this.stopped || !this.page.alive) return;
    if (this.again) {
      this.again = false;
      this.tick();
      return;
    }
    this.timer = setTimeout(() => this.tick(), Math.max(250, this.ms - (Date.now() - started)));
  }

  kick() {
    this.tick();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
  }
}

class Page {
  constructor(root, required) {
    this.root = root;
    this.alive = true;
    this.refused = false;
    this.pollers = [];
    this.required = new Set(required);
  }

  // Calls the API for this page. Failures go to the banner; a refusal (401/403) wipes the page.
  // optional: the caller handles every failure itself (nothing reaches the banner).
  async call(service, method, body = {}, {optional = false} = {}) {
    const key = `${service}/${method}`;
    try {
      const reply = await api(service, method, body);
      if (!this.alive || this.refused) throw new Stale();
      if (!optional) clearError(key);
      return reply;
    } catch (err) {
      if (!this.alive || this.refused || err instanceof Stale) throw new Stale();
      if (!optional) {
        setError(key, err);
        if (err instanceof ApiError && err.refused) this.refuse();
      }
      throw err;
    }
  }

  // A refused page shows no data: stop its polls and replace what it showed with a short note.
  refuse() {
    this.refused = true;
    for (const p of this.pollers) p.stop();
    this.root.removeAttribute("data-loaded");
    this.root.replaceChildren(h("div", {class: "refused"},
      "Refused: this page needs a token with the right role (see the error above). ",
      "Enter one in the token box and press Save."));
  }

  poll(ms, fn) {
    const p = new Poller(this, ms, fn);
    this.pollers.push(p);
    p.tick();
    return p;
  }

  // Marks one required part loaded; when every required part has loaded once, data-loaded="true".
  loaded(part) {
    this.required.delete(part);
    if (this.required.size === 0 && this.alive && !this.refused) this.root.setAttribute("data-loaded", "true");
  }

  close() {
    this.alive = false;
    for (const p of this.pollers) p.stop();
  }
}

// Swallow what a page's call already reported (the banner) and stale replies; log real bugs.
function quietly(promise) {
  return promise.catch((err) => {
    if (!(err instanceof Stale) && !(err instanceof ApiError)) {
      console.error(err);
      setError("console", err);
    }
  });
}

// =============================================================================================
// Routing: #/farm, #/trajectories?..., #/trajectory/ID, #/training, #/intake, #/submission/ID,
// #/contributor/NAME.
// =============================================================================================

const ROUTES = [
  [/^\/farm$/, "farm", farmPage, ["status", "history"]],
  [/^\/trajectories$/, "trajectories", trajectoriesPage, ["list"]],
  [/^\/trajectory\/([^/]+)$/, "trajectory", trajectoryPage, ["trajectory"]],
  [/^\/training$/, "training", trainingPage, ["curve", "history"]],
  [/^\/intake$/, "intake", intakePage, ["bounties", "submissions"]],
  [/^\/submission\/([^/]+)$/, "submission", submissionPage, ["submission"]],
  [/^\/contributor\/([^/]+)$/, "contributor", contributorPage, ["contributor"]],
];
const NAV_OF = {trajectory: "trajectories", submission: "intake", contributor: "intake"};

let current = null;

function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/farm";
  const q = raw.indexOf("?");
  const path = q < 0 ? raw : raw.slice(0, q);
  return {path, params: new URLSearchParams(q < 0 ? "" : raw.slice(q + 1))};
}

function route() {
  const {path, params} = parseHash();
  const match = ROUTES.map(([re, name, fn, req]) => [re.exec(path), name, fn, req]).find(([m]) => m);
  if (!match) {
    location.replace("#/farm");
    return;
  }
  const [m, name, render, required] = match;
  if (current) current.close();
  clearPageErrors();

  const root = h("div", {id: `page-${name}`, class: "page"});
  $("#app").replaceChildren(root);
  const page = new Page(root, required);
  current = page;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === (NAV_OF[name] || name));
  }
  let args;
  try {
    args = m.slice(1).map(decodeURIComponent);
  } catch {
    args = m.slice(1);
  }
  quietly(Promise.resolve().then(() => render(page, params, ...args)));
}

// Navigate to a hash with a query, re-rendering even when the hash is unchanged (Apply twice).
function go(path, query) {
  const qs = query && [...query.keys()].length ? `?${query.toString()}` : "";
  const target = `#${path}${qs}`;
  if (location.hash === target) route(); else location.hash = target;
}

// =============================================================================================
// Page: Farm
// =============================================================================================

let historyWindow = sessionStorage.getItem(WINDOW_KEY) || "3600s";

function windowSelect(onChange) {
  const sel = h("select", {id: "history-window", "aria-label": "history window", on: {
    change: () => {
      historyWindow = sel.value;
      sessionStorage.setItem(WINDOW_KEY, historyWindow);
      onChange();
    },
  }}, HISTORY_WINDOWS.map(([v, label]) => h("option", {value: v, selected: v === historyWindow}, label)));
  return h("label", {class: "inline"}, "window ", sel);
}

function farmPage(page) {
  const tiles = h("div", {class: "tiles", id: "farm-tiles"});
  const plots = h("div", {class: "plots"});
  const nodes = h("div", {class: "table-wrap"});
  const consumers = h("div", {class: "table-wrap"});
  const bank = h("div", {class: "table-wrap"});
  const passRates = h("div", {class: "table-wrap"});
  const runs = h("div", {class: "table-wrap"});
  const isolation = h("div", {});

  const plotEls = {};
  for (const [key, title] of [
    ["throughput", "Throughput (trajectories/s)"], ["queue", "Queue depth"], ["policy", "Policy version"],
    ["lag", "Consumer lag (trajectories)"], ["bank", "Task bank: band occupancy and informative groups"],
    ["flags", "Verifier flags per hour"], ["passrate", "Pass rate by environment"],
  ]) {
    plotEls[key] = h("div", {id: `plot-${key}`, class: "plot", "data-title": title});
    plots.append(plotEls[key]);
  }

  let historyPoller = null;
  page.root.append(
    h("h1", {}, "Farm"),
    tiles,
    section(null, h("div", {class: "section-head"}, h("h2", {}, "History"), windowSelect(() => historyPoller && historyPoller.kick())), plots),
    section("Nodes", nodes),
    section("Consumers", consumers),
    section("Task bank", bank),
    section("Pass rate by environment and level", passRates),
    section("Recent runs", runs),
    isolation,
  );

  page.poll(STATUS_EVERY_MS, async () => {
    const s = await page.call("FarmService", "GetStatus", {});
    renderNodeInfo(s);
    renderFarmTiles(tiles, s);
    // The nodes table shows "seconds since the last heartbeat": redrawn at least every 5 s for that.
    update(nodes, [s.nodes, Math.floor(Date.now() / 5000)], () => nodesTable(s.nodes || []));
    update(consumers, s.consumers, () => consumersTable(s.consumers || []));
    update(bank, s.bank, () => bankTable(s.bank || []));
    update(passRates, s.pass_rates, () => passRatesTable(s.pass_rates || []));
    update(isolation, [s.isolation, s.counters], () => isolationSection(s));
    page.loaded("status");
  });
  historyPoller = page.poll(HISTORY_EVERY_MS, async () => {
    const hist = await page.call("FarmService", "GetHistory", {window: historyWindow});
    renderFarmPlots(plotEls, hist);
    page.loaded("history");
  });
  // Recent runs are a convenience: a failure is said in their section, not in the page's banner.
  page.poll(SLOW_EVERY_MS, async () => {
    try {
      const r = await page.call("FarmService", "ListRuns", {page_size: 10}, {optional: true});
      update(runs, r.runs, () => runsTable(r.runs || []));
    } catch (err) {
      if (err instanceof Stale) throw err;
      update(runs, String(err.message), () => h("div", {class: "muted"}, `not shown: ${err instanceof ApiError ? err.text : err}`));
    }
  });
}

function renderFarmTiles(el, s) {
  const q = s.queue || {};
  const uptime = durationSeconds(s.uptime);
  el.replaceChildren(
    tile("stat-policy-version", "policy version", s.policy_version ?? "0", fmtCount(s.policy_version)),
    tile("stat-last-seq", "last seq", s.last_seq ?? "0", fmtCount(s.last_seq)),
    tile("stat-throughput", "throughput", s.throughput_per_s ?? 0, `${fmtFloat(s.throughput_per_s, 2)} /s`),
    tile("stat-queued", "queued", q.queued ?? "0", fmtCount(q.queued ?? 0)),
    tile("stat-leased", "leased", q.leased ?? "0", fmtCount(q.leased ?? 0)),
    tile("stat-done", "done", q.done ?? "0", fmtCount(q.done ?? 0)),
    tile("stat-failed", "failed", q.failed ?? "0", fmtCount(q.failed ?? 0), toNum(q.failed) > 0 ? "tile-warn" : null),
    tile("stat-cancelled", "cancelled", q.cancelled ?? "0", fmtCount(q.cancelled ?? 0)),
    tile("stat-streams", "trainer streams", s.streams ?? 0, fmtCount(s.streams ?? 0)),
    tile("stat-workers", "workers", s.workers ?? 0, fmtCount(s.workers ?? 0), null, `${fmtCount(s.max_boxes ?? 0)} boxes at once`),
    tile("stat-node", "node", s.node ?? "", s.node || DASH, "tile-text"),
    tile("stat-isolation", "isolation", String(Boolean(s.isolation_ok)), s.isolation_ok ? "ok" : "NOT OK",
      s.isolation_ok ? "tile-good" : "tile-bad", s.isolation_ok ? null : "refuses untrusted code"),
    tile("stat-uptime", "uptime", s.uptime ?? "", fmtSeconds(uptime)),
    ...diskTiles(s.disk || {}),
    ...standbyTiles(s),
  );
}

// The coordinators standing by to take over, on a store other coordinators can share (PostgreSQL); none there is
// worth a warning: if this one stops, nothing serves until it is started again.
function standbyTiles(s) {
  if (!s.shared_store) return [];
  const standbys = s.standbys || [];
  return [tile("stat-standbys", "standby coordinators", standbys.length, fmtCount(standbys.length),
    standbys.length ? null : "tile-warn",
    standbys.length ? standbys.map((b) => b.address || "?").join(", ") : "none: nothing takes over")];
}

// The disk the store and the policies take, and how fast it grows (bytes/hour over the window farmd says).
function diskTiles(d) {
  const growth = absent(d.store_growth_bytes_per_hour) || absent(d.policy_growth_bytes_per_hour) ? null
    : toNum(d.store_growth_bytes_per_hour) + toNum(d.policy_growth_bytes_per_hour);
  const window = durationSeconds(d.growth_window);
  return [
    tile("stat-store-bytes", "store on disk", d.store_bytes ?? "0", fmtBytes(d.store_bytes ?? 0)),
    tile("stat-policy-bytes", "policies on disk", d.policy_bytes ?? "0", fmtBytes(d.policy_bytes ?? 0), null,
      `${fmtCount(d.policies_kept ?? 0)} kept, ${fmtCount(d.policies_pinned ?? 0)} pinned, ${fmtCount(d.policies_removed ?? 0)} removed`),
    tile("stat-disk-growth", "disk growth", growth ?? "", growth === null ? "not measured yet" : `${fmtBytes(growth)}/h`,
      null, growth === null ? null : `store ${fmtBytes(d.store_growth_bytes_per_hour)}/h, policies ${fmtBytes(d.policy_growth_bytes_per_hour)}/h, last ${fmtSeconds(window)}`),
  ];
}

const NODE_TONE = {NODE_STATE_CONNECTED: "good", NODE_STATE_DISCONNECTED: "warn", NODE_STATE_LOST: "bad",
  NODE_STATE_QUARANTINED: "bad"};

function nodesTable(nodes) {
  return table("nodes-table",
    ["name", "address", "state", ["capacity", "num"], ["in flight", "num"], ["done", "num"], ["failed", "num"],
      ["checked", "num"], ["disagreed", "num"], ["refused", "num"], ["heartbeat", "num"], "isolation", "version",
      "policies cached"],
    nodes.map((n) => ({
      attrs: {class: "node-row", "data-name": n.name ?? ""},
      cells: [
        h("span", {class: "mono"}, n.name ?? ""), h("span", {class: "mono"}, n.address ?? ""),
        // A quarantined node's reason shows on the badge (text, never markup: it quotes what the node sent).
        h("span", {class: "node-state", title: n.quarantine_reason || null}, badge(n.state, "NODE_STATE_", NODE_TONE[n.state]),
          n.quarantine_reason ? h("span", {class: "muted"}, " ", n.quarantine_reason) : null),
        numCell(fmtCount(n.capacity)), numCell(fmtCount(n.in_flight)), numCell(fmtCount(n.done)),
        numCell(fmtCount(n.failed)), numCell(fmtCount(n.checked)), numCell(fmtCount(n.disagreed)),
        numCell(fmtCount(n.refused)),
        numCell(fmtAgo(n.last_heartbeat), n.last_heartbeat),
        n.isolation_ok ? h("span", {class: "ok"}, "ok") : h("span", {class: "bad"}, "NOT OK"),
        h("span", {class: "mono"}, n.version ?? ""),
        (n.policy_versions || []).join(", ") || DASH,
      ],
    })), {empty: "no nodes"});
}

const CONSUMER_TONE = {CONSUMER_STATE_CONSUMING: "good", CONSUMER_STATE_STALLED: "warn", CONSUMER_STATE_CLOSED: null};

function consumersTable(consumers) {
  return table("consumers-table",
    ["name", ["cursor", "num"], ["lag", "num"], ["streams", "num"], "state", ["staleness", "num"], "acked"],
    consumers.map((c) => ({
      attrs: {class: "consumer-row", "data-name": c.name ?? ""},
      cells: [
        h("span", {class: "mono"}, c.name ?? "", c.whole_groups ? h("span", {class: "muted"}, " (whole groups)") : null),
        numCell(fmtCount(c.cursor)), numCell(fmtCount(c.lag)), numCell(fmtCount(c.streams)),
        badge(c.state, "CONSUMER_STATE_", CONSUMER_TONE[c.state]),
        numCell(absent(c.staleness) ? DASH : fmtFloat(c.staleness, 2)),
        fmtTime(c.acked_at),
      ],
    })), {empty: "no consumers yet"});
}

function bankTable(bank) {
  // Per environment first, the totals (env "") last, as farmd sends them; the totals row is "all".
  return table("bank-table",
    ["env", ["level", "num"], ["level pass rate", "num"], ["tasks", "num"], ["in band", "num"], ["easy", "num"],
      ["hard", "num"], ["retired", "num"], ["band occupancy", "num"], ["informative", "num"], ["fresh", "num"]],
    bank.map((b) => ({
      attrs: {class: b.env ? "bank-row" : "bank-row total-row", "data-env": b.env ?? ""},
      cells: [
        b.env ? h("span", {class: "mono"}, b.env) : h("strong", {}, "all"),
        numCell(b.env ? `${b.level ?? 0}/${b.max_difficulty ?? 0}` : DASH),
        numCell(fmtPct(b.level_pass_rate)), numCell(fmtCount(b.tasks)), numCell(fmtCount(b.in_band)),
        numCell(fmtCount(b.easy)), numCell(fmtCount(b.hard)), numCell(fmtCount(b.retired)),
        numCell(fmtPct(b.band_occupancy)), numCell(fmtPct(b.informative_fraction)), numCell(fmtPct(b.fresh_share)),
      ],
    })), {empty: "the task bank is empty"});
}

function passRatesTable(rates) {
  const sorted = [...rates].sort((a, b) => String(a.env).localeCompare(String(b.env)) || (a.difficulty ?? 0) - (b.difficulty ?? 0));
  return table("pass-rates-table",
    ["env", ["difficulty", "num"], ["trajectories", "num"], ["passed", "num"], ["rate", "num"], ["mean reward", "num"],
      ["errors", "num"]],
    sorted.map((r) => ({
      attrs: {class: "pass-rate-row", "data-env": r.env ?? "", "data-difficulty": r.difficulty ?? 0},
      cells: [
        link(`#/trajectories?${new URLSearchParams({env: r.env ?? ""})}`, h("span", {class: "mono"}, r.env ?? "")),
        numCell(fmtCount(r.difficulty)), numCell(fmtCount(r.trajectories)), numCell(fmtCount(r.passed)),
        numCell(fmtPct(ratio(r.passed, r.trajectories))),
        numCell(absent(r.mean_reward) ? DASH : fmtFloat(r.mean_reward)),
        numCell(fmtCount(r.errors), undefined),
      ],
    })), {empty: "no trajectories yet"});
}

const RUN_TONE = {RUN_STATE_RUNNING: "info", RUN_STATE_SUCCEEDED: "good", RUN_STATE_FAILED: "bad", RUN_STATE_CANCELLED: null};

function runsTable(runs) {
  return table("runs-table",
    [["id", "num"], "env", "agent", "state", ["done/jobs", "num"], ["passed", "num"], ["failed", "num"], "created", "finished",
     "last error"],
    runs.map((r) => ({
      attrs: {class: "run-row", "data-id": r.id ?? ""},
      cells: [
        numCell(link(`#/trajectories?${new URLSearchParams({run_id: r.id ?? ""})}`, String(r.id ?? ""))),
        h("span", {class: "mono"}, r.env ?? ""), h("span", {class: "mono"}, r.agent ?? ""),
        badge(r.state, "RUN_STATE_", RUN_TONE[r.state]),
        numCell(`${fmtCount(r.done ?? 0)}/${fmtCount(r.jobs ?? 0)}`), numCell(fmtCount(r.passed ?? 0)),
        numCell(fmtCount(r.failed ?? 0)), fmtTime(r.created_at), fmtTime(r.finished_at),
        lastErrorCell(r.last_error),
      ],
    })), {empty: "no runs yet"});
}

// A run's last_error is a google.rpc.Status: its ErrorInfo's reason names the kind, its message what the worker
// said (which may quote an endpoint or a node: set as text, never as markup).
function lastErrorCell(status) {
  if (!status) return h("span", {class: "muted"}, "");
  const info = (status.details || []).find((d) => d && typeof d.reason === "string");
  return h("span", {class: "run-error mono", title: status.message || ""},
    h("strong", {}, info ? info.reason : `code ${status.code ?? ""}`), " ", status.message || "");
}

function isolationSection(s) {
  const checks = s.isolation || [];
  const counters = Object.entries(s.counters || {}).sort(([a], [b]) => a.localeCompare(b));
  return h("div", {},
    checks.length ? section("Isolation checks (this node)", table("isolation-table", ["check", "ok", "detail", "fix"],
      checks.map((c) => ({cells: [c.name ?? "", c.ok ? h("span", {class: "ok"}, "ok") : h("span", {class: "bad"}, "NOT OK"),
        c.detail ?? "", c.fix ?? ""]})))) : null,
    counters.length ? h("details", {class: "card"}, h("summary", {}, `Counters (${counters.length})`),
      table("counters-table", ["counter", ["value", "num"]], counters.map(([k, v]) => ({cells: [h("span", {class: "mono"}, k), numCell(fmtCount(v))]})))) : null);
}

// ---- history plots (shared with the training page) ----

function sampleTimes(hist) {
  return (hist.samples || []).map((s) => tsSeconds(s.time));
}

// The x range of a history window: from its oldest data (not before the window starts; a farmd that
// started a minute ago has a minute of samples, drawn across the plot) to its newest.
function historyRange(hist) {
  const times = sampleTimes(hist).filter((t) => t !== null);
  const since = tsSeconds(hist.since);
  const width = durationSeconds(hist.bucket) || 0;
  const starts = (hist.activity || []).map((a) => tsSeconds(a.start)).filter((t) => t !== null);
  const xMin = Math.max(Math.min(...times, ...starts), since ?? -Infinity);
  const xMax = Math.max(...times, ...starts.map((t) => t + width));
  return {xMin: Number.isFinite(xMin) ? xMin : undefined, xMax: Number.isFinite(xMax) ? xMax : undefined};
}

// One series per consumer (whole-groups cursors apart), `value(sample, previousSample)` per sample.
function consumerSeries(hist, value) {
  const samples = hist.samples || [];
  const keys = new Set();
  for (const s of samples) for (const c of s.consumers || []) keys.add(consumerKey(c));
  const byKey = (s) => new Map((s.consumers || []).map((c) => [consumerKey(c), c]));
  const maps = samples.map(byKey);
  return [...keys].sort().map((key) => ({
    name: key,
    points: samples.map((s, i) => {
      const c = maps[i].get(key);
      const prev = i > 0 ? maps[i - 1].get(key) : undefined;
      return [tsSeconds(s.time), c ? value(c, prev, s, samples[i - 1]) : null];
    }),
  }));
}

const RATE_SPAN_S = 30;

function consumptionSeries(hist) {
  const samples = hist.samples || [];
  const times = samples.map((s) => tsSeconds(s.time));
  const maps = samples.map((s) => new Map((s.consumers || []).map((c) => [consumerKey(c), c])));
  const keys = [...new Set(maps.flatMap((m) => [...m.keys()]))].sort();
  return keys.map((key) => {
    let from = 0;
    return {name: key, points: samples.map((s, i) => {
      while (from < i && times[i] - times[from + 1] >= RATE_SPAN_S) from += 1;
      const now = maps[i].get(key), then = maps[from].get(key);
      const dt = times[i] - times[from];
      if (!now || !then || dt <= 0) return [times[i], null];
      const stored = toNum(s.last_seq ?? 0) - toNum(samples[from].last_seq ?? 0);
      const consumed = stored - (toNum(now.lag ?? 0) - toNum(then.lag ?? 0));
      return [times[i], Math.max(0, consumed) / dt];
    })};
  });
}

function consumerKey(c) {
  return c.whole_groups ? `${c.name} (whole groups)` : String(c.name ?? "");
}

// Activity buckets on a regular grid, so a bucket with nothing stored in it is a gap (or a 0), not skipped.
function activityGrid(hist) {
  const width = durationSeconds(hist.bucket);
  const activity = hist.activity || [];
  if (!width || !activity.length) return {width, starts: []};
  // From the oldest bucket with trajectories to the newest (activity is oldest first).
  const base = tsSeconds(activity[0].start);
  const last = Math.max(...activity.map((a) => tsSeconds(a.start)));
  const starts = [];
  for (let k = 0; base + k * width <= last + 1e-6 && starts.length < 2000; k++) starts.push(base + k * width);
  return {width, starts};
}

function renderFarmPlots(el, hist) {
  const samples = hist.samples || [];
  const times = sampleTimes(hist);
  const range = historyRange(hist);
  const common = {xTime: true, ...range};
  const title = (key) => el[key].dataset.title;

  linePlot(el.throughput, {...common, title: title("throughput"), yMin: 0,
    series: [{name: "trajectories/s", points: samples.map((s, i) => [times[i], toNum(s.throughput_per_s ?? 0)])}]});
  linePlot(el.queue, {...common, title: title("queue"), yMin: 0, series: [
    {name: "queued", points: samples.map((s, i) => [times[i], toNum((s.queue || {}).queued ?? 0)])},
    {name: "leased", points: samples.map((s, i) => [times[i], toNum((s.queue || {}).leased ?? 0)])},
  ]});
  linePlot(el.policy, {...common, title: title("policy"),
    series: [{name: "policy version", points: samples.map((s, i) => [times[i], toNum(s.policy_version ?? 0)])}]});
  linePlot(el.lag, {...common, title: title("lag"), yMin: 0, emptyText: "no consumers yet",
    series: consumerSeries(hist, (c) => toNum(c.lag ?? 0))});

  const totals = samples.map((s) => (s.bank || []).find((b) => (b.env ?? "") === "") || {});
  linePlot(el.bank, {...common, title: title("bank"), percent: true, yMin: 0, yMax: 1, series: [
    {name: "band occupancy", points: totals.map((b, i) => [times[i], absent(b.band_occupancy) ? null : b.band_occupancy])},
    {name: "informative fraction", points: totals.map((b, i) => [times[i], absent(b.informative_fraction) ? null : b.informative_fraction])},
  ]});

  // Flags per hour: each flag summed over environments per bucket, divided by the bucket's hours.
  const {width, starts} = activityGrid(hist);
  const flagTotals = new Map();
  for (const a of hist.activity || []) {
    const start = tsSeconds(a.start);
    for (const [flag, count] of Object.entries(a.flags || {})) {
      const name = String(flag).toLowerCase().replace(/^flag_/, "");
      if (!flagTotals.has(name)) flagTotals.set(name, new Map());
      const perStart = flagTotals.get(name);
      perStart.set(start, (perStart.get(start) || 0) + toNum(count));
    }
  }
  const hours = width ? width / 3600 : 1;
  barPlot(el.flags, {...common, title: `${title("flags")}${width ? ` (buckets of ${fmtSeconds(width)})` : ""}`,
    barWidth: width, emptyText: "no verifier flags in this window",
    series: [...flagTotals.keys()].sort().map((name) => ({
      name, points: starts.map((t) => [t, (flagTotals.get(name).get(t) || 0) / hours]),
    }))});

  // Pass rate per environment per bucket; a bucket where an environment stored nothing is a gap.
  const perEnv = new Map();
  for (const a of hist.activity || []) {
    const env = String(a.env ?? "");
    if (!perEnv.has(env)) perEnv.set(env, new Map());
    perEnv.get(env).set(tsSeconds(a.start), ratio(a.passed ?? 0, a.trajectories ?? 0));
  }
  linePlot(el.passrate, {...common, title: title("passrate"), percent: true, yMin: 0, yMax: 1,
    emptyText: "no trajectories in this window",
    series: [...perEnv.keys()].sort().map((env) => ({
      name: env, points: starts.map((t) => [t, perEnv.get(env).has(t) ? perEnv.get(env).get(t) : null]),
    }))});
}

// =============================================================================================
// Page: Trajectories
// =============================================================================================

// Filters kept in the hash query, with the request field each becomes.
const TRAJ_FILTERS = [
  ["env", "env", "text"], ["agent", "agent", "text"], ["policy_version", "policy version", "number"],
  ["min_reward", "min reward", "number"], ["max_reward", "max reward", "number"], ["flag", "flag", "flag"],
  ["node", "node", "text"], ["run_id", "run id", "number"],
];

function trajectoriesPage(page, params) {
  const envList = h("datalist", {id: "env-names"});
  const inputs = {};
  for (const [key, label, kind] of TRAJ_FILTERS) {
    const id = `f-${key.replace(/_/g, "-")}`;
    let input;
    if (kind === "flag") {
      input = h("select", {id, name: key},
        h("option", {value: ""}, "any"),
        FLAGS.map((f) => h("option", {value: f, selected: normFlag(params.get(key)) === f}, f)));
    } else {
      input = h("input", {id, name: key, type: kind === "number" ? "number" : "text", value: params.get(key) || "",
        step: key.endsWith("reward") ? "any" : (kind === "number" ? "1" : null), min: key === "run_id" || key === "policy_version" ? "0" : null,
        list: key === "env" ? "env-names" : null, autocomplete: "off", spellcheck: "false"});
    }
    inputs[key] = input;
  }
  // Withdrawn trajectories (a quarantine took them back) are left out unless asked for, as farmctl does.
  const withdrawnBox = h("input", {id: "f-include-withdrawn", name: "include_withdrawn", type: "checkbox",
    checked: params.get("include_withdrawn") === "1"});
  const form = h("form", {id: "traj-filter", class: "filters", on: {submit: (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [key] of TRAJ_FILTERS) {
      const v = inputs[key].value.trim();
      if (v !== "") q.set(key, v);
    }
    if (withdrawnBox.checked) q.set("include_withdrawn", "1");
    go("/trajectories", q);
  }}},
  TRAJ_FILTERS.map(([key, label]) => h("label", {}, h("span", {}, label), inputs[key])),
  h("label", {}, h("span", {}, "include withdrawn"), withdrawnBox),
  h("div", {class: "filter-buttons"},
    h("button", {type: "submit", id: "f-apply", class: "primary"}, "Apply"),
    h("button", {type: "button", id: "f-clear", on: {click: () => go("/trajectories", null)}}, "Clear")),
  envList);

  const body = h("tbody", {});
  const none = emptyFoot(11, "no trajectories match", false);
  const count = h("span", {class: "muted", id: "traj-count"});
  const older = h("button", {type: "button", id: "traj-older", hidden: true}, "Older");
  const tbl = h("table", {id: "trajectories-table", class: "grid clickable"},
    h("thead", {}, h("tr", {}, ["id", "seq", "env", "difficulty", "agent", "policy", "reward", "passed", "flags", "node", "finished"]
      .map((c, i) => h("th", {class: [0, 1, 3, 5, 6].includes(i) ? "num" : null}, c)))),
    body, none);
  page.root.append(h("h1", {}, "Trajectories"), section(null, form), section(null, h("div", {class: "section-head"}, count), tbl, h("div", {class: "pager"}, older)));

  // Env names for the datalist: a convenience, so a refusal here is no error.
  page.call("FarmService", "GetStatus", {}, {optional: true}).then((s) => {
    for (const b of s.bank || []) if (b.env) envList.append(h("option", {value: b.env}));
  }).catch(() => {});

  let request;
  try {
    request = trajectoryRequest(params);
  } catch (err) {
    setError("filters", err);
    return;
  }
  let shown = 0;
  let leftOut = 0;
  const load = async (pageToken) => {
    const reply = await page.call("FarmService", "ListTrajectories", {...request, ...(pageToken ? {page_token: pageToken} : {})});
    const rows = reply.trajectories || [];
    if (!pageToken) {
      body.replaceChildren();
      leftOut = toNum(reply.withdrawn_left_out) ?? 0;  // the first page says it for the whole listing
    }
    for (const t of rows) body.append(trajectoryRow(t));
    shown += rows.length;
    none.hidden = shown > 0;
    count.textContent = `${shown} shown${reply.next_page_token ? ", more older" : ""}` +
      (leftOut ? `, ${fmtCount(leftOut)} withdrawn left out` : "");
    older.hidden = !reply.next_page_token;
    older.dataset.token = reply.next_page_token || "";
    page.loaded("list");
  };
  older.addEventListener("click", () => {
    older.disabled = true;
    quietly(load(older.dataset.token).finally(() => { older.disabled = false; }));
  });
  quietly(load(""));
}

// The ListTrajectories body: only the filters the user set; optional fields as numbers.
function trajectoryRequest(params) {
  const body = {newest_first: true, page_size: 50};
  const number = (key) => {
    const n = Number(params.get(key));
    if (!Number.isFinite(n)) throw new ApiError(0, "INVALID_ARGUMENT", `${key} must be a number, not ${JSON.stringify(params.get(key))}`);
    return n;
  };
  for (const key of ["env", "agent", "node"]) if (params.get(key)) body[key] = params.get(key);
  for (const key of ["policy_version", "min_reward", "max_reward", "run_id"]) if (params.get(key)) body[key] = number(key);
  if (params.get("flag")) body.flag = normFlag(params.get("flag"));
  if (params.get("include_withdrawn") === "1") body.include_withdrawn = true;
  return body;
}

// Accept "timeout" or "flag_timeout" in a hand-written link as well as the enum name.
function normFlag(flag) {
  if (!flag) return "";
  const f = String(flag).toUpperCase();
  return f.startsWith("FLAG_") ? f : `FLAG_${f}`;
}

function trajectoryRow(t) {
  const href = `#/trajectory/${encodeURIComponent(t.id ?? "")}`;
  return h("tr", {class: "trajectory-row", "data-id": t.id ?? "", on: {click: (ev) => {
    // A click on the link itself navigates by itself; anywhere else on the row does the same.
    if (!(ev.target instanceof Element && ev.target.closest("a")) && !window.getSelection().toString()) location.hash = href;
  }}},
  h("td", {class: "num"}, link(href, String(t.id ?? ""))),
  h("td", {class: "num"}, String(t.seq ?? "")),
  h("td", {class: "mono"}, t.env ?? ""),
  h("td", {class: "num"}, String(t.difficulty ?? 0)),
  h("td", {class: "mono ellipsis", title: t.agent ?? ""}, t.agent ?? ""),
  h("td", {class: "num"}, toNum(t.policy_version) ? String(t.policy_version) : DASH),
  h("td", {class: "num"}, fmtFloat(t.reward)),
  h("td", {}, passBadge(t)),
  h("td", {}, flagBadges(t.flags)),
  h("td", {class: "mono"}, t.node ?? ""),
  h("td", {}, fmtTime(t.finished_at)));
}

function passBadge(t) {
  if (t.status === "VERDICT_STATUS_ERROR") return h("span", {class: "badge tone-bad", title: "VERDICT_STATUS_ERROR"}, "error");
  return t.passed ? h("span", {class: "badge tone-good"}, "pass") : h("span", {class: "badge"}, "fail");
}

// =============================================================================================
// Page: one trajectory
// =============================================================================================

async function trajectoryPage(page, params, id) {
  const reply = await page.call("FarmService", "GetTrajectory", {id: String(id)});
  const t = reply.trajectory || {};
  page.root.append(
    h("h1", {}, "Trajectory ", h("span", {class: "mono"}, String(t.id ?? id))),
    trajectoryHeader(t),
    section("Verdict", trajectoryVerdict(t)),
    section("Task as posed", trajectoryTask(t.task || {})),
    section(`Conversation (${(t.messages || []).length} messages, ${(t.turns || []).length} model turns)`, trajectoryTurns(t)),
    section(`Steps (${(t.steps || []).length})`, trajectorySteps(t.steps || [])),
    section("Final submission", pre(t.final ?? "", "long", "traj-final"), (t.final ?? "") === "" ? h("div", {class: "muted"}, "(empty)") : null),
    section("Every verdict it was given", scoresTable(t.scores || [], verdictVersion(t))),
  );
  page.loaded("trajectory");
}

function trajectoryHeader(t) {
  const tm = t.timings || {};
  const sp = t.sampling;
  const u = t.usage;
  const runId = toNum(t.run_id);
  return section(null, h("div", {class: "columns"},
    facts([
      ["env", h("span", {class: "mono"}, `${t.env ?? ""}@${t.env_version ?? ""}`)],
      ["seed", h("span", {class: "mono"}, String(t.seed ?? "0"))],
      ["difficulty", String(t.difficulty ?? 0)],
      ["agent", h("span", {class: "mono"}, t.agent ?? "")],
      ["policy version", toNum(t.policy_version) ? String(t.policy_version) : "0 (no farm policy)"],
      ["node", h("span", {class: "mono"}, t.node ?? "")],
      ["seq", String(t.seq ?? "")],
      ["group", String(t.group_id ?? "")],
      ["run", runId ? link(`#/trajectories?${new URLSearchParams({run_id: t.run_id})}`, String(t.run_id)) : "0 (a trainer's demand)"],
    ]),
    facts([
      ["started", fmtTime(t.started_at)],
      ["finished", fmtTime(t.finished_at)],
      ["time: task", fmtDuration(tm.task)],
      ["time: agent", fmtDuration(tm.agent)],
      ["time: verify", fmtDuration(tm.verify)],
      ["time: total", fmtDuration(tm.total)],
      ["usage", u ? usageText(u) : DASH],
    ]),
    sp ? facts([
      ["model", h("span", {class: "mono"}, sp.model ?? "")],
      ["temperature", String(sp.temperature ?? 0)],
      ["top_p", String(sp.top_p ?? 0)],
      ["max_tokens", String(sp.max_tokens ?? 0)],
      ["seed", absent(sp.seed) ? DASH : String(sp.seed)],
      ["stop", (sp.stop || []).length ? h("span", {class: "mono"}, JSON.stringify(sp.stop)) : DASH],
      ["n", String(sp.n ?? 0)],
      ["extra", sp.extra && Object.keys(sp.extra).length ? pre(pretty(sp.extra), "small") : DASH],
    ]) : null));
}

function usageText(u) {
  return `${fmtCount(u.prompt_tokens ?? 0)} prompt + ${fmtCount(u.completion_tokens ?? 0)} completion = ${fmtCount(u.total_tokens ?? 0)} tokens` +
    `, ${fmtCount(u.requests ?? 0)} requests, ${fmtCount(u.retries ?? 0)} retries`;
}

function trajectoryVerdict(t) {
  const details = t.verdict_details;
  return h("div", {id: "traj-verdict"},
    h("div", {class: "tiles"},
      tile("traj-reward", "reward", t.reward ?? 0, fmtFloat(t.reward ?? 0)),
      tile("traj-passed", "passed", String(Boolean(t.passed)), t.passed ? "pass" : "fail", t.passed ? "tile-good" : "tile-bad"),
      tile("traj-status", "status", t.status ?? "", enumShort(t.status, "VERDICT_STATUS_"), t.status === "VERDICT_STATUS_ERROR" ? "tile-bad" : null),
      tile("traj-verifier", "verifier version", t.verifier_version ?? "", t.verifier_version || DASH, "tile-text"),
      // The verdict shown is the current one: the first (0), or a later score's (a rescore, a withdrawal).
      tile("traj-verdict-version", "verdict", String(verdictVersion(t)),
        verdictVersion(t) ? `later (${t.verdict_version})` : "first", "tile-text")),
    facts([
      ["flags", flagBadges(t.flags)],
      ["reasons", (t.reasons || []).length ? h("ul", {class: "reasons"}, t.reasons.map((r) => h("li", {}, r))) : DASH],
      ["agent error", t.agent_error ? pre(t.agent_error, "error-text") : DASH],
      ["details", details && Object.keys(details).length ? pre(pretty(details), "json") : DASH],
    ]));
}

function trajectoryTask(task) {
  const examples = task.examples || [];
  const metadata = task.metadata || {};
  return h("div", {id: "traj-task"},
    facts([
      ["kind", badge(task.kind, "TASK_KIND_")],
      ["entry point", task.entry_point ? h("span", {class: "mono"}, task.entry_point) : DASH],
      ["answer format", task.answer_format ? pre(task.answer_format, "small") : DASH],
    ]),
    h("h3", {}, "Prompt"), pre(task.prompt ?? "", "long prompt"),
    h("h3", {}, `Examples (${examples.length})`), examples.length ? pre(pretty(examples), "json") : h("div", {class: "muted"}, "none"),
    h("h3", {}, "Metadata"), Object.keys(metadata).length ? pre(pretty(metadata), "json") : h("div", {class: "muted"}, "none"));
}

function trajectoryTurns(t) {
  const messages = t.messages || [];
  const turns = t.turns || [];
  const turnAt = new Map(turns.map((tu) => [toNum(tu.message_index ?? 0), tu]));
  const used = new Set();
  const container = h("div", {id: "traj-turns"});
  messages.forEach((msg, i) => {
    const tu = msg.role === "assistant" ? turnAt.get(i) : undefined;
    if (tu) used.add(tu);
    container.append(messageEl(msg, i, tu));
  });
  // Turns whose message is not in the conversation (should not happen): shown after it, from their completion.
  for (const tu of turns) {
    if (used.has(tu)) continue;
    container.append(messageEl({role: "assistant", content: tu.completion ?? ""}, toNum(tu.message_index ?? 0), tu, true));
  }
  if (!messages.length && !turns.length) container.append(h("div", {class: "muted"}, "no conversation (a scripted agent)"));
  return container;
}

// One conversation message (class "turn"); a model turn with no stored message is drawn the same way
// but classed "orphan-turn", so `.turn` counts messages exactly.
function messageEl(msg, index, tu, orphan = false) {
  const role = String(msg.role ?? "");
  const calls = msg.tool_calls || [];
  return h("div", {class: [orphan ? "orphan-turn" : "turn", `role-${role.replace(/[^a-z]/gi, "") || "unknown"}`], "data-index": index, "data-role": role},
    h("div", {class: "turn-head"},
      h("span", {class: "turn-role"}, role || "?"),
      h("span", {class: "muted"}, ` #${index}`),
      msg.tool_call_id ? h("span", {class: "muted mono"}, ` answers ${msg.tool_call_id}`) : null,
      orphan ? h("span", {class: "badge tone-warn"}, "turn without a stored message") : null),
    pre(msg.content ?? "", "long"),
    calls.length ? h("div", {class: "tool-calls"}, calls.map((c) => h("div", {class: "tool-call"},
      h("div", {}, "tool call ", h("span", {class: "mono"}, c.name ?? ""), h("span", {class: "muted mono"}, ` (${c.id ?? ""})`)),
      pre(c.arguments ?? "", "small")))) : null,
    tu ? turnFacts(tu, msg) : null);
}

function turnFacts(tu, msg) {
  const tokens = tu.token_ids || [];
  const promptTokens = tu.prompt_token_ids || [];
  const out = h("div", {class: "turn-facts"},
    facts([
      // Plain digits (no grouping): the counts are read and compared as they are.
      ["completion tokens", String(tokens.length)],
      ["prompt tokens", String(promptTokens.length)],
      ["finish", badge(tu.finish_reason, "FINISH_REASON_", tu.finish_reason === "FINISH_REASON_LENGTH" ? "warn" : null)],
      ["latency", fmtDuration(tu.latency)],
      ["usage", tu.usage ? usageText(tu.usage) : DASH],
      ["prompt messages", String(tu.prompt_messages ?? 0)],
      toNum(tu.choice_index) ? ["choice", String(tu.choice_index)] : null,
      ["logprobs", tu.has_logprobs ? logprobSummary(tu.logprobs || []) : "not returned"],
    ], "facts inline"));
  if (tu.has_logprobs) out.append(logprobDetails(tokens, tu.logprobs || []));
  // The completion as produced, when the stored message was repaired from it.
  if (!absent(tu.completion) && tu.completion !== "" && tu.completion !== (msg.content ?? "")) {
    out.append(h("details", {class: "raw-completion"}, h("summary", {}, "completion as the model produced it (before repair)"), pre(tu.completion, "long")));
  }
  return out;
}

function logprobSummary(logprobs) {
  if (!logprobs.length) return "none";
  const sum = logprobs.reduce((a, b) => a + Number(b), 0);
  return `sum ${sum.toFixed(3)}, mean ${(sum / logprobs.length).toFixed(4)} over ${logprobs.length} tokens`;
}

// The per-token list can be thousands of rows: built only when first opened.
function logprobDetails(tokens, logprobs) {
  const n = Math.max(tokens.length, logprobs.length);
  const details = h("details", {class: "logprobs"}, h("summary", {}, `per-token logprobs (${n})`));
  details.addEventListener("toggle", () => {
    if (!details.open || details.dataset.built) return;
    details.dataset.built = "true";
    const rows = [];
    for (let i = 0; i < n; i++) {
      rows.push({cells: [numCell(String(i)), numCell(absent(tokens[i]) ? DASH : String(tokens[i])), numCell(absent(logprobs[i]) ? DASH : Number(logprobs[i]).toFixed(4))]});
    }
    details.append(h("div", {class: "scroll"}, table(null, [["#", "num"], ["token id", "num"], ["logprob", "num"]], rows)));
  });
  return details;
}

function trajectorySteps(steps) {
  const container = h("div", {id: "traj-steps"});
  if (!steps.length) container.append(h("div", {class: "muted"}, "no steps"));
  steps.forEach((st, i) => {
    const violations = st.violations || [];
    container.append(h("div", {class: "step", "data-index": i},
      h("div", {class: "step-head"},
        h("strong", {}, `step ${i + 1}`),
        h("span", {class: "muted"}, ` · exit ${absent(st.exit_code) ? "–" : st.exit_code} · ${fmtDuration(st.duration)}`),
        violations.length ? h("span", {class: "flags"}, " ", violations.map((v) => h("span", {class: "badge tone-bad"}, v))) : null),
      st.action ? [h("div", {class: "label"}, "action"), pre(st.action, "long action")] : h("div", {class: "muted"}, "(the submission: see Final)"),
      h("div", {class: "label"}, "observation"), pre(st.observation ?? "", "long")));
  });
  return container;
}

// Which verdict a record or a score is: 0 the first, else its place in the farm's sequence of scores.
const verdictVersion = (x) => toNum(x.verdict_version) ?? 0;

function scoresTable(scores, current) {
  return table("traj-scores", ["", "verifier version", ["reward", "num"], "passed", "status", "reasons", "flags", "scored"],
    scores.map((s) => ({
      attrs: {class: "score-row", "data-verifier": s.verifier_version ?? "", "data-verdict": String(verdictVersion(s))},
      cells: [verdictVersion(s) === current ? h("span", {class: "badge tone-good"}, "current")
        : (verdictVersion(s) ? "" : h("span", {class: "badge"}, "first")),
        h("span", {class: "mono"}, s.verifier_version ?? ""), numCell(fmtFloat(s.reward ?? 0)), passBadge(s),
        badge(s.status, "VERDICT_STATUS_", s.status === "VERDICT_STATUS_ERROR" ? "bad" : null),
        (s.reasons || []).join("; ") || DASH, flagBadges(s.flags), fmtTime(s.scored_at)],
    })), {empty: "no scores"});
}

// =============================================================================================
// Page: Training
// =============================================================================================

function trainingPage(page, params) {
  const agentSel = h("select", {id: "curve-agent", "aria-label": "agent", on: {change: () => {
    const q = new URLSearchParams();
    if (agentSel.value) q.set("agent", agentSel.value);
    go("/training", q);
  }}});
  const tiles = h("div", {class: "tiles", id: "curve-tiles"});
  const curve = h("div", {id: "training-curve", class: "plots"});
  const curveRate = h("div", {class: "plot"});
  const curveLevel = h("div", {class: "plot"});
  const hp = {};
  const plots = h("div", {class: "plots"});
  for (const key of ["staleness", "rate", "lag", "policy"]) {
    hp[key] = h("div", {id: `plot-${key === "policy" ? "train-policy" : key}`, class: "plot"});
    plots.append(hp[key]);
  }
  let historyPoller = null;
  page.root.append(
    h("h1", {}, "Training"),
    section(null, h("div", {class: "section-head"}, h("h2", {}, "Learning curve"), h("label", {class: "inline"}, "agent ", agentSel)), tiles, curve),
    section(null, h("div", {class: "section-head"}, h("h2", {}, "Trainers"), windowSelect(() => historyPoller && historyPoller.kick())), plots));

  const chosen = params.get("agent") || "";
  page.poll(SLOW_EVERY_MS, async () => {
    const c = await page.call("FarmService", "GetLearningCurve", chosen ? {agent: chosen} : {});
    renderAgentChoices(agentSel, c, chosen);
    renderCurve(tiles, curve, curveRate, curveLevel, c);
    page.loaded("curve");
  });
  historyPoller = page.poll(HISTORY_EVERY_MS, async () => {
    const hist = await page.call("FarmService", "GetHistory", {window: historyWindow});
    renderTrainingPlots(hp, hist);
    page.loaded("history");
  });
}

function renderAgentChoices(sel, c, chosen) {
  const agents = [...new Set([...(c.agents || []), ...(c.agent ? [c.agent] : [])])].sort();
  const selected = chosen || c.agent || "";
  // Rebuilt only when the list changed, so an open dropdown is not yanked away by a poll.
  const key = JSON.stringify([agents, selected]);
  if (sel.dataset.key === key) return;
  sel.dataset.key = key;
  fill(sel,
    h("option", {value: ""}, "newest farm policy's agent"),
    agents.map((a) => h("option", {value: a, selected: a === selected && Boolean(chosen)}, a)));
}

function renderCurve(tiles, container, ratePlot, levelPlot, c) {
  const points = c.points || [];
  const last = points[points.length - 1];
  tiles.replaceChildren(
    tile("curve-agent-name", "agent", c.agent ?? "", c.agent || DASH, "tile-text"),
    tile("curve-rollouts", "rollouts", last ? last.rollouts : "", last ? fmtCount(last.rollouts) : DASH),
    tile("curve-pass-rate", "pass rate (latest)", last ? String(ratio(last.passed, last.trajectories) ?? "") : "",
      last ? fmtPct(ratio(last.passed, last.trajectories)) : DASH, null,
      last ? `${fmtCount(last.passed)} of ${fmtCount(last.trajectories)}` : null),
    tile("curve-difficulty", "mean difficulty", last ? last.mean_difficulty : "", last ? fmtFloat(last.mean_difficulty, 2) : DASH),
    tile("curve-policy-version", "policy version", last ? last.policy_version : "", last ? fmtCount(last.policy_version) : DASH),
    tile("curve-time", "latest", last ? last.time ?? "" : "", last ? fmtAgo(last.time) : DASH));
  if (!points.length) {
    container.replaceChildren(h("div", {class: "empty-state"},
      c.agent ? `no trajectories from ${c.agent} yet` : "no trajectories from a farm policy yet"));
    return;
  }
  if (!ratePlot.isConnected) container.replaceChildren(ratePlot, levelPlot);
  const xs = points.map((p) => toNum(p.rollouts));
  linePlot(ratePlot, {title: "Pass rate against rollouts", xLabel: "rollouts", percent: true, yMin: 0, yMax: 1,
    series: [{name: "pass rate", points: points.map((p, i) => [xs[i], ratio(p.passed, p.trajectories)])}]});
  linePlot(levelPlot, {title: "Mean difficulty against rollouts", xLabel: "rollouts", yMin: 0,
    series: [{name: "mean difficulty", points: points.map((p, i) => [xs[i], toNum(p.mean_difficulty ?? 0)])}]});
}

function renderTrainingPlots(el, hist) {
  const samples = hist.samples || [];
  const times = sampleTimes(hist);
  const common = {xTime: true, ...historyRange(hist), emptyText: "no trainer has consumed in this window"};
  linePlot(el.staleness, {...common, title: "Staleness per consumer (policy versions behind)", yMin: 0,
    series: consumerSeries(hist, (c) => (absent(c.staleness) ? null : c.staleness))});
  // Consumption rate in trajectories a second, whatever a cursor counts (trajectories or groups): what was
  // stored meanwhile less what the lag grew by. Over a trailing window, since trainers ack in steps (at
  // checkpoints), and a rate between two acks would read 0 then a spike.
  linePlot(el.rate, {...common, title: `Consumption rate per consumer (trajectories/s, over ${RATE_SPAN_S} s)`,
    yMin: 0, series: consumptionSeries(hist)});
  linePlot(el.lag, {...common, title: "Lag per consumer (trajectories)", yMin: 0,
    series: consumerSeries(hist, (c) => toNum(c.lag ?? 0))});
  linePlot(el.policy, {...common, title: "Policy version", emptyText: "no samples yet",
    series: [{name: "policy version", points: samples.map((s, i) => [times[i], toNum(s.policy_version ?? 0)])}]});
}

// =============================================================================================
// Page: Intake
// =============================================================================================

function intakePage(page, params) {
  const funnel = section("Funnel", h("div", {class: "muted"}, "loading…"));
  funnel.id = "funnel";
  const bounties = h("div", {class: "table-wrap"});
  const stateSel = h("select", {id: "submissions-state", "aria-label": "state", on: {change: () => {
    const q = new URLSearchParams();
    if (stateSel.value) q.set("state", stateSel.value);
    go("/intake", q);
  }}}, h("option", {value: ""}, "every state"),
  SUBMISSION_STATES.map((s) => h("option", {value: s, selected: params.get("state") === s}, enumShort(s, "SUBMISSION_STATE_"))));
  const subBody = h("tbody", {});
  const none = emptyFoot(7, "no submissions", false);
  const older = h("button", {type: "button", id: "submissions-older", hidden: true}, "Older");
  const subTable = h("table", {id: "submissions-table", class: "grid clickable"}, submissionsHead(), subBody, none);
  page.root.append(h("h1", {}, "Intake"),
    funnel,
    section("Bounty board", bounties),
    section(null, h("div", {class: "section-head"}, h("h2", {}, "Submissions"), h("label", {class: "inline"}, "state ", stateSel)), subTable, h("div", {class: "pager"}, older)));

  // The funnel is for operators and reviewers: a 403 just leaves the section out.
  quietly(page.call("IntakeService", "GetFunnel", {}, {optional: true}).then((f) => {
    funnel.replaceChildren(h("h2", {}, "Funnel"), funnelView(f));
  }, (err) => {
    if (err instanceof Stale) return;
    if (err instanceof ApiError && err.status === 403) funnel.remove();
    else {
      funnel.remove();
      setError("IntakeService/GetFunnel", err);
    }
  }));

  const loadBounties = async () => {
    await whoamiDone;
    const r = await page.call("IntakeService", "ListBounties", {});
    bounties.replaceChildren(bountiesTable(r.bounties || [], page, loadBounties));
    page.loaded("bounties");
  };
  quietly(loadBounties());

  let shown = 0;
  const body = params.get("state") ? {state: params.get("state")} : {};
  const loadSubs = async (token) => {
    const r = await page.call("IntakeService", "ListSubmissions", {...body, page_size: 50, ...(token ? {page_token: token} : {})});
    const rows = r.submissions || [];
    if (!token) subBody.replaceChildren();
    for (const s of rows) subBody.append(submissionRow(s));
    shown += rows.length;
    none.hidden = shown > 0;
    older.hidden = !r.next_page_token;
    older.dataset.token = r.next_page_token || "";
    page.loaded("submissions");
  };
  older.addEventListener("click", () => {
    older.disabled = true;
    quietly(loadSubs(older.dataset.token).finally(() => { older.disabled = false; }));
  });
  quietly(loadSubs(""));
}

function funnelView(f) {
  const states = Object.entries(f.states || {});
  const tiers = f.tiers || [];
  return h("div", {},
    h("div", {class: "tiles"},
      tile("funnel-accepted", "accepted", f.accepted ?? "0", fmtCount(f.accepted ?? 0)),
      tile("funnel-total-usd", "total cost", usdOf(f.total_cost) ?? 0, fmtUsd(f.total_cost ?? {})),
      tile("funnel-payouts-usd", "payouts", usdOf(f.payouts) ?? 0, fmtUsd(f.payouts ?? {})),
      tile("funnel-usd-per-accepted", "cost per accepted", usdOf(f.cost_per_accepted) ?? "", fmtUsd(f.cost_per_accepted)),
      states.map(([k, v]) => tile(`funnel-state-${String(k).toLowerCase().replace(/[^a-z0-9_-]/g, "")}`, k, v, fmtCount(v)))),
    tierCostTable("funnel-tiers-table", tiers, f.per_accepted));
}

function tierCostTable(id, tiers, perAccepted) {
  const row = (label, c) => ({cells: [label, numCell(fmtFloat(durationSeconds(c.box_cpu) ?? 0, 1)), numCell(fmtFloat(durationSeconds(c.box_wall) ?? 0, 1)),
    numCell(fmtCount(c.box_calls ?? 0)), numCell(fmtCount(c.attacker_tokens ?? 0)), numCell(fmtFloat(durationSeconds(c.review) ?? 0, 0)), numCell(fmtUsd(c.cost ?? {}))]});
  const rows = tiers.map((c) => row(toNum(c.tier) ? `tier ${c.tier}` : "all tiers", c));
  if (perAccepted) rows.push({...row("per accepted env", perAccepted), attrs: {class: "total-row"}});
  return table(id, ["", ["box CPU s", "num"], ["box wall s", "num"], ["box calls", "num"], ["attacker tokens", "num"], ["review s", "num"], ["cost", "num"]],
    rows, {empty: "no costs yet"});
}

function bountiesTable(bounties, page, reload) {
  const mine = me.roles || [];
  const mayClaim = mine.includes("operator") || mine.includes("contributor") || me.read_only;
  const why = whyNot(["operator", "contributor"]);
  return table("bounties-table",
    [["id", "num"], "domain", "requirements", ["payout", "num"], ["min reputation", "num"], ["accepted/wanted", "num"], "state", "claimed by", "posted by",
      mayClaim ? "" : null].filter((x) => x !== null),
    bounties.map((b) => {
      const claimants = b.claimants || [];
      const cells = [
        numCell(String(b.id ?? "")), b.domain ?? "", h("div", {class: "requirements"}, b.requirements ?? ""),
        numCell(`${fmtUsd(b.pay_min ?? {})}–${fmtUsd(b.pay_max ?? {})}`), numCell(fmtFloat(b.min_reputation ?? 0, 1)),
        numCell(`${fmtCount(b.accepted ?? 0)}/${fmtCount(b.wanted ?? 0)}`),
        b.open ? h("span", {class: "badge tone-good"}, "open") : h("span", {class: "badge"}, "closed"),
        claimants.length ? claimants.map((c, i) => [i ? ", " : "", link(`#/contributor/${encodeURIComponent(c)}`, c)]) : DASH,
        b.posted_by ?? "",
      ];
      if (mayClaim) {
        const btn = h("button", {type: "button", class: "bounty-claim small", "data-id": b.id ?? "", disabled: Boolean(why) || !b.open,
          title: why || (b.open ? "claim this bounty" : "this bounty is closed")}, "Claim");
        btn.addEventListener("click", () => {
          if (!window.confirm(`Claim bounty ${b.id} (${b.domain ?? ""})?`)) return;
          btn.disabled = true;
          quietly(page.call("IntakeService", "ClaimBounty", {id: String(b.id)}).then(reload).finally(() => { btn.disabled = false; }));
        });
        cells.push(btn);
      }
      return {attrs: {class: "bounty-row", "data-id": b.id ?? ""}, cells};
    }), {empty: "no bounties"});
}

const SUBMISSION_TONE = {
  SUBMISSION_STATE_CHECKING: "info", SUBMISSION_STATE_REJECTED: "bad", SUBMISSION_STATE_IN_REVIEW: "warn",
  SUBMISSION_STATE_APPROVED: "good", SUBMISSION_STATE_QUARANTINED: "bad",
};

function submissionsHead() {
  return h("thead", {}, h("tr", {}, ["id", "name@version", "contributor", "state", "tier", "created", "detail"]
    .map((c, i) => h("th", {class: i === 0 || i === 4 ? "num" : null}, c))));
}

function submissionRow(s) {
  const href = `#/submission/${encodeURIComponent(s.id ?? "")}`;
  return h("tr", {class: "submission-row", "data-id": s.id ?? "", on: {click: (ev) => {
    if (!(ev.target instanceof Element && ev.target.closest("a")) && !window.getSelection().toString()) location.hash = href;
  }}},
  h("td", {class: "num"}, link(href, String(s.id ?? ""))),
  h("td", {class: "mono"}, `${s.name ?? ""}@${s.version ?? ""}`),
  h("td", {}, s.contributor ? link(`#/contributor/${encodeURIComponent(s.contributor)}`, s.contributor) : DASH),
  h("td", {}, badge(s.state, "SUBMISSION_STATE_", SUBMISSION_TONE[s.state])),
  h("td", {class: "num"}, String(s.tier ?? 0)),
  h("td", {}, fmtTime(s.created_at)),
  h("td", {class: "ellipsis", title: s.detail ?? ""}, s.detail ?? ""));
}

// =============================================================================================
// Page: one submission (with the reviewer's actions)
// =============================================================================================

function submissionPage(page, params, id) {
  const result = h("div", {id: "action-result", class: "action-result", hidden: true});
  const content = h("div", {});
  page.root.append(h("h1", {}, "Submission ", h("span", {class: "mono"}, String(id))), result, content);

  const showResult = (text) => {
    result.textContent = text;
    result.hidden = false;
  };

  const load = async () => {
    await whoamiDone;
    const r = await page.call("IntakeService", "GetSubmission", {id: String(id)});
    if (!page.alive) return;
    content.replaceChildren(...submissionView(r.submission || {}, page, showResult, load));
    page.loaded("submission");
  };
  return load();
}

function submissionView(s, page, showResult, reload) {
  const findings = s.findings || [];
  const byTier = new Map();
  for (const f of findings) {
    const t = toNum(f.tier ?? 0);
    if (!byTier.has(t)) byTier.set(t, []);
    byTier.get(t).push(f);
  }
  const mutation = toNum(s.mutants) ? `${fmtCount(s.mutants_killed ?? 0)} of ${fmtCount(s.mutants)} mutants rejected (${fmtPct(s.mutation_share)})`
    : (absent(s.mutation_share) ? DASH : fmtPct(s.mutation_share));
  return [
    section(null,
      h("div", {class: "state-line"}, "state ",
        h("span", {id: "submission-state", class: ["state", `tone-${SUBMISSION_TONE[s.state] || "none"}`],
                   "data-value": s.state ?? "", title: s.state ?? ""}, enumShort(s.state, "SUBMISSION_STATE_")),
        h("span", {class: "muted"}, ` at tier ${s.tier ?? 0}`), s.detail ? h("span", {class: "detail"}, ` — ${s.detail}`) : null),
      h("div", {class: "columns"},
        facts([
          ["name", h("span", {class: "mono"}, `${s.name ?? ""}@${s.version ?? ""}`)],
          ["env", h("span", {class: "mono"}, s.env ?? "")],
          ["contributor", s.contributor ? link(`#/contributor/${encodeURIComponent(s.contributor)}`, s.contributor) : DASH],
          ["domain", s.domain ?? ""], ["kind", s.kind ?? ""], ["levels", String(s.levels ?? 0)],
          ["digest", h("span", {class: "mono break"}, s.digest ?? "")],
          ["bounty", toNum(s.bounty_id) ? String(s.bounty_id) : DASH],
        ]),
        facts([
          ["tier", h("span", {id: "submission-tier"}, String(s.tier ?? 0))],
          ["mutation coverage", mutation],
          ["seeds per level", String(s.seeds ?? 0)], ["attack budget", String(s.attack_budget ?? 0)],
          ["rounds", String(s.rounds ?? 0)],
          ["trajectories", `${fmtCount(s.trajectories ?? 0)} (${fmtCount(s.withdrawn ?? 0)} withdrawn)`],
          ["created", fmtTime(s.created_at)], ["decided", fmtTime(s.decided_at)],
        ]),
        facts([
          ["reviewer", s.reviewer || DASH],
          ["review note", s.review_note ? pre(s.review_note, "small") : DASH],
        ]))),
    section("Actions", submissionActions(s, page, showResult, reload)),
    section(`Findings (${findings.length})`, h("div", {id: "submission-findings"},
      findings.length ? [...byTier.keys()].sort((a, b) => a - b).map((tier) => h("div", {class: "tier-group", "data-tier": tier},
        h("h3", {}, `Tier ${tier}`),
        byTier.get(tier).map((f) => h("div", {class: ["finding", f.blocking ? "blocking" : "note"]},
          h("div", {class: "finding-head"}, f.blocking ? h("span", {class: "badge tone-bad"}, "blocking") : h("span", {class: "badge"}, "note"),
            " ", h("span", {class: "mono"}, f.check ?? "")),
          f.evidence ? [h("div", {class: "label"}, "evidence"), pre(f.evidence, "long")] : null,
          f.fix ? [h("div", {class: "label"}, "fix"), h("div", {class: "fix"}, f.fix)] : null)))) : h("div", {class: "muted"}, "no findings"))),
    section("Cost per tier", tierCostTable("submission-costs", s.costs || [], null)),
  ];
}

function submissionActions(s, page, showResult, reload) {
  const why = whyNot(["operator", "reviewer"]);
  const note = why ? h("div", {class: "why-not", id: "actions-why"}, why) : null;
  const run = async (buttons, label, method, body) => {
    buttons.forEach((b) => { b.disabled = true; });
    try {
      const r = await page.call("IntakeService", method, body);
      const sub = r.submission || {};
      const extra = method === "QuarantineSubmission" ? `, ${fmtCount(r.withdrawn ?? 0)} trajectories withdrawn` : "";
      showResult(`${label}: submission ${sub.id ?? s.id} is now ${sub.state ?? "?"}${extra}`);
      await reload();
    } catch (err) {
      if (!(err instanceof Stale) && !(err instanceof ApiError)) throw err;
    } finally {
      buttons.forEach((b) => { if (b.isConnected) b.disabled = Boolean(why); });
    }
  };

  if (s.state === "SUBMISSION_STATE_IN_REVIEW") {
    const text = h("textarea", {id: "review-note", rows: 3, placeholder: "what you saw (required)", disabled: Boolean(why)});
    const planted = h("input", {type: "checkbox", id: "review-planted", disabled: Boolean(why)});
    const approve = h("button", {type: "button", id: "review-approve", class: "primary", disabled: Boolean(why)}, "Approve");
    const reject = h("button", {type: "button", id: "review-reject", class: "danger", disabled: Boolean(why)}, "Reject");
    const buttons = [approve, reject];
    approve.addEventListener("click", () => quietly(run(buttons, "approved", "ReviewSubmission", {id: String(s.id), approve: true, note: text.value})));
    reject.addEventListener("click", () => quietly(run(buttons, "rejected", "ReviewSubmission",
      {id: String(s.id), approve: false, note: text.value, ...(planted.checked ? {planted: true} : {})})));
    return h("div", {class: "actions"}, note, h("label", {class: "block"}, "review note", text),
      h("label", {class: "inline"}, planted, " rejecting a deliberately planted exploit (tanks the author)"),
      h("div", {class: "buttons"}, approve, reject));
  }
  if (s.state === "SUBMISSION_STATE_APPROVED") {
    const reason = h("input", {type: "text", id: "quarantine-reason", placeholder: "the hack found (required)", disabled: Boolean(why)});
    const planted = h("input", {type: "checkbox", id: "quarantine-planted", disabled: Boolean(why)});
    const btn = h("button", {type: "button", id: "quarantine", class: "danger", disabled: Boolean(why)}, "Quarantine");
    btn.addEventListener("click", () => quietly(run([btn], "quarantined", "QuarantineSubmission",
      {id: String(s.id), reason: reason.value, ...(planted.checked ? {planted: true} : {})})));
    return h("div", {class: "actions"}, note,
      h("p", {class: "muted"}, "Quarantine takes this version out of service: the task bank stops serving it and its trajectories are withdrawn."),
      h("label", {class: "block"}, "reason", reason),
      h("label", {class: "inline"}, planted, " a deliberately planted exploit"),
      h("div", {class: "buttons"}, btn));
  }
  return h("div", {class: "muted", id: "actions-none"}, `no actions for a submission in state ${enumShort(s.state, "SUBMISSION_STATE_")}`);
}

// =============================================================================================
// Page: one contributor
// =============================================================================================

async function contributorPage(page, params, name) {
  const r = await page.call("IntakeService", "GetContributor", {name});
  const c = r.contributor || {};
  const ledger = c.ledger || [];
  const subs = h("div", {class: "table-wrap"}, h("div", {class: "muted"}, "loading…"));
  page.root.append(
    h("h1", {}, "Contributor ", h("span", {class: "mono"}, c.name ?? name)),
    h("div", {class: "tiles"},
      tile("contrib-reputation", "reputation", c.reputation ?? 0, fmtFloat(c.reputation ?? 0, 2)),
      tile("contrib-trust", "trust", c.trust ?? "", c.tanked ? `${c.trust || DASH} (tanked)` : (c.trust || DASH), c.tanked ? "tile-bad tile-text" : "tile-text"),
      tile("contrib-submitted", "submitted", c.submitted ?? 0, fmtCount(c.submitted ?? 0)),
      tile("contrib-accepted", "accepted", c.accepted ?? 0, fmtCount(c.accepted ?? 0)),
      tile("contrib-rejected", "rejected", c.rejected ?? 0, fmtCount(c.rejected ?? 0)),
      tile("contrib-paid", "paid", usdOf(c.total_paid) ?? 0, fmtUsd(c.total_paid ?? {})),
      tile("contrib-max-payout", "max bounty payout", usdOf(c.bounty_cap) ?? 0, fmtUsd(c.bounty_cap ?? {})),
      tile("contrib-seeds", "seeds per level", c.seeds ?? 0, fmtCount(c.seeds ?? 0)),
      tile("contrib-attack-budget", "attack budget", c.attack_budget ?? 0, fmtCount(c.attack_budget ?? 0))),
    section(`Reputation ledger (${ledger.length})`, table("ledger-table",
      [["seq", "num"], "at", ["delta", "num"], ["balance", "num"], "reason", ["submission", "num"]],
      ledger.map((e) => ({
        attrs: {class: "ledger-row"},
        cells: [numCell(String(e.seq ?? "")), fmtTime(e.at),
          {v: `${toNum(e.delta) > 0 ? "+" : ""}${fmtFloat(e.delta ?? 0, 2)}`, cls: toNum(e.delta) < 0 ? "num bad" : "num ok"},
          numCell(fmtFloat(e.balance ?? 0, 2)), e.reason ?? "",
          numCell(toNum(e.submission_id) ? link(`#/submission/${encodeURIComponent(e.submission_id)}`, String(e.submission_id)) : DASH)],
      })), {empty: "no ledger entries"})),
    section("Submissions", subs));
  page.loaded("contributor");

  // Their submissions: a convenience; if the caller may not list them, say so here, not in the banner.
  try {
    const list = await page.call("IntakeService", "ListSubmissions", {contributor: c.name ?? name, page_size: 50}, {optional: true});
    const tb = h("table", {id: "contributor-submissions", class: "grid clickable"}, submissionsHead(),
      h("tbody", {}, (list.submissions || []).map(submissionRow)));
    subs.replaceChildren((list.submissions || []).length ? tb : h("div", {class: "muted"}, "no submissions"));
  } catch (err) {
    if (err instanceof Stale) return;
    subs.replaceChildren(h("div", {class: "muted"}, `not shown: ${err instanceof ApiError ? err.text : err}`));
  }
}

// =============================================================================================
// Start: the header's token box, then the first page.
// =============================================================================================

function reloadAll() {
  quietly(refreshWhoami().then(refreshNodeInfo));
  route();
}

function start() {
  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = $("#token");
    const token = input.value.trim();
    if (token) sessionStorage.setItem(TOKEN_KEY, token); else sessionStorage.removeItem(TOKEN_KEY);
    input.value = "";
    reloadAll();
  });
  $("#token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("#token").value = "";
    reloadAll();
  });
  window.addEventListener("hashchange", route);
  // A poll skipped while the tab was hidden runs as soon as it is shown again.
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && current) for (const p of current.pollers) p.kick();
  });
  reloadAll();
}

start();
