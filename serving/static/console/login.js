// Sign in: POST the key once; the server answers with an HTTP-only session cookie.
const form = document.getElementById("login-form");
const input = document.getElementById("key");
const status = document.getElementById("login-status");

form.addEventListener("submit", async (ev) => {
  ev.preventDefault();
  status.textContent = "";
  const key = input.value.trim();
  if (!key) { status.textContent = "Enter an API key."; input.setAttribute("aria-invalid", "true"); input.focus(); return; }
  const r = await fetch("/ui/login", {method: "POST", headers: {"Content-Type": "application/json"},
                                      body: JSON.stringify({key}), credentials: "same-origin"});
  const body = await r.json().catch(() => ({}));
  if (!r.ok) {
    status.textContent = (body.error && body.error.message) || `sign-in failed (${r.status})`;
    input.setAttribute("aria-invalid", "true");
    input.focus();
    return;
  }
  input.value = "";
  const next = new URLSearchParams(location.search).get("next");
  const target = next && next.startsWith("/ui/") && !next.startsWith("//") ? next : "/ui/" + body.pages[0];
  location.assign(target);
});
input.focus();
