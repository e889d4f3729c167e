// The pipeline run page: patches counts and matrix cells in place from the
// server's `state` events, so a selection or a scroll position survives.
(function () {
  const root = document.getElementById("run");
  if (!root || root.dataset.final === "true") return;
  const url = "/ui/pipelines/" + root.dataset.id + "/events" +
    (root.dataset.after ? "?after=" + root.dataset.after : "");
  const events = flotillaLive(url);
  const set = (id, text) => {
    const el = document.getElementById(id);
    if (el && el.textContent !== String(text)) el.textContent = text;
  };
  events.addEventListener("state", (e) => {
    const s = JSON.parse(e.data);
    set("run-state", s.state);
    document.getElementById("run-state").className = "state s-" + s.state;
    set("count-done", s.counts.done);
    set("count-active", s.counts.active);
    set("count-waiting", s.counts.waiting);
    set("count-failed", s.counts.failed + s.counts.cancelled);
    set("count-items", s.items === null ? "?" : s.items);
    s.steps.forEach((st, i) => {
      set("col-" + i + "-running", st.running);
      set("col-" + i + "-succeeded", st.succeeded);
      set("col-" + i + "-failed", st.failed);
      set("col-" + i + "-mean", st.mean_s === null ? "-" : st.mean_s.toFixed(1) + " s");
    });
    s.gates.forEach((g, i) => set("gate-" + i, g.inside));
    s.rows.forEach((r, i) => {
      set("row-" + i + "-state", r.state);
      r.cells.forEach((c, j) => {
        const a = document.getElementById("cell-" + i + "-" + j);
        if (!a) return;
        const state = c ? c[0] : "none";
        const cls = "cell s-" + state;
        if (a.className !== cls) a.className = cls;
        if (c && c[1]) {
          const href = "/ui/jobs/" + c[1];
          if (a.getAttribute("href") !== href) a.setAttribute("href", href);
        }
        a.title = a.title.replace(/: [a-z ]+$/, ": " + (c ? state : "not there"));
      });
    });
  });
  events.addEventListener("end", () => { events.close(); location.reload(); });
})();
