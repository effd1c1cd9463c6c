// Goodput: each run's wall time as one stacked bar, kept training and the time lost by cause
// (/api/goodput); on the server page, each GPU's hours held by jobs against those that became training.
"use strict";
(function () {
  const ST = window.steadytune, fmt = ST.fmt, el = ST.el;
  const pct = (x) => (x === null || x === undefined ? "–" : `${(100 * x).toFixed(1)} %`);
  const hours = (s) => (s >= 3600 ? `${(s / 3600).toFixed(2)} h` : fmt.dur(s));

  function bar(run, data) {
    const shown = data.parts.filter((p) => run.seconds[p] > 0);
    return el("div", { class: "gpbar" }, ...shown.map((p) => {
      const seg = el("div", {
        class: `seg gp-${p}`, "data-part": p, "data-seconds": String(run.seconds[p]),
        title: `${data.labels[p]}: ${pct(run.shares[p])} (${fmt.dur(run.seconds[p])})`,
      });
      seg.style.width = `${(100 * run.shares[p]).toFixed(3)}%`;
      return seg;
    }));
  }

  // The causes a person reads first: the largest, evaluation apart (useful, not training).
  function lost(run, data) {
    const named = data.lost.filter((p) => run.shares[p] >= 0.0005 || (p === "unattributed" && run.seconds[p] > 0))
      .sort((a, b) => run.seconds[b] - run.seconds[a]).slice(0, 4);
    const text = named.map((p) => `${data.labels[p]} ${pct(run.shares[p])}`).join(", ");
    return `lost: ${text || "nothing"}` + (run.seconds.eval > 0 ? `; ${data.labels.eval} ${pct(run.shares.eval)}` : "");
  }

  function runRow(run, data) {
    return el("div", { class: "gp-run", "data-run": run.run, "data-goodput": String(run.goodput) },
      el("a", { class: "mono", href: `/run/${encodeURIComponent(run.run)}`, text: run.run }),
      el("span", { class: "mono gp-value", text: pct(run.goodput) }),
      bar(run, data),
      el("span", { class: "muted gp-lost", text: `${fmt.dur(run.wall_s)} · ${lost(run, data)}` }));
  }

  function legend(data) {
    return data.parts.map((p) => el("span", {}, el("i", { class: `swatch gp-${p}` }), data.labels[p]));
  }

  function gpuRow(g) {
    const share = g.allocated_s > 0 ? g.productive_s / g.allocated_s : null;
    const fill = el("div", { class: "seg gp-productive" });
    fill.style.width = `${(100 * (share || 0)).toFixed(3)}%`;
    return el("div", { class: "gp-run", "data-gpu-hours": String(g.gpu), "data-allocated": String(g.allocated_s), "data-productive": String(g.productive_s) },
      el("span", { class: "mono", text: `GPU ${g.gpu}` }),
      el("span", { class: "mono gp-value", text: pct(share) }),
      el("div", { class: "gpbar gp-held" }, fill),
      el("span", { class: "muted gp-lost",
        text: `allocated ${hours(g.allocated_s)} · productive ${hours(g.productive_s)}` + (g.jobs.length ? ` · jobs ${g.jobs.join(", ")}` : "") }));
  }

  // The newest SHOWN runs until "show all" is clicked: a thousand bars are not read, and drawing
  // them held the runs page for seconds. Redraw only the bars whose account moved.
  const SHOWN = 100;
  let drawn = [], all = false;  // drawn: [run, its account as text] of each bar shown
  const more = document.getElementById("goodput-more");
  function drawRuns(data) {
    let list = data.runs.slice().reverse();
    const waiting = document.getElementById("goodput-pending");
    if (waiting) {
      waiting.textContent = data.pending ? `${fmt.int(data.pending)} runs not read yet: their accounts come as they are read.` : "";
      waiting.classList.toggle("hidden", !data.pending);
    }
    if (more) {
      more.textContent = `show all ${fmt.int(list.length)} runs`;
      more.classList.toggle("hidden", all || list.length <= SHOWN);
    }
    if (!all) list = list.slice(0, SHOWN);
    const texts = list.map((r) => JSON.stringify(r));
    if (list.length === drawn.length && list.every((r, i) => r.run === drawn[i][0])) {
      texts.forEach((t, i) => { if (t !== drawn[i][1]) runs.children[i].replaceWith(runRow(list[i], data)); });
    } else {
      document.getElementById("goodput-legend").replaceChildren(...legend(data));
      runs.replaceChildren(...list.map((r) => runRow(r, data)));
    }
    drawn = list.map((r, i) => [r.run, texts[i]]);
  }

  const runs = document.getElementById("goodput-runs"), gpus = document.getElementById("goodput-gpus");
  if (more) more.addEventListener("click", () => { all = true; refresh(); });
  async function refresh() {
    try {
      const data = await ST.getJSON("/api/goodput");
      if (runs) drawRuns(data);
      if (gpus && data.gpus) gpus.replaceChildren(...data.gpus.map(gpuRow));
    } catch (err) { /* the next refresh tries again */ }
  }
  // On the runs page the table comes first: a thousand runs' accounts, read once by a dashboard
  // that never saw them, would hold the server while the table waits (10 s at most).
  const table = document.getElementById("runs");
  const first = table ? new Promise((go) => {
    document.addEventListener("steadytune:runs", go, { once: true });
    setTimeout(go, 10000);
  }) : Promise.resolve();
  first.then(() => { refresh(); setInterval(refresh, 5000); });
})();
