/* strata dashboard: the training-progress panel (each job's "progress" in /api/dashboard).
 *
 * It draws what dashboard.js fetched, when it renders (window.strataDashboard.renderers): no
 * request or timer of its own. Per job: samples trained and samples/s, the current epoch's
 * remaining samples and ETA, each live worker's samples/s with the slowest one marked, and
 * where each committed checkpoint lives. Samples/s are deltas of the lease owner's lifetime
 * counts between the server's reads: with none ("no recent data": the first read, a gap, or
 * every live worker silent) there is no rate, no ETA and no slowest worker, and the panel
 * says why instead of showing a number. */
(function () {
  "use strict";

  const el = (...args) => window.strataDashboard.el(...args);  // dashboard.js's DOM helper
  const rate = (v) => (v === null || v === undefined ? "–" : Number(v).toFixed(v < 100 ? 1 : 0));
  function duration(s) {
    if (s === null || s === undefined) return "–";
    const whole = Math.round(s);  // rounded first: 119.6 s is 2 min 0 s, never 1 min 60 s
    if (whole < 60) return `${whole} s`;
    if (whole < 3600) return `${Math.floor(whole / 60)} min ${whole % 60} s`;
    const minutes = Math.round(s / 60);
    return `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
  }
  function stat(name, label, value, small, sub, none) {
    return el("div", { class: "card", "data-progress": name }, el("div", { class: "label", text: label }),
      el("div", { class: none ? "value none" : "value" }, value, small ? el("small", { text: ` ${small}` }) : null),
      sub ? el("div", { class: "sub", text: sub, title: sub }) : null);
  }

  // Why a job has no rate, in the CLI's words (`strata status`: "no rate (no worker heartbeating)").
  function noRate(job) {
    if (window.strataDashboard.allSilent(job)) return "no worker heartbeating";
    if (job.live_workers === 0) return `no live worker (job ${job.state})`;
    return "first read, or nothing read within the rate's window";
  }

  function jobPanel(job, multi) {
    const p = job.progress;
    const left = p.epoch_remaining_samples;
    const leftWords = left === null ? "epoch not started" : `${left.toLocaleString()} samples left`;
    const cards = [p.samples_per_s === null
      ? stat("rate", "samples/s", "no recent data", "", noRate(job), true)
      : stat("rate", "samples/s", rate(p.samples_per_s), "", `job, over the last ${Math.round(p.rate_window_s)} s`)];
    // an ETA only with a rate (or a finished epoch); else what is left, without one
    if (p.eta_s !== null) cards.push(stat("eta", `epoch ${job.epoch} ETA`, p.eta_s === 0 ? "done" : duration(p.eta_s), "", leftWords));
    else cards.push(stat("left", `epoch ${job.epoch}`, left === null ? "not started" : left.toLocaleString(), left === null ? "" : "samples left", "", left === null));
    cards.push(stat("trained", "samples trained", p.samples_trained.toLocaleString(), "", "over the job's life"));
    // the slowest only when the document names one (never at a tie, nor for silent workers)
    if (p.slowest_worker) cards.push(stat("slowest", "slowest worker", p.slowest_worker, "", "lowest samples/s, live"));
    const stats = el("div", { class: "cards progress-cards" }, ...cards);
    const workers = el("table", { class: "progress-workers" },
      el("thead", {}, el("tr", {}, el("th", { text: "worker" }), el("th", { class: "num", text: "samples/s" }),
        el("th", { class: "num", text: "samples trained" }), el("th", { text: "" }))),
      el("tbody", {}, ...p.workers.map((w) => el("tr", { "data-worker": w.worker_id, class: w.slowest ? "slowest" : null },
        el("td", { text: w.worker_id }), el("td", { class: "num", text: rate(w.samples_per_s) }),
        el("td", { class: "num", text: w.samples_trained.toLocaleString() }),
        el("td", {}, w.slowest ? el("span", { class: "pill slowest", text: "slowest" }) : null)))));
    const places = el("table", { class: "progress-checkpoints" },
      el("thead", {}, el("tr", {}, el("th", { text: "checkpoint" }), el("th", { text: "location" }))),
      el("tbody", {}, ...p.checkpoints.map((c) => el("tr", { "data-label": c.label },
        el("td", { text: window.strataDashboard.checkpointName(c), title: c.label }),
        el("td", { class: "location", text: c.location || "– (not recorded)" })))));
    return el("div", { class: "progress-job", "data-job": job.job_id },
      multi ? el("h3", {}, job.job_id, " ", window.strataDashboard.stateBadge(job.state)) : null, stats,
      el("div", { class: "grid two" }, el("div", { class: "scroll" }, workers), el("div", { class: "scroll" }, places)));
  }

  function render(doc) {
    const target = document.getElementById("progress");
    if (!target) return;
    const multi = doc.jobs.length !== 1;
    target.replaceChildren(...doc.jobs.filter((j) => j.progress).map((j) => jobPanel(j, multi)));
  }

  const state = window.strataDashboard;
  state.renderers.push(render);
  if (state.doc) render(state.doc);  // a document drawn before this script ran
})();
