// Helpers every console page uses: the API (session cookie + CSRF header), small DOM
// builders, level badges that say their level in words, number and time formats.
export const state = {me: null, levels: {}};

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function api(path, {method = "GET", body} = {}) {
  const headers = {};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && state.me && state.me.csrf) headers["X-Triage-CSRF"] = state.me.csrf;
  const r = await fetch(path, {method, headers, credentials: "same-origin",
                               body: body === undefined ? undefined : JSON.stringify(body)});
  if (r.status === 401) { location.assign("/ui/login?next=" + encodeURIComponent(location.pathname + location.search)); throw new ApiError(401, "signed out"); }
  const ct = r.headers.get("content-type") || "";
  const data = ct.includes("json") ? await r.json().catch(() => ({})) : await r.text();
  if (!r.ok) throw new ApiError(r.status, (data && data.error && data.error.message) || `HTTP ${r.status}`);
  return data;
}

export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined && c !== false) e.append(c instanceof Node ? c : String(c));
  return e;
}

export function levelName(level) { return (state.levels[level] && state.levels[level].name) || ""; }

// "L2 Emergent": the level is always written, colour only reinforces it
export function badge(level) {
  if (level === null || level === undefined) return el("span", {class: "muted", text: "–"});
  const name = levelName(level);
  return el("span", {class: `lv lv${Math.min(5, Math.max(1, level))}`, dataset: {level: String(level)}},
            `L${level}`, name ? ` ${name}` : "");
}

export function fmt(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  return typeof x === "number" ? x.toFixed(digits) : String(x);
}
export function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(1) + " %"; }
export function secs(x) { return x === null || x === undefined ? "–" : (Math.abs(x) < 10 ? x.toFixed(2) : x.toFixed(1)) + " s"; }
export function ms(x) { return x === null || x === undefined ? "–" : (1000 * x).toFixed(0) + " ms"; }
export function when(t) {
  if (t === null || t === undefined) return "–";
  const d = new Date(t * 1000);
  return d.toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

let statusTimer = null;
export function say(msg, kind = "") {
  const s = document.getElementById("status");
  s.textContent = msg;
  s.className = "status " + kind;
  clearTimeout(statusTimer);
  if (msg && kind !== "error") statusTimer = setTimeout(() => { s.textContent = ""; }, 8000);
}

// An operator's change is answered once its audit record is durable (`recorded`); false
// means the audit database did not answer in time: the change holds, its record waits.
export function sayDone(msg, res) {
  if (res && res.recorded === false) {
    say(`${msg} Its audit record is not written yet (the audit database is not answering); it will be when the database is back.`, "error");
  } else {
    say(msg, "ok");
  }
}

export function table(caption, headers, opts = {}) {
  const t = el("table", {id: opts.id, class: opts.class});
  if (caption) t.append(el("caption", {class: opts.captionVisible ? "" : "sr-only", text: caption}));
  const tr = el("tr");
  for (const h of headers) {
    const [label, cls] = Array.isArray(h) ? h : [h, ""];
    tr.append(el("th", {scope: "col", class: cls, text: label}));
  }
  t.append(el("thead", {}, tr));
  return t;
}

// a horizontally scrollable region that keyboard users can reach (axe: scrollable-region-focusable)
export function scroll(label, child) { return el("div", {class: "scroll", tabindex: "0", role: "region", "aria-label": label}, child); }

// datetime-local value <-> UNIX seconds (UTC on both sides, said on the label)
export function toLocalInput(t) { return new Date(t * 1000).toISOString().slice(0, 16); }
export function fromLocalInput(v) { return v ? Date.parse(v + ":00Z") / 1000 : null; }
