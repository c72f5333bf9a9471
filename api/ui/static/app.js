// kron's dashboard: plain JavaScript, no dependencies.
// The API key lives in sessionStorage (this tab only) and goes in the Authorization header
// of fetch() calls to this server's JSON API. Data is only ever put in the page as text
// (textContent, text nodes, attributes set one by one): never as HTML.
"use strict";

const KEY = "kron.key";
const TENANT = "kron.tenant";
const SVG = "http://www.w3.org/2000/svg";
const DONE = new Set(["succeeded", "failed", "skipped", "missed", "cancelled"]);

// --- the API --------------------------------------------------------------------------------

function apiKey() { return sessionStorage.getItem(KEY); }

function toSignIn() {
  const next = location.pathname + location.search;
  location.assign("/ui/signin?next=" + encodeURIComponent(next));
}

async function api(method, path, body, key) {
  const headers = { "Accept": "application/json",
                    "Authorization": "Bearer " + (key || apiKey() || "") };
  const init = { method, headers, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  let data = null;
  try { data = await r.json(); } catch (e) { data = null; }
  if (r.status === 401 && !key) {
    sessionStorage.removeItem(KEY);
    toSignIn();
  }
  return { status: r.status, ok: r.ok, data };
}

// An answer's problem (RFC 9457) as a line of text: its detail, and the field it names
// unless `bare`.
function problem(res, bare) {
  const d = res.data || {};
  const text = d.detail || d.title || ("HTTP " + res.status);
  return d.field && !bare ? text + " (" + d.field + ")" : text;
}

// --- building the page ----------------------------------------------------------------------

function $(sel) { return document.querySelector(sel); }

// el("a", {href: "/ui/jobs/x", class: "c"}, "text", otherNode): children are text or nodes.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function notice(text, kind) {
  const n = $("#notice");
  n.textContent = text;
  n.className = "notice " + (kind || "");
  n.hidden = !text;
}

function jobLink(id, text) {
  return el("a", { href: "/ui/jobs/" + encodeURIComponent(id) }, text || id);
}

function runLink(id, text) {
  return el("a", { href: "/ui/runs/" + encodeURIComponent(id) }, text || id);
}

function badge(state) { return el("span", { class: "badge state-" + safeClass(state) }, state); }

// Why a queued run waits (its `reason`: "tenant concurrency limit", "dispatch rate"); ""
// for a run that is not queued.
function queuedReason(r) { return r && r.state === "queued" && r.reason ? String(r.reason) : ""; }

// A run's state as its user reads it: its badge, and a queued run's reason beside it.
function runState(r) {
  const why = queuedReason(r);
  if (!why) return badge(r.state);
  return el("span", { class: "run-state" }, badge(r.state), " ", el("span", { class: "reason" }, why));
}

// A run's state as plain text (a link's): "queued (dispatch rate)".
function runStateText(r) {
  const why = queuedReason(r);
  return why ? r.state + " (" + why + ")" : r.state;
}

function safeClass(s) { return String(s || "").replace(/[^a-z_]/g, ""); }

function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

function inZone(iso, tz) {
  try {
    return new Date(iso).toLocaleString("sv-SE", { timeZone: tz }) + " " + tz;
  } catch (e) { return ""; }
}

function ms(v) {
  if (v === null || v === undefined) return "–";
  return Math.abs(v) < 1000 ? v + " ms" : (v / 1000).toFixed(v < 10000 ? 2 : 1) + " s";
}

function replaceRows(tbody, rows) { tbody.replaceChildren(...rows); }

function every(seconds, fn) {
  fn();
  return setInterval(() => { if (!document.hidden) fn(); }, seconds * 1000);
}

// --- the frame: who is signed in ------------------------------------------------------------

