// gpuhealth status page: polls /api/v1/overview and redraws. No dependencies, no CDN.
// Every string from the server goes through textContent (never innerHTML).
// The fleet is shown grouped (state, node pool, reason); the grid lists the nodes the filter
// selects (at most the server's limit, problem nodes first). The filter lives in the URL's
// hash (#state=unhealthy&pool=a&reason=xid-79) so a filtered view can be shared.
// Reads are authorized by default (http.auth.reads): the page sends the bearer token the
// viewer gives it (the sign-in form, or #token=... in the URL, moved out of the URL at once)
// and keeps it for this tab only (sessionStorage).
"use strict";

const OVERVIEW_URL = "/api/v1/overview";
const TOKEN_KEY = "gpuhealth.token";
const POLL_MS = 2000;
const STATES = ["unhealthy", "unknown", "degraded", "healthy"];
const ANY = "*";
const filters = { state: ANY, pool: ANY, reason: ANY };
let last = null;

function readHash() {
  const h = new URLSearchParams(location.hash.slice(1));
  if (h.has("token")) {
    sessionStorage.setItem(TOKEN_KEY, h.get("token"));
    h.delete("token");
    const rest = h.toString();
    history.replaceState(null, "", rest ? `#${rest}` : location.pathname);
  }
  for (const k of Object.keys(filters)) filters[k] = h.has(k) ? h.get(k) : ANY;
}

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function askForToken(status, body) {
  const form = document.getElementById("auth");
  form.hidden = false;
  form.setAttribute("data-status", String(status));
  const why = (body && body.message) || `HTTP ${status}`;
  document.getElementById("auth-why").textContent =
    status === 403 ? `this token may not read the fleet: ${why}` : `a bearer token is needed: ${why}`;
  const up = document.getElementById("updated");
  up.setAttribute("data-ok", "false");
  up.textContent = status === 403 ? "not allowed" : "sign in to see the fleet";
}

document.getElementById("auth").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = document.getElementById("auth-token");
  if (input.value.trim()) sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  document.getElementById("auth").hidden = true;
  clearTimeout(pollTimer);
  poll();
});

function query() {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(filters)) if (v !== ANY) q.set(k, v);
  return q.toString();
}

