// A job page: appends new log lines as they arrive and reloads once the
// job ended (its end event carries the final state) or its state or
// attempt is no longer what the header shows (changed: queued -> running,
// a retry, the next attempt).
(function () {
  const log = document.getElementById("log");
  if (!log || !log.dataset.stream) return;
  const events = flotillaLive(log.dataset.stream);
  events.addEventListener("lines", (e) => {
    const empty = document.getElementById("log-empty");
    if (empty) empty.remove();
    const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent += e.data; // each line with its newline
    if (stick) log.scrollTop = log.scrollHeight;
  });
  events.addEventListener("end", () => { events.close(); location.reload(); });
  events.addEventListener("changed", () => { events.close(); location.reload(); });
})();
