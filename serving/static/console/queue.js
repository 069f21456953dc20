// Live queue: waiting and running requests by level, pushed by the server (SSE) twice a
// second. Operators see the first words of each message and relabel from the row.
import {api, badge, el, levelName, sayDone, scroll, secs, state, table} from "./common.js";

let view = null;
let paused = false;
let source = null;

const COLS = [["Level"], ["Request"], ["Message"], ["Age", "num"], ["Predicted → effective"], ["P(level 1–5)"],
              ["Predicted length", "num"], ["Slack to next deadline", "num"], ["Instance"], ["Tokens so far", "num"], ["Action"]];

export async function render(root) {
  const me = state.me;
  const cols = COLS.filter(([c]) => (c !== "Message" || me.text) && (c !== "Action" || me.can_edit));
  root.append(...[
    el("p", {class: "note", id: "qsum", "aria-live": "off"}, "connecting…"),
    el("div", {class: "bar"},
      el("button", {id: "pause", type: "button", "aria-pressed": "false", onclick: togglePause}, "Pause updates")),
    me.text ? null : el("p", {class: "note"}, "Message text is shown to operators only."),
    el("h2", {id: "h-waiting"}, "Waiting"),
    scroll("Waiting requests", table("Waiting requests by level", cols, {id: "waiting"})),
    el("h2", {id: "h-running"}, "Running"),
    scroll("Running requests", table("Running requests by level", cols, {id: "running"})),
    relabelDialog(),
  ].filter(Boolean));
  connect();
}

function connect() {
  source = new EventSource("/ui/api/queue/stream");
  addEventListener("pagehide", () => source.close());   // free the connection before the next page loads
  source.onmessage = (ev) => { view = JSON.parse(ev.data); if (!paused) draw(); };
  source.onerror = () => { document.getElementById("qsum").textContent = "connection lost; retrying…"; };
}

function togglePause(ev) {
  paused = !paused;
  ev.currentTarget.setAttribute("aria-pressed", String(paused));
  ev.currentTarget.textContent = paused ? "Resume updates" : "Pause updates";
  if (!paused && view) draw();
}

function draw() {
  for (const l of view.levels) state.levels[l.level] = l;
  const t = new Date(view.at * 1000).toISOString().slice(11, 19);
  document.getElementById("qsum").textContent =
    `${view.waiting.length} waiting · ${view.running.length} running · classes version ${view.classes_version} · updated ${t} UTC`;
  // keep keyboard focus on the same control across redraws
  const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.focusKey : null;
  fill("waiting", view.waiting);
  fill("running", view.running);
  if (focused) {
    const again = document.querySelector(`[data-focus-key="${CSS.escape(focused)}"]`);
    if (again) again.focus();
  }
}

function fill(id, rows) {
  const t = document.getElementById(id);
  for (const tb of t.querySelectorAll("tbody")) tb.remove();
  const ncol = t.querySelectorAll("thead th").length;
  if (!rows.length) {
    t.append(el("tbody", {}, el("tr", {}, el("td", {colspan: ncol, class: "muted", text: `No ${id} requests.`}))));
    return;
  }
  const byLevel = new Map();
  for (const r of rows) { if (!byLevel.has(r.level)) byLevel.set(r.level, []); byLevel.get(r.level).push(r); }
  for (const [lv, rs] of [...byLevel.entries()].sort((a, b) => a[0] - b[0])) {
    const tb = el("tbody", {dataset: {level: String(lv)}});
    tb.append(el("tr", {}, el("th", {scope: "rowgroup", colspan: ncol},
      `Level ${lv}${levelName(lv) ? " — " + levelName(lv) : ""}: ${rs.length} ${id}`)));
    for (const r of rs) tb.append(rowFor(r));
    t.append(tb);
  }
}

function probs(p) {
  if (!p || !p.length) return el("span", {class: "muted", text: "–"});
  const top = p.indexOf(Math.max(...p));
  return el("span", {},
    el("span", {class: "probs", "aria-hidden": "true"},
      p.map((x, i) => el("span", {}, i === top ? el("b", {}, `${i + 1}:${(100 * x).toFixed(0)}%`) : `${i + 1}:${(100 * x).toFixed(0)}%`))),
    el("span", {class: "sr-only"}, p.map((x, i) => `level ${i + 1} ${(100 * x).toFixed(0)} percent`).join(", ")));
}

