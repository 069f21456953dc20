// Audit: the hash chain's status (last check and a check now), the calls the service did not
// answer in full (to follow up), and the exports.
import {api, badge, el, say, scroll, secs, state, table, when} from "./common.js";

// ended by the service, not by the caller: shed from a full queue, failed, cut by an engine
// restart or a shutdown's deadline, or interrupted by a crash of the service process
const UNANSWERED = ["interrupted", "shed", "error", "engine_restart", "shutdown"];

export async function render(root) {
  root.append(
    el("h2", {}, "Hash chain"),
    el("div", {id: "chain"}),
    el("div", {class: "bar"}, el("button", {type: "button", id: "verify", class: "primary", onclick: verifyNow}, "Verify the chain now")),
    el("h2", {}, "Calls not answered in full"),
    el("p", {class: "note"}, "Shed from a full queue, failed, cut by an engine restart or a shutdown, or interrupted by a crash of the service: newest first, to follow up."),
    el("form", {id: "unanswered-form", class: "bar", onsubmit: (ev) => { ev.preventDefault(); loadUnanswered(); }},
      el("label", {for: "u-level"}, "Level", el("select", {id: "u-level"}, el("option", {value: ""}, "All"),
        ...Object.keys(state.levels).sort((a, b) => a - b).map((lv) => el("option", {value: lv}, `L${lv} ${state.levels[lv].name || ""}`)))),
      el("label", {for: "u-outcome"}, "How it ended", el("select", {id: "u-outcome"}, el("option", {value: UNANSWERED.join(",")}, "Any of these"),
        ...UNANSWERED.map((o) => el("option", {value: o}, o)))),
      el("button", {type: "submit", id: "u-show"}, "Show")),
    el("p", {id: "u-count", class: "note", role: "status"}),
    scroll("Calls not answered in full", el("div", {id: "unanswered"})),
    el("h2", {}, "Export"),
    el("ul", {},
      el("li", {}, el("a", {href: "/audit/export", id: "export-events", download: "triage-audit.jsonl"}, "Audit events (JSON lines, with hashes)")),
      el("li", {}, el("a", {href: "/audit/latency?format=csv", id: "export-latency", download: "latency.csv"}, "Latency by level, all time (CSV)"))),
  );
  show(await api("/audit/verify/last"));
  await loadUnanswered();
}

async function loadUnanswered() {
  const p = new URLSearchParams({outcome: document.getElementById("u-outcome").value, limit: "200"});
  const lv = document.getElementById("u-level").value;
  if (lv) p.set("level", lv);
  let r;
  try { r = await api("/audit/requests?" + p); } catch (e) { say(e.message, "error"); return; }
  document.getElementById("u-count").textContent = `${r.count} call${r.count === 1 ? "" : "s"}${r.truncated ? " (the newest 200)" : ""}`;
  const t = table("Calls not answered in full, newest first", ["Arrived", "Level", "How it ended", "Tokens sent", "First token after", "Audit record"], {id: "unanswered-rows"});
  const tb = el("tbody");
  for (const x of r.requests) {
    tb.append(el("tr", {dataset: {id: x.id, outcome: x.outcome}},
      el("td", {text: when(x.arrival)}), el("td", {}, badge(x.effective_level)), el("td", {text: x.outcome}),
      el("td", {text: String(x.output_tokens)}), el("td", {text: secs(x.ttft)}),
      el("td", {}, el("a", {href: `/ui/record?id=${encodeURIComponent(x.id)}`, "aria-label": `Audit record of ${x.id}`}, x.id))));
  }
  if (!r.requests.length) tb.append(el("tr", {}, el("td", {colspan: 6, class: "muted", text: "None."})));
  t.append(tb);
  document.getElementById("unanswered").replaceChildren(t);
}

function show(v) {
  const c = document.getElementById("chain");
  if (!v || v.checked_at === null || v.checked_at === undefined) {
    c.replaceChildren(el("p", {id: "chain-state"}, el("span", {class: "pill"}, "Not checked yet"), " since this service started."));
    return;
  }
  const ok = v.ok;
  c.replaceChildren(
    el("p", {id: "chain-state"}, el("span", {class: "pill " + (ok ? "ok" : "bad")}, ok ? "✓ Verified" : "✗ Broken"),
       ` — last checked ${when(v.checked_at)}`),
    el("dl", {}, ...Object.entries(v).filter(([k]) => !["ok", "checked_at"].includes(k))
      .flatMap(([k, x]) => [el("dt", {text: k}), el("dd", {class: "mono", text: typeof x === "object" ? JSON.stringify(x) : String(x)})])));
}

async function verifyNow() {
  const b = document.getElementById("verify");
  b.disabled = true;
  try {
    const r = await fetch("/audit/verify", {credentials: "same-origin"});
    const v = await r.json();
    if (r.status !== 200 && r.status !== 409) throw new Error((v.error && v.error.message) || r.status);
    show(v);
    say(v.ok ? "The audit chain verifies." : "The audit chain does NOT verify.", v.ok ? "ok" : "error");
  } catch (e) { say(`Check failed: ${e.message}`, "error"); }
  b.disabled = false;
  b.focus();
}
