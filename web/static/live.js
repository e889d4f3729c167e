// A page's live stream: an EventSource that, when the server refuses it
// (a 429 past the stream caps, a 401 once the session ended, a 5xx; a
// stream that merely dropped reconnects by itself), leaves the page as it
// is and says under the alert banner that its live updates stopped.
//
// The stream is open only while the page can be seen. Over HTTP/1.1 a
// browser holds at most six connections to a server, and each live tab
// held one for ever, so with six dashboard tabs open the seventh page never
// loaded. A tab hidden for HIDDEN_MS gives its connection back; shown
// again, it opens the stream afresh (a background tab opens it when first
// shown). The overview, ROI and pipeline streams begin with the whole
// state; a job's log goes on after the last line the page got (its
// events' ids, given back as `after`).
//
// Returns { addEventListener(name, fn), close() }: the listeners outlive
// each EventSource under them.
function flotillaLive(url) {
  const HIDDEN_MS = 5000;
  const listeners = [];
  let events = null;
  let lastId = "";
  let closed = false;
  let hideTimer = null;

  const stopped = (source) => () => {
    if (source.readyState !== EventSource.CLOSED) return;
    if (source !== events) return; // one this page closed itself
    if (document.getElementById("live-stopped")) return;
    const p = document.createElement("p");
    p.id = "live-stopped";
    p.className = "alert";
    p.setAttribute("role", "status");
    p.textContent = "Live updates stopped: the server refused this page's stream " +
      "(too many live views open for this login or on the server, the session ended, " +
      "or the server is unavailable). Close other dashboard tabs, then reload this page.";
    const banner = document.getElementById("alerts");
    if (banner) banner.after(p);
    else document.body.prepend(p);
  };

  const open = () => {
    if (events || closed) return;
    let where = url;
    if (lastId) {
      const u = new URL(url, location.href);
      u.searchParams.set("after", lastId);
      where = u.pathname + u.search;
    }
    const source = new EventSource(where);
    events = source;
    source.addEventListener("error", stopped(source));
    source.addEventListener("open", () => {
      const note = document.getElementById("live-stopped");
      if (note) note.remove();
    });
    for (const [name, fn] of listeners) source.addEventListener(name, fn);
  };

  const shut = () => {
    hideTimer = null;
    if (!events) return;
    const source = events;
    events = null;
    source.close();
  };

  document.addEventListener("visibilitychange", () => {
    if (document.hidden) {
      if (!hideTimer) hideTimer = setTimeout(shut, HIDDEN_MS);
    } else {
      clearTimeout(hideTimer);
      hideTimer = null;
      open();
    }
  });
  if (!document.hidden) open();

  return {
    addEventListener(name, fn) {
      const seen = (e) => {
        if (e.lastEventId) lastId = e.lastEventId;
        fn(e);
      };
      listeners.push([name, seen]);
      if (events) events.addEventListener(name, seen);
    },
    close() {
      closed = true;
      clearTimeout(hideTimer);
      shut();
    },
  };
}