function frame() {
  if (document.body.dataset.page === "signin") return true;
  if (!apiKey()) { toSignIn(); return false; }
  $("#tenant").textContent = sessionStorage.getItem(TENANT) || "?";
  $("#signout").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    sessionStorage.removeItem(TENANT);
    location.assign("/ui/signin");
  });
  return true;
}

// --- sign in --------------------------------------------------------------------------------

function pageSignin() {
  $("#signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const key = $("#signin-key").value.trim();
    const err = $("#signin-error");
    const res = await api("GET", "/v1/stats", undefined, key);
    if (!res.ok) {
      err.textContent = res.status === 401 ? "That key is not valid." : problem(res);
      err.hidden = false;
      return;
    }
    sessionStorage.setItem(KEY, key);
    sessionStorage.setItem(TENANT, res.data.tenant);
    const next = new URLSearchParams(location.search).get("next") || "";
    // Only a path of this dashboard: never another origin.
    location.assign(/^\/ui(\/[^/\\]|$|\?)/.test(next) ? next : "/ui");
  });
}

// --- overview -------------------------------------------------------------------------------

function pageOverview() {
  every(5, async () => {
    const res = await api("GET", "/v1/stats");
    if (!res.ok) return notice(problem(res), "error");
    const s = res.data;
    $("#count-queued").textContent = s.queued;
    $("#count-running").textContent = s.running;
    $("#count-failed").textContent = s.runs_by_state.failed;
    $("#count-succeeded").textContent = s.runs_by_state.succeeded;
    replaceRows($("#states tbody"), Object.entries(s.runs_by_state).map(
      ([k, v]) => el("tr", {}, el("td", {}, badge(k)), el("td", { class: "num" }, v))));
  });
  every(15, async () => {
    const res = await api("GET", "/ui/api/activity?minutes=60");
    if (!res.ok) return notice(problem(res), "error");
    const minutes = res.data.minutes;
    barChart($("#chart-executions"), minutes.map((m) => m.executions),
             minutes.map((m) => m.minute), "executions");
    lineChart($("#chart-lateness"), [
      { name: "p50", cls: "p50", values: minutes.map((m) => m.lateness_ms.p50) },
      { name: "p95", cls: "p95", values: minutes.map((m) => m.lateness_ms.p95) },
    ], minutes.map((m) => m.minute));
    $("#activity-note").textContent = res.data.runs + " runs in the hour" +
      (res.data.truncated ? " (more than the dashboard reads: the counts are partial)" : "");
  });
}

const W = 720, H = 180, PAD = 36;

function axes(box, max, labels, unit) {
  box.append(svg("line", { x1: PAD, y1: H - PAD, x2: W - 4, y2: H - PAD, class: "axis" }));
  box.append(svg("line", { x1: PAD, y1: 8, x2: PAD, y2: H - PAD, class: "axis" }));
  box.append(svg("text", { x: PAD - 4, y: 14, class: "tick", "text-anchor": "end" },
                 unit === "ms" ? ms(max) : max));
  box.append(svg("text", { x: PAD - 4, y: H - PAD, class: "tick", "text-anchor": "end" }, 0));
  if (labels.length) {
    box.append(svg("text", { x: PAD, y: H - PAD + 16, class: "tick" }, when(labels[0]).slice(11, 16)));
    box.append(svg("text", { x: W - 4, y: H - PAD + 16, class: "tick", "text-anchor": "end" },
                   when(labels[labels.length - 1]).slice(11, 16) + " UTC"));
  }
}

function chartBox(host) {
  const box = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot", role: "img" });
  host.replaceChildren(box);
  return box;
}

function barChart(host, values, labels, what) {
  const box = chartBox(host);
  const max = Math.max(1, ...values);
  axes(box, max, labels, "");
  const step = (W - PAD - 8) / Math.max(1, values.length);
  values.forEach((v, i) => {
    const h = (H - PAD - 10) * v / max;
    const bar = svg("rect", { x: PAD + 2 + i * step, y: H - PAD - h, width: Math.max(1, step - 2),
                              height: h, class: "bar" });
    bar.append(svg("title", {}, when(labels[i]) + ": " + v + " " + what));
    box.append(bar);
  });
}