function rowFor(r) {
  const me = state.me;
  const tr = el("tr", {class: `lvrow${Math.min(5, r.level)}`, dataset: {id: r.request_id, level: String(r.level), state: r.state}});
  const late = r.slack_s < 0;
  const pred = r.predicted_level === r.level && r.override_level === null
    ? el("span", {}, badge(r.level))
    : el("span", {}, badge(r.predicted_level), " → ", badge(r.level),
         r.override_level !== null ? el("span", {class: "muted"}, " (override)") : null);
  tr.append(
    el("td", {}, badge(r.level)),
    el("td", {class: "mono"}, r.request_id, r.position !== null ? el("div", {class: "muted"}, `#${r.position + 1} in queue`) : null),
  );
  if (me.text) tr.append(el("td", {class: "msg", dataset: {col: "text"}, text: r.text || "–"}));
  tr.append(
    el("td", {class: "num", text: secs(r.age_s)}),
    el("td", {}, pred),
    el("td", {}, probs(r.probs)),
    el("td", {class: "num", text: `${r.predicted_output_len} tok`}),
    el("td", {class: "num " + (late ? "late" : ""), text: late ? `late by ${secs(-r.slack_s)}` : secs(r.slack_s)}),
    el("td", {text: r.instance || "–"}),
    el("td", {class: "num", text: `${r.output_tokens} / ${r.max_tokens}`}),
  );
  if (me.can_edit) {
    tr.append(el("td", {}, el("button", {type: "button", class: "relabel", dataset: {focusKey: "relabel:" + r.request_id},
      "aria-label": `Relabel ${r.request_id} (now level ${r.level})`, onclick: () => openRelabel(r)}, "Relabel…")));
  }
  return tr;
}

// --- relabel ---------------------------------------------------------------------------
let target = null;
let opener = null;

function relabelDialog() {
  const d = el("dialog", {id: "relabel-dialog", "aria-labelledby": "relabel-title"});
  const form = el("form", {method: "dialog", id: "relabel-form"},
    el("h2", {id: "relabel-title"}, "Relabel request"),
    el("p", {id: "relabel-what", class: "mono"}),
    el("label", {for: "relabel-level"}, "New level"),
    el("select", {id: "relabel-level", name: "level", required: true}),
    el("label", {for: "relabel-reason"}, "Reason (kept in the audit trail)"),
    el("textarea", {id: "relabel-reason", name: "reason", rows: "3", required: true, maxlength: "2000"}),
    el("p", {id: "relabel-error", class: "error", role: "alert"}),
    el("div", {class: "actions"},
      el("button", {type: "button", id: "relabel-cancel", onclick: () => d.close()}, "Cancel"),
      el("button", {type: "submit", id: "relabel-submit", class: "primary"}, "Move request")));
  form.addEventListener("submit", submitRelabel);
  d.addEventListener("close", () => {
    const key = opener && opener.dataset ? opener.dataset.focusKey : null;
    const back = key ? document.querySelector(`[data-focus-key="${CSS.escape(key)}"]`) : null;
    (back || document.getElementById("main")).focus();
  });
  d.append(form);
  return d;
}

function openRelabel(r) {
  target = r;
  opener = document.activeElement;
  const d = document.getElementById("relabel-dialog");
  document.getElementById("relabel-what").textContent = `${r.request_id}: now level ${r.level}` + (r.text ? ` — “${r.text}”` : "");
  const sel = document.getElementById("relabel-level");
  sel.replaceChildren(...Object.values(state.levels).map(l =>
    el("option", {value: String(l.level), selected: l.level === r.level ? true : null}, `L${l.level} ${l.name}`)));
  document.getElementById("relabel-reason").value = "";
  document.getElementById("relabel-error").textContent = "";
  d.showModal();
  sel.focus();
}

async function submitRelabel(ev) {
  ev.preventDefault();
  const level = Number(document.getElementById("relabel-level").value);
  const reason = document.getElementById("relabel-reason").value.trim();
  const err = document.getElementById("relabel-error");
  if (!reason) { err.textContent = "Give a reason: it goes into the audit trail."; document.getElementById("relabel-reason").focus(); return; }
  if (level === target.level) { err.textContent = `The request is already at level ${level}.`; return; }
  try {
    const res = await api(`/admin/requests/${encodeURIComponent(target.request_id)}`, {method: "PATCH", body: {level, reason}});
    // move the row at once; the next pushed view confirms it
    for (const list of [view.waiting, view.running]) {
      const r = list.find(x => x.request_id === target.request_id);
      if (r) { r.level = level; r.override_level = level; if (res.position !== null && res.position !== undefined) r.position = res.position; }
    }
    for (const list of [view.waiting, view.running]) list.sort((a, b) => a.level - b.level);
    document.getElementById("relabel-dialog").close();
    if (!paused) draw();
    sayDone(`Moved ${target.request_id} from level ${res.from_level} to level ${res.to_level}.`, res);
  } catch (e) {
    err.textContent = `Relabel failed: ${e.message}`;
  }
}
