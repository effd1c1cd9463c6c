// Runs page: every run of the runs directory, updated live over SSE.
"use strict";
(function () {
  const ST = window.steadytune, fmt = ST.fmt, el = ST.el;
  ST.theme.init();
  const body = document.querySelector("#runs tbody");

  function row(r) {
    const step = r.max_steps ? `${fmt.int(r.step)} / ${fmt.int(r.max_steps)}` : fmt.int(r.step);
    const last = r.last_anomaly;
    const anomalies = el("td", {}, r.anomalies === null ? el("span", { class: "muted", text: "…" }) :
      r.anomalies ? el("span", { class: last ? `sev-${last.severity}` : "", text: String(r.anomalies) }) : "0",
      last ? el("span", { class: "muted", text: `  ${last.name}` }) : null);
    return el("tr", { "data-run": r.run_id },
      el("td", {}, el("a", { href: `/run/${encodeURIComponent(r.run_id)}`, text: r.run_id })),
      el("td", {}, ST.stateBadge(r.state)),
      el("td", { class: "num", text: step }),
      el("td", { class: "num", text: r.loss_nonfinite ? "NaN" : fmt.num(r.loss) }),
      el("td", { class: "num", text: fmt.int(r.tokens_per_s) }),
      el("td", { class: "num", text: fmt.dur(r.eta_s) }),
      anomalies,
      el("td", { class: "num", text: String(r.restarts ?? 0) }),
      el("td", { class: "mono", text: r.last_checkpoint || "–" }),
      el("td", { class: "muted", text: fmt.ago(r.updated_ts) }));
  }

  // The same runs in the same order (the stream's first list, after /api/runs): only the rows
  // that differ are made again; a thousand rows made twice held the page a second under load.
  function render(runs) {
    const old = ST.runs || [];
    if (old.length === runs.length && runs.every((r, i) => r.run_id === old[i].run_id)) {
      runs.forEach((r, i) => { if (JSON.stringify(r) !== JSON.stringify(old[i])) body.children[i].replaceWith(row(r)); });
    } else {
      body.replaceChildren(...runs.map(row));
    }
    document.getElementById("empty").classList.toggle("hidden", runs.length > 0);
    ST.runs = runs;
    pending();
    document.dispatchEvent(new Event("steadytune:runs"));  // the goodput panel waits for the table
  }

  // A dashboard new to a runs folder reads its runs in the background, newest first: until a run
  // is read its row is what its status.json says (`indexing`), and this line says how many wait.
  function pending() {
    const n = ST.runs.filter((r) => r.indexing).length, line = document.getElementById("pending");
    line.textContent = n ? `${fmt.int(n)} of ${fmt.int(ST.runs.length)} runs not read yet (newest first): ` +
      "their anomalies and latest values fill in as they are read." : "";
    line.classList.toggle("hidden", !n);
  }

  // Only the rows that changed: a thousand runs are not redrawn every second for the live one.
  function changed(rows) {
    const byId = new Map(rows.map((r) => [r.run_id, r]));
    ST.runs = (ST.runs || []).map((r) => byId.get(r.run_id) || r);
    pending();
    for (const tr of body.querySelectorAll("tr[data-run]")) {
      const r = byId.get(tr.dataset.run);
      if (r) tr.replaceWith(row(r));
    }
  }

  ST.getJSON("/api/runs").then(render).catch(() => {});
  // The server page exists when `steadytune server --dashboard` serves this dashboard.
  ST.getJSON("/api/server").then(() => document.getElementById("server-link").classList.remove("hidden")).catch(() => {});
  const dot = document.getElementById("live");
  ST.stream("/api/stream", { runs: render, runs_changed: changed }, (on) => dot.classList.toggle("on", on));
})();