function lineChart(host, series, labels) {
  const box = chartBox(host);
  const all = series.flatMap((s) => s.values).filter((v) => v !== null);
  const max = Math.max(1, ...all);
  axes(box, max, labels, "ms");
  const step = (W - PAD - 8) / Math.max(1, labels.length - 1);
  series.forEach((s, n) => {
    const pts = [];
    s.values.forEach((v, i) => {
      if (v === null) return;
      const x = PAD + 2 + i * step, y = H - PAD - (H - PAD - 10) * Math.max(0, v) / max;
      pts.push(x.toFixed(1) + "," + y.toFixed(1));
      const dot = svg("circle", { cx: x, cy: y, r: 2, class: "dot " + s.cls });
      dot.append(svg("title", {}, when(labels[i]) + " " + s.name + ": " + ms(v)));
      box.append(dot);
    });
    box.append(svg("polyline", { points: pts.join(" "), class: "line " + s.cls }));
    box.append(svg("text", { x: W - 60, y: 16 + 14 * n, class: "legend " + s.cls }, s.name));
  });
  if (!all.length) {
    box.append(svg("text", { x: W / 2, y: H / 2, class: "tick", "text-anchor": "middle" },
                   "no executions in the last hour"));
  }
}

// --- jobs -----------------------------------------------------------------------------------

function kindOf(def) {
  const when = def.schedule ? "cron" : "one-off";
  const what = def.dag ? "dag" : (def.target && def.target.type) || "?";
  return when + " · " + what;
}

function scheduleOf(def) {
  return def.schedule ? def.schedule.cron + " (" + def.schedule.timezone + ")" : "at " + when(def.run_at);
}

function labels(meta) {
  return el("span", {}, ...Object.entries(meta || {}).map(([k, v]) => el("span", { class: "label" }, k + "=" + v)));
}

function pageJobs() {
  const form = $("#job-filter");
  const params = new URLSearchParams(location.search);
  for (const name of ["name", "label", "status", "kind"]) form.elements[name].value = params.get(name) || "";
  let cursor = null;
  async function load(more) {
    const q = new URLSearchParams();
    for (const name of ["name", "label", "status", "kind"]) {
      if (form.elements[name].value) q.set(name, form.elements[name].value);
    }
    if (more && cursor) q.set("cursor", cursor);
    const res = await api("GET", "/ui/api/jobs?" + q.toString());
    if (!res.ok) return notice(problem(res), "error");
    const rows = res.data.jobs.map((j) => el("tr", { "data-job-id": j.job_id },
      el("td", {}, jobLink(j.job_id, j.name)), el("td", {}, badge(j.status)),
      el("td", {}, kindOf(j.definition)), el("td", {}, scheduleOf(j.definition)),
      el("td", {}, when(j.next_run_at)),
      el("td", {}, j.last_run ? runLink(j.last_run.run_id, runStateText(j.last_run)) : "–"),
      el("td", {}, labels(j.definition.metadata))));
    const body = $("#jobs tbody");
    if (more) body.append(...rows); else replaceRows(body, rows);
    cursor = res.data.next_cursor;
    $("#jobs-more").hidden = !cursor;
    $("#jobs-empty").hidden = body.children.length > 0;
    if (res.data.truncated) notice("This tenant has more jobs than one search reads: the list may be partial.");
  }
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const name of ["name", "label", "status", "kind"]) {
      if (form.elements[name].value) q.set(name, form.elements[name].value);
    }
    history.replaceState(null, "", "/ui/jobs" + (q.toString() ? "?" + q : ""));
    load(false);
  });
  $("#jobs-more").addEventListener("click", () => load(true));
  load(false);
}

// --- a new job ------------------------------------------------------------------------------

