// stepstone inspector: the run list (filters, counts, groups), one run's page (its steps
// over time, diagram, agent turns, streams, actions), and two runs side by side.
// A run's page follows the run's changes as Server-Sent Events (GET /runs/{key}/watch)
// and its streams item by item (GET /runs/{key}/streams/{name}); the list polls.
"use strict";

const $ = (sel) => document.querySelector(sel);
const enc = encodeURIComponent;
let pollMs = 1000;
let updates = 0;
let timer = null;
let offset = 0;
const picked = new Set();   // runs picked on the list to compare
let watch = null;           // the run page's change feed: {key, ctl, live}
const streams = new Map();  // stream name -> {ctl, box}
let busy = false;
let again = false;
let shownRow = null;        // the timeline row last brought into view: {key, name}

// -- small helpers ----------------------------------------------------------------------

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function when(ts) {
  return ts ? new Date(ts * 1000).toLocaleString() : "";
}

function short(value, width) {
  if (value === null || value === undefined) return "";
  let text = typeof value === "string" ? value : JSON.stringify(value, null, 1);
  if (text === undefined) text = "";
  return text.length > width ? text.slice(0, width - 1) + "…" : text;
}

function oneLine(value, width) {
  return short(value, 100000).replace(/\s+/g, " ").slice(0, width);
}

function clockTime(ts) {
  // a time of day to the millisecond: when a step started
  if (ts === null || ts === undefined) return "—";
  const d = new Date(ts * 1000);
  const two = (n) => String(n).padStart(2, "0");
  return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds()) + "." +
    String(d.getMilliseconds()).padStart(3, "0");
}

function span(seconds) {
  // a duration as a person reads it: how long a step took, or the gap before it
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 0.001) return Math.round(seconds * 1e6) + " us";
  if (seconds < 1) return (seconds * 1000).toFixed(1) + " ms";
  if (seconds < 60) return seconds.toFixed(2) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.floor(seconds % 60) + " s";
  return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
}

function statusBadge(status) {
  return el("span", status, "badge status-" + status);
}

