// Every page's alert banner: polls /ui/alerts.json and lists the active
// alerts at the top of the page (text only: names and sentences come from
// agents and are never parsed as HTML). Quiet when signed out or offline.
(function () {
  const box = document.getElementById("alerts");
  // The login page has no session to ask with (the poll would be a 401).
  if (!box || location.pathname === "/ui/login") return;
  let shown = "";
  function render(list) {
    const key = JSON.stringify(list.alerts);
    if (key === shown) return; // keep any text being selected
    shown = key;
    box.replaceChildren();
    if (list.alerts.length === 0) { box.hidden = true; return; }
    box.hidden = false;
    for (const a of list.alerts) {
      const p = document.createElement("p");
      p.className = "alert sev-" + a.severity;
      p.dataset.alert = a.alert;
      p.dataset.subject = a.subject;
      const head = document.createElement("strong");
      head.textContent = a.severity + " · " + a.alert + " · " + a.subject + ": ";
      p.append(head, document.createTextNode(a.message + " "));
      const more = document.createElement("a");
      more.href = "/ui/alerts";
      more.textContent = "all alerts";
      p.append(more);
      box.append(p);
    }
  }
  let timer = null;
  async function poll() {
    if (document.hidden) return; // asked again when shown
    try {
      const r = await fetch("/ui/alerts.json", { credentials: "same-origin" });
      if (r.ok) render(await r.json());
      // Signed out (here or in another tab): asking again cannot help.
      else if (r.status === 401) clearInterval(timer);
    } catch (e) { /* offline: try again at the next tick */ }
  }
  poll();
  timer = setInterval(poll, 5000);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) poll(); });
})();
