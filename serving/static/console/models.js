// Models: the urgency and length predictors in use, their figures, and (where the
// service has them) site adapters from GET /admin/models.
import {api, el, fmt} from "./common.js";
import {renderAdapters} from "./adapters.js";

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
  await renderAdapters(box);   // versions, shadow agreement; admins: fit, shadow, promote, roll back
}