function button(text, cls, onClick) {
  const b = el("button", text, cls);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

function ownerText(run) {
  if (run.owner === "live" && run.cancel_requested) return "live, cancel requested";
  if (run.owner === "live") return "live (lease " + Math.max(0, Math.round(run.lease_expires_in)) + " s)";
  if (run.owner === "dead") return "dead (stranded)";
  if (run.owner === "superseded") return "superseded by " + run.superseded_by;
  return "—";
}

function ownerCell(run, tag) {
  // A run another run took over links to it.
  const cell = el(tag, null, run.owner === "dead" ? "owner-dead" : "");
  if (run.superseded_by) {
    cell.append((run.owner === "superseded" ? "superseded" : ownerText(run) + ", superseded") + " by ");
    const link = el("a", run.superseded_by, "superseded-by");
    link.href = "#run=" + enc(run.superseded_by);
    cell.append(link);
  } else {
    cell.textContent = ownerText(run);
  }
  return cell;
}

function route() {
  // "#run=KEY": one run; "#diff?a=KEY&b=KEY" (or "#diff="): two runs; else the list
  const hash = location.hash;
  const run = hash.match(/^#run=(.*)$/);
  if (run) return { view: "run", key: decodeURIComponent(run[1]) };
  if (hash.startsWith("#diff")) {
    const q = new URLSearchParams(hash.replace(/^#diff[?=]?/, ""));
    return { view: "diff", a: q.get("a") || "", b: q.get("b") || "" };
  }
  return { view: "list" };
}

function currentKey() {
  const r = route();
  return r.view === "run" ? r.key : null;
}

// -- talking to the server --------------------------------------------------------------

function authHeaders(extra) {
  const headers = Object.assign({}, extra || {});
  const token = sessionStorage.getItem("stepstone-token");
  if (token) headers.Authorization = "Bearer " + token;
  return headers;
}

async function getJSON(url) {
  const resp = await fetch(url, { cache: "no-store", headers: authHeaders() });
  const data = await resp.json().catch(() => ({ error: resp.statusText }));
  if (resp.status === 401 && askToken()) return getJSON(url);
  if (!resp.ok) throw new Error(data.error || resp.statusText);
  return data;
}

function askToken() {
  // A server started with --token-file: ask for it once, keep it for this tab.
  const given = window.prompt("This server needs its token (the content of its --token-file):");
  if (!given) return false;
  sessionStorage.setItem("stepstone-token", given.trim());
  return true;
}

function follow(url, handlers) {
  // Server-Sent Events over fetch (so a token header can go with it): calls
  // handlers.event(name, data, id) for each event; reconnects after a drop with the
  // Last-Event-ID header, so a stream goes on after the last item it got.
  const ctl = { stopped: false, lastId: null, abort: null, connected: false };
  ctl.stop = () => { ctl.stopped = true; if (ctl.abort) ctl.abort.abort(); };
  (async () => {
    let delay = 300;
    while (!ctl.stopped) {
      ctl.abort = new AbortController();
      try {
        const headers = authHeaders({ Accept: "text/event-stream" });
        if (ctl.lastId !== null) headers["Last-Event-ID"] = ctl.lastId;
        const resp = await fetch(url, { headers, signal: ctl.abort.signal, cache: "no-store" });
        if (!resp.ok) {
          if (handlers.refused) handlers.refused(resp.status);
          if (resp.status >= 400 && resp.status < 500) return;
          throw new Error(resp.statusText);
        }
        ctl.connected = true;
        if (handlers.open) handlers.open();
        delay = 300;
        const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value.replace(/\r\n?/g, "\n");
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            let name = "message", id = null;
            const data = [];
            for (const line of block.split("\n")) {
              if (!line || line.startsWith(":")) continue;
              const at = line.indexOf(":");
              const field = at < 0 ? line : line.slice(0, at);
              const val = at < 0 ? "" : line.slice(at + 1).replace(/^ /, "");
              if (field === "event") name = val;
              else if (field === "data") data.push(val);
              else if (field === "id") id = val;
            }
            if (id !== null) ctl.lastId = id;
            if (data.length) handlers.event(name, data.join("\n"), id);
            if (ctl.stopped) return;
          }
        }
      } catch (err) {
        if (ctl.stopped) return;
      }
      ctl.connected = false;
      if (handlers.dropped) handlers.dropped();
      if (ctl.stopped) return;
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 5000);
    }
  })();
  return ctl;
}

function markLive(extra) {
  updates += 1;
  const live = $("#live");
  const how = watch && watch.ctl.connected ? "live (events)" : "live";
  live.textContent = how + " · updated " + new Date().toLocaleTimeString() + (extra || "");
  live.dataset.updates = String(updates);
}

// -- actions: each one confirmed first ------------------------------------------------------

function confirmThen(text, then) {
  const dialog = $("#confirm");
  $("#confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.onclose = () => { if (dialog.returnValue === "yes") then(); };
  dialog.showModal();
}

async function post(url, body) {
  const resp = await fetch(url, {
    method: "POST",
    headers: authHeaders({ "Content-Type": "application/json", "X-Stepstone-Action": "1" }),
    body: JSON.stringify(body === undefined ? {} : body),
  });
  const data = await resp.json().catch(() => ({ error: resp.statusText }));
  const result = $("#action-result");
  result.textContent = data.outcome || data.error || (resp.ok ? "done" : resp.statusText);
  result.dataset.ok = String(resp.ok);
  refresh();
}

function runUrl(key, tail) {
  return "/runs/" + enc(key) + tail;
}

// -- the list ---------------------------------------------------------------------------

const COUNTED = [["running", "status"], ["claimed", "status"], ["paused", "status"],
  ["failed", "status"], ["done", "status"], ["stranded", "group"], ["waiting", "group"],
  ["queued", "group"]];

async function renderList() {
  const params = new URLSearchParams();
  for (const [k, v] of new FormData($("#filters"))) if (v) params.set(k, v);
  params.set("offset", String(offset));
  const data = await getJSON("/api/runs?" + params.toString());
  if (offset > 0 && offset >= data.total) { offset = 0; return renderList(); }
  const shown = data.runs.length;
  $("#page").textContent = data.total ? (offset + 1) + "-" + (offset + shown) + " of " + data.total : "";
  $("#newer").disabled = offset === 0;
  $("#older").disabled = offset + shown >= data.total;
  $("#pager").dataset.offset = String(offset);
  $("#newer").onclick = () => { offset = Math.max(0, offset - data.page_size); refresh(); };
  $("#older").onclick = () => { offset += data.page_size; refresh(); };
  pollMs = Math.max(200, data.poll_seconds * 1000);
  $("#store").textContent = data.store;
  $("#mode").textContent = data.allow_actions ? "actions enabled" : "read-only";
  $("#count").textContent = data.total + " run(s)";
  renderCounts(data.counts || {});
  const rows = [];
  for (const run of data.runs) {
    const tr = el("tr", null, run.error ? "row-error" : "");
    tr.dataset.key = run.key;
    tr.dataset.status = run.status;
    const pick = el("input", null, "pick");
    pick.type = "checkbox";
    pick.checked = picked.has(run.key);
    pick.setAttribute("aria-label", "pick " + run.key + " to compare");
    pick.addEventListener("change", () => {
      if (pick.checked) picked.add(run.key); else picked.delete(run.key);
      while (picked.size > 2) picked.delete(picked.values().next().value);
      updateCompare();
    });
    const pickCell = el("td");
    pickCell.append(pick);
    const link = el("a", run.key);
    link.href = "#run=" + enc(run.key);
    const keyCell = el("td");
    keyCell.append(link);
    const statusCell = el("td");
    statusCell.append(statusBadge(run.status));
    if (run.damaged) {
      // Its head reads, a journal row does not: say so where the status is.
      const flag = el("span", "damaged", "badge status-failed damaged-flag");
      flag.title = run.damaged;
      statusCell.append(" ", flag);
    }
    if (run.waiting) {
      const w = run.waiting;
      const said = w.state === "waiting" ? "waits for '" + w.topic + "'" : w.state === "sleeping" ? "sleeping" : "due";
      statusCell.append(" ", el("span", said, "badge waiting-flag"));
    }
    const errText = run.error_type ? run.error_type + (run.error ? ": " + oneLine(run.error, 80) : "") : "";
    tr.append(pickCell, keyCell, el("td", run.kind || ""), statusCell,
      ownerCell(run, "td"),
      el("td", run.steps), el("td", run.next_step || ""), el("td", run.queue || ""),
      el("td", when(run.updated_at)),
      el("td", errText, run.error_type ? "owner-dead" : ""));
    rows.push(tr);
  }
  const body = $("#runs tbody");
  patchChildren(body, rows);
  for (const pick of body.querySelectorAll("input.pick")) pick.checked = picked.has(pick.closest("tr").dataset.key);
  updateCompare();
  markLive();
}

function patchChildren(host, fresh) {
  // Put the nodes ``fresh`` in ``host``, keeping in place each old child equal to its new
  // one (same attributes and text: their handlers act on the same run): the list redraws
  // on every poll, and must not swap a row from under a click or the keyboard focus.
  const old = [...host.children];
  fresh.forEach((node, i) => {
    const was = old[i];
    if (!was) host.append(node);
    else if (!was.isEqualNode(node)) host.replaceChild(node, was);
  });
  for (const extra of old.slice(fresh.length)) extra.remove();
}

function renderCounts(counts) {
  const form = $("#filters");
  const buttons = [];
  for (const [name, field] of COUNTED) {
    const n = counts[name] || 0;
    const on = form.elements[field].value === name;
    const b = button(name + " " + n, "plain count" + (on ? " on" : "") + (n ? "" : " zero"), () => {
      form.elements.status.value = "";
      form.elements.group.value = "";
      if (!on) form.elements[field].value = name;
      offset = 0;
      refresh();
    });
    b.dataset.count = name;
    b.dataset.n = String(n);
    b.setAttribute("aria-pressed", String(on));
    buttons.push(b);
  }
  patchChildren($("#counts"), buttons);
}

function updateCompare() {
  const keys = [...picked];
  const b = $("#compare");
  b.disabled = keys.length !== 2;
  b.onclick = () => { location.hash = "#diff?a=" + enc(keys[0]) + "&b=" + enc(keys[1]); };
}

// -- one run ----------------------------------------------------------------------------

async function renderRun(key) {
  let run;
  try {
    run = await getJSON("/api/run?key=" + enc(key));
  } catch (err) {
    $("#run-key").textContent = key;
    $("#run-facts").textContent = String(err.message);
    $("#timeline tbody").replaceChildren();
    return;
  }
  $("#run-key").textContent = run.key;
  $("#mode").textContent = run.allow_actions ? "actions enabled" : "read-only";
  const facts = $("#run-facts");
  const compare = el("a", "compare with another run", "compare-link");
  compare.href = "#diff?a=" + enc(run.key);
  facts.replaceChildren(
    statusBadge(run.status),
    el("span", " " + (run.kind || "queued") + " run"),
    el("span", "steps " + (run.steps || 0)),
    el("span", "next step " + (run.next_step || "—")),
    el("span", "owner "), ownerCell(run, "span"),
    el("span", "updated " + when(run.updated_at)),
    el("span", run.duration_seconds === undefined ? "" : "ran " + run.duration_seconds.toFixed(1) + " s since its first claim"),
    compare,
  );
  if (run.entry) facts.append(el("span", "queue " + run.entry.queue + " (" + run.entry.status + ")", "queue-fact"));
  if (run.cancel_requested) facts.append(el("span", "cancel requested", "badge status-failed cancel-flag"));
  facts.dataset.status = run.status;
  facts.dataset.steps = String(run.steps || 0);
  const errBox = $("#run-error");
  if (run.error || run.corrupt) {
    errBox.hidden = false;
    const said = run.error ? (run.error.type || "error") + " at step " + (run.error.step || run.error.node || "?") + ": " + (run.error.message || "") : "";
    errBox.textContent = [said, run.corrupt || ""].filter(Boolean).join(" · ");
  } else {
    errBox.hidden = true;
    errBox.textContent = "";
  }
  const focused = focusMark();
  renderActions(run);
  renderApprovals(run);
  renderDiagram(run.diagram);
  renderGantt(run);
  renderTurns(run);
  renderWaits(run);
  renderStreams(run);
  renderAgent(run.agent);
  renderOperations(run);
  renderTimeline(run);
  renderWebhooks(run.webhooks || []);
  refocus(focused);
  markLive(" · " + (run.steps || 0) + " step(s)");
}

function renderActions(run) {
  const acts = run.actions || [];
  const can = (a) => acts.includes(a);
  $("#cancel").hidden = !can("cancel");
  $("#cancel").onclick = () => confirmThen("Cancel the run " + run.key + "? Its owner stops at its next commit.",
    () => post(runUrl(run.key, "/cancel"), { reason: "cancelled from the web inspector" }));
  $("#resume").hidden = !can("resume");
  $("#resume").onclick = () => confirmThen("Put " + run.key + " back in its queue? A worker resumes it.",
    () => post(runUrl(run.key, "/resume")));
  const steps = run.retry_from || [];
  $("#retry-box").hidden = !(can("retry") && steps.length);
  const select = $("#retry-step");
  const chosen = select.value;
  select.replaceChildren(...steps.map((s) => el("option", s)));
  if (steps.includes(chosen)) select.value = chosen;
  $("#retry").onclick = () => retryFrom(run, select.value);
  $("#send-box").hidden = !can("send");
  $("#send-box").onsubmit = (e) => {
    e.preventDefault();
    const topic = $("#send-topic").value.trim();
    const text = $("#send-value").value;
    let value;
    try { value = JSON.parse(text); } catch (err) {
      $("#action-result").textContent = "the value must be JSON (a string in double quotes): " + err.message;
      return;
    }
    confirmThen("Send " + text + " to " + run.key + " on '" + topic + "'?",
      () => post(runUrl(run.key, "/messages/" + enc(topic)), value));
  };
  $("#actions").hidden = !["cancel", "resume", "retry", "send"].some(can);
}

function retryFrom(run, step) {
  confirmThen("Rewind " + run.key + " to '" + step + "'? That step and the ones after it run again.",
    () => post(runUrl(run.key, "/retry?from=" + enc(step))));
}

function renderApprovals(run) {
  const calls = run.pending_approvals || [];
  $("#approvals").hidden = calls.length === 0;
  const body = $("#approvals-table tbody");
  body.replaceChildren();
  const can = (run.actions || []).includes("approve");
  for (const call of calls) {
    const tr = el("tr");
    tr.dataset.callId = call.call_id;
    const cell = el("td");
    const decided = call.decision !== null && call.decision !== undefined;
    if (decided) {
      cell.append(el("span", call.decision === true ? "approved" : "denied: " + call.decision, "decision"), " ");
    }
    if (can) {
      // A decision this page shows may be changed (replace); one recorded since it was
      // drawn is not: the server refuses and says which decision stands.
      // the run's own calls go through its key (a queued run is queued again after);
      // those of a paused Plan's LLM step, through that step's run
      const own = !call.run_key || call.run_key === (run.record_key || run.key);
      const url = runUrl(own ? run.key : call.run_key, "/approvals/" + enc(call.call_id));
      const what = call.tool + "(" + short(call.arguments, 120) + ")";
      cell.append(
        button("approve", "plain approve", () => confirmThen("Approve " + what + "?",
          () => post(url, { approve: true, replace: decided }))),
        " ",
        button("deny", "plain deny", () => confirmThen("Deny " + what + "? The model is told why.",
          () => post(url, { deny: "denied from the web inspector", replace: decided }))));
    }
    tr.append(el("td", call.call_id), el("td", call.tool), el("td", short(call.arguments, 200), "payload"),
      el("td", call.reason || ""), cell);
    body.append(tr);
  }
}

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

function renderDiagram(shape) {
  // A Plan's steps, the nodes a graph reached, a ReplanEngine's rounds: each node with
  // its state; columns in the order things happen, rows for what runs side by side.
  const box = $("#diagram-box");
  box.hidden = !shape || !shape.nodes.length;
  const host = $("#diagram");
  host.replaceChildren();
  if (box.hidden) return;
  const W = 150, H = 38, DX = 190, DY = 58;
  const cols = Math.max(...shape.nodes.map((n) => n.col)) + 1;
  const rows = Math.max(...shape.nodes.map((n) => n.row)) + 1;
  const at = new Map(shape.nodes.map((n) => [n.id, n]));
  const root = svg("svg", { width: cols * DX, height: rows * DY + 4, role: "group",
    "aria-label": shape.kind + " diagram" });
  const defs = svg("defs");
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5,
    markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", class: "arrow" }));
  defs.append(marker);
  root.append(defs);
  for (const e of shape.edges) {
    const a = at.get(e.from), b = at.get(e.to);
    if (!a || !b) continue;
    const x1 = a.col * DX + W, y1 = a.row * DY + H / 2 + 2;
    const x2 = b.col * DX, y2 = b.row * DY + H / 2 + 2;
    const mid = (x1 + x2) / 2;
    const path = x2 > x1 ? `M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`
      : `M${a.col * DX + W / 2},${a.row * DY + H + 2} L${b.col * DX + W / 2},${b.row * DY + 2}`;
    root.append(svg("path", { d: path, class: "edge", "marker-end": "url(#arrow)" }));
    if (e.count > 1) root.append(svg("text", { x: mid, y: (y1 + y2) / 2 - 4, class: "edge-count" }, "×" + e.count));
  }
  for (const n of shape.nodes) {
    const g = svg("g", { class: "node state-" + n.state, transform: `translate(${n.col * DX},${n.row * DY + 2})`,
      tabindex: 0, role: "img", "aria-label": n.label + ": " + n.state + (n.detail ? ", " + n.detail : "") });
    g.dataset.id = n.id;
    g.dataset.state = n.state;
    g.append(svg("title", {}, n.label + " — " + n.state + (n.visits > 1 ? ", ran " + n.visits + " times" : "") + (n.detail ? "\n" + n.detail : "")));
    g.append(svg("rect", { width: W, height: H, rx: 6 }));
    g.append(svg("text", { x: 10, y: 16, class: "label" }, short(n.label, 20)));
    g.append(svg("text", { x: 10, y: 31, class: "state" }, n.state + (n.visits > 1 ? " ×" + n.visits : "")));
    g.addEventListener("keydown", (ev) => { if (ev.key === "Enter") showRow(n.id); });
    g.addEventListener("click", () => showRow(n.id));
    root.append(g);
  }
  host.append(root);
  $("#diagram-key").textContent = "done · running · next · failed · stranded · pending (not reached)";
}

function focusMark() {
  // A redraw rebuilds the diagram's nodes and the Gantt's lanes: note which one has the
  // keyboard focus (its name, and which of the lanes of that name), so the rebuilt one
  // gets it back. A poll must not take the focus from under a user's keys.
  const a = document.activeElement;
  const box = a && a.closest ? a.closest("#gantt, #diagram") : null;
  if (!box) return null;
  const name = focusName(a);
  const same = [...box.querySelectorAll("[tabindex]")].filter((e) => focusName(e) === name);
  return { box: box.id, name, nth: same.indexOf(a) };
}

function focusName(node) {
  return node.dataset.id || node.dataset.name || "";
}

function refocus(mark) {
  if (!mark) return;
  const same = [...document.querySelectorAll("#" + mark.box + " [tabindex]")].filter((e) => focusName(e) === mark.name);
  const again = same[Math.min(mark.nth, same.length - 1)];
  if (again && document.activeElement !== again) again.focus({ preventScroll: true });
}

function markRow(name) {
  // The last timeline row of a step: marked current, its payload open (a redraw, which
  // rebuilds the rows, marks it again).
  const rows = [...document.querySelectorAll("#timeline tbody tr")].filter((r) => r.dataset.name === name);
  const row = rows[rows.length - 1];
  for (const r of document.querySelectorAll('#timeline tr[aria-current="true"]')) r.removeAttribute("aria-current");
  if (!row) return null;
  row.setAttribute("aria-current", "true");
  const details = row.querySelector("details");
  if (details) details.open = true;
  return row;
}

function showRow(name) {
  // Bring a step's timeline row into view.
  const row = markRow(name);
  if (!row) return;
  shownRow = { key: currentKey(), name };
  row.scrollIntoView({ block: "center" });
  row.classList.add("flash");
  setTimeout(() => row.classList.remove("flash"), 1200);
}

function serverNow(run) {
  return run.updated_at !== undefined && run.age_seconds !== undefined ? run.updated_at + run.age_seconds : Date.now() / 1000;
}

function renderGantt(run) {
  // Each timeline entry as a bar over time: the gap before it (waiting, sleeping,
  // stranded, or the engine between steps), then its work, from start to commit.
  const entries = (run.timeline || []).filter((e) => e.started_at !== null && e.started_at !== undefined);
  const box = $("#gantt-box");
  const host = $("#gantt");
  host.replaceChildren();
  box.hidden = entries.length === 0 && !(run.waiting || []).length;
  if (box.hidden) return;
  const t0 = run.created_at || entries[0].started_at - (entries[0].gap_seconds || 0);
  let lastCommit = t0;
  for (const e of entries) lastCommit = Math.max(lastCommit, e.committed_at || e.started_at);
  const now = serverNow(run);
  const state = runState(run);
  const end = state ? Math.max(now, lastCommit) : lastCommit;
  const total = Math.max(end - t0, 1e-6);
  const pct = (t) => (100 * (t - t0) / total).toFixed(3) + "%";
  const seen = new Map();
  const shown = entries.slice(-200);
  for (const e of shown) {
    // a Plan step journaled again ran again (a retry, a resume after a crash)
    const n = e.kind === "step" ? (seen.get(e.name) || 0) + 1 : 1;
    if (e.kind === "step") seen.set(e.name, n);
    const lane = el("div", null, "lane");
    lane.setAttribute("role", "listitem");
    lane.tabIndex = 0;
    lane.dataset.name = e.name || "";
    lane.dataset.kind = e.kind;
    const label = el("div", (e.name || e.kind) + (n > 1 ? " (try " + n + ")" : ""), "lane-label");
    const track = el("div", null, "track");
    if (e.gap_seconds) {
      const gap = el("div", null, "bar gap");
      gap.style.left = pct(e.started_at - e.gap_seconds);
      gap.style.width = pct(t0 + e.gap_seconds);
      track.append(gap);
    }
    const work = el("div", null, "bar work" + (e.error ? " fail" : n > 1 ? " retry" : ""));
    work.style.left = pct(e.started_at);
    work.style.width = pct(t0 + (e.duration_seconds || 0));
    track.append(work);
    const said = e.kind + " " + (e.name || "") + ": started " + clockTime(e.started_at) + ", took " +
      span(e.duration_seconds) + ", " + span(e.gap_seconds) + " before it" + (n > 1 ? ", try " + n : "") +
      (e.error ? ", " + (e.error.type || "error") + ": " + (e.error.message || "") : "");
    lane.title = said;
    lane.setAttribute("aria-label", said);
    lane.addEventListener("click", () => showRow(e.name));
    lane.addEventListener("keydown", (ev) => { if (ev.key === "Enter") showRow(e.name); });
    lane.append(label, track, el("div", span(e.duration_seconds), "lane-took"));
    host.append(lane);
  }
  if (state) {
    const lane = el("div", null, "lane lane-now");
    lane.setAttribute("role", "listitem");
    lane.tabIndex = 0;
    lane.dataset.state = state.kind;
    const track = el("div", null, "track");
    const bar = el("div", null, "bar now state-" + state.kind);
    bar.style.left = pct(lastCommit);
    bar.style.width = pct(t0 + Math.max(now - lastCommit, 0));
    track.append(bar);
    lane.title = state.text;
    lane.setAttribute("aria-label", state.text);
    lane.append(el("div", state.text, "lane-label"), track, el("div", span(Math.max(now - lastCommit, 0)), "lane-took"));
    host.append(lane);
  }
  const axis = el("div", null, "lane axis");
  axis.append(el("div", clockTime(t0), "lane-label"), el("div", null, "track"), el("div", span(total), "lane-took"));
  host.append(axis);
}

function runState(run) {
  // What the run does now, when it is not over: a lane from its last commit to now.
  const w = (run.waiting || [])[0];
  if (w) {
    if (w.state === "sleeping") return { kind: "sleeping", text: "sleeping until " + clockTime(w.until) };
    if (w.state === "waiting") return { kind: "waiting", text: "waiting for '" + w.topic + "'" };
    return { kind: "due", text: "woken: goes on any moment" };
  }
  if (run.owner === "dead") return { kind: "stranded", text: "stranded: its owner died" };
  if (run.owner === "live") return { kind: "running", text: "running " + (run.next_step || "") };
  if (run.status === "queued") return { kind: "queued", text: "queued" };
  return null;
}

function turnText(t) {
  // A model turn's summary: model, tokens, cost, the tool calls it asked for (or its text).
  const parts = [t.model || "model", (t.input_tokens || 0) + " in / " + (t.output_tokens || 0) + " out",
    t.cost_usd === null || t.cost_usd === undefined ? "cost unknown" : "$" + t.cost_usd.toFixed(6)];
  const calls = t.tool_calls || [];
  if (calls.length) parts.push(calls.map((c) => c.name + "(" + (typeof c.args === "string" ? c.args : JSON.stringify(c.arguments || c.args)) + ")").join(", "));
  else if (t.text) parts.push(JSON.stringify(t.text));
  return parts.join(" · ");
}

function renderTurns(run) {
  // An agent run's turns: each model call with its model, tokens and cost, the tool
  // calls it asked for with their arguments, and what each tool answered.
  const effects = (run.agent && run.agent.effects) || [];
  const models = effects.filter((e) => e.kind === "model");
  $("#turns-box").hidden = models.length === 0;
  const list = $("#turns");
  list.replaceChildren();
  if (!models.length) return;
  let tin = 0, tout = 0, cost = 0, priced = true;
  for (const m of models) {
    tin += m.input_tokens || 0;
    tout += m.output_tokens || 0;
    if (m.cost_usd === null || m.cost_usd === undefined) priced = false; else cost += m.cost_usd;
    const li = el("li", null, "turn" + (m.error ? " row-error" : ""));
    li.dataset.turn = String(m.turn);
    const head = el("div", null, "turn-head");
    head.append(el("strong", "turn " + m.turn), " ", el("span", m.model || "model", "model"), " · ",
      el("span", (m.input_tokens || 0) + " in / " + (m.output_tokens || 0) + " out tokens", "tokens"), " · ",
      el("span", m.cost_usd === null || m.cost_usd === undefined ? "cost unknown" : "$" + m.cost_usd.toFixed(6), "cost"));
    if (m.replays) head.append(" · ", el("span", "replayed " + m.replays + "×", "muted"));
    if (m.state !== "done") head.append(" ", el("span", "in doubt", "badge status-paused"));
    li.append(head);
    if (m.text) li.append(el("div", m.text, "turn-text"));
    const calls = el("ul", null, "calls");
    for (const c of m.tool_calls || []) {
      const done = effects.find((e) => e.kind !== "model" && e.call_id === c.id);
      const item = el("li", null, "call");
      item.dataset.callId = c.id || "";
      item.append(el("code", c.name + "(" + oneLine(c.arguments, 200) + ")"));
      if (done) {
        item.append(" → ", el("span", done.error ? (done.error.type || "") + ": " + (done.error.message || "") : oneLine(done.content, 200),
          done.error ? "call-error" : "call-result"));
        if (done.state !== "done") item.append(" ", el("span", "in doubt", "badge status-paused"));
      } else {
        item.append(" ", el("span", "not run yet", "muted"));
      }
      calls.append(item);
    }
    if (calls.childElementCount) li.append(calls);
    if (m.error) li.append(el("div", (m.error.type || "") + ": " + (m.error.message || ""), "call-error"));
    list.append(li);
  }
  $("#turns-total").textContent = models.length + " turn(s) · " + tin + " in / " + tout + " out tokens · " +
    (priced ? "$" + cost.toFixed(6) : "cost " + (cost ? "at least $" + cost.toFixed(6) : "unknown"));
}

function renderOperations(run) {
  const ops = run.operations;
  $("#workflow").hidden = !ops;
  if (!ops) return;
  const body = $("#operations tbody");
  body.replaceChildren();
  const canRetry = (run.actions || []).includes("retry");
  for (const op of ops) {
    const tr = el("tr", null, op.error ? "row-error" : "");
    tr.dataset.position = op.position;
    const name = (op.op === "step" ? op.name : op.op + " " + op.name) + (op.key ? " (" + op.key + ")" : "");
    const shown = op.error ? (op.error.type || "").split(":").pop() + ": " + (op.error.message || "")
      : op.summary ? turnText(op.summary) : short(op.value, 300);
    const cell = el("td", shown, "payload");
    if (canRetry && op.op === "step") {
      cell.append(" ", button("retry from here", "plain retry", () => retryFrom(run, op.position)));
    }
    tr.append(el("td", op.position), el("td", name), el("td", op.status), el("td", short(op.args, 200), "payload"),
      cell, el("td", op.attempts), el("td", op.ms === null || op.ms === undefined ? "" : op.ms.toFixed(1)));
    body.append(tr);
  }
}

function payloadCell(entry) {
  // A payload on one line; the whole of it (as the page got it) one click away.
  const cell = el("td", null, "payload");
  if (entry.payload === null || entry.payload === undefined) return cell;
  const line = oneLine(entry.payload, 140);
  const full = short(entry.payload, 1e9);
  if (full.length <= 140 && !full.includes("\n")) {
    cell.textContent = full;
  } else {
    const details = el("details");
    details.append(el("summary", line + (full.length > 140 ? "…" : "")), el("pre", full));
    cell.append(details);
  }
  if (entry.payload_chars) {
    cell.append(el("span", " (" + entry.payload_chars + " characters; all of it: stepstone history KEY --payloads --json)", "muted cut"));
  }
  return cell;
}

function renderTimeline(run) {
  const body = $("#timeline tbody");
  body.replaceChildren();
  const canRetry = (run.actions || []).includes("retry") && run.kind === "plan";
  const steps = new Set(run.retry_from || []);
  for (const entry of run.timeline || []) {
    const tr = el("tr", null, entry.error ? "row-error" : "");
    tr.dataset.name = entry.name || "";
    const errCell = el("td", entry.error ? (entry.error.type || "") + ": " + (entry.error.message || "") : "");
    if (canRetry && entry.name && steps.has(entry.name)) {
      errCell.append(" ", button("retry from here", "plain retry", () => retryFrom(run, entry.name)));
    }
    const nameCell = el("td", entry.name || "");
    if (entry.detail) nameCell.append(el("div", entry.detail, "muted detail"));
    tr.append(el("td", entry.seq), el("td", entry.kind), nameCell,
      el("td", clockTime(entry.started_at), "started"), el("td", span(entry.duration_seconds), "took"),
      el("td", span(entry.gap_seconds), "gap"), payloadCell(entry), errCell);
    body.append(tr);
  }
  if (shownRow && shownRow.key === run.key) markRow(shownRow.name);
}

function renderWaits(run) {
  // What the run waits for, its events, streams and pending messages (time_and_messages).
  const items = [];
  for (const w of run.waiting || []) {
    const until = w.until === null ? "no time limit" : "until " + when(w.until);
    const said = w.state === "sleeping" ? "sleeping " + until
      : w.state === "waiting" ? "waiting for a message on '" + w.topic + "', " + until
      : "woken (due " + (w.until === null ? "now" : when(w.until)) + "): it goes on any moment";
    items.push(["waits", said]);
  }
  for (const [name, value] of Object.entries(run.events || {})) {
    items.push(["event", name + ": " + short(value, 200)]);
  }
  for (const s of run.streams || []) items.push(["stream", s.name + ": " + s.length + " value(s)"]);
  const pending = ((run.messages || {}).pending) || [];
  if (pending.length) {
    const topics = [...new Set(pending.map((m) => m.topic))].sort();
    items.push(["messages", pending.length + " pending on " + topics.map((t) => "'" + t + "'").join(", ")]);
  }
  $("#waits").hidden = items.length === 0;
  const list = $("#waits-list");
  list.replaceChildren();
  for (const [what, text] of items) {
    const li = el("li");
    li.dataset.what = what;
    li.append(el("strong", what), " " + text);
    list.append(li);
  }
}

function renderStreams(run) {
  // Each stream of the run, its items as they come (text items run on, as tokens do).
  const names = (run.streams || []).map((s) => s.name);
  $("#streams-box").hidden = names.length === 0;
  for (const name of names) {
    if (streams.has(name)) continue;
    const box = el("div", null, "stream");
    box.dataset.name = name;
    box.dataset.items = "0";
    const head = el("div", null, "stream-head");
    head.append(el("strong", name), " ", el("span", "following…", "muted stream-state"));
    const text = el("pre", null, "stream-text");
    text.setAttribute("aria-live", "polite");
    box.append(head, text);
    $("#streams").append(box);
    const ctl = follow(runUrl(run.key, "/streams/" + enc(name)), {
      event(kind, data) {
        if (kind === "item") {
          const value = JSON.parse(data);
          text.textContent += typeof value === "string" ? value : JSON.stringify(value) + "\n";
          box.dataset.items = String(Number(box.dataset.items) + 1);
        } else if (kind === "end") {
          const ended = JSON.parse(data);
          box.dataset.ended = ended.status || "ended";
          box.querySelector(".stream-state").textContent = "ended: the run is " + (ended.status || "over");
          ctl.stop();
        }
      },
      refused(status) { box.querySelector(".stream-state").textContent = "cannot follow it (" + status + ")"; },
    });
    streams.set(name, { ctl, box });
  }
}

function stopStreams() {
  for (const { ctl } of streams.values()) ctl.stop();
  streams.clear();
  $("#streams").replaceChildren();
}

function renderAgent(agent) {
  $("#agent").hidden = !agent;
  if (!agent) return;
  const replayed = agent.effects.reduce((n, e) => n + e.replays, 0);
  $("#agent-facts").textContent = "agent state " + (agent.agent_state || "running") + " · " +
    agent.phases.length + " phase record(s) · " + agent.effects.length + " effect(s), replayed " + replayed + " time(s)";
  const body = $("#effects tbody");
  body.replaceChildren();
  for (const e of agent.effects) {
    const tr = el("tr", null, e.error ? "row-error" : "");
    tr.dataset.position = e.position;
    tr.append(el("td", e.position), el("td", e.kind), el("td", e.name), el("td", e.call_id || ""),
      el("td", e.state), el("td", e.replays),
      el("td", e.error ? (e.error.type || "") + ": " + (e.error.message || "") : ""));
    body.append(tr);
  }
}

function renderWebhooks(hooks) {
  $("#webhooks-box").hidden = hooks.length === 0;
  const list = $("#webhooks");
  list.replaceChildren();
  for (const h of hooks) {
    const li = el("li");
    li.dataset.status = h.status;
    const tries = (h.attempts || []).map((a) => (a.status || a.error || "?") + " at " + clockTime(a.at)).join(", ");
    li.append(el("code", h.url), " " + h.status + (tries ? " · attempts: " + tries : ""));
    list.append(li);
  }
}

function followRun(key) {
  // The run's changes as events: each one redraws the page at once.
  if (watch && watch.key === key) return;
  stopFollowing();
  $("#action-result").textContent = "";
  const ctl = follow(runUrl(key, "/watch"), {
    event(kind) { if (kind === "run" || kind === "gone") soon(); },
    open() { soon(); },
  });
  watch = { key, ctl };
}

function stopFollowing() {
  if (watch) watch.ctl.stop();
  watch = null;
  stopStreams();
}

// -- two runs side by side ----------------------------------------------------------------

function entryCell(entry) {
  const cell = el("td", null, entry ? (entry.error ? "row-error" : "") : "absent");
  if (!entry) { cell.textContent = "—"; return cell; }
  cell.append(el("strong", entry.kind + " " + (entry.name || "")));
  if (entry.payload !== null && entry.payload !== undefined) cell.append(el("div", oneLine(entry.payload, 160), "payload"));
  if (entry.error) cell.append(el("div", (entry.error.type || "") + ": " + (entry.error.message || ""), "call-error"));
  return cell;
}

async function renderDiff(a, b) {
  $("#diff-a").value = a;
  $("#diff-b").value = b;
  const body = $("#diff tbody");
  const summary = $("#diff-summary");
  body.replaceChildren();
  if (!a || !b) { summary.textContent = "Name two runs (or pick two on the list)."; return; }
  let d;
  try {
    d = await getJSON("/diff?a=" + enc(a) + "&b=" + enc(b));
  } catch (err) {
    summary.textContent = err.message;
    summary.className = "error";
    return;
  }
  summary.className = "";
  summary.textContent = d.identical ? "The two runs are identical."
    : "The same for their first " + d.same_prefix + " entries; they differ from entry " + d.same_prefix + " on.";
  summary.dataset.same = String(d.same_prefix);
  $("#diff-head-a").textContent = "A: " + a + " (" + d.a.status + ")";
  $("#diff-head-b").textContent = "B: " + b + " (" + d.b.status + ")";
  if (d.same.length) {
    const tr = el("tr", null, "same");
    const cell = el("td");
    cell.colSpan = 2;
    const details = el("details");
    details.append(el("summary", d.same.length + " entries the same in both"));
    const list = el("ol");
    for (const e of d.same) list.append(el("li", e.kind + " " + (e.name || "") + (e.payload !== null && e.payload !== undefined ? ": " + oneLine(e.payload, 120) : "")));
    details.append(list);
    cell.append(details);
    tr.append(el("td", "0-" + (d.same.length - 1)), cell);
    body.append(tr);
  }
  const n = Math.max(d.only_a.length, d.only_b.length);
  for (let i = 0; i < n; i++) {
    const tr = el("tr", null, i === 0 ? "first-diff" : "");
    tr.dataset.index = String(d.same_prefix + i);
    tr.append(el("td", d.same_prefix + i), entryCell(d.only_a[i]), entryCell(d.only_b[i]));
    body.append(tr);
  }
  const ends = el("tr", null, "ends");
  const end = (x) => el("td", x.status + (x.next_step ? ", next step " + x.next_step : "") + (x.error ? ", " + (x.error.type || "") + ": " + (x.error.message || "") : ""));
  ends.append(el("td", "end"), end(d.ends.a), end(d.ends.b));
  if (JSON.stringify(d.ends.a) !== JSON.stringify(d.ends.b)) ends.classList.add("differs");
  body.append(ends);
  markLive();
}

// -- the page ---------------------------------------------------------------------------

function soon() {
  if (busy) { again = true; return; }
  refresh();
}

async function refresh() {
  clearTimeout(timer);
  if (busy) { again = true; return; }
  busy = true;
  const r = route();
  $("#list-view").hidden = r.view !== "list";
  $("#run-view").hidden = r.view !== "run";
  $("#diff-view").hidden = r.view !== "diff";
  if (r.view !== "run") stopFollowing();
  let next = pollMs;
  try {
    if (r.view === "list") await renderList();
    else if (r.view === "run") {
      if (watch && watch.key !== r.key) stopFollowing();
      followRun(r.key);
      await renderRun(r.key);
      // with the run's events flowing, a slow redraw only moves the clocks on
      if (watch && watch.ctl.connected) next = Math.max(1000, pollMs * 5);
    } else {
      await renderDiff(r.a, r.b);
      next = null;
    }
  } catch (err) {
    $("#live").textContent = "cannot reach the inspector: " + err.message;
  } finally {
    busy = false;
  }
  if (again) { again = false; return refresh(); }
  if (next !== null) timer = setTimeout(refresh, next);
}

window.addEventListener("hashchange", () => { offset = offset || 0; refresh(); });
document.addEventListener("DOMContentLoaded", async () => {
  // "#token=TOKEN" (a link to a server with --token-file): kept for this tab, then dropped
  const given = location.hash.match(/^#token=(.+)$/);
  if (given) {
    sessionStorage.setItem("stepstone-token", decodeURIComponent(given[1]));
    history.replaceState(null, "", location.pathname);
  }
  $("#filters").addEventListener("input", () => { offset = 0; refresh(); });
  $("#filters").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
  $("#diff-form").addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = "#diff?a=" + enc($("#diff-a").value.trim()) + "&b=" + enc($("#diff-b").value.trim());
  });
  try {
    const about = await getJSON("/about");
    pollMs = Math.max(200, about.poll_seconds * 1000);
    $("#store").textContent = about.store;
    $("#mode").textContent = about.actions ? "actions enabled" : "read-only";
  } catch (err) {
    $("#live").textContent = "cannot reach the inspector: " + err.message;
  }
  refresh();
});
