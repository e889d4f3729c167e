// The overview: the server pushes a rendering of the live panel when it
// changed (checked every two seconds). The page is patched, not replaced:
// rows are matched by their id (an agent's name, a job's id), and only the
// attributes and text that differ are touched, so a selection, a focused
// link or a hover on an unchanged cell survives an update.
(function () {
  const live = document.getElementById("live");
  if (!live) return;

  const sameNode = (a, b) =>
    a.nodeType === b.nodeType &&
    a.nodeName === b.nodeName &&
    (a.nodeType !== 1 || a.id === b.id);

  const patchAttributes = (el, want) => {
    for (const a of Array.from(el.attributes)) {
      if (!want.hasAttribute(a.name)) el.removeAttribute(a.name);
    }
    for (const a of Array.from(want.attributes)) {
      if (el.getAttribute(a.name) !== a.value) el.setAttribute(a.name, a.value);
    }
  };

  // Makes `el`'s children look like `want`'s, reusing every node that can
  // be kept: a child with an id is found wherever it now is, one without
  // is kept when it is the same kind of node at the same place.
  const patchChildren = (el, want) => {
    const byId = new Map();
    for (const c of Array.from(el.children)) if (c.id) byId.set(c.id, c);
    let cur = el.firstChild;
    for (const w of Array.from(want.childNodes)) {
      let keep = null;
      if (w.nodeType === 1 && w.id) {
        keep = byId.get(w.id) || null;
      } else if (cur && sameNode(cur, w)) {
        keep = cur;
      }
      if (!keep) {
        el.insertBefore(w, cur);
        continue;
      }
      if (keep === cur) cur = cur.nextSibling;
      else el.insertBefore(keep, cur);
      if (w.nodeType === 1) {
        patchAttributes(keep, w);
        patchChildren(keep, w);
      } else if (keep.nodeValue !== w.nodeValue) {
        keep.nodeValue = w.nodeValue;
      }
    }
    while (cur) {
      const next = cur.nextSibling;
      el.removeChild(cur);
      cur = next;
    }
  };

  const events = flotillaLive("/ui/events");
  events.addEventListener("overview", (e) => {
    const fresh = document.createElement("template");
    fresh.innerHTML = e.data;
    patchChildren(live, fresh.content);
  });
})();