function pageJobNew() {
  const form = $("#job-form");
  const sync = () => {
    const cron = $("#f-cron-kind").checked;
    form.classList.toggle("is-cron", cron);
    $("#f-cron").required = cron;
  };
  form.addEventListener("change", sync);
  sync();
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const err = $("#form-error");
    err.hidden = true;
    let body;
    try { body = jobBody(); } catch (e) { err.textContent = e.message; err.hidden = false; return; }
    $("#f-submit").disabled = true;
    const res = await api("POST", "/v1/jobs", body);
    $("#f-submit").disabled = false;
    if (res.status !== 201 && res.status !== 200) {
      err.textContent = problem(res);
      err.hidden = false;
      return;
    }
    location.assign("/ui/jobs/" + encodeURIComponent(res.data.job_id));
  });
}

function jobBody() {
  const body = { name: $("#f-name").value.trim() };
  if ($("#f-cron-kind").checked) {
    body.schedule = { cron: $("#f-cron").value.trim(), timezone: $("#f-tz").value.trim() || "UTC" };
  } else {
    body.run_at = $("#f-run-at").value.trim() || new Date().toISOString();
  }
  body.target = { type: "http", method: $("#f-method").value, url: $("#f-url").value.trim() };
  if ($("#f-body").value) body.target.body = $("#f-body").value;
  body.retry = { max_attempts: Number($("#f-attempts").value || 3) };
  const meta = {};
  for (const line of $("#f-metadata").value.split("\n")) {
    if (!line.trim()) continue;
    const at = line.indexOf("=");
    if (at < 1) throw new Error("a label is key=value: " + line.trim());
    meta[line.slice(0, at).trim()] = line.slice(at + 1).trim();
  }
  body.metadata = meta;
  return body;
}

// --- a job ----------------------------------------------------------------------------------

function pageJob() {
  const id = document.body.dataset.jobId;
  const path = "/v1/jobs/" + encodeURIComponent(id);
  let tz = "UTC";

  async function loadJob() {
    const res = await api("GET", path);
    if (res.status === 404) {
      $("#job").hidden = true;
      notice("Job not found: no job " + id + " for this tenant.", "error");
      return false;
    }
    if (!res.ok) { notice(problem(res), "error"); return false; }
    const j = res.data;
    tz = (j.definition.schedule && j.definition.schedule.timezone) || "UTC";
    document.title = j.name + " · kron";
    $("#job-name").textContent = j.name;
    const st = $("#job-status");
    st.textContent = j.status;
    st.className = "badge state-" + safeClass(j.status);
    $("#job-id").textContent = j.job_id;
    $("#job-spec").textContent = JSON.stringify(j.definition, null, 2);
    $("#btn-pause").disabled = j.status !== "active";
    $("#btn-resume").disabled = j.status !== "paused";
    $("#btn-trigger").disabled = j.status === "deleted";
    $("#btn-delete").disabled = j.status === "deleted";
    $("#job").hidden = false;
    return true;
  }

  async function loadUpcoming() {
    const res = await api("GET", "/ui/api/jobs/" + encodeURIComponent(id) + "/upcoming?count=5");
    if (!res.ok) return;
    replaceRows($("#upcoming"), res.data.upcoming.map((t) => el("li", {}, when(t),
      tz !== "UTC" ? el("span", { class: "muted" }, " · " + inZone(t, tz)) : null)));
    $("#upcoming-note").textContent = !res.data.upcoming.length ? "No slots to come." :
      res.data.status === "paused" ? "Paused: these slots are recorded skipped until it is resumed." : "";
  }

  async function loadRuns() {
    const res = await api("GET", path + "/runs?limit=50");
    if (!res.ok) return;
    replaceRows($("#runs tbody"), res.data.runs.map((r) => el("tr", { "data-run-id": r.run_id, class: "run" },
      el("td", {}, runLink(r.run_id, when(r.scheduled_for))), el("td", {}, runState(r)),
      el("td", {}, r.trigger), el("td", { class: "num" }, r.attempt),
      el("td", { class: "num" }, ms(r.lateness_ms)),
      el("td", {}, r.error || (queuedReason(r) ? "" : r.reason) || taskCounts(r.tasks)))));
    $("#runs-empty").hidden = res.data.runs.length > 0;
  }

  async function act(label, method, url) {
    $("#action-result").textContent = label + "…";
    const res = await api(method, url);
    $("#action-result").textContent = res.ok ? label + ": done" : label + " failed: " + problem(res);
    if (res.ok && method === "DELETE") {
      location.assign("/ui/jobs");  // a deleted job's page is not found
      return;
    }
    if (await loadJob()) { loadUpcoming(); loadRuns(); }
  }

  $("#btn-pause").addEventListener("click", () => act("Pause", "POST", path + ":pause"));
  $("#btn-resume").addEventListener("click", () => act("Resume", "POST", path + ":resume"));
  $("#btn-trigger").addEventListener("click", () => act("Run now", "POST", path + ":trigger"));
  $("#btn-delete").addEventListener("click", () => {
    if (confirm("Delete this job? Its runs stay readable.")) act("Delete", "DELETE", path);
  });

  loadJob().then((found) => {
    if (!found) return;
    loadUpcoming();
    setInterval(() => { if (!document.hidden) loadUpcoming(); }, 30000);
    every(2, async () => { if (await loadJob()) loadRuns(); });
  });
}

