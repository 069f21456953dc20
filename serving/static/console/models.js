// Models: the urgency and length predictors in use, their figures, and (where the
// service has them) site adapters from GET /admin/models.
import {api, el, fmt, scroll, table} from "./common.js";

export async function render(root) {
  const info = await api("/ui/api/models");
  root.append(el("p", {class: "note"}, `Backend ${info.backend}, served model ${info.served_model}. ` +
    `Escalation threshold in force: ${fmt(info.escalate_below_in_force, 4)} (change it on Priority classes).`));
  for (const k of ["urgency", "length"]) {
    const m = info[k];
    root.append(el("h2", {}, k === "urgency" ? "Urgency model" : "Output-length model"));
    if (!m) { root.append(el("p", {class: "muted"}, "Not loaded in this service.")); continue; }
    const dl = el("dl", {id: `model-${k}`});
    const rows = {encoder: m.encoder, runtime: m.runtime, labels: m.labels.join(", "), temperature: m.temperature};
    if (k === "urgency") rows["escalation threshold (trained)"] = fmt(m.escalate_below_trained, 4);
    else rows["bucket edges (tokens)"] = m.bucket_edges.join(", ");
    for (const [a, b] of Object.entries({...rows, ...m.metrics})) dl.append(el("dt", {text: a}), el("dd", {class: "mono", text: typeof b === "number" ? fmt(b, 4) : String(b)}));
    root.append(dl);
  }
  root.append(el("h2", {}, "Site adapters"));
  const box = el("div", {id: "adapters"});
  root.append(box);
  try {
    const a = await api("/admin/models");
    const list = Array.isArray(a) ? a : (a.models || a.adapters || []);
    if (!list.length) { box.append(el("p", {class: "muted"}, "No site adapters registered.")); return; }
    const cols = [...new Set(list.flatMap(x => Object.keys(x)))];
    const t = table("Site adapters", cols, {id: "adapter-rows"});
    const tb = el("tbody");
    for (const x of list) tb.append(el("tr", {}, ...cols.map(c => el("td", {class: "mono", text: typeof x[c] === "object" ? JSON.stringify(x[c]) : String(x[c] ?? "–")}))));
    t.append(tb);
    box.append(scroll("Site adapters", t));
  } catch (e) {
    box.append(el("p", {class: "muted", id: "adapters-none"}, e.status === 404
      ? "This service has no site-adapter endpoint (GET /admin/models); only the models above are in use."
      : `Site adapters unavailable: ${e.message}`));
  }
}
