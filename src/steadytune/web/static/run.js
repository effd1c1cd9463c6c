// Run page: live charts, events timeline, checkpoints, plan revisions, operator controls.
"use strict";
(function () {
  const ST = window.steadytune, fmt = ST.fmt, el = ST.el;
  ST.theme.init();
  const runId = decodeURIComponent(location.pathname.split("/").filter(Boolean)[1] || "");
  const base = `/api/runs/${encodeURIComponent(runId)}`;
  document.getElementById("run-id").textContent = runId;
  document.title = `steadytune — ${runId}`;

  const STEP_METRICS = ["loss", "eval_loss", "grad_norm", "lr", "tokens_per_s", "step_time_s",
    "mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes"];
  const pct = (v) => fmt.num(v, 3) + "%";

  // ---- charts -----------------------------------------------------------------------
  const charts = {};
  const grid = document.getElementById("charts");
  function card(id, title, opts) {
    const box = el("div", { class: "chart", id: `chart-${id}` });
    const note = el("span", { class: "note", id: `note-${id}` });
    const head = el("h3", {}, title, note);
    const wrap = el("div", { class: "card", id: `card-${id}` }, head, box);
    grid.append(wrap);
    const c = new ST.Chart(box, Object.assign({ onFull: scheduleRefetch }, opts));
    c.card = wrap;
    c.title = head.firstChild;
    charts[id] = c;
    return c;
  }
  const zoom = (range) => { state.zoom = range; loadSeries(); };
  card("loss", "Loss", { series: [{ key: "loss", label: "train loss", color: "--c1" },
    { key: "eval_loss", label: "eval loss", color: "--c2", dots: true, band: false }], onZoom: zoom });
  card("grad", "Gradient norm", { series: [{ key: "grad_norm", label: "grad norm", color: "--c5" }], onZoom: zoom });
  // Gradient flow per layer: full width, right under the run-wide gradient norm it breaks down.
  const heatBox = el("div", { class: "heatmap", id: "heatmap" });
  const heatLegend = el("div", { class: "legend", id: "heatmap-legend" });
  grid.append(el("div", { class: "card wide" },
    el("h3", {}, "Gradient flow per layer (log10 grad norm)", el("span", { class: "note", id: "note-gradflow" })),
    heatBox, heatLegend));
  const heat = new ST.HeatMap(heatBox, heatLegend);
  // What the gradient values look like inside each layer, at one recording of the heat map.
  const histBox = el("div", { class: "heatmap", id: "gradhist" });
  grid.append(el("div", { class: "card wide" },
    el("h3", {}, "Gradient values per layer (share of |grad| entries per log10 bin)", el("span", { class: "note", id: "note-gradhist" })),
    histBox));
  const hist = new ST.GradHist(histBox);
  card("lr", "Learning rate", { series: [{ key: "lr", label: "LR", color: "--c4", band: false }], onZoom: zoom });
  card("tps", "Throughput (tokens/s)", { series: [{ key: "tokens_per_s", label: "tokens/s", color: "--c3" }], onZoom: zoom, yMin: 0 });
  card("mem", "Device memory", { series: [
    { key: "mem_allocated_bytes", label: "allocated", color: "--c1" },
    { key: "mem_reserved_bytes", label: "reserved", color: "--c5" },
    { key: "mem_peak_bytes", label: "peak", color: "--c4" }], yFormat: fmt.bytes, onZoom: zoom, yMin: 0 });
  card("rss", "Process memory (RSS; no CUDA on this host)", { xKind: "time", yFormat: fmt.bytes, yMin: 0,
    series: [{ key: "rss", label: "worker RSS", color: "--c1" }] });
  charts.rss.card.classList.add("hidden");
  card("gpu", "GPU utilization & temperature", { xKind: "time", series: [
    { key: "util", label: "util %", color: "--c3" }, { key: "temp", label: "temp °C", color: "--c2" }], yMin: 0 });
  card("power", "GPU power (W)", { xKind: "time", series: [{ key: "power", label: "W", color: "--c4" }], yMin: 0 });
  card("host", "Host CPU & RAM (%)", { xKind: "time", yFormat: pct, series: [
    { key: "cpu", label: "CPU %", color: "--c1" }, { key: "ram", label: "RAM %", color: "--c5" }], yMin: 0, yMax: 100 });
  card("disk", "Disk free", { xKind: "time", yFormat: fmt.bytes, series: [{ key: "disk", label: "free", color: "--c3" }], yMin: 0 });

  const state = { zoom: null, maxStep: -1, attempt: 0, lastSysTs: 0, lastSeq: -1, version: 0, es: null,
    refetch: null, capacity: null, events: [] };
  ST.charts = charts;
  ST.state = state;
  ST.heatmap = heat;
  ST.gradhist = hist;

  // By column (web/api.py columns()): x is each bucket's last x; a metric's max and mean are left
  // out where they equal its min, and the metric is null where it has no value.
  function columns(series, metric) {
    const c = series.columns[metric];
    const x = series.x.slice(); // each chart series grows its own x as live points arrive
    if (!c) { const none = x.map(() => null); return { x, y: none, lo: none, hi: none }; }
    return { x, y: c.mean || c.min, lo: c.min, hi: c.max || c.min };
  }
  function setCols(chart, key, c, f) {
    const s = chart.get(key);
    if (!f) { s.set(c.x, c.y, c.lo, c.hi); return; }
    s.set(c.x, c.y.map(f), c.lo.map(f), c.hi.map(f));
  }
  const scale = (m) => (v) => (v === null || v === undefined ? null : v * m);

  async function loadSeries() {
    const q = state.zoom ? `&lo=${Math.floor(state.zoom[0])}&hi=${Math.ceil(state.zoom[1])}` : "";
    const w = Math.max(400, Math.min(3000, Math.round(grid.clientWidth / 2) * 2));
    // One GPU is drawn: the others' charts are not sent (data.gpu_indices lists them all).
    const data = await ST.getJSON(`${base}/series?points=${w}&gpus=0${q}`);
    const st = data.steps;
    setCols(charts.loss, "loss", columns(st, "loss"));
    setCols(charts.loss, "eval_loss", columns(st, "eval_loss"));
    setCols(charts.grad, "grad_norm", columns(st, "grad_norm"));
    setCols(charts.lr, "lr", columns(st, "lr"));
    setCols(charts.tps, "tokens_per_s", columns(st, "tokens_per_s"));
    for (const m of ["mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes"]) setCols(charts.mem, m, columns(st, m));
    for (const c of Object.values(charts)) c.view = c.opts.xKind === "step" && state.zoom ? state.zoom : null;
    const sys = data.system;
    setCols(charts.host, "cpu", columns(sys, "cpu_ratio"), scale(100));
    const used = columns(sys, "ram_used_bytes"), total = columns(sys, "ram_total_bytes");
    charts.host.get("ram").set(used.x, used.y.map((v, i) => (v === null || !total.y[i] ? null : (100 * v) / total.y[i])));
    setCols(charts.disk, "disk", columns(sys, "disk_free_bytes"));
    setCols(charts.rss, "rss", columns(sys, "worker_rss_bytes"));
    if (sys.x.length) setHardware(data.gpu_indices.length > 0);
    if (st.x.length) setCuda(columns(st, "mem_allocated_bytes").y.some((v) => v !== null && v !== undefined));
    const g0 = data.gpus["0"];
    if (g0) {
      setCols(charts.gpu, "util", columns(g0, "util_ratio"), scale(100));
      setCols(charts.gpu, "temp", columns(g0, "temperature_c"));
      setCols(charts.power, "power", columns(g0, "power_w"));
      const cap = columns(g0, "mem_total_bytes").y.filter((v) => v).pop();
      if (cap) setCapacity(cap);
    }
    state.maxStep = Math.max(state.maxStep, st.hi ?? -1);
    state.lastSysTs = Math.max(state.lastSysTs, sys.hi ?? 0);
    setMarkers(data.anomalies);
    Object.values(charts).forEach((c) => c.draw());
    document.getElementById("note-loss").textContent = st.total > st.x.length ? `${fmt.int(st.total)} steps, ${st.x.length} buckets` : "";
    // After the series, so the stream that starts from data.version misses no recording.
    await loadHeatmap();
    return data.version;
  }

  // ---- gradient flow --------------------------------------------------------------------
  const heatPoints = () => Math.max(50, Math.min(2000, Math.floor((heatBox.clientWidth - 120) / 3)));
  async function loadHeatmap() {
    const q = state.zoom ? `&lo=${Math.floor(state.zoom[0])}&hi=${Math.ceil(state.zoom[1])}` : "";
    heat.set(await ST.getJSON(`${base}/gradflow?points=${heatPoints()}${q}`));
    noteHeatmap();
    state.histShown = null; // read again: a restart may have rewritten the recording at that step
    await loadHist();
  }
  // The histogram follows the newest recording until a heat-map column is clicked.
  async function loadHist() {
    const step = state.histStep ?? heat.lastStep;
    if (step < 0 || step === state.histShown) return;
    state.histShown = step;
    hist.set(await ST.getJSON(`${base}/gradhist?step=${step}`));
    const picked = state.histStep !== null && state.histStep !== undefined;
    document.getElementById("note-gradhist").textContent = hist.step === null ? "" :
      `step ${fmt.int(hist.step)} · ${picked ? "picked on the heat map (double-click it to follow the newest)" : "newest recording (click a heat-map column for another)"}`;
  }
  heat.onPick = (step) => { state.histStep = step; state.histShown = null; loadHist(); };
  function noteHeatmap() {
    const f = heat.flagged(), bits = [];
    if (heat.total) bits.push(`${fmt.int(heat.total)} recordings${heat.bucket > 1 ? ` in ${heat.columns.length} columns` : ""}`);
    if (f.exploding) bits.push(`${f.exploding} exploding`);
    if (f.vanishing + f.dead) bits.push(`${f.vanishing + f.dead} dead/vanishing`);
    document.getElementById("note-gradflow").textContent = bits.join(" · ");
  }
  function onGradflow(data) {
    if (state.zoom) data.columns = data.columns.filter((c) => c.first <= state.zoom[1]);
    if (!data.columns.length) return;
    // Appended when it fits; otherwise (merged columns, new layers, a restart) the whole map is read again.
    if (!heat.append(data) || heat.columns.length > 2 * heatPoints()) scheduleHeatmapRefetch();
    noteHeatmap();
    loadHist();
  }
  function scheduleHeatmapRefetch() {
    if (state.heatRefetch) return;
    state.heatRefetch = setTimeout(async () => { state.heatRefetch = null; await loadHeatmap(); }, 1000);
  }

  // A host without a GPU never sends GPU samples: say so instead of waiting for them.
  const NO_GPU = "no GPU on this host";
  function setHardware(hasGpu) {
    if (state.hasGpu === hasGpu) return;
    state.hasGpu = hasGpu;
    for (const id of ["gpu", "power"]) charts[id].setEmptyText(hasGpu ? "waiting for data…" : NO_GPU);
    showMemory();
  }
  // Without CUDA the steps carry no device memory: the memory card shows the worker's RSS instead.
  function setCuda(hasCuda) {
    if (state.hasCuda === hasCuda) return;
    state.hasCuda = hasCuda;
    showMemory();
  }
  function showMemory() {
    const rss = state.hasCuda === false;
    charts.mem.card.classList.toggle("hidden", rss);
    charts.rss.card.classList.toggle("hidden", !rss);
    // A GPU host whose steps carry no device memory (another tool's log, a CPU run) is not "no CUDA".
    charts.rss.title.textContent = state.hasGpu === false ? "Process memory (RSS; no CUDA on this host)"
      : "Process memory (RSS; the steps report no device memory)";
  }

  function setCapacity(bytes) {
    state.capacity = bytes;
    charts.mem.setHLine(bytes, `device capacity ${fmt.bytes(bytes)}`);
    updateHeadroom();
  }
  function updateHeadroom() {
    const s = charts.mem.get("mem_reserved_bytes");
    const last = s.y.filter((v) => v !== null).pop();
    if (state.capacity && last) document.getElementById("note-mem").textContent = `headroom ${fmt.bytes(state.capacity - last)}`;
  }
  function setMarkers(anoms) {
    state.anomalies = anoms;
    charts.loss.setMarkers(anoms.map((a) => ({ x: a.step, label: `${a.name} @ ${a.step}`, color: a.severity === "critical" ? "--crit" : "--warn" })));
  }

  // ---- header, side panels ------------------------------------------------------------
  function renderStatus(s) {
    const sum = s.summary || s;
    document.getElementById("state").replaceChildren(ST.stateBadge(sum.state));
    setStep(Math.max(sum.step ?? -1, state.maxStep));
    document.getElementById("max-steps").textContent = sum.max_steps ? ` / ${fmt.int(sum.max_steps)}` : "";
    const step = Math.max(sum.step ?? 0, state.maxStep);
    if (sum.max_steps) document.getElementById("progress").style.width = `${Math.min(100, (100 * step) / sum.max_steps)}%`;
    document.getElementById("loss").textContent = sum.loss_nonfinite ? "NaN" : fmt.num(sum.loss);
    document.getElementById("tps").textContent = fmt.int(sum.tokens_per_s);
    document.getElementById("eta").textContent = fmt.dur(sum.eta_s);
    document.getElementById("attempt").textContent = sum.attempt ?? "–";
    document.getElementById("restarts").textContent = sum.restarts ?? 0;
    document.getElementById("ckpt").textContent = sum.last_checkpoint || "–";
    state.maxSteps = sum.max_steps;
  }
  function setStep(step) {
    if (step === null || step < 0) return;
    const e = document.getElementById("step");
    e.textContent = fmt.int(step);
    e.dataset.step = String(step);
    if (state.maxSteps) document.getElementById("progress").style.width = `${Math.min(100, (100 * step) / state.maxSteps)}%`;
  }

  function eventItem(e) {
    const d = e.data || {};
    const sev = e.kind === "anomaly" || e.kind === "alert" ? `sev-${e.severity}` : "";
    const extra = [];
    if (d.cause) extra.push(el("div", { class: "fix", text: `cause: ${d.cause}` }));
    if (d.suggestion || d.fix) extra.push(el("div", { class: "fix", text: `fix: ${d.suggestion || d.fix}` }));
    if (e.kind === "alert") {
      const und = Object.keys(d.undelivered || {});
      extra.push(el("div", { class: "fix", text: `${d.status || ""}${(d.delivered || []).length ? " → " + d.delivered.join(", ") : ""}${und.length ? " · undelivered: " + und.join(", ") : ""}` }));
    }
    if (e.kind === "control") extra.push(el("div", { class: "fix", text: `by ${d.issuer || e.user || "?"}` }));
    return el("li", {},
      el("div", { class: "when", text: `${fmt.time(e.ts)}${e.step !== undefined && e.step !== null ? " · step " + fmt.int(e.step) : ""} · ${e.kind}` }),
      el("div", { class: `what ${sev}`, text: e.name }),
      e.message ? el("div", { text: e.message }) : null, ...extra);
  }
  function addEvents(events) {
    const list = document.getElementById("events");
    for (const e of events) {
      // Every event has its seq (the server sees to it): each is shown once, however often it is sent.
      if (typeof e.seq === "number" && e.seq <= state.lastSeq) continue;
      state.lastSeq = Math.max(state.lastSeq, e.seq ?? state.lastSeq);
      state.events.push(e);
      list.prepend(eventItem(e));
      if (e.kind === "anomaly" && e.step !== undefined && e.step !== null) {
        state.anomalies = (state.anomalies || []).concat([{ step: e.step, name: e.name, severity: e.severity }]);
        setMarkers(state.anomalies);
      }
    }
    while (list.children.length > 300) list.lastChild.remove();
    document.getElementById("events-count").textContent = `${state.events.length}`;
  }
  function renderSide(side) {
    const ck = side.checkpoints || { items: [] };
    const t = document.getElementById("checkpoints");
    t.replaceChildren(el("tr", {}, el("th", { text: "name" }), el("th", { text: "step" }), el("th", { text: "state" })));
    for (const c of [...ck.items].reverse()) {
      const tags = el("td", {}, el("span", { class: `tag ${c.verified ? "good" : "bad"}`, text: c.verified ? "verified" : "unverified", title: c.problem || "" }));
      if (c.last_good) tags.append(el("span", { class: "tag good", text: "LAST_GOOD" }));
      if (c.latest) tags.append(el("span", { class: "tag", text: "LATEST" }));
      t.append(el("tr", {}, el("td", { class: "mono", text: c.name }), el("td", { class: "mono", text: fmt.int(c.step) }), tags));
    }
    if (!ck.items.length) t.append(el("tr", {}, el("td", { class: "muted", text: "none yet" })));
    const p = document.getElementById("plans");
    p.replaceChildren(el("tr", {}, el("th", { text: "rev" }), el("th", { text: "reason" }), el("th", { text: "plan" })));
    for (const r of [...(side.plans || [])].reverse()) {
      const bits = [];
      if (r.per_device_train_batch_size) bits.push(`mb ${r.per_device_train_batch_size}`);
      if (r.gradient_accumulation_steps) bits.push(`ga ${r.gradient_accumulation_steps}`);
      if (r.micro_batch_split > 1) bits.push(`split ×${r.micro_batch_split}`);
      if (r.lr_scale !== undefined && r.lr_scale !== 1) bits.push(`lr ×${r.lr_scale}`);
      if (r.skip_summary) bits.push(`skip ${r.skip_summary}`);
      if (r.resume_checkpoint) bits.push(`from ${r.resume_checkpoint}`);
      p.append(el("tr", {}, el("td", { class: "mono", text: String(r.revision) }), el("td", { text: r.reason }),
        el("td", { class: "mono", text: bits.join(" · ") || "–" })));
    }
  }

  // ---- live updates -------------------------------------------------------------------
  function onSteps(rows) {
    let newest = null;
    for (const r of rows) {
      if (r.step <= state.maxStep) {
        // Same step again: a later attempt rewrote history after a restart; redraw from the index.
        if (r.attempt > state.attempt) scheduleRefetch();
        // Same attempt: the eval loss, logged once evaluation of that step finished.
        else if (r.eval_loss !== null && r.eval_loss !== undefined && !charts.loss.setAt("eval_loss", r.step, r.eval_loss)) scheduleRefetch();
        state.attempt = Math.max(state.attempt, r.attempt);
        continue;
      }
      state.attempt = Math.max(state.attempt, r.attempt);
      state.maxStep = r.step;
      if (state.zoom && r.step > state.zoom[1]) continue;
      charts.loss.push("loss", r.step, r.loss);
      charts.loss.push("eval_loss", r.step, r.eval_loss);
      charts.grad.push("grad_norm", r.step, r.grad_norm);
      charts.lr.push("lr", r.step, r.lr);
      charts.tps.push("tokens_per_s", r.step, r.tokens_per_s);
      for (const m of ["mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes"]) charts.mem.push(m, r.step, r[m]);
      if (r.mem_allocated_bytes !== null && r.mem_allocated_bytes !== undefined) setCuda(true);
      else if (state.hasCuda === undefined) setCuda(false);
      newest = r;
    }
    if (!newest) return;
    setStep(newest.step);
    if (newest.loss !== null && newest.loss !== undefined) document.getElementById("loss").textContent = fmt.num(newest.loss);
    updateHeadroom();
    // For the latency benchmark: when did the newest record reach the screen?
    requestAnimationFrame(() => { ST.lastRender = { step: newest.step, recordTs: newest.ts, shownAt: Date.now() / 1000 }; });
  }
  function onSystem(rows) {
    for (const r of rows) {
      if (r.ts <= state.lastSysTs) continue;
      state.lastSysTs = r.ts;
      charts.host.push("cpu", r.ts, r.cpu_ratio === null ? null : 100 * r.cpu_ratio);
      charts.host.push("ram", r.ts, r.ram_used_bytes && r.ram_total_bytes ? (100 * r.ram_used_bytes) / r.ram_total_bytes : null);
      charts.disk.push("disk", r.ts, r.disk_free_bytes);
      charts.rss.push("rss", r.ts, r.worker_rss_bytes);
      setHardware((r.gpus || []).length > 0);
      const g = (r.gpus || []).find((x) => x.idx === 0);
      if (g) {
        charts.gpu.push("util", r.ts, g.util_ratio === null ? null : 100 * g.util_ratio);
        charts.gpu.push("temp", r.ts, g.temperature_c);
        charts.power.push("power", r.ts, g.power_w);
        if (g.mem_total_bytes && g.mem_total_bytes !== state.capacity) setCapacity(g.mem_total_bytes);
      }
    }
  }
  function scheduleRefetch() {
    if (state.refetch) return;
    state.refetch = setTimeout(async () => { state.refetch = null; state.maxStep = -1; await loadSeries(); }, 500);
  }
  function connect() {
    const dot = document.getElementById("live");
    // A reconnection asks for what came after what this page already has.
    state.es = ST.stream(() => `${base}/stream?since=${state.version}&after=${state.lastSeq}`, {
      status: renderStatus, steps: onSteps, gradflow: onGradflow, system: onSystem, events: addEvents, side: renderSide,
    }, (on) => dot.classList.toggle("on", on));
  }

  // ---- operator controls ----------------------------------------------------------------
  async function initControls() {
    const auth = await ST.getJSON("/api/auth");
    const box = document.getElementById("controls");
    if (!auth.controls) return; // no token configured: read-only dashboard
    box.classList.remove("hidden");
    document.getElementById("unlock").classList.toggle("hidden", auth.authorized);
    document.getElementById("actions").classList.toggle("hidden", !auth.authorized);
  }
  document.getElementById("unlock-btn").addEventListener("click", () => {
    ST.token.set(document.getElementById("token").value.trim());
    initControls();
  });
  const dlg = document.getElementById("confirm");
  let pending = null;
  document.querySelectorAll("#actions button").forEach((b) => b.addEventListener("click", () => {
    pending = b.dataset.cmd;
    document.getElementById("confirm-text").textContent = `${b.textContent} run ${runId}?`;
    document.getElementById("issuer").value = localStorage.getItem("steadytune-issuer") || "";
    document.getElementById("confirm-error").textContent = "";
    dlg.showModal();
  }));
  dlg.addEventListener("close", async () => {
    if (dlg.returnValue !== "ok" || !pending) return;
    const issuer = document.getElementById("issuer").value.trim();
    localStorage.setItem("steadytune-issuer", issuer);
    try {
      await ST.postJSON(`${base}/control`, { command: pending, issuer, confirm: true });
    } catch (err) {
      alert(`${pending} failed: ${err.message}`);
    }
    pending = null;
  });

  // ---- start ----------------------------------------------------------------------------
  (async function start() {
    const detail = await ST.getJSON(base);
    renderStatus(detail);
    renderSide(detail);
    state.lastSeq = -1;
    addEvents(detail.events || []);
    state.version = await loadSeries();
    setStep(Math.max(detail.summary.step ?? -1, state.maxStep));
    connect();
    initControls().catch(() => {});
    ST.ready = true;
  })().catch((err) => { document.getElementById("charts").prepend(el("div", { class: "empty", text: String(err) })); });
})();
