// Priority classes: the table in force, an editor with validation and a diff against the
// current version, the version history (author, time, reason) and roll-back.
import {api, badge, el, fmt, sayDone, scroll, state, table, when} from "./common.js";

const FIELDS = [["name", "Name", "text"], ["weight", "Weight", "number"], ["ttft", "TTFT SLO (s)", "number"], ["tpot", "TPOT SLO (s)", "number"]];
const GLOBALS = [["w_first", "First-token weight w_first"], ["w_decode", "Decode weight w_decode"],
                 ["escalate_below", "Escalation threshold: P(level 1–2) ≥"]];
let current = null;

export async function render(root) {
  root.append(
    el("p", {class: "note"}, "A new version applies to waiting requests at once and to the engine at its next step; " +
       "the escalation threshold applies to the next request classified."),
    el("form", {id: "classes-form", novalidate: true, onsubmit: review},
      el("h2", {}, "Current classes ", el("span", {id: "cur-version", class: "muted"})),
      scroll("Class table", el("div", {id: "class-table"})),
      el("fieldset", {id: "globals"}, el("legend", {}, "Gain weights and escalation")),
      state.me.can_edit ? el("div", {class: "bar"},
        el("label", {for: "class-reason"}, "Reason for this change",
           el("input", {id: "class-reason", type: "text", size: "50", maxlength: "2000"})),
        el("button", {type: "submit", id: "review"}, "Review changes")) : null,
      el("p", {id: "class-error", class: "error", role: "alert"})),
    el("section", {id: "diff-section", hidden: true, "aria-labelledby": "diff-h"},
      el("h2", {id: "diff-h", tabindex: "-1"}, "Changes against the current version"),
      el("div", {id: "diff"}),
      el("div", {class: "bar"},
        el("button", {type: "button", id: "save-classes", class: "primary", onclick: save}, "Save as a new version"),
        el("button", {type: "button", onclick: hideDiff}, "Keep editing"))),
    el("h2", {}, "Version history"),
    scroll("Version history", el("div", {id: "versions"})),
    rollbackDialog(),
  );
  await load();
}

async function load() {
  current = await api("/admin/classes");
  state.classes = current;
  document.getElementById("cur-version").textContent = `(version ${current.version})`;
  const edit = state.me.can_edit;
  const t = table("Priority classes", ["Level", ...FIELDS.map(f => f[1])], {id: "class-rows"});
  const tb = el("tbody");
  for (const c of current.classes) {
    const tr = el("tr", {dataset: {level: String(c.level)}}, el("td", {}, badge(c.level)));
    for (const [k, label, type] of FIELDS) {
      tr.append(el("td", {}, edit
        ? el("input", {type, name: `${k}-${c.level}`, id: `${k}-${c.level}`, value: String(c[k]), required: true,
                       "aria-label": `Level ${c.level} ${label}`, step: type === "number" ? "any" : null,
                       min: type === "number" ? "0" : null, size: type === "text" ? "16" : "8"})
        : el("span", {text: String(c[k])})));
    }
    tb.append(tr);
  }
  t.append(tb);
  document.getElementById("class-table").replaceChildren(t);
  const g = document.getElementById("globals");
  g.replaceChildren(el("legend", {}, "Gain weights and escalation"));
  for (const [k, label] of GLOBALS) {
    const v = current[k];
    g.append(el("label", {for: `g-${k}`}, label + " "),
      edit ? el("input", {type: "number", id: `g-${k}`, step: "any", min: "0", max: k === "escalate_below" ? "1" : null,
                          value: v === null || v === undefined ? "" : String(v), size: "8"})
           : el("span", {id: `g-${k}`, text: fmt(v, 4)}), " ");
  }
  await loadVersions();
}

function readForm() {
  const errs = [];
  const classes = current.classes.map(c => {
    const out = {level: c.level};
    for (const [k, label, type] of FIELDS) {
      const inp = document.getElementById(`${k}-${c.level}`);
      inp.removeAttribute("aria-invalid");
      if (type === "text") {
        out[k] = inp.value.trim();
        if (!out[k] || out[k].length > 64) { errs.push(`Level ${c.level}: ${label} must be 1–64 characters.`); inp.setAttribute("aria-invalid", "true"); }
      } else {
        out[k] = Number(inp.value);
        if (inp.value.trim() === "" || !Number.isFinite(out[k]) || out[k] <= 0) {
          errs.push(`Level ${c.level}: ${label} must be a number above 0.`); inp.setAttribute("aria-invalid", "true");
        }
      }
    }
    return out;
  });
  const body = {classes, reason: document.getElementById("class-reason").value.trim() || null};
  for (const [k, label] of GLOBALS) {
    const inp = document.getElementById(`g-${k}`);
    inp.removeAttribute("aria-invalid");
    if (inp.value.trim() === "") { if (k !== "escalate_below" || current[k] !== null) { errs.push(`${label} is required.`); inp.setAttribute("aria-invalid", "true"); } continue; }
    const v = Number(inp.value);
    const bad = !Number.isFinite(v) || v <= 0 || (k === "escalate_below" && v > 1);
    if (bad) { errs.push(`${label} must be ${k === "escalate_below" ? "above 0 and at most 1" : "a number above 0"}.`); inp.setAttribute("aria-invalid", "true"); }
    body[k] = v;
  }
  return {body, errs};
}

