// Site adapters (GET /admin/models): versions with their held-out figures, the shadow
// candidate's agreement with the live decisions, and for admins the buttons that fit a new
// adapter from the operators' relabels, shadow, promote and roll back (serving/adapt).
import {api, el, fmt, say, scroll, state, table} from "./common.js";

function figs(m) {
  const a = (m.figures && m.figures.adapted) || {}, c = (m.figures && m.figures.current) || {}, g = (m.figures && m.figures.general) || {};
  return {a, c, g};
}

export async function renderAdapters(box) {
  box.replaceChildren();
  let info;
  try {
    info = await api("/admin/models");
  } catch (e) {
    box.append(el("p", {class: "muted", id: "adapters-none"}, e.status === 404
      ? "This service has no site-adapter endpoint (GET /admin/models); only the models above are in use."
      : `Site adapters unavailable: ${e.message}`));
    return;
  }
  const admin = state.me && state.me.role === "admin";
  box.append(el("p", {id: "adapters-serving"}, `Serving: ${info.serving}.`));
  if (admin) {
    const run = async (label, path, method = "POST") => {
      try {
        const r = await api(path, {method});
        say(`${label}: ${r.verdict || JSON.stringify(r)}`, r.passed === false ? "error" : "");
      } catch (e) { say(`${label}: ${e.message}`, "error"); }
      await renderAdapters(box);
    };
    box.append(el("p", {},
      el("button", {id: "adapt-button", type: "button", onclick: () => run("Fit adapter", "/admin/models/adapt")}, "Fit adapter from relabels"),
      " ",
      el("button", {id: "rollback-button", type: "button", disabled: info.live === null,
                    onclick: () => run("Roll back", "/admin/models/rollback")}, "Roll back live adapter")));
    box.dataset.run = "1";
    box._run = run;
  }
  if (info.shadow) {
    const s = info.shadow;
    box.append(el("p", {id: "shadow-agreement"},
      `Shadow: v${s.version} decided ${s.n} requests beside the live model; agreement ${s.agreement === null ? "–" : (100 * s.agreement).toFixed(1) + " %"}, ` +
      `more urgent ${s.shadow_more_urgent}, less urgent ${s.shadow_less_urgent}.`));
  }
  if (!info.models.length) { box.append(el("p", {class: "muted"}, "No site adapters yet: operators' relabels are the training data.")); return; }
  const cols = ["version", "status", "relabels (train / held out)", "held-out accuracy (adapted / current / general)",
                "under-triage 1-2 (adapted / general)", "verdict"];
  if (admin) cols.push("actions");
  const t = table("Site adapters", cols, {id: "adapter-rows"});
  const tb = el("tbody");
  for (const m of info.models) {
    const {a, c, g} = figs(m);
    const tr = el("tr", {dataset: {version: String(m.version), status: m.status}},
      el("td", {class: "mono", text: `v${m.version}`}), el("td", {text: m.status + (m.usable ? "" : " (other general model)")}),
      el("td", {class: "mono", text: `${m.n_train} / ${m.n_holdout}`}),
      el("td", {class: "mono", text: `${fmt(a.accuracy)} / ${fmt(c.accuracy)} / ${fmt(g.accuracy)}`}),
      el("td", {class: "mono", text: `${fmt(a.under_triage_1_2)} / ${fmt(g.under_triage_1_2)}`}),
      el("td", {text: m.verdict}));
    if (admin) {
      const td = el("td");
      if (m.passed && m.status !== "live" && m.usable) {
        td.append(el("button", {type: "button", class: "promote", onclick: () => box._run(`Promote v${m.version}`, `/admin/models/${m.version}/promote`)}, "Promote"), " ");
        td.append(el("button", {type: "button", class: "shadow", onclick: () => box._run(`Shadow v${m.version}`, `/admin/models/${m.version}/shadow`)}, "Shadow"));
      }
      tr.append(td);
    }
    tb.append(tr);
  }
  t.append(tb);
  box.append(scroll("Site adapters", t));
}
