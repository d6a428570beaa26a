// Live updates of a job page: the job's event stream says something changed, then the
// page's panel is fetched again and swapped in; the stream ends when the job is settled.
(function () {
  const panel = document.getElementById("panel");
  if (!panel) return;
  const job = panel.dataset.job;
  let pending = null;

  function refresh() {
    pending = null;
    fetch(`/ui/jobs/${job}/panel`, { credentials: "same-origin" })
      .then((answer) => (answer.ok ? answer.text() : null))
      .then((html) => { if (html !== null) panel.innerHTML = html; });
  }

  function soon() {
    if (pending === null) pending = setTimeout(refresh, 200);
  }

  if (panel.dataset.final === "true") return;
  const events = new EventSource(`/ui/jobs/${job}/events`);
  events.onmessage = soon;
  events.addEventListener("end", () => { events.close(); refresh(); });
})();
