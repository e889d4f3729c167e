// A page's live stream: an EventSource that, when the server refuses it
// (a 429 past the stream caps, a 401 once the session ended, a 5xx; a
// stream that merely dropped reconnects by itself), leaves the page as it
// is and says under the alert banner that its live updates stopped.
function flotillaLive(url) {
  const events = new EventSource(url);
  events.addEventListener("error", () => {
    if (events.readyState !== EventSource.CLOSED) return;
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
  });
  return events;
}
