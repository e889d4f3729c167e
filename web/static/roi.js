// The ROI page: patches its counts, progress, ETA, the agents' bars and the
// map's tiles in place from the server's `state` events (the first carries
// every tile as a letter, later ones the tiles that changed), so a scroll
// position, a hover or a selection survives.
(function () {
  const root = document.getElementById("roi");
  if (!root) return;
  const id = root.dataset.id;
  const names = { m: "missing", q: "queued", r: "running", d: "done", f: "failed" };
  const set = (elId, text) => {
    const el = document.getElementById(elId);
    if (el && el.textContent !== String(text)) el.textContent = text;
  };
  const patchTile = (i, letter) => {
    const rect = document.getElementById("t" + i);
    const state = names[letter];
    if (!rect || !state) return;
    const cls = "t-" + state;
    const old = rect.getAttribute("class");
    if (old === cls) return;
    rect.setAttribute("class", cls);
    const title = rect.querySelector("title");
    const name = title ? title.textContent.split(":")[0] : "";
    if (title) title.textContent = name + ": " + state;
    const a = rect.parentNode;
    if (state === "missing") {
      a.removeAttribute("href");
    } else if (!a.hasAttribute("href") || old === "t-missing" || old === "t-failed") {
      // The tile may have a new job: the server finds it on click.
      a.setAttribute("href", "/ui/rois/" + id + "/tiles/" + name);
    }
  };
  // The agents' bars: one group an agent, made the first time it appears
  // (an ROI page opened before any tile ended has none), in the server's
  // order, and dropped once an agent has no tile in the last hour.
  const SVG = "http://www.w3.org/2000/svg";
  const svgEl = (name, attrs, text) => {
    const el = document.createElementNS(SVG, name);
    Object.keys(attrs).forEach((k) => el.setAttribute(k, attrs[k]));
    if (text !== undefined) el.textContent = text;
    return el;
  };
  const patchAgents = (agents) => {
    const chart = document.getElementById("agents-chart");
    if (!chart || !Array.isArray(agents)) return;
    const groups = new Map();
    chart.querySelectorAll("g[data-agent]").forEach((g) => groups.set(g.dataset.agent, g));
    agents.forEach((a) => {
      let g = groups.get(a.agent);
      if (!g) {
        g = svgEl("g", {});
        g.dataset.agent = a.agent;
        g.append(
          svgEl("text", { class: "bar-label", x: 0 }, a.agent),
          svgEl("rect", { class: "bar", x: a.x, height: 18 }),
          svgEl("text", { class: "bar-value" }, a.text));
      }
      groups.delete(a.agent);
      chart.append(g); // in the server's order
      g.querySelector(".bar-label").setAttribute("y", a.y + 15);
      const rect = g.querySelector("rect");
      rect.setAttribute("y", a.y + 2);
      rect.setAttribute("width", a.width);
      const v = g.querySelector(".bar-value");
      v.setAttribute("x", a.value_x);
      v.setAttribute("y", a.y + 15);
      if (v.textContent !== a.text) v.textContent = a.text;
    });
    groups.forEach((g) => g.remove());
    chart.setAttribute("height", Math.max(agents.length, 1) * 26);
    const box = document.getElementById("agents-box");
    if (box) box.hidden = agents.length === 0;
    const none = document.getElementById("agents-none");
    if (none) none.hidden = agents.length !== 0;
  };
  const events = flotillaLive("/ui/rois/" + id + "/events");
  events.addEventListener("state", (e) => {
    const s = JSON.parse(e.data);
    const h = s.head;
    set("roi-state", h.state);
    const pill = document.getElementById("roi-state");
    if (pill) pill.className = "state s-" + h.state;
    Object.keys(h.counts).forEach((k) => set("count-" + k, h.counts[k]));
    const bar = document.getElementById("roi-progress");
    if (bar) {
      bar.max = h.total;
      bar.value = h.counts.done;
    }
    set("roi-percent", h.percent);
    set("roi-total", h.total);
    set("roi-eta", h.eta);
    set("roi-pace", h.pace);
    patchAgents(h.agents);
    if (s.tiles && typeof s.tiles.all === "string") {
      for (let i = 0; i < s.tiles.all.length; i++) patchTile(i, s.tiles.all[i]);
    }
    if (s.tiles && s.tiles.changed) s.tiles.changed.forEach((c) => patchTile(c[0], c[1]));
  });
})();
