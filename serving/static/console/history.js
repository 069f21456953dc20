// History: relabels and class edits as one searchable log, each sealed by an audit event.
import {api, el, say, scroll, state, table, when, fromLocalInput} from "./common.js";

export async function render(root) {
  root.append(
    el("form", {id: "history-form", class: "bar", role: "search", onsubmit: (ev) => { ev.preventDefault(); load(); }},
      el("label", {for: "h-q"}, "Search (actor, request, reason, change)", el("input", {id: "h-q", type: "search", size: "30"})),
      el("label", {for: "h-kind"}, "Kind", el("select", {id: "h-kind"},
        el("option", {value: "all"}, "All"), el("option", {value: "relabel"}, "Relabels"), el("option", {value: "classes"}, "Class edits"))),
      el("label", {for: "h-since"}, "From (UTC)", el("input", {id: "h-since", type: "datetime-local"})),
      el("label", {for: "h-until"}, "Until (UTC)", el("input", {id: "h-until", type: "datetime-local"})),
      el("button", {type: "submit", id: "h-search"}, "Search")),
    el("p", {id: "h-count", class: "note", role: "status"}),
    scroll("History log", el("div", {id: "history"})),
  );
  await load();
}

async function load() {
  const p = new URLSearchParams({q: document.getElementById("h-q").value, kind: document.getElementById("h-kind").value});
  const s = fromLocalInput(document.getElementById("h-since").value), u = fromLocalInput(document.getElementById("h-until").value);
  if (s) p.set("since", s);
  if (u) p.set("until", u);
  let h;
  try { h = await api("/admin/history?" + p); } catch (e) { say(e.message, "error"); return; }
  document.getElementById("h-count").textContent = `${h.count} entr${h.count === 1 ? "y" : "ies"}`;
  const t = table("Relabels and class edits, newest first", ["Time", "Actor", "What", "From → to", "Reason / changes", "Audit record"], {id: "history-rows"});
  const tb = el("tbody");
  for (const e of h.entries) {
    const what = e.kind === "relabel" ? el("span", {}, "Relabel ", el("span", {class: "mono"}, e.request_id), e.stage ? ` (${e.stage})` : "") : "Class edit";
    const detail = e.kind === "classes" ? el("span", {}, e.reason ? el("div", {text: e.reason}) : null, el("div", {class: "mono muted", text: (e.changes || []).join("; ")}))
                                        : el("span", {text: e.reason});
    let link = el("span", {class: "muted", text: "–"});
    if (e.audit_event_id !== null) {
      const label = `event #${e.audit_event_id} · ${e.audit_hash.slice(0, 12)}…`;
      link = e.kind === "relabel" && state.me.can_audit
        ? el("a", {href: `/ui/record?id=${encodeURIComponent(e.request_id)}`, "aria-label": `Audit record of ${e.request_id}, ${label}`}, label)
        : el("span", {class: "mono", text: label});
    }
    tb.append(el("tr", {dataset: {kind: e.kind, request: e.request_id || ""}},
      el("td", {text: when(e.at)}), el("td", {class: "mono", text: e.actor || "–"}), el("td", {}, what),
      el("td", {text: `${e.from} → ${e.to}`}), el("td", {}, detail), el("td", {}, link)));
  }
  if (!h.entries.length) tb.append(el("tr", {}, el("td", {colspan: 6, class: "muted", text: "Nothing matches."})));
  t.append(tb);
  document.getElementById("history").replaceChildren(t);
}