function taskCounts(tasks) {
  if (!tasks) return "";
  return "tasks: " + Object.entries(tasks).filter(([, n]) => n > 0).map(([k, n]) => n + " " + k).join(", ");
}

// --- a run ----------------------------------------------------------------------------------

function pageRun() {
  const id = document.body.dataset.runId;
  let named = false;
  let timer = null;
  let shown = null;  // the run as last shown
  let grace = 0;  // reads after a command that go on while the run still shows it ended
  const load = async () => {
    const res = await api("GET", "/v1/runs/" + encodeURIComponent(id));
    if (res.status === 404) {
      clearInterval(timer);
      $("#run").hidden = true;
      notice("Run not found: no run " + id + " for this tenant.", "error");
      return;
    }
    if (!res.ok) return notice(problem(res), "error");
    shown = res.data;
    showRun(res.data);
    if (!DONE.has(res.data.state)) grace = 0;
    else if (grace > 0) grace--;  // a retry the worker has not applied yet: read again
    else clearInterval(timer);
    if (!named) {  // the job's name, once (a deleted job's runs keep its id only)
      named = true;
      const job = await api("GET", "/v1/jobs/" + encodeURIComponent(res.data.job_id));
      if (job.ok) $("#run-job").textContent = job.data.name;
    }
  };
  const start = () => { clearInterval(timer); timer = every(2, load); };
  runActions(id, () => shown, () => { grace = 5; start(); });
  start();
}

// Which commands a run takes, as POST /v1/runs/{id}:cancel and :retry judge it
// (api/routes/run_actions.py): a DAG run is cancelled while running and retried when failed
// or cancelled; a plain run is cancelled while queued, running or waiting for its retry, and
// retried when failed, missed or skipped; a DAG task instance takes neither (its run does).
// The API has the last word: a run that changed meanwhile answers 409, shown as it says.
function runCommands(r) {
  if (!r || r.task_id) return { cancel: false, retry: false };
  if (r.tasks) return { cancel: r.state === "running", retry: r.state === "failed" || r.state === "cancelled" };
  return { cancel: ["queued", "running", "retry_pending"].includes(r.state),
           retry: ["failed", "missed", "skipped"].includes(r.state) };
}

