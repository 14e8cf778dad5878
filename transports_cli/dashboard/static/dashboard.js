// Samples /api/stats while the overview is open: updates the counts (in total and by
// priority) in place, and draws the backlog (ready + in flight + parked) of the last few
// minutes as a sparkline, with its change per second (messages published minus settled,
// as the counts show it).
"use strict";
(function () {
  const counts = document.getElementById("counts");
  const line = document.getElementById("sparkline-line");
  const rate = document.getElementById("rate");
  if (!counts || !line) return;
  const every = Math.max(0.5, Number(counts.dataset.refresh) || 2) * 1000;
  const keep = 90; // samples in the sparkline
  const samples = [];

  function draw() {
    const values = samples.map((s) => s.waiting);
    const high = Math.max(1, ...values);
    const step = 300 / Math.max(1, samples.length - 1);
    line.setAttribute("points", values.map((v, i) =>
      `${(i * step).toFixed(1)},${(58 - (v / high) * 56).toFixed(1)}`).join(" "));
    if (samples.length >= 2) {
      const a = samples[samples.length - 2], b = samples[samples.length - 1];
      const perSecond = (b.waiting - a.waiting) / Math.max(0.001, b.time - a.time);
      const sign = perSecond > 0 ? "+" : "";
      rate.textContent = `${b.waiting} waiting, ${sign}${perSecond.toFixed(1)} per second ` +
        `(peak ${high} over the last ${samples.length} samples)`;
    }
  }

  // An age in seconds as the page shows it: "12.3 s", or "-" when nothing is ready.
  function age(seconds) {
    return typeof seconds === "number" ? `${seconds.toFixed(1)} s` : "-";
  }

  function priorities(rows) {
    const body = document.querySelector("#by-priority tbody");
    if (!body || !Array.isArray(rows)) return;
    body.replaceChildren(...rows.map((p) => {
      const row = document.createElement("tr");
      for (const name of ["priority", "ready", "in_flight", "parked", "dead", "ready_groups",
        "busy_groups", "oldest_ready_age"]) {
        const cell = row.insertCell();
        cell.className = "num";
        cell.textContent = name === "oldest_ready_age" ? age(p[name]) : String(p[name]);
      }
      return row;
    }));
  }

  async function sample() {
    try {
      const response = await fetch("/api/stats", { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const stats = await response.json();
      for (const [name, value] of Object.entries(stats)) {
        const cell = document.getElementById(`stat-${name}`);
        if (cell && name === "oldest_ready_age") cell.textContent = age(value);
        else if (cell && typeof value === "number") cell.textContent = String(value);
      }
      priorities(stats.by_priority);
      samples.push(stats);
      if (samples.length > keep) samples.shift();
      draw();
    } catch (error) {
      rate.textContent = `could not sample the queue: ${error.message}`;
    }
  }

  sample();
  setInterval(sample, every);
})();
