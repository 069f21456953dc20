// Audit: the hash chain's status (last check and a check now) and the exports.
import {api, el, say, when} from "./common.js";

export async function render(root) {
  root.append(
    el("h2", {}, "Hash chain"),
    el("div", {id: "chain"}),
    el("div", {class: "bar"}, el("button", {type: "button", id: "verify", class: "primary", onclick: verifyNow}, "Verify the chain now")),
    el("h2", {}, "Export"),
    el("ul", {},
      el("li", {}, el("a", {href: "/audit/export", id: "export-events", download: "triage-audit.jsonl"}, "Audit events (JSON lines, with hashes)")),
      el("li", {}, el("a", {href: "/audit/latency?format=csv", id: "export-latency", download: "latency.csv"}, "Latency by level, all time (CSV)"))),
  );
  show(await api("/audit/verify/last"));
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
