// The console shell: who is signed in, the navigation their role allows, then the page.
import {api, el, state, say} from "./common.js";

const page = location.pathname.replace(/^\/ui\//, "").split("/")[0] || "queue";

async function boot() {
  try {
    state.me = await api("/ui/api/me");
  } catch (e) { return; }
  const me = state.me;
  document.getElementById("whoami").textContent = `${me.actor}`;
  const nav = document.getElementById("nav");
  for (const p of me.pages) {
    const a = el("a", {href: "/ui/" + p, text: me.titles[p]});
    if (p === page) a.setAttribute("aria-current", "page");
    nav.append(el("li", {}, a));
  }
  document.getElementById("logout").addEventListener("click", async () => {
    await api("/ui/logout", {method: "POST"}).catch(() => {});
    location.assign("/ui/login");
  });
  try {
    const cls = await api("/admin/classes");
    for (const c of cls.classes) state.levels[c.level] = c;
    state.classes = cls;
  } catch (e) { /* pages that need classes say so themselves */ }
  const title = (me.titles && me.titles[page]) || (page === "record" ? "Audit record" : page);
  document.getElementById("title").textContent = title;
  document.title = `${title} · Triage console`;
  const root = document.getElementById("page");
  try {
    const mod = await import(`./${page}.js`);
    await mod.render(root);
  } catch (e) {
    say(`This page failed to load: ${e.message}`, "error");
  }
}
boot();