function diffRows(body) {
  const rows = [];
  for (const c of current.classes) {
    const n = body.classes.find(x => x.level === c.level);
    for (const [k, label] of FIELDS) if (String(n[k]) !== String(c[k])) rows.push([`L${c.level} ${label}`, c[k], n[k]]);
  }
  for (const [k, label] of GLOBALS) if (body[k] !== undefined && body[k] !== current[k]) rows.push([label, current[k], body[k]]);
  return rows;
}

let pending = null;

function review(ev) {
  ev.preventDefault();
  const err = document.getElementById("class-error");
  const {body, errs} = readForm();
  if (errs.length) { err.textContent = errs.join(" "); hideDiff(); const bad = document.querySelector('[aria-invalid="true"]'); if (bad) bad.focus(); return; }
  err.textContent = "";
  const rows = diffRows(body);
  const t = table(`Changes from version ${current.version}`, ["Field", "Current", "New"], {class: "diff", id: "diff-table"});
  const tb = el("tbody");
  if (!rows.length) tb.append(el("tr", {}, el("td", {colspan: 3, class: "muted", text: "No changes."})));
  for (const [f, a, b] of rows) tb.append(el("tr", {}, el("td", {text: f}), el("td", {class: "old", text: String(a)}), el("td", {class: "new", text: String(b)})));
  t.append(tb);
  document.getElementById("diff").replaceChildren(t);
  document.getElementById("save-classes").disabled = !rows.length;
  pending = body;
  const sec = document.getElementById("diff-section");
  sec.hidden = false;
  document.getElementById("diff-h").focus();
}

function hideDiff() { document.getElementById("diff-section").hidden = true; pending = null; }

async function save() {
  if (!pending) return;
  try {
    const res = await api("/admin/classes", {method: "PUT", body: pending});
    hideDiff();
    document.getElementById("class-reason").value = "";
    await load();
    sayDone(`Saved version ${res.version}.`, res);
    document.getElementById("cur-version").focus?.();
  } catch (e) {
    document.getElementById("class-error").textContent = `Not saved: ${e.message}`;
  }
}

// --- history and roll-back -------------------------------------------------------------
async function loadVersions() {
  const h = await api("/admin/classes/history");
  const t = table("Class versions, newest first", ["Version", "Author", "Time", "Reason", "Classes (weight · TTFT · TPOT)", "Escalation", "Action"], {id: "version-rows"});
  const tb = el("tbody");
  for (const v of h.versions) {
    const summary = v.classes.map(c => `L${c.level} ${c.weight}·${c.ttft}s·${c.tpot}s`).join("; ");
    tb.append(el("tr", {dataset: {version: String(v.version)}},
      el("td", {}, String(v.version), v.version === h.current ? el("span", {class: "pill ok"}, " in force") : null),
      el("td", {class: "mono", text: v.actor || "–"}), el("td", {text: when(v.created)}), el("td", {text: v.reason || "–"}),
      el("td", {class: "mono", text: summary}), el("td", {text: fmt(v.escalate_below, 4)}),
      el("td", {}, state.me.can_edit && v.version !== h.current
        ? el("button", {type: "button", class: "rollback", dataset: {version: String(v.version)},
                        "aria-label": `Roll back to version ${v.version}`, onclick: () => openRollback(v.version)}, "Roll back…")
        : el("span", {class: "muted", text: "–"}))));
  }
  t.append(tb);
  document.getElementById("versions").replaceChildren(t);
}

function rollbackDialog() {
  const d = el("dialog", {id: "rollback-dialog", "aria-labelledby": "rb-title"});
  const form = el("form", {method: "dialog"},
    el("h2", {id: "rb-title"}, "Roll back"),
    el("p", {id: "rb-what"}),
    el("label", {for: "rb-reason"}, "Reason"),
    el("input", {id: "rb-reason", type: "text", size: "40", maxlength: "2000"}),
    el("p", {id: "rb-error", class: "error", role: "alert"}),
    el("div", {class: "actions"}, el("button", {type: "button", onclick: () => d.close()}, "Cancel"),
      el("button", {type: "submit", class: "primary", id: "rb-submit"}, "Roll back")));
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      const res = await api("/admin/classes/rollback", {method: "POST", body: {version: Number(d.dataset.version), reason: document.getElementById("rb-reason").value.trim() || null}});
      d.close();
      await load();
      sayDone(`Rolled back: version ${res.version} now equals version ${d.dataset.version}.`, res);
    } catch (e) { document.getElementById("rb-error").textContent = e.message; }
  });
  d.append(form);
  return d;
}

function openRollback(version) {
  const d = document.getElementById("rollback-dialog");
  d.dataset.version = String(version);
  document.getElementById("rb-what").textContent = `Make a new version equal to version ${version}.`;
  document.getElementById("rb-error").textContent = "";
  d.showModal();
  document.getElementById("rb-reason").focus();
}
