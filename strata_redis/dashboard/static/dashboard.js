/* strata dashboard: polls GET /api/dashboard and draws it. No framework, no build step.
 *
 * Polling asks again only after the previous reply arrived (then waits poll-ms), so a slow
 * server never gets a pile of requests. The header says how long ago the shown numbers were
 * read; a page that cannot reach its server says so and greys the numbers out instead of
 * showing them as live. */
(function () {
  "use strict";

  const app = document.getElementById("app");
  const cfg = app.dataset;
  const POLL_MS = Number(cfg.pollMs) || 1000;
  const TIMEOUT_MS = 10000;            // a request with no reply by then counts as lost
  const HIDDEN_POLL_MS = 5000;         // a background tab asks less often
  const job = cfg.job || null;
  const MB_S_DEFINITION = cfg.mbSDefinition || "";
  const COLORS = ["#3949ab", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#5d4037", "#ad1457"];

  const state = {
    doc: null, lastOk: null, failure: null, failedSince: null, inFlight: false, offset: 0, limit: 500,
    charts: {}, datasetNodes: new Map(), polls: 0,
    renderers: [],                    // more panels' render(doc), called with every new document
  };
  window.strataDashboard = state;     // for people poking around, and for the browser test

  // -- small DOM helpers --------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "text") node.textContent = v;
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  state.el = el;  // progress.js builds its panel with it
  const $ = (id) => document.getElementById(id);
  const fmt = (v, digits) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i++; }
    return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
  }
  function clock(ms) {
    return ms ? new Date(ms).toLocaleTimeString([], { hour12: false }) : "–";
  }
  // A checkpoint's MB/s, the same digits on the tile and in the table.
  const mbps = (v) => fmt(v, 1);
  // A window's length as people say it: "10 min", "90 s", "2 h" (text.py's window_words).
  function windowWords(s) {
    if (s >= 3600 && s % 3600 === 0) return `${s / 3600} h`;
    if (s >= 60 && s % 60 === 0) return `${s / 60} min`;
    return `${s} s`;
  }
  function jobUrl(id) { return cfg.jobBase + encodeURIComponent(id); }
  // A checkpoint by its numbers, the run always beside them (two launches reuse steps):
  // "run 1 · epoch 0 · step 200", as `strata status` and `strata events` tell them apart.
  function checkpointName(c) {
    if (!c) return "–";
    return [`run ${c.run ?? 0}`, c.epoch === null || c.epoch === undefined ? null : `epoch ${c.epoch}`,
      `step ${c.step}`].filter((w) => w).join(" · ");
  }
  state.checkpointName = checkpointName;  // progress.js names its checkpoints the same way
  // A job's state in the CLI's words (`strata jobs`, `strata status`), with what each means.
  const STATE_MEANS = {
    running: "a worker heartbeated within the job's heartbeat timeout",
    stale: "workers registered, but every one silent past the job's heartbeat timeout (or the last one failed)",
    ended: "the job ended, or every worker left",
    lost: "its state in Redis is gone (a restart without persistence, a flush)",
    idle: "no worker ever registered (checkpoints only)",
  };
  function stateBadge(s) {
    return el("span", { class: `pill job-state state-${s}`, text: s, title: `${s}: ${STATE_MEANS[s] || "unknown state"}` });
  }
  state.stateBadge = stateBadge;
  // Every live worker silent past the timeout: nothing trains that anyone can see, and
  // there is no live count, no rate, no ETA (the document's silent_workers).
  const allSilent = (j) => j.live_workers > 0 && j.silent_workers >= j.live_workers;
  state.allSilent = allSilent;

  // -- polling --------------------------------------------------------------------------------
  function apiUrl() {
    const q = new URLSearchParams();
    if (job) q.set("job", job);
    q.set("offset", String(state.offset));
    q.set("limit", String(state.limit));
    return `${cfg.api}?${q}`;
  }

  async function poll() {
    state.inFlight = true;
    state.polls++;
    const ctrl = new AbortController();
    const timer = setTimeout(() => ctrl.abort(), TIMEOUT_MS);
    try {
      const reply = await fetch(apiUrl(), { signal: ctrl.signal, cache: "no-store", credentials: "same-origin" });
      let body = null;
      try { body = await reply.json(); } catch (e) { body = null; }
      if (!reply.ok) {
        const message = (body && body.error) || `HTTP ${reply.status}`;
        // 5xx: the server is up but cannot read Redis; 4xx: this page asks for something wrong.
        state.failure = { kind: reply.status >= 500 ? "lost" : "error", message };
        if (body && body.redis) {
          state.failure.redis = body.redis;
          state.failure.since = body.redis_down_since_ms;
        }
        if (state.failedSince === null) state.failedSince = Date.now();
      } else {
        state.failure = null;
        state.failedSince = null;
        state.lastOk = performance.now();
        state.doc = body;
        render(body);
      }
    } catch (err) {
      state.failure = {
        kind: "lost",
        message: err && err.name === "AbortError" ? `no reply within ${TIMEOUT_MS / 1000} s` : "cannot reach the dashboard server",
      };
      if (state.failedSince === null) state.failedSince = Date.now();
    } finally {
      clearTimeout(timer);
      state.inFlight = false;
      showConnection();
      setTimeout(poll, document.hidden ? HIDDEN_POLL_MS : POLL_MS);
    }
  }

  function showConnection() {
    const conn = $("conn");
    const text = $("conn-text");
    const age = state.lastOk === null ? null : (performance.now() - state.lastOk) / 1000;
    const ago = age === null ? "never updated" : `updated ${age < 10 ? age.toFixed(1) : Math.round(age)} s ago`;
    let kind = "live";
    let message = ago;
    if (state.failure && state.failure.redis) {
      kind = "lost";
      message = `Redis unreachable · ${ago}`;
    } else if (state.failure && state.failure.kind === "lost") {
      kind = "lost";
      message = `lost the server (${state.failure.message}) · ${ago}`;
    } else if (state.failure) {
      kind = "error";
      message = `${state.failure.message} · ${ago}`;
    } else if (age === null) {
      kind = "waiting";
      message = "connecting…";
    } else if (age * 1000 > 3 * POLL_MS + 2000) {
      kind = "slow";
      message = `waiting for the server · ${ago}`;
    }
    conn.dataset.state = kind;
    text.textContent = message;
    document.body.classList.toggle("stale", kind === "lost" || kind === "slow");
    const box = $("error");
    box.hidden = !state.failure;
    $("error-text").textContent = state.failure ? banner(state.failure) : "";
    $("error-detail").textContent = state.failure && state.failure.kind === "lost" ? `(${state.failure.message})` : "";
  }

  // The banner over numbers that are no longer live: what is unreachable, since when, and
  // when the numbers shown were read (Redis' clock of the document shown).
  function banner(f) {
    if (f.kind !== "lost") return f.message;
    const from = state.doc ? `numbers below are from ${clock(state.doc.time_ms)}` : "numbers below: never read";
    if (f.redis) return `Redis at ${f.redis} unreachable since ${clock(f.since || state.failedSince)}; ${from}`;
    return `Dashboard server unreachable since ${clock(state.failedSince)}; ${from}, not live`;
  }

  // -- rendering ------------------------------------------------------------------------------
  function render(doc) {
    const multi = doc.jobs.length !== 1;
    app.classList.toggle("nojobcol", !multi);
    renderOverview(doc);
    renderState(doc);
    renderJobs(doc, multi);
    renderWorkers(doc);
    renderEvents(doc);
    renderDatasets(doc, multi);
    renderCharts(doc, multi);
    renderCheckpoints(doc);
    for (const more of state.renderers) more(doc);
  }

  function card(label, value, small, bad, sub, title, id) {
    return el("div", { class: bad ? "card bad" : "card", title, id }, el("div", { class: "label", text: label }),
      el("div", { class: "value" }, value, small ? el("small", { text: ` ${small}` }) : null),
      sub ? el("div", { class: "sub", text: sub }) : null);
  }

  // The badge beside the job's name (the job page, or a page showing one job).
  function renderState(doc) {
    const badge = $("job-state");
    const one = doc.jobs.length === 1 ? doc.jobs[0] : null;
    badge.hidden = !one;
    if (!one) return;
    const fresh = stateBadge(one.state);
    badge.className = fresh.className;
    badge.textContent = fresh.textContent;
    badge.title = fresh.title;
  }

  function renderOverview(doc) {
    const m = doc.metrics.jobs;
    const sum = (f) => m.reduce((a, j) => a + f(j), 0);
    const live = sum((j) => j.workers.idle + j.workers.training + j.workers.checkpointing);
    // Failures of the window from the membership events: one that rejoined since counts.
    const failed = sum((j) => j.recent.failed);
    const partial = m.some((j) => !j.recent.complete);
    const window = m.length ? windowWords(m[0].recent.window_s) : "";
    const stale = sum((j) => j.workers.stale);
    const registered = doc.jobs.reduce((a, j) => a + j.registered_workers, 0);
    const one = doc.jobs.length === 1 ? doc.jobs[0] : null;
    const p99 = m.map((j) => j.barrier.p99_ms).filter((v) => v !== null);
    // The newest checkpoint with a save (of the jobs shown): the same figure as its table row.
    const saved = m.filter((j) => j.checkpoint.last_mb_s !== null)
      .sort((a, b) => (b.last_commit_ms ?? 0) - (a.last_commit_ms ?? 0));
    const last = saved.length ? saved[0].checkpoint : null;
    const lastJob = saved.length && !one ? `${saved[0].job_id} ` : "";
    const cards = [
      one ? card("epoch", one.epoch) : card("jobs", doc.jobs.length),
      one ? card("membership gen.", one.membership_generation) : card("datasets", doc.datasets.length),
      live === 0 && stale > 0
        ? card("workers live", "–", "none heartbeating", true, `${stale} silent · ${registered} registered`,
          "every live worker is silent past its job's heartbeat timeout: no live count", "tile-live")
        : card("workers live", live, "", false,
          `${sum((j) => j.workers.training)} training · ${sum((j) => j.workers.checkpointing)} ckpt · ${sum((j) => j.workers.idle)} idle`,
          null, "tile-live"),
      card(`failed, last ${window}`, `${failed}${partial ? "+" : ""}`, "", failed + stale > 0,
        `${sum((j) => j.recent.left)} left${stale ? ` · ${stale} silent now` : ""}`,
        `fail events of the membership stream in the last ${window}: a worker that rejoined since still counts`, "tile-failed"),
      card("barrier p99", p99.length ? fmt(Math.max(...p99), 1) : "–", "ms", false,
        `p50 ${fmt(Math.max(0, ...m.map((j) => j.barrier.p50_ms ?? 0)), 1)} ms · ${sum((j) => j.barrier.releases)} releases`),
      card("checkpoint", last ? mbps(last.last_mb_s) : "–", "MB/s", false,
        `${last ? `${lastJob}step ${last.last_step} · run ${last.last_run ?? 0} · ` : ""}${sum((j) => j.checkpoint.aborted_steps)} aborted`,
        `MB/s = ${MB_S_DEFINITION}`, "tile-checkpoint"),
      one ? latestCard(one.latest_checkpoint)
        : card("checkpoints", doc.checkpoints.filter((c) => c.state === "committed").length, "committed"),
      card("requests", fmt(doc.metrics.redis.commands_per_s, 0), "/s", false, "Redis commands, whole server"),
    ];
    $("overview").replaceChildren(...cards);
  }

  function renderJobs(doc, multi) {
    $("jobs-section").hidden = !multi;
    if (!multi) return;
    const rows = doc.jobs.map((j) => {
      const m = doc.metrics.jobs.find((x) => x.job_id === j.job_id);
      const silent = j.silent_workers;
      const live = allSilent(j) ? `– (${silent} silent)`
        : `${j.live_workers - silent}${silent ? ` (+${silent} silent)` : ""}`;
      return el("tr", { "data-job": j.job_id },
        el("td", {}, el("a", { href: jobUrl(j.job_id), text: j.job_id })),
        el("td", {}, stateBadge(j.state)),
        el("td", { class: "num", text: j.epoch }), el("td", { class: "num", text: j.membership_generation }),
        el("td", { class: "num live", text: live }),
        el("td", { class: "num", text: `${m.recent.failed}${m.recent.complete ? "" : "+"} / ${m.recent.left}` }),
        el("td", { class: "num", text: j.datasets }),
        el("td", { class: "latest", text: checkpointName(j.latest_checkpoint), title: j.latest_checkpoint ? j.latest_checkpoint.label : null }));
    });
    $("jobs").tBodies[0].replaceChildren(...rows);
    const listing = doc.jobs_listing;
    $("jobs-note").textContent = listing
      ? `${listing.shown} shown of ${listing.known}${listing.complete ? "" : " (still listing)"}` : "";
  }

  function renderWorkers(doc) {
    const rows = doc.workers.map((w) => {
      const shard = w.shards.length
        ? w.shards.map((s) => `${s.dataset} #${s.shard_id} (${fmt(s.expires_in_s, 0)} s)`).join(", ")
        : "";
      const status = el("td", { class: "status" }, el("span", { class: `pill ${w.status}`, text: w.status }));
      if (w.stale) status.append(el("span", { class: "stale-note", text: "no heartbeat", title: "silent longer than the heartbeat timeout; no reaper has declared it failed yet" }));
      return el("tr", { "data-worker": w.worker_id, "data-job": w.job_id, class: w.status === "failed" ? "failed" : null },
        el("td", { class: "jobcol", text: w.job_id }), el("td", { class: "mono", text: w.worker_id }), status,
        el("td", { class: "num", text: w.last_seen_s === null ? "–" : `${fmt(w.last_seen_s, 1)} s` }),
        el("td", { text: w.host ?? "–" }), el("td", { class: "mono", text: w.address ?? "–" }),
        el("td", { class: "num", text: w.gpu_count }), el("td", { class: "mono", text: shard }));
    });
    $("workers").tBodies[0].replaceChildren(...rows);
    const page = doc.page;
    const last = Math.min(page.offset + page.limit, page.total);
    const recent = doc.metrics.jobs.length ? doc.metrics.jobs[0].recent : null;
    $("workers-note").textContent = `${page.total} listed: live, and failed or left in the last ${recent ? windowWords(recent.window_s) : "window"}`;
    $("page-note").textContent = page.total ? `${page.offset + 1}–${last} of ${page.total}` : "none";
    $("prev").disabled = page.offset === 0;
    $("next").disabled = last >= page.total;
    $("prev").parentElement.hidden = page.total <= page.limit && page.offset === 0;
  }

  function renderEvents(doc) {
    const items = doc.events.slice(-60).reverse().map((e) =>
      el("li", { class: e.type },
        el("span", { class: "t", text: clock(e.ms) }),
        `${e.type} ${e.worker_id}${doc.jobs.length > 1 ? ` (${e.job_id})` : ""} · gen ${e.generation}`));
    $("events").replaceChildren(...items);
  }

  function renderDatasets(doc, multi) {
    const box = $("datasets");
    const nodes = state.datasetNodes;
    const keep = new Set();
    box.querySelector(".none")?.remove();
    for (const d of doc.datasets) {
      const key = JSON.stringify([d.job_id, d.name]);
      keep.add(key);
      let node = nodes.get(key);
      if (!node) {
        node = el("div", { class: "dataset" },
          el("div", {}, el("div", { class: "name" }), el("div", { class: "bar" }, el("div", { class: "done" }), el("div", { class: "leased" })),
            el("div", { class: "counts" }), el("div", { class: "meta" })),
          el("div", { class: "chart dist" }));
        nodes.set(key, node);
        box.append(node);
      }
      const p = d.progress;
      node.querySelector(".name").textContent = `${multi ? `${d.job_id} / ` : ""}${d.name} · epoch ${d.epoch}`;
      node.querySelector(".bar .done").style.width = `${(100 * p.done) / Math.max(1, p.total)}%`;
      node.querySelector(".bar .leased").style.width = `${(100 * p.leased) / Math.max(1, p.total)}%`;
      node.querySelector(".counts").textContent =
        `${p.done} done · ${p.leased} leased · ${p.todo} to do of ${p.total} shards · ${p.steals} stolen${p.initialized ? "" : " (epoch not started)"}`;
      node.querySelector(".meta").textContent =
        `${d.total_samples.toLocaleString()} samples, ${d.samples_per_shard} per shard, ${d.shuffle ? `shuffled (seed ${d.seed})` : "not shuffled"}`;
      const chartBox = node.querySelector(".dist");
      const dist = d.distribution;
      if (dist === null) {
        chartBox.replaceChildren(el("div", { class: "empty", text: "more than 20,000 shards: per-worker counts not read" }));
        continue;
      }
      const xs = dist.map((_, i) => i);
      drawChart(`dist:${key}`, chartBox, {
        height: 150,
        scales: { x: { time: false, range: (u, lo, hi) => [-0.5, Math.max(hi, 0) + 0.5] } },
        // a label a tick: ticks as far apart as the longest worker id is wide, so ids never overlap
        axes: [{ space: Math.max(40, 7 * Math.max(0, ...dist.map((r) => r.worker_id.length))),
          values: (u, splits) => splits.map((i) => (Number.isInteger(i) && dist[i] ? dist[i].worker_id : "")) },
        { label: "shards" }],
        series: [{ label: "worker", value: (u, i) => (i === null || !dist[i] ? "–" : dist[i].worker_id) },
          { label: "done", stroke: "#2e7d32", fill: "rgba(46,125,50,.45)", paths: uPlot.paths.bars({ size: [0.7, 40] }), points: { show: false } },
          { label: "leased now", stroke: "#1565c0", width: 0, points: { show: true, size: 7, fill: "#1565c0" } }],
      }, [xs, dist.map((r) => r.done), dist.map((r) => r.leased)]);
    }
    for (const [key, node] of [...nodes]) {
      if (!keep.has(key)) {
        destroyChart(`dist:${key}`);
        node.remove();
        nodes.delete(key);
      }
    }
    if (!doc.datasets.length) box.append(el("div", { class: "meta none", text: "no datasets registered" }));
  }

  function timeChart(name, target, series, tables, yLabel) {
    // tables: one [xs, ys...] per job; uPlot.join aligns them on one x axis.
    const rows = tables.filter((t) => t[0].length);
    if (!rows.length) {
      destroyChart(name);
      target.replaceChildren(el("div", { class: "empty", text: "no data yet" }));
      return;
    }
    const data = rows.length === 1 ? rows[0] : uPlot.join(rows);
    drawChart(name, target, {
      height: 180,
      scales: { x: { time: true } },
      axes: [{}, { label: yLabel, size: 50 }],
      series: [{}, ...series.filter((_, i) => tables[Math.floor(i / (series.length / tables.length))][0].length)],
    }, data);
    // At least a minute of x axis: a single point would otherwise stretch it over years.
    const xs = data[0];
    const lo = xs[0];
    const hi = xs[xs.length - 1];
    if (hi - lo < 60) state.charts[name].plot.setScale("x", { min: hi - 60, max: hi + 2 });
  }

  function renderCharts(doc, multi) {
    const jobs = doc.metrics.jobs;
    const tag = (j, label) => (multi ? `${j.job_id} ${label}` : label);
    const color = (i) => COLORS[i % COLORS.length];
    timeChart("barrier", $("chart-barrier"),
      jobs.flatMap((j, i) => [
        { label: tag(j, "p50"), stroke: color(2 * i + 2), width: 1.5, spanGaps: true },
        { label: tag(j, "p99"), stroke: color(2 * i + 1), width: 2, spanGaps: true }]),
      jobs.map((j) => [j.barrier.series.map((p) => p[0]), j.barrier.series.map((p) => p[1]), j.barrier.series.map((p) => p[2])]),
      "ms");
    timeChart("checkpoint", $("chart-checkpoint"),
      jobs.map((j, i) => ({ label: tag(j, "MB/s"), stroke: color(i), width: 2, spanGaps: true, points: { show: true, size: 5 } })),
      jobs.map((j) => [j.checkpoint.series.map((p) => p[0]), j.checkpoint.series.map((p) => p[1])]),
      "MB/s");
    const r = doc.metrics.redis.series;
    timeChart("requests", $("chart-requests"),
      [{ label: "commands/s", stroke: COLORS[0], width: 2, fill: "rgba(57,73,171,.12)" }],
      [[r.map((p) => p[0]), r.map((p) => p[1])]], "per s");
    // Membership: every job's events summed per time bucket.
    const buckets = new Map();
    for (const j of jobs) {
      for (const [t, joins, leaves, fails] of j.membership.series) {
        const b = buckets.get(t) || [0, 0, 0];
        buckets.set(t, [b[0] + joins, b[1] + leaves, b[2] + fails]);
      }
    }
    const ts = [...buckets.keys()].sort((a, b) => a - b);
    const bars = (i) => uPlot.paths.bars({ size: [0.6, 14], align: i - 2 });
    timeChart("membership", $("chart-membership"), [
      { label: "joins", stroke: "#2e7d32", fill: "rgba(46,125,50,.5)", paths: bars(1), points: { show: false } },
      { label: "leaves", stroke: "#9e9e9e", fill: "rgba(158,158,158,.5)", paths: bars(2), points: { show: false } },
      { label: "failures", stroke: "#c62828", fill: "rgba(198,40,40,.6)", paths: bars(3), points: { show: false } },
    ], [[ts, ...[0, 1, 2].map((k) => ts.map((t) => buckets.get(t)[k]))]], "events");
  }

  // The newest committed checkpoint: the loop's step, with its epoch and run.
  function latestCard(c) {
    if (!c) return card("latest checkpoint", "–", "step");
    const where = [c.epoch === null ? null : `epoch ${c.epoch}`, `run ${c.run}`];
    return card("latest checkpoint", c.step, "step", false, where.filter((w) => w).join(" · "), c.label);
  }

  function renderCheckpoints(doc) {
    const rows = doc.checkpoints.map((c) => {
      const note = c.state === "aborted" ? `by ${c.culprit ?? "?"}: ${c.reason ?? ""}` : (c.state === "committed" ? "every rank acked; metadata.json written" : "");
      return el("tr", { "data-job": c.job_id, "data-step": c.step, "data-epoch": c.epoch ?? "" },
        el("td", { class: "jobcol", text: c.job_id }), el("td", { class: "num run", text: c.run }),
        el("td", { class: "num", text: c.epoch ?? "–" }),
        el("td", { class: "num", text: c.step, title: c.label ?? "" }),
        el("td", {}, el("span", { class: `pill ${c.state}`, text: c.state })),
        el("td", { class: "num", text: bytes(c.bytes) }),
        el("td", { class: "num", text: c.world_size === null ? c.ranks_saved : `${c.ranks_saved}/${c.world_size}` }),
        el("td", { class: "num mb-s", text: mbps(c.mb_s) }), el("td", { class: "num", text: fmt(c.seconds, 2) }),
        el("td", { text: clock(c.at_ms) }), el("td", { class: "note", text: note, title: note }));
    });
    $("checkpoints").tBodies[0].replaceChildren(...rows);
  }

  // -- charts (uPlot) ---------------------------------------------------------------------------
  function widthOf(target) { return Math.max(200, target.clientWidth || 300); }

  function drawChart(name, target, opts, data) {
    const old = state.charts[name];
    const shape = JSON.stringify(opts.series.map((s) => s.label));
    if (old && old.shape === shape && old.target === target) {
      old.plot.setData(data);
      return;
    }
    destroyChart(name);
    target.replaceChildren();
    const plot = new uPlot({ width: widthOf(target), legend: { live: false }, cursor: { show: true }, ...opts }, data, target);
    state.charts[name] = { plot, shape, target };
  }

  function destroyChart(name) {
    const old = state.charts[name];
    if (old) {
      old.plot.destroy();
      delete state.charts[name];
    }
  }

  window.addEventListener("resize", () => {
    for (const c of Object.values(state.charts)) c.plot.setSize({ width: widthOf(c.target), height: c.plot.height });
  });

  // -- paging -----------------------------------------------------------------------------------
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - state.limit); });
  $("next").addEventListener("click", () => { state.offset += state.limit; });

  setInterval(showConnection, 250);
  poll();
})();
