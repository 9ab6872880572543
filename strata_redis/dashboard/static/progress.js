/* strata dashboard: the training-progress panel (each job's "progress" in /api/dashboard).
 *
 * It draws what dashboard.js fetched, when it renders (window.strataDashboard.renderers): no
 * request or timer of its own. Per job: samples trained and samples/s, the current epoch's
 * remaining samples and ETA, each live worker's samples/s with the slowest one marked, and
 * where each committed checkpoint lives. Samples/s are deltas of the lease owner's lifetime counts between the server's
 * reads, so the first reads show "–". */
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
  function stat(name, label, value, small, sub) {
    return el("div", { class: "card", "data-progress": name }, el("div", { class: "label", text: label }),
      el("div", { class: "value" }, value, small ? el("small", { text: ` ${small}` }) : null),
      sub ? el("div", { class: "sub", text: sub }) : null);
  }

  function jobPanel(job, multi) {
    const p = job.progress;
    const eta = p.eta_s === 0 ? "done" : duration(p.eta_s);
    const left = p.epoch_remaining_samples;
    const stats = el("div", { class: "cards progress-cards" },
      stat("rate", "samples/s", rate(p.samples_per_s), "", p.rate_window_s ? `job, over the last ${Math.round(p.rate_window_s)} s` : "needs two reads"),
      stat("eta", `epoch ${job.epoch} ETA`, eta, "", left === null ? "epoch not started" : `${left.toLocaleString()} samples left`),
      stat("trained", "samples trained", p.samples_trained.toLocaleString(), "", "over the job's life"),
      stat("slowest", "slowest worker", p.slowest_worker || "–", "", "lowest samples/s, live"));
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
        el("td", { text: c.label }), el("td", { class: "location", text: c.location || "– (not recorded)" })))));
    return el("div", { class: "progress-job", "data-job": job.job_id },
      multi ? el("h3", { text: job.job_id }) : null, stats,
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