function setFilters(next) {
  Object.assign(filters, next);
  const q = query();
  history.replaceState(null, "", q ? `#${q}` : location.pathname);
  if (last) renderFilters(last);
  clearTimeout(pollTimer);
  poll();
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else node[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function replace(id, ...children) {
  const target = document.getElementById(id);
  target.replaceChildren(...children);
}

function time(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return d.toLocaleTimeString([], { hour12: false });
}

function primaryCode(gpu) {
  const c = gpu.conditions.find((x) => x.severity === gpu.state) || gpu.conditions[0];
  return c ? c.code : "";
}

function renderSummary(o) {
  const s = o.summary;
  const n = s.nodes_by_state;
  const g = s.gpus_by_state;
  replace("summary",
    el("b", {}, s.nodes), " nodes (",
    el("b", {}, n.unhealthy), " unhealthy, ", el("b", {}, n.degraded), " degraded) · ",
    el("b", {}, s.gpus), " GPUs (", el("b", {}, g.unhealthy), " unhealthy, ",
    el("b", {}, g.degraded), " degraded) · ", el("b", {}, s.tainted_nodes), " tainted · ",
    el("b", {}, s.idle_allocations), " idle · ", el("b", {}, s.connected_agents),
    " agents connected", o.dry_run ? " · DRY RUN" : "", incomplete(o));
}

// Past one process: the shards this overview could not read (never a part shown as the whole).
function incomplete(o) {
  const missing = (o.shards && o.shards.unavailable) || [];
  if (!missing.length) return "";
  const why = missing.map((u) => `shard ${u.shard}: ${u.reason}`).join("; ");
  return el("b", { class: "incomplete", title: why },
    ` · INCOMPLETE: shard ${missing.map((u) => u.shard).join(", ")} not read`);
}

function renderGrid(o) {
  const idle = new Set((o.idle || []).map((a) => a.uuid));
  const width = Math.max(1, ...o.nodes.map((n) => n.gpus.length));
  const rows = o.nodes.map((n) => {
    const head = el("th", { "data-node": n.name },
      n.name, el("span", { class: `chip node-state state-${n.state}` }, n.state),
      ...n.taints.map((t) => el("span", { class: t.endsWith(":PreferNoSchedule") ? "taint soft" : "taint" }, t)),
      ...(n.allocations_unknown ? [el("span", { class: "taint soft", title: n.allocations_unknown },
        "allocations unknown: no GPU blamed from application faults")] : []));
    if (!n.connected) head.append(el("span", { class: "taint soft" }, "agent not connected"));
    for (const r of n.rails || []) {
      const what = r.verdicts.length ? r.verdicts.join(", ") : r.state || "not up";
      head.append(el("span", {
        class: "taint soft rail", "data-rail": r.port,
        title: `${r.port}: ${r.state} ${r.phys_state}, ${r.flaps} flap(s) in the window` +
          (r.gpus.length ? `; GPUs behind it: ${r.gpus.join(", ")}` : ""),
      }, `rail ${r.port}: ${what}`));
    }
    const cells = n.gpus.map((g) => {
      const tip = [`GPU ${g.index} ${g.uuid}`, g.model, `state: ${g.state}` +
        (g.since ? ` since ${time(g.since)}` : ""), g.summary];
      if (g.temperature_c !== null) tip.push(`temperature ${g.temperature_c.toFixed(0)} °C`);
      if (g.utilization_ratio !== null) tip.push(`utilisation ${(g.utilization_ratio * 100).toFixed(0)} %`);
      if (idle.has(g.uuid)) tip.push("IDLE: allocated to a pod that does not use it");
      const isIdle = idle.has(g.uuid);
      const temp = g.temperature_c !== null ? `${g.temperature_c.toFixed(0)}°C` : "";
      const code = g.state !== "healthy" ? primaryCode(g) : isIdle ? "idle" : temp;
      return el("td", {
        class: `gpu state-${g.state}${idle.has(g.uuid) ? " idle" : ""}`,
        title: tip.filter(Boolean).join("\n"),
        "data-node": n.name, "data-gpu": g.index, "data-state": g.state,
        "data-idle": idle.has(g.uuid) ? "true" : null,
      }, el("span", { class: "idx" }, `GPU ${g.index}`), el("span", { class: "code" }, code));
    });
    for (let i = cells.length; i < width; i++) cells.push(el("td", { class: "empty" }, i === 0 ? "no report yet" : ""));
    return el("tr", { "data-node": n.name, "data-state": n.state }, head, ...cells);
  });
  replace("grid", el("tbody", {}, ...(rows.length ? rows : [el("tr", {}, el("td", { class: "muted" }, "no GPU nodes"))])));
}

function poolName(p) { return p === "" ? "(no pool)" : p; }

function renderGroups(o) {
  const head = el("tr", {}, ...["state", "node pool", "reason", "nodes"].map((h) => el("th", {}, h)));
  const rows = o.groups.map((g) => el("tr", {
    class: "group", "data-state": g.state, "data-pool": g.pool, "data-reason": g.reason, "data-count": g.nodes,
    title: "show these nodes", onclick: () => setFilters({ state: g.state, pool: g.pool, reason: g.reason || ANY }),
  }, el("td", {}, el("span", { class: `chip state-${g.state}` }, g.state)), el("td", {}, poolName(g.pool)),
  el("td", {}, g.reason || "-"), el("td", { class: "num" }, g.nodes)));
  replace("groups", el("tbody", {}, ...(rows.length ? [head, ...rows] : [el("tr", {}, el("td", { class: "muted" }, "no GPU nodes"))])));
}

function options(id, values, label) {
  const select = document.getElementById(id);
  const key = id.slice(2);
  const all = [ANY, ...values];
  if (filters[key] !== ANY && !values.includes(filters[key])) all.push(filters[key]);
  select.replaceChildren(...all.map((v) => el("option", { value: v, selected: v === filters[key] }, v === ANY ? `any ${key}` : label(v))));
}

function renderFilters(o) {
  const pools = [...new Set(o.groups.map((g) => g.pool))].sort();
  const reasons = [...new Set(o.groups.map((g) => g.reason).filter(Boolean))].sort();
  options("f-state", STATES, (v) => v);
  options("f-pool", pools, poolName);
  options("f-reason", reasons, (v) => v);
  const shown = document.getElementById("shown");
  shown.setAttribute("data-shown", String(o.nodes.length));
  shown.setAttribute("data-matched", String(o.nodes_matched));
  shown.textContent = o.nodes.length < o.nodes_matched
    ? `showing ${o.nodes.length} of ${o.nodes_matched} matching nodes (problem nodes first); narrow the filter to see the rest`
    : `${o.nodes_matched} matching node(s)`;
}

function renderTaints(o) {
  const items = o.nodes.filter((n) => n.taints.length).map((n) =>
    el("li", { "data-node": n.name }, el("b", {}, n.name), " ",
      ...n.taints.map((t) => el("code", { class: t.endsWith(":PreferNoSchedule") ? "soft" : "" }, t, " "))));
  replace("taints", ...(items.length ? items : [el("li", { class: "muted" }, "none")]));
}

function renderBreaker(o) {
  const b = o.breaker;
  const box = document.getElementById("breaker");
  if (!b) { box.className = "breaker muted"; box.replaceChildren("not reported by this controller"); return; }
  box.className = `breaker ${b.open ? "open" : "closed"}`;
  box.setAttribute("data-open", String(b.open));
  box.replaceChildren(...[
    el("div", { class: "big" }, !b.enabled ? "disabled" : b.open ? "OPEN — new taints blocked" : "closed"),
    el("div", {}, `${b.nodes_tainted_in_window} node(s) newly tainted in the window; limit ${b.limit || "-"}; trips ${b.trips}`),
    b.blocked_nodes.length ? el("div", {}, `blocked: ${b.blocked_nodes.join(", ")}`) : null,
    b.open ? el("div", { class: "muted" }, "reset: gpuhealth-controller breaker reset (operators)") : null,
  ].filter(Boolean));
}

function renderIdle(o) {
  if (o.idle === null) { replace("idle", el("tbody", {}, el("tr", {}, el("td", { class: "muted" }, "idle detection not running")))); return; }
  const rows = o.idle.map((a) => el("tr", { "data-pod": `${a.namespace}/${a.pod}` },
    el("td", {}, `${a.namespace}/${a.pod}`), el("td", {}, a.node), el("td", {}, `GPU ${a.gpu}`),
    el("td", {}, `${Math.round(a.idle_for_s)} s < ${Math.round(a.threshold_ratio * 100)} %`)));
  const head = el("tr", {}, el("th", {}, "pod"), el("th", {}, "node"), el("th", {}, "gpu"), el("th", {}, "idle"));
  replace("idle", el("tbody", {}, ...(rows.length ? [head, ...rows] : [el("tr", {}, el("td", { class: "muted" }, "none"))])));
}

const PIPELINE = ["Pending", "Quarantined", "Draining", "Remediating", "Validating", "Returned"];

function duration(s) {
  if (s === null || s === undefined) return "-";
  s = Math.max(0, Math.floor(s));
  return s < 120 ? `${s}s` : s < 7200 ? `${Math.floor(s / 60)}m` : `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

function renderRemediation(o) {
  const r = o.remediation;
  const box = document.getElementById("pipeline");
  if (!r) {
    box.className = "pipeline muted"; box.replaceChildren("remediation off");
    replace("episodes", el("tbody", {})); return;
  }
  const stage = (p) => el("span", { class: `stage phase-${p.toLowerCase()}`, "data-phase": p, "data-count": String(r.pipeline[p] || 0) },
    el("b", {}, String(r.pipeline[p] || 0)), ` ${p}`);
  const flow = [];
  PIPELINE.forEach((p, i) => { if (i) flow.push(" → "); flow.push(stage(p)); });
  box.className = "pipeline";
  box.replaceChildren(...flow, " | ", stage("Escalated"), " ", stage("Failed"));
  const rows = r.episodes.map((e) => el("tr", { "data-episode": e.name, "data-node": e.node, "data-phase": e.phase },
    el("td", {}, e.node), el("td", { class: `phase-${e.phase.toLowerCase()}` }, e.phase), el("td", {}, e.action),
    el("td", { title: e.message || "" }, e.reason || "-"), el("td", {}, duration(e.in_phase_s)), el("td", {}, String(e.evicted))));
  const head = el("tr", {}, ...["node", "phase", "action", "reason", "in phase", "evicted"].map((h) => el("th", {}, h)));
  replace("episodes", el("tbody", {}, ...(rows.length ? [head, ...rows] : [el("tr", {}, el("td", { class: "muted" }, "no episodes"))])));
}

function incidentSubject(i) {
  const s = i.subjects || {};
  const nodes = s.nodes || [];
  if (s.owner) return `${s.owner} (${nodes.length} nodes)`;
  if (s.domain) return `domain ${s.domain} (${nodes.length} nodes)`;
  if (i.kind === "gpu" && (s.gpus || []).length) return s.gpus[0];
  return nodes.slice(0, 3).join(", ") + (nodes.length > 3 ? ` +${nodes.length - 3}` : "");
}

// On-call's part of an incident (its GPUIncident's spec.lifecycle, as the controller applied it).
function incidentOnCall(i) {
  const lc = i.lifecycle || {};
  const words = [];
  const add = (name, text) => { const a = lc[name]; if (a && a.applied) words.push(text(a)); };
  add("resolved", (a) => `resolved by ${a.by}: ${a.reason}`);
  add("silenced", (a) => `silenced by ${a.by} until ${time(a.until)}`);
  add("acknowledged", (a) => `acknowledged by ${a.by}`);
  return words.length ? words.join("; ") : (i.paging || "paging");
}

function renderIncidents(o) {
  const list = o.incidents || [];
  const rows = list.map((i) => el("tr", { "data-incident": i.id, "data-kind": i.kind, "data-paging": i.paging || "", class: `incident-${i.kind}` },
    el("td", {}, i.kind), el("td", {}, incidentSubject(i)), el("td", {}, el("b", {}, i.decision)),
    el("td", {}, time(i.openedAt)), el("td", { class: `paging-${i.paging || "paging"}` }, incidentOnCall(i)),
    el("td", { title: JSON.stringify(i.evidence || {}) }, i.reason)));
  const head = el("tr", {}, ...["kind", "subject", "decided", "since", "on-call", "why"].map((h) => el("th", {}, h)));
  replace("incidents", el("tbody", {}, ...(rows.length ? [head, ...rows] : [el("tr", {}, el("td", { class: "muted" }, "none"))])));
}

function renderEvents(o) {
  const items = o.events.map((e) => el("li", { class: `sev-${e.severity}`, "data-kind": e.kind },
    el("span", { class: "t" }, time(e.at)), e.node ? el("span", { class: "n" }, e.node) : null, e.message));
  replace("events", ...(items.length ? items : [el("li", { class: "muted" }, "none yet")]));
}

function render(o) {
  last = o;
  renderSummary(o); renderGroups(o); renderFilters(o); renderGrid(o); renderTaints(o); renderBreaker(o); renderIdle(o); renderRemediation(o); renderIncidents(o); renderEvents(o);
  const up = document.getElementById("updated");
  up.setAttribute("data-ok", "true");
  up.setAttribute("data-generated", o.generated_at);
  up.textContent = `updated ${time(o.generated_at)}`;
}

let pollTimer = null;

async function poll() {
  const q = query();
  try {
    const resp = await fetch(q ? `${OVERVIEW_URL}?${q}` : OVERVIEW_URL, {
      cache: "no-store",
      headers: authHeaders(),
    });
    if (resp.status === 401 || resp.status === 403) {
      askForToken(resp.status, await resp.json().catch(() => null));
      return;
    }
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    document.getElementById("auth").hidden = true;
    render(await resp.json());
  } catch (err) {
    const up = document.getElementById("updated");
    up.setAttribute("data-ok", "false");
    up.textContent = `controller unreachable (${err.message}); retrying`;
  } finally {
    clearTimeout(pollTimer);
    pollTimer = setTimeout(poll, POLL_MS);
  }
}

for (const key of Object.keys(filters)) {
  document.getElementById(`f-${key}`).addEventListener("change", (e) => setFilters({ [key]: e.target.value }));
}
document.getElementById("f-clear").addEventListener("click", () => setFilters({ state: ANY, pool: ANY, reason: ANY }));
readHash();
poll();
