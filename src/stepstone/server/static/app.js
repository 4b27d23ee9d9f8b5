// stepstone inspector: polls the JSON API and renders the run list or one run's timeline.
"use strict";

const $ = (sel) => document.querySelector(sel);
let pollMs = 1000;
let allowActions = false;
let updates = 0;
let timer = null;
let offset = 0;

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
    link.href = "#run=" + encodeURIComponent(run.superseded_by);
    cell.append(link);
  } else {
    cell.textContent = ownerText(run);
  }
  return cell;
}

function currentKey() {
  const m = location.hash.match(/^#run=(.*)$/);
  return m ? decodeURIComponent(m[1]) : null;
}

async function getJSON(url) {
  const resp = await fetch(url, { cache: "no-store" });
  const data = await resp.json();
  if (!resp.ok) throw new Error(data.error || resp.statusText);
  return data;
}

function markLive(extra) {
  updates += 1;
  const live = $("#live");
  live.textContent = "live · updated " + new Date().toLocaleTimeString() + (extra || "");
  live.dataset.updates = String(updates);
}

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
  allowActions = data.allow_actions;
  $("#store").textContent = data.store;
  $("#mode").textContent = data.allow_actions ? "actions enabled" : "read-only";
  $("#count").textContent = data.total + " run(s)";
  const body = $("#runs tbody");
  body.replaceChildren();
  for (const run of data.runs) {
    const tr = el("tr");
    tr.dataset.key = run.key;
    tr.dataset.status = run.status;
    const link = el("a", run.key);
    link.href = "#run=" + encodeURIComponent(run.key);
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
    tr.append(keyCell, el("td", run.kind), statusCell,
      ownerCell(run, "td"),
      el("td", run.steps), el("td", run.next_step || ""), el("td", when(run.updated_at)),
      el("td", run.error_type || "", run.error_type ? "owner-dead" : ""));
    body.append(tr);
  }
  markLive();
}

async function renderRun(key) {
  let run;
  try {
    run = await getJSON("/api/run?key=" + encodeURIComponent(key));
  } catch (err) {
    $("#run-key").textContent = key;
    $("#run-facts").textContent = String(err.message);
    $("#timeline tbody").replaceChildren();
    return;
  }
  $("#run-key").textContent = run.key;
  $("#mode").textContent = run.allow_actions ? "actions enabled" : "read-only";
  const facts = $("#run-facts");
  facts.replaceChildren(
    statusBadge(run.status),
    el("span", " " + run.kind + " run"),
    el("span", "steps " + run.steps),
    el("span", "next step " + (run.next_step || "—")),
    el("span", "owner "), ownerCell(run, "span"),
    el("span", "updated " + when(run.updated_at)),
    el("span", "ran " + run.duration_seconds.toFixed(1) + " s since its first claim"),
  );
  if (run.cancel_requested) facts.append(el("span", "cancel requested", "badge status-failed cancel-flag"));
  facts.dataset.status = run.status;
  facts.dataset.steps = String(run.steps);
  const errBox = $("#run-error");
  if (run.error || run.corrupt) {
    errBox.hidden = false;
    const said = run.error ? (run.error.type || "error") + " at step " + (run.error.step || run.error.node || "?") + ": " + (run.error.message || "") : "";
    errBox.textContent = [said, run.corrupt || ""].filter(Boolean).join(" · ");
  } else {
    errBox.hidden = true;
    errBox.textContent = "";
  }
  $("#actions").hidden = !(run.allow_actions && run.status !== "done");
  renderApprovals(run);
  renderWaits(run);
  renderAgent(run.agent);
  renderOperations(run);
  const body = $("#timeline tbody");
  body.replaceChildren();
  const canRetry = run.allow_actions && run.owner !== "live" && run.kind === "plan";
  for (const entry of run.timeline) {
    const tr = el("tr", null, entry.error ? "row-error" : "");
    tr.dataset.name = entry.name || "";
    const errCell = el("td", entry.error ? (entry.error.type || "") + ": " + (entry.error.message || "") : "");
    if (canRetry && entry.name && (entry.kind === "step" || entry.name === run.next_step)) {
      const btn = el("button", "retry from here", "plain retry");
      btn.type = "button";
      btn.addEventListener("click", () => act("/api/retry?key=" + encodeURIComponent(run.key) + "&step=" + encodeURIComponent(entry.name)));
      errCell.append(" ", btn);
    }
    const payload = el("td", short(entry.payload, 600), "payload");
    if (entry.payload_chars) {
      payload.append(el("span", " (" + entry.payload_chars + " characters; all of it: stepstone history KEY --payloads --json)", "muted cut"));
    }
    const nameCell = el("td", entry.name || "");
    if (entry.detail) nameCell.append(el("div", entry.detail, "muted detail"));
    tr.append(el("td", entry.seq), el("td", entry.kind), nameCell,
      el("td", clockTime(entry.started_at), "started"), el("td", span(entry.duration_seconds), "took"),
      el("td", span(entry.gap_seconds), "gap"), payload, errCell);
    body.append(tr);
  }
  markLive(" · " + run.steps + " step(s)");
}

