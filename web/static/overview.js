// The overview: the server pushes a fresh rendering of the live panel
// every two seconds.
(function () {
  const live = document.getElementById("live");
  if (!live) return;
  const events = new EventSource("/ui/events");
  events.addEventListener("overview", (e) => { live.innerHTML = e.data; });
})();
