// Audit: the hash chain's status (last check and a check now), the order check (was the most
// urgent call served first), the calls the service did not answer in full (to follow up), and
// the exports.
import {api, badge, el, say, scroll, secs, state, table, when} from "./common.js";

// ended by the service, not by the caller: shed from a full queue, failed, cut by an engine
// restart or a shutdown's deadline, or interrupted by a crash of the service process
const UNANSWERED = ["interrupted", "shed", "error", "engine_restart", "shutdown"];

export async function render(root) {
  root.append(
    el("h2", {}, "Hash chain"),
    el("div", {id: "chain"}),
    el("div", {class: "bar"}, el("button", {type: "button", id: "verify", class: "primary", onclick: verifyNow}, "Verify the chain now")),
    el("h2", {}, "Served in order"),
    el("p", {class: "note"}, "A call started while a more urgent one on the same engine, there for longer than the tolerance, still waited for its first token: an inversion."),
    el("form", {id: "order-form", class: "bar", onsubmit: (ev) => { ev.preventDefault(); loadOrder(); }},
      el("label", {for: "o-window"}, "Calls of", el("select", {id: "o-window"},
        ...[["3600", "the last hour"], ["86400", "the last 24 hours"], ["604800", "the last 7 days"], ["", "all time"]]
          .map(([v, t]) => el("option", {value: v, selected: v === "86400"}, t)))),
      el("label", {for: "o-tolerance"}, "Tolerance (s)", el("input", {id: "o-tolerance", type: "number", min: "0", max: "60", step: "0.1", value: "1"})),
      el("button", {type: "submit", id: "o-check"}, "Check")),
    el("div", {id: "order", role: "status"}),
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
  await Promise.all([loadOrder(), loadUnanswered()]);
}

async function loadOrder() {
  const p = new URLSearchParams({tolerance_s: document.getElementById("o-tolerance").value || "1"});
  const w = document.getElementById("o-window").value;
  if (w) p.set("since", String(Date.now() / 1000 - Number(w)));
  let r;
  try { r = await api("/audit/order?" + p); } catch (e) { say(e.message, "error"); return; }
  const e1 = r.esi1;
  const verdict = el("p", {id: "order-state"},
    el("span", {class: "pill " + (r.ok ? "ok" : "bad")}, r.ok ? "✓ No ESI-1 call overtaken" : `✗ ${e1.overtaken} ESI-1 call${e1.overtaken === 1 ? "" : "s"} overtaken`),
    ` — ${r.calls} call${r.calls === 1 ? "" : "s"}, ${r.inversions} inversion${r.inversions === 1 ? "" : "s"} at any level${r.truncated ? " (the window's first 20,000 calls)" : ""}`);
  const t = table("Calls overtaken by a less urgent call, by level", ["Level", "Calls", "Overtaken", "By a call that came later", "By calls of level (times)"], {id: "order-levels"});
  const tb = el("tbody");
  for (const [lv, x] of Object.entries(r.per_level)) {
    tb.append(el("tr", {dataset: {level: lv}}, el("td", {}, badge(Number(lv))), el("td", {text: String(x.calls)}),
      el("td", {text: String(x.overtaken)}), el("td", {text: String(x.overtaken_by_later)}),
      el("td", {text: Object.entries(x.overtaken_by_levels).map(([b, n]) => `L${b}: ${n}`).join(", ") || "—"})));
  }
  t.append(tb);
  const parts = [verdict, t];
  if (r.worst.length) {
    const wt = table("Longest waits after being overtaken", ["Call", "Level", "Overtaken by", "First overtaker", "Still waited"], {id: "order-worst"});
    const wb = el("tbody");
    for (const x of r.worst.slice(0, 10)) {
      wb.append(el("tr", {dataset: {id: x.id}},
        el("td", {}, el("a", {href: `/ui/record?id=${encodeURIComponent(x.id)}`, "aria-label": `Audit record of ${x.id}`}, x.id)),
        el("td", {}, badge(x.level)), el("td", {text: `${x.overtaken_by} call${x.overtaken_by === 1 ? "" : "s"} (${x.overtaken_by_later} later)`}),
        el("td", {}, badge(x.first_overtaker.level), " ", el("a", {href: `/ui/record?id=${encodeURIComponent(x.first_overtaker.id)}`,
          "aria-label": `Audit record of ${x.first_overtaker.id}`}, x.first_overtaker.id)),
        el("td", {text: secs(x.waited_after_s)})));
    }
    wt.append(wb);
    parts.push(scroll("Longest waits after being overtaken", wt));
  }
  document.getElementById("order").replaceChildren(...parts);
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
