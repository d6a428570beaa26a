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

// Live updates of the home page: its panel is fetched again every few seconds while the
// page is in view, since its figures move with the clock as much as with jobs.
(function () {
  const home = document.getElementById("home");
  if (!home) return;
  const every = Number(home.dataset.refreshS) * 1000;
  const source = `/ui/home/panel?window=${encodeURIComponent(home.dataset.window)}`;

  function refresh() {
    if (document.visibilityState !== "visible") return;
    fetch(source, { credentials: "same-origin" })
      .then((answer) => (answer.ok ? answer.text() : null))
      .then((html) => { if (html !== null) home.innerHTML = html; });
  }

  setInterval(refresh, every);
  document.addEventListener("visibilitychange", refresh);
})();
