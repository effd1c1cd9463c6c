// Runs page: one page of the runs directory's runs, updated live over SSE. The search, the state
// filter and the sort run on the server over every run (/api/runs?q=&state=&sort=&order=&offset=&limit=):
// a thousand rows laid out and painted held the page for seconds on a loaded machine.
"use strict";
(function () {
  const ST = window.steadytune, fmt = ST.fmt, el = ST.el;
  ST.theme.init();
  const body = document.querySelector("#runs tbody");
  const $ = (id) => document.getElementById(id);
  const PAGE = 100;
  const query = { q: "", state: "", sort: "run_id", order: "asc", offset: 0, limit: PAGE };

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

  function params() {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) if (v !== "") p.set(k, String(v));
    return p.toString();
  }

  // The same runs in the same order (the stream's first page, after /api/runs): only the rows
  // that differ are made again.
  function render(page) {
    if (!page.runs.length && page.offset > 0 && page.matched > 0) {
      // Runs went away under a later page (or fewer match now): show the last page there is.
      query.offset = Math.floor((page.matched - 1) / PAGE) * PAGE;
      return load();
    }
    const runs = page.runs, old = ST.runs || [];
    if (old.length === runs.length && runs.every((r, i) => r.run_id === old[i].run_id)) {
      runs.forEach((r, i) => { if (JSON.stringify(r) !== JSON.stringify(old[i])) body.children[i].replaceWith(row(r)); });
    } else {
      body.replaceChildren(...runs.map(row));
    }
    ST.runs = runs;
    ST.runsPage = page;
    counts(page);
    document.dispatchEvent(new Event("steadytune:runs"));  // the goodput panel waits for the table
  }

  function counts(page) {
    $("empty").classList.toggle("hidden", page.total > 0);
    $("no-match").classList.toggle("hidden", page.total === 0 || page.matched > 0);
    const first = page.matched ? page.offset + 1 : 0, last = page.offset + page.runs.length;
    $("runs-count").textContent = page.matched === page.total
      ? `runs ${fmt.int(first)}–${fmt.int(last)} of ${fmt.int(page.total)}`
      : `runs ${fmt.int(first)}–${fmt.int(last)} of ${fmt.int(page.matched)} matching (${fmt.int(page.total)} in all)`;
    $("runs-prev").disabled = page.offset === 0;
    $("runs-next").disabled = last >= page.matched;
    const select = $("runs-state"), states = Object.keys(page.states).sort();
    if (query.state && !states.includes(query.state)) states.push(query.state);
    const shown = [...select.options].slice(1).map((o) => o.value);
    if (shown.join("\n") !== states.join("\n")) {
      select.replaceChildren(el("option", { value: "", text: "every state" }),
        ...states.map((s) => el("option", { value: s, text: s })));
      select.value = query.state;
    }
    for (const o of [...select.options].slice(1)) o.textContent = `${o.value} (${fmt.int(page.states[o.value] || 0)})`;
    for (const th of document.querySelectorAll("#runs th[data-sort]")) {
      th.setAttribute("aria-sort", th.dataset.sort === query.sort ? (query.order === "asc" ? "ascending" : "descending") : "none");
    }
    pending(page);
  }

  // A dashboard new to a runs folder reads its runs in the background, newest first: until a run
  // is read its row is what its status.json says (`indexing`), and this line says how many wait.
  function pending(page) {
    const n = page.pending, line = $("pending");
    line.textContent = n ? `${fmt.int(n)} of ${fmt.int(page.total)} runs not read yet (newest first): ` +
      "their anomalies and latest values fill in as they are read." : "";
    line.classList.toggle("hidden", !n);
  }

  // Only the rows that changed: the page's rows are not redrawn every second for the live one.
  function changed(rows) {
    const byId = new Map(rows.map((r) => [r.run_id, r]));
    ST.runs = (ST.runs || []).map((r) => byId.get(r.run_id) || r);
    for (const tr of body.querySelectorAll("tr[data-run]")) {
      const r = byId.get(tr.dataset.run);
      if (r) tr.replaceWith(row(r));
    }
  }

  // A new query: the page asked for, then the live stream opened again for it. Not both at once:
  // each reads every run's row, and the two held each other up in the server (its first message
  // is the same page again; only the rows that moved since are made again).
  const dot = $("live");
  let stream = null, asked = 0;
  function load() {
    const mine = ++asked;
    if (stream) stream.close();
    stream = null;
    const live = () => {
      if (mine !== asked) return;
      stream = ST.stream(() => `/api/stream?${params()}`, { runs: render, runs_changed: changed },
        (on) => dot.classList.toggle("on", on));
    };
    ST.getJSON(`/api/runs?${params()}`).then((page) => { if (mine === asked) render(page); }).catch(() => {}).finally(live);
  }

  let typing = null;
  $("runs-search").addEventListener("input", (e) => {
    clearTimeout(typing);
    typing = setTimeout(() => { query.q = e.target.value.trim(); query.offset = 0; load(); }, 250);
  });
  $("runs-bar").addEventListener("submit", (e) => e.preventDefault());
  $("runs-state").addEventListener("change", (e) => { query.state = e.target.value; query.offset = 0; load(); });
  $("runs-prev").addEventListener("click", () => { query.offset = Math.max(0, query.offset - PAGE); load(); });
  $("runs-next").addEventListener("click", () => { query.offset += PAGE; load(); });
  $("runs-clear").addEventListener("click", () => {
    Object.assign(query, { q: "", state: "", offset: 0 });
    $("runs-search").value = "";
    load();
  });
  for (const th of document.querySelectorAll("#runs th[data-sort]")) {
    th.addEventListener("click", () => {
      const key = th.dataset.sort;
      // Numbers and times read largest / newest first; names and states from A.
      const first = key === "run_id" || key === "state" ? "asc" : "desc";
      query.order = query.sort === key ? (query.order === "asc" ? "desc" : "asc") : first;
      query.sort = key;
      query.offset = 0;
      load();
    });
  }

  load();
  // The server page exists when `steadytune server --dashboard` serves this dashboard.
  ST.getJSON("/api/server").then(() => $("server-link").classList.remove("hidden")).catch(() => {});
})();
