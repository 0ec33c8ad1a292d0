// The pool console: reads GET /v1/console with the token the user gave,
// every second, and redraws each panel from it. Every value from the pool
// reaches the page through esc(): pod names and labels are the tenants'.
"use strict";

const tokenKey = "gpupool-token";
const every = 1000; // ms between reads: the page is at most 2 s behind
const maxRows = 500; // rows drawn of a long table; the CSV has them all

const $ = (sel) => document.querySelector(sel);
let timer = null;
let view = null;
let sort = { key: "age", desc: false };
let csvURL = null;

function esc(s) {
  return String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
const gpus = (x) => (x ?? 0).toFixed(2);
const pct = (x) => (x == null ? "" : (x * 100).toFixed(0) + "%");

// age is how long ago t (a time from the API) was, at now (ms).
function age(t, now) {
  return span(now - Date.parse(t));
}

// idleNote says how long a lease has been measured idle, and when its
// namespace's policy reclaims it: " idle 35m, reclaimed in 10m".
function idleNote(l, now) {
  if (l.idleSeconds == null) return "";
  let note = " idle " + span(l.idleSeconds * 1000);
  if (l.reclaimAt) note += ", reclaimed in " + span(Date.parse(l.reclaimAt) - now);
  return esc(note);
}

function span(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return s + "s";
  if (s < 7200) return Math.round(s / 60) + "m";
  return Math.round(s / 3600) + "h";
}

function bytes(n) {
  if (!n) return "0";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function signedIn(on) {
  $("#login").hidden = on;
  $("#console").hidden = !on;
  $("#signout").hidden = !on;
  if (!on) {
    // No token, no data: what the last token saw goes with it.
    for (const tb of document.querySelectorAll("#console tbody")) tb.innerHTML = "";
    $("#servers .map").innerHTML = "";
    $("#viewer").textContent = "";
    $("#updated").textContent = "";
    document.body.removeAttribute("data-at");
    view = null;
  }
}

function signOut(message) {
  sessionStorage.removeItem(tokenKey);
  clearTimeout(timer);
  signedIn(false);
  $("#login-error").textContent = message || "";
  $("#token").focus();
}

async function read() {
  const token = sessionStorage.getItem(tokenKey);
  if (!token) return signOut();
  try {
    const r = await fetch("../v1/console", { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
    if (r.status === 401 || r.status === 403) {
      return signOut("The pool did not accept that token.");
    }
    if (!r.ok) throw new Error((await r.json().catch(() => ({}))).error || r.statusText);
    view = await r.json();
    signedIn(true);
    render(view);
  } catch (e) {
    $("#updated").textContent = "not updated: " + e.message;
  }
  timer = setTimeout(read, every);
}

function render(v) {
  const now = Date.parse(v.at);
  $("#viewer").textContent = v.namespace ? "namespace " + v.namespace : "admin";
  $("#updated").textContent = "as of " + new Date(now).toLocaleTimeString();
  renderOverview(v);
  renderHistory(v);
  renderServers(v, now);
  renderFragmentation(v);
  renderTenants(v);
  renderLeases(v, now);
  renderPending(v, now);
  document.body.setAttribute("data-at", v.at);
}

function renderOverview(v) {
  $("#overview tbody").innerHTML = v.models.map((m) =>
    `<tr data-model="${esc(m.model)}"><td>${esc(m.model)}</td><td class="gpus">${m.gpus}</td><td class="healthy">${m.healthy}</td>` +
    `<td class="leased">${gpus(m.leasedGPUs)}</td><td class="used">${gpus(m.usedGPUs)}</td><td class="idle">${gpus(m.idleHeldGPUs)}</td>` +
    `<td class="free">${gpus(m.freeGPUs)}</td><td class="pending">${gpus(m.pendingGPUs)}</td></tr>`).join("");
}

function renderHistory(v) {
  const h = v.history;
  const top = Math.max(1, ...h.map((p) => p.gpus));
  const line = (f) => h.map((p, i) => {
    const x = h.length < 2 ? 600 : (i * 600) / (h.length - 1);
    return x.toFixed(1) + "," + (160 - (f(p) / top) * 156).toFixed(1);
  }).join(" ");
  $("#history-chart .leased").setAttribute("points", line((p) => p.leasedGPUs));
  $("#history-chart .used").setAttribute("points", line((p) => p.usedGPUs));
  $("#history-scale").textContent = h.length ? `(top: ${top} GPUs; ${h.length} points, one every 10 s)` : "(the first point comes within 10 s)";
}

function renderServers(v, now) {
  $("#servers .map").innerHTML = v.servers.map((s) => {
    const state = !s.schedulable ? "silent" : s.healthy ? "ok" : "GPU unhealthy";
    const tiles = s.gpus.map((g) => {
      const util = g.utilization == null ? "" : (g.utilization * 100).toFixed(0);
      const title = `${s.name} GPU ${g.index} ${g.model} ${g.uuid}\nleased ${g.leasedPercent.toFixed(2)}%, used ${util === "" ? "unknown" : util + "%"}\n` +
        `memory ${bytes(g.memoryUsedBytes)} of ${bytes(g.memoryBytes)}${g.healthy ? "" : "\nUNHEALTHY"}` +
        (g.links ? "\nlinks: " + g.links.join(", ") : "");
      return `<div class="gpu${g.healthy ? "" : " bad"}" id="gpu-${esc(s.name)}-${g.index}" data-gpu="${esc(s.name)}/${g.index}" data-leased="${g.leasedPercent.toFixed(2)}" data-util="${util}" title="${esc(title)}">` +
        `<span class="bar"></span><span class="n">${g.index}</span><span class="u">${util === "" ? "–" : util + "%"}</span></div>`;
    }).join("");
    return `<div class="server${s.healthy ? "" : " unhealthy"}" id="server-${esc(s.name)}" data-server="${esc(s.name)}">` +
      `<div class="head"><span class="name">${esc(s.name)}</span><span class="state">${state}</span>` +
      `<span class="meta">${s.leases} lease${s.leases === 1 ? "" : "s"} · heartbeat ${age(s.lastHeartbeat, now)} ago</span></div><div class="gpus">${tiles}</div></div>`;
  }).join("");
  // The page's policy allows no inline style: the bars are sized here.
  for (const g of document.querySelectorAll("#servers .gpu")) {
    g.firstChild.style.width = Math.min(100, Number(g.dataset.leased)) + "%";
  }
}

function renderFragmentation(v) {
  $("#frag-policy").textContent = v.policy;
  $("#frag-total").textContent = gpus(v.fragmentationGPUs);
  const rows = [...v.servers].sort((a, b) => b.fragmentationGPUs - a.fragmentationGPUs).slice(0, maxRows);
  $("#fragmentation tbody").innerHTML = rows.map((s) => {
    // The free share of its healthy GPUs, silent or not: what the stranded share is part of.
    const free = s.gpus.reduce((f, g) => f + (g.healthy ? (100 - g.leasedPercent) / 100 : 0), 0);
    return `<tr data-server="${esc(s.name)}"><td><a href="#server-${esc(s.name)}">${esc(s.name)}</a></td>` +
      `<td class="frag">${gpus(s.fragmentationGPUs)}</td><td class="free">${gpus(free)}</td></tr>`;
  }).join("");
}

function renderTenants(v) {
  $("#tenants tbody").innerHTML = v.tenants.map((t) =>
    `<tr data-namespace="${esc(t.namespace)}"><td>${esc(t.namespace)}</td><td class="hard">${t.hardGPUs ? gpus(t.hardGPUs) : "none"}</td>` +
    `<td class="quota-used">${gpus(t.quotaUsedGPUs)}</td><td class="leases">${t.leases}</td><td class="pods">${t.pods}</td>` +
    `<td class="apps">${esc((t.apps || []).join(", "))}</td><td class="leased">${gpus(t.leasedGPUs)}</td><td class="used">${gpus(t.usedGPUs)}</td>` +
    `<td class="waiting">${t.pending}</td></tr>`).join("");
}

const sortKeys = {
  namespace: (l) => l.namespace, pod: (l) => l.pod || "", app: (l) => l.app || "", server: (l) => l.server,
  share: (l) => l.shareGPUs, use: (l) => l.use ?? -1, age: (l) => -Date.parse(l.grantedAt),
  ttl: (l) => (l.expiresAt ? Date.parse(l.expiresAt) : Infinity), id: (l) => Number(l.id) || l.id,
};

function leaseRows(v) {
  const f = $("#lease-filter").value.trim().toLowerCase();
  const rows = v.leases.filter((l) => !f || [l.namespace, l.pod, l.app, l.server, l.id].some((x) => (x || "").toLowerCase().includes(f)));
  const key = sortKeys[sort.key];
  rows.sort((a, b) => {
    const x = key(a), y = key(b);
    return (x < y ? -1 : x > y ? 1 : 0) * (sort.desc ? -1 : 1);
  });
  return rows;
}

function renderLeases(v, now) {
  const rows = leaseRows(v);
  $("#lease-count").textContent = rows.length > maxRows ? `${maxRows} of ${rows.length} shown; the CSV has all` : `${rows.length} leases`;
  $("#leases tbody").innerHTML = rows.slice(0, maxRows).map((l) =>
    `<tr data-lease="${esc(l.id)}" class="${l.idle ? "idle" : ""}"><td class="namespace">${esc(l.namespace)}</td><td class="pod">${esc(l.pod)}</td>` +
    `<td class="app">${esc(l.app)}</td><td class="server"><a href="#server-${esc(l.server)}">${esc(l.server)}</a> / ${l.gpus.map((g) => `<a href="#gpu-${esc(l.server)}-${g}">${g}</a>`).join(",")}</td>` +
    `<td class="share">${gpus(l.shareGPUs)}</td><td class="use">${pct(l.use)}${idleNote(l, now)}</td><td class="age">${age(l.grantedAt, now)}</td>` +
    `<td class="ttl">${l.expiresAt ? "in " + span(Date.parse(l.expiresAt) - now) + " (" + esc(l.ttl) + ")" : "when released"}</td><td class="id">${esc(l.id)}</td></tr>`).join("");
  for (const th of document.querySelectorAll("#leases th")) {
    th.classList.toggle("sorted", th.dataset.sort === sort.key);
    th.classList.toggle("desc", th.dataset.sort === sort.key && sort.desc);
  }
}

// csvCell is one cell of leases.csv. A cell that starts with = + - @, a
// tab or a carriage return is one a spreadsheet may run as a formula, even
// quoted: OWASP's advice is a leading ' (text), then the quotes.
function csvCell(x) {
  let s = String(x ?? "");
  if (/^[=+\-@\t\r]/.test(s)) s = "'" + s;
  return /[",\n\r']/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
}

// downloadCSV saves the rows shown, filtered and sorted, as leases.csv:
// one file kept at a time, so that a page left open does not grow, and
// none made on the reads nobody downloads.
function downloadCSV() {
  if (!view) return;
  const lines = [["lease", "namespace", "pod", "app", "server", "gpus", "share_gpus", "use", "granted_at", "expires_at"].join(",")];
  for (const l of leaseRows(view)) {
    lines.push([l.id, l.namespace, l.pod, l.app, l.server, l.gpus.join(" "), l.shareGPUs.toFixed(2), l.use == null ? "" : l.use.toFixed(3),
      l.grantedAt, l.expiresAt || ""].map(csvCell).join(","));
  }
  if (csvURL) URL.revokeObjectURL(csvURL);
  csvURL = URL.createObjectURL(new Blob([lines.join("\n") + "\n"], { type: "text/csv" }));
  const a = document.createElement("a");
  a.href = csvURL;
  a.download = "leases.csv";
  a.click();
}

function renderPending(v, now) {
  $("#pending tbody").innerHTML = v.pending.slice(0, maxRows).map((p, i) => {
    const asks = `${p.gpus} × ${gpus(p.shareGPUs / p.gpus)}` + (p.models ? " " + esc(p.models.join("|")) : "") + (p.topology ? " " + esc(p.topology) : "");
    return `<tr data-pending="${i}"><td class="namespace">${esc(p.namespace)}</td><td class="pod">${esc(p.pod)}</td><td>${asks}</td>` +
      `<td>${age(p.since, now)}</td><td class="reason">${esc(p.reason)}</td><td class="message">${esc(p.message)}</td></tr>`;
  }).join("");
}

document.addEventListener("DOMContentLoaded", () => {
  $("#login").addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem(tokenKey, $("#token").value.trim());
    $("#token").value = "";
    $("#login-error").textContent = "";
    clearTimeout(timer);
    read();
  });
  $("#signout").addEventListener("click", () => signOut());
  $("#csv").addEventListener("click", downloadCSV);
  $("#lease-filter").addEventListener("input", () => view && renderLeases(view, Date.parse(view.at)));
  for (const th of document.querySelectorAll("#leases th")) {
    th.addEventListener("click", () => {
      sort = { key: th.dataset.sort, desc: sort.key === th.dataset.sort ? !sort.desc : false };
      if (view) renderLeases(view, Date.parse(view.at));
    });
  }
  if (sessionStorage.getItem(tokenKey)) read();
  else signOut();
});