// An attempt's output (`attempts[].output`: a string, bounded by the server) as text to
// show; null when the attempt has none.
function outputText(output) {
  if (output === undefined || output === null) return null;
  return typeof output === "string" ? output : JSON.stringify(output, null, 2);
}

// An attempt's rows in the attempts table: the attempt, then its output if it has one.
function attemptRows(a) {
  const rows = [el("tr", { class: "attempt", "data-attempt": a.attempt },
    el("td", { class: "num" }, a.attempt), el("td", {}, a.worker || "–"),
    el("td", {}, when(a.started_at)), el("td", {}, when(a.finished_at)),
    el("td", {}, a.outcome ? badge(a.outcome) : "–"), el("td", { class: "num" }, a.status_code ?? "–"),
    el("td", {}, a.error || ""))];
  const out = outputText(a.output);
  if (out !== null) {
    rows.push(el("tr", { class: "output", "data-attempt": a.attempt }, el("td", {}),
      el("td", { colspan: 6 }, el("pre", {}, out))));
  }
  return rows;
}

function showRun(r) {
  $("#run-id").textContent = r.exec_id || r.run_id;
  const st = $("#run-state");
  st.textContent = r.state;
  st.className = "badge state-" + safeClass(r.state);
  $("#run-reason").textContent = queuedReason(r) ? "waiting: " + queuedReason(r) : "";
  const job = $("#run-job");
  if (!job.textContent) job.textContent = r.job_id;
  job.href = "/ui/jobs/" + encodeURIComponent(r.job_id);
  const fields = [["scheduled for", when(r.scheduled_for)], ["trigger", r.trigger],
    ["started", when(r.started_at)], ["finished", when(r.finished_at)],
    ["lateness", ms(r.lateness_ms)], ["status code", r.status_code ?? "–"],
    ["error", r.error || "–"], ["reason", r.reason || "–"]];
  // A task instance's commands are its DAG run's: a link there.
  if (r.task_id) fields.push(["task", el("span", {}, r.task_id + " of run ", runLink(r.run_id))]);
  if (r.dst_outcome) fields.push(["DST", r.dst_outcome]);
  replaceRows($("#run-fields tbody"), fields.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
  const attempts = r.attempts || [];
  replaceRows($("#attempts tbody"), attempts.flatMap(attemptRows));
  $("#attempts-empty").hidden = attempts.length > 0;
  $("#attempts-section").hidden = !!r.tasks && !attempts.length;
  if (r.tasks) showTasks(r.tasks);
  const can = runCommands(r);
  $("#btn-cancel").hidden = !can.cancel;
  $("#btn-retry").hidden = !can.retry;
  $("#run").hidden = false;
}

function runActions(id, current, reload) {
  const act = async (label, action) => {
    $("#run-action-result").textContent = label + "…";
    const res = await api("POST", "/v1/runs/" + encodeURIComponent(id) + ":" + action);
    // A refusal (409: the run is in no state for it) says why, in the API's words.
    $("#run-action-result").textContent = res.ok
      ? label + ": " + (res.data.applied ? "done" : "sent") : label + " failed: " + problem(res, true);
    reload();
  };
  $("#btn-cancel").addEventListener("click", () => {
    const r = current();
    const what = r && r.tasks
      ? "Cancel this run? Its running tasks are cancelled, the rest skipped."
      : "Cancel this run? Its attempt is stopped, and a result that comes after is ignored.";
    if (confirm(what)) act("Cancel", "cancel");
  });
  $("#btn-retry").addEventListener("click", () => act("Retry", "retry"));
}

function showTasks(tasks) {
  $("#dag-section").hidden = false;
  dagGraph($("#dag-graph"), tasks);
  replaceRows($("#tasks tbody"), tasks.map((t) => el("tr", { "data-task-id": t.task_id },
    el("td", {}, t.task_id), el("td", {}, badge(t.state)), el("td", {}, (t.depends_on || []).join(", ")),
    el("td", {}, t.trigger_rule || ""), el("td", { class: "task-attempts" }, ...taskAttempts(t.attempts || [])),
    el("td", {}, t.reason || ""))));
}

// A task's attempts in its row: "#1 failed 500; #2 …", and their outputs folded beneath.
function taskAttempts(attempts) {
  const line = attempts.map(
    (a) => "#" + a.attempt + " " + (a.outcome || "…") + (a.status_code ? " " + a.status_code : "")).join("; ");
  const outs = attempts.filter((a) => outputText(a.output) !== null)
    .map((a) => "#" + a.attempt + "\n" + outputText(a.output));
  if (!outs.length) return [line];
  return [line, el("details", {}, el("summary", {}, "output"), el("pre", {}, outs.join("\n\n")))];
}

// Tasks in columns by depth (the longest chain of dependencies before them), edges as lines.
function dagLayout(tasks) {
  const byId = new Map(tasks.map((t) => [t.task_id, t]));
  const depth = new Map();
  const visit = (id, seen) => {
    if (depth.has(id)) return depth.get(id);
    if (seen.has(id)) return 0;
    seen.add(id);
    const deps = (byId.get(id).depends_on || []).filter((d) => byId.has(d));
    const d = deps.length ? 1 + Math.max(...deps.map((p) => visit(p, seen))) : 0;
    depth.set(id, d);
    return d;
  };
  const rows = new Map();
  const place = new Map();
  for (const t of tasks) {
    const d = visit(t.task_id, new Set());
    const row = rows.get(d) || 0;
    rows.set(d, row + 1);
    place.set(t.task_id, { col: d, row });
  }
  return { place, cols: Math.max(1, ...[...rows.keys()].map((d) => d + 1)), rows: Math.max(1, ...rows.values()) };
}

function dagGraph(host, tasks) {
  const { place, cols, rows } = dagLayout(tasks);
  const NW = 130, NH = 30, GX = 50, GY = 16;
  const w = cols * (NW + GX), h = rows * (NH + GY) + GY;
  const box = svg("svg", { viewBox: `0 0 ${w} ${h}`, class: "dag", width: w, height: h });
  const xy = (id) => { const p = place.get(id); return [10 + p.col * (NW + GX), GY + p.row * (NH + GY)]; };
  for (const t of tasks) {
    for (const dep of t.depends_on || []) {
      if (!place.has(dep)) continue;
      const [x1, y1] = xy(dep), [x2, y2] = xy(t.task_id);
      box.append(svg("line", { x1: x1 + NW, y1: y1 + NH / 2, x2, y2: y2 + NH / 2, class: "edge" }));
    }
  }
  for (const t of tasks) {
    const [x, y] = xy(t.task_id);
    const g = svg("g", { class: "node state-" + safeClass(t.state), "data-task-id": t.task_id });
    g.append(svg("rect", { x, y, width: NW, height: NH, rx: 5 }));
    g.append(svg("text", { x: x + 8, y: y + 19 }, t.task_id.length > 16 ? t.task_id.slice(0, 15) + "…" : t.task_id));
    g.append(svg("title", {}, t.task_id + ": " + t.state));
    box.append(g);
  }
  host.replaceChildren(box);
}

// --- failures -------------------------------------------------------------------------------

function pageFailures() {
  const load = async () => {
    const since = $("#failures-since").value, state = $("#failures-state").value;
    const res = await api("GET", "/ui/api/runs?state=" + encodeURIComponent(state) +
                          "&since_minutes=" + encodeURIComponent(since) + "&limit=200");
    if (!res.ok) return notice(problem(res), "error");
    replaceRows($("#failed-runs tbody"), res.data.runs.map((r) => el("tr", { "data-run-id": r.run_id },
      el("td", {}, runLink(r.run_id, when(r.scheduled_for))),
      el("td", {}, jobLink(r.job_id, r.job_name || r.job_id)), el("td", {}, runState(r)),
      el("td", { class: "num" }, r.attempt), el("td", {}, r.error || r.reason || ""))));
    $("#failures-empty").hidden = res.data.runs.length > 0;
    $("#failures-note").textContent = res.data.matched > res.data.runs.length
      ? "Showing the newest " + res.data.runs.length + " of " + res.data.matched + "." : "";
  };
  $("#failures-filter").addEventListener("change", load);
  every(10, load);
  deadLetters();
}

// The tenant's dead letters (GET /v1/dead-letters), newest first, a page at a time by the
// list's cursor: the first page is read again every 15 s until "More" is pressed. The page
// size is `dl_limit` in the page's query (1..500, 50 if absent).
function deadLetters() {
  const table = $("#dead-letters"), note = $("#dead-letters-note"), more = $("#dead-letters-more");
  const asked = Number(new URLSearchParams(location.search).get("dl_limit"));
  const limit = Number.isInteger(asked) && asked >= 1 && asked <= 500 ? asked : 50;
  let cursor = null, paged = false, latest = 0;
  const load = async (next) => {
    const mine = ++latest;
    const q = new URLSearchParams({ limit: String(limit) });
    if (next && cursor) q.set("cursor", cursor);
    const res = await api("GET", "/v1/dead-letters?" + q.toString());
    if (mine !== latest) return;  // a newer read is on its way
    if (!res.ok) { note.textContent = problem(res); return; }
    const rows = res.data.dead_letters.map(deadLetterRow);
    if (next) table.tBodies[0].append(...rows); else replaceRows(table.tBodies[0], rows);
    cursor = res.data.next_cursor;
    more.hidden = !cursor;
    const n = table.tBodies[0].children.length;
    table.hidden = n === 0;
    note.textContent = n ? "" : "None.";
  };
  more.addEventListener("click", () => { paged = true; load(true); });
  every(15, () => { if (!paged) load(false); });
}

// One dead letter (api/routes/dead_letters.py's DeadLetter): when, what (a failure alert or
// a refused command, and its error class), its job and run, the error, and for an alert its
// output and for a command whether it was redriven.
function deadLetterRow(d) {
  const a = d.alert, c = d.command;
  let job = "–", run = "–";
  if (a) {
    job = a.job_id ? jobLink(a.job_id, a.job_name || a.job_id) : "–";
    if (a.run_id) {
      run = el("span", {}, runLink(a.run_id, a.scheduled_for ? when(a.scheduled_for) : a.run_id),
        a.task_id ? " task " + a.task_id : "", a.attempt ? " #" + a.attempt : "");
    }
  } else if (c && c.job_id) {
    job = el("span", {}, jobLink(c.job_id, c.job_id));
  }
  const what = el("span", {}, el("span", { class: "badge kind-" + safeClass(d.kind) }, d.kind), " ",
    el("code", {}, d.error_class), c ? el("span", { class: "muted" }, " " + c.name) : null);
  const error = el("td", { class: "dl-error" }, d.error);
  const out = a ? outputText(a.output) : null;
  if (out !== null) error.append(el("details", {}, el("summary", {}, "output"), el("pre", {}, out)));
  if (d.redriven) error.append(el("div", { class: "muted" }, "redriven " + when(d.redriven.at) + " as command " + d.redriven.command_id));
  return el("tr", { "data-dl-id": d.id, class: "dead-letter kind-" + safeClass(d.kind) },
    el("td", {}, when(d.occurred_at)), el("td", {}, what), el("td", {}, job), el("td", {}, run), error);
}

// --- start ----------------------------------------------------------------------------------

const PAGES = { signin: pageSignin, overview: pageOverview, jobs: pageJobs, job_new: pageJobNew,
                job: pageJob, run: pageRun, failures: pageFailures };

document.addEventListener("DOMContentLoaded", () => {
  if (frame()) PAGES[document.body.dataset.page]();
});
