// One request's audit record: its row, relabels and hash-chained events (no message text).
import {api, el, say, scroll, table, when} from "./common.js";

export async function render(root) {
  const id = new URLSearchParams(location.search).get("id");
  if (!id) { say("No request id given.", "error"); return; }
  let rec;
  try { rec = await api(`/audit/requests/${encodeURIComponent(id)}`); } catch (e) { say(e.message, "error"); return; }
  const r = rec.request;
  const dl = el("dl", {id: "record"});
  for (const k of ["id", "effective_level", "predicted_level", "classifier_level", "override_level", "outcome", "arrival",
                   "ttft", "mean_tpot", "max_tpot", "ttft_slo", "tpot_slo", "slo_met", "output_tokens", "instance", "classes_version"]) {
    dl.append(el("dt", {text: k}), el("dd", {class: "mono", text: k === "arrival" ? when(r[k]) : String(r[k])}));
  }
  const ev = table("Audit events", ["#", "Time", "Kind", "Actor", "Hash"]);
  const tb = el("tbody");
  for (const e of rec.events) tb.append(el("tr", {}, el("td", {text: String(e.id)}), el("td", {text: when(e.at)}),
    el("td", {text: e.kind}), el("td", {class: "mono", text: e.actor || "–"}), el("td", {class: "mono", text: e.hash})));
  ev.append(tb);
  const rl = table("Relabels", ["Time", "Actor", "From → to", "Reason"]);
  const rb = el("tbody");
  for (const x of rec.relabels) rb.append(el("tr", {}, el("td", {text: when(x.at)}), el("td", {class: "mono", text: x.actor}),
    el("td", {text: `${x.from_level} → ${x.to_level}`}), el("td", {text: x.reason})));
  rl.append(rb);
  root.append(el("h2", {}, "Request ", el("span", {class: "mono"}, id)), dl,
              el("h2", {}, "Relabels"), scroll("Relabels", rl), el("h2", {}, "Audit events"), scroll("Audit events", ev));
}