function renderApprovals(run) {
  const calls = run.pending_approvals || [];
  $("#approvals").hidden = calls.length === 0;
  const body = $("#approvals-table tbody");
  body.replaceChildren();
  for (const call of calls) {
    const tr = el("tr");
    tr.dataset.callId = call.call_id;
    const cell = el("td");
    if (call.decision !== null && call.decision !== undefined) {
      cell.append(el("span", call.decision === true ? "approved" : "denied: " + call.decision, "decision"), " ");
    }
    if (run.allow_actions && run.owner !== "live") {
      // A decision this page shows may be changed (replace=1); one recorded since it was
      // drawn is not: the server refuses and says which decision stands.
      const decided = call.decision !== null && call.decision !== undefined;
      const url = "/api/approve?key=" + encodeURIComponent(call.run_key) + "&call_id=" + encodeURIComponent(call.call_id) + (decided ? "&replace=1" : "");
      const approve = el("button", "approve", "plain approve");
      approve.type = "button";
      approve.addEventListener("click", () => act(url));
      const deny = el("button", "deny", "plain deny");
      deny.type = "button";
      deny.addEventListener("click", () => act(url + "&deny=" + encodeURIComponent("denied from the web inspector")));
      cell.append(approve, " ", deny);
    }
    tr.append(el("td", call.call_id), el("td", call.tool), el("td", short(call.arguments, 200), "payload"),
      el("td", call.reason || ""), cell);
    body.append(tr);
  }
}

function turnText(t) {
  // A model turn's summary: model, tokens, cost, the tool calls it asked for (or its text).
  const parts = [t.model || "model", (t.input_tokens || 0) + " in / " + (t.output_tokens || 0) + " out",
    t.cost_usd === null || t.cost_usd === undefined ? "cost unknown" : "$" + t.cost_usd.toFixed(6)];
  const calls = t.tool_calls || [];
  if (calls.length) parts.push(calls.map((c) => c.name + "(" + c.args + ")").join(", "));
  else if (t.text) parts.push(JSON.stringify(t.text));
  return parts.join(" · ");
}

function renderOperations(run) {
  const ops = run.operations;
  $("#workflow").hidden = !ops;
  if (!ops) return;
  const body = $("#operations tbody");
  body.replaceChildren();
  const canRetry = run.allow_actions && run.owner !== "live";
  for (const op of ops) {
    const tr = el("tr", null, op.error ? "row-error" : "");
    tr.dataset.position = op.position;
    const name = (op.op === "step" ? op.name : op.op + " " + op.name) + (op.key ? " (" + op.key + ")" : "");
    const shown = op.error ? (op.error.type || "").split(":").pop() + ": " + (op.error.message || "")
      : op.summary ? turnText(op.summary) : short(op.value, 300);
    const cell = el("td", shown, "payload");
    if (canRetry && op.op === "step") {
      const btn = el("button", "retry from here", "plain retry");
      btn.type = "button";
      btn.addEventListener("click", () => act("/api/retry?key=" + encodeURIComponent(run.key) + "&step=" + encodeURIComponent(op.position)));
      cell.append(" ", btn);
    }
    tr.append(el("td", op.position), el("td", name), el("td", op.status), el("td", short(op.args, 200), "payload"),
      cell, el("td", op.attempts), el("td", op.ms === null || op.ms === undefined ? "" : op.ms.toFixed(1)));
    body.append(tr);
  }
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

async function refresh() {
  clearTimeout(timer);
  const key = currentKey();
  $("#list-view").hidden = key !== null;
  $("#run-view").hidden = key === null;
  try {
    if (key === null) await renderList(); else await renderRun(key);
  } catch (err) {
    $("#live").textContent = "cannot reach the inspector: " + err.message;
  }
  timer = setTimeout(refresh, pollMs);
}

async function cancelRun() {
  await act("/api/cancel?key=" + encodeURIComponent(currentKey()));
}

async function act(url) {
  const resp = await fetch(url, { method: "POST", headers: { "X-Stepstone-Action": "1" } });
  const data = await resp.json();
  $("#action-result").textContent = data.outcome || data.error;
  refresh();
}

window.addEventListener("hashchange", refresh);
document.addEventListener("DOMContentLoaded", () => {
  $("#filters").addEventListener("input", () => { offset = 0; refresh(); });
  $("#filters").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
  $("#cancel").addEventListener("click", cancelRun);
  refresh();
});
