// Step and time charts drawn by uPlot (vendored: uPlot.iife.min.js, see VENDORED.md).
// This file only keeps each chart's data (mean line plus the min..max band of each
// server bucket) and maps it onto uPlot: bands, anomaly markers, a reference line,
// drag-to-zoom handed to the page (which asks the server for that range again).
"use strict";
(function () {
  const ST = (window.steadytune = window.steadytune || {});

  const cssVar = ST.cssVar;
  const PLOT_HEIGHT = 190;
  const clean = (v) => (v === undefined || (typeof v === "number" && !isFinite(v)) ? null : v);

  class Series {
    constructor(opts) {
      Object.assign(this, { key: opts.key, label: opts.label, color: opts.color || "--c1", band: opts.band !== false,
        dots: !!opts.dots });
      this.clear();
    }
    clear() { this.x = []; this.y = []; this.lo = []; this.hi = []; }
    set(x, y, lo, hi) { this.x = x; this.y = y.map(clean); this.lo = (lo || y).map(clean); this.hi = (hi || y).map(clean); }
    push(x, y) {
      const v = y === null || y === undefined || Number.isNaN(y) ? null : clean(y);
      this.x.push(x); this.y.push(v); this.lo.push(v); this.hi.push(v);
    }
    get length() { return this.x.length; }
  }

  function nearest(xs, x) {
    let lo = 0, hi = xs.length - 1;
    if (hi < 0) return -1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid; else hi = mid; }
    return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
  }

  class Chart {
    constructor(container, opts) {
      this.opts = Object.assign({ xKind: "step", yFormat: ST.fmt.num, maxPoints: 3000, yMin: null, yMax: null }, opts);
      this.series = opts.series.map((s) => new Series(s));
      this.markers = [];
      this.hline = null;
      this.view = null; // [lo, hi] on x when zoomed
      this.emptyText = "waiting for data…";
      this.container = container;
      this.empty = ST.el("div", { class: "chart-empty" });
      container.append(this.empty);
      this.pending = false;
      this.plot = null;
      new ResizeObserver(() => this._resize()).observe(container);
      // uPlot reads colours once, when it is built: a new theme builds it again.
      window.addEventListener("themechange", () => { this._destroy(); this.draw(); });
    }
    get(key) { return this.series.find((s) => s.key === key); }
    pointCount() { return this.series.reduce((n, s) => n + s.y.filter((v) => v !== null).length, 0); }
    setMarkers(m) { this.markers = m; this.draw(); }
    setHLine(value, label) { this.hline = value === null || value === undefined ? null : { value, label }; this.draw(); }
    // What the chart says while it has nothing to draw ("no GPU on this host" where there is none to wait for).
    setEmptyText(text) { this.emptyText = text; this.draw(); }
    push(key, x, y) {
      const s = this.get(key);
      if (!s) return;
      s.push(x, y);
      // Bucketing is the server's alone: a live chart grown past its budget asks the page
      // to fetch the range again, re-bucketed, instead of merging points here.
      if (s.length > this.opts.maxPoints * 2 && this.opts.onFull) this.opts.onFull();
      this.draw();
    }
    // Fill in the value at an x already drawn (an eval loss logged after its step); false if x is not there.
    setAt(key, x, y) {
      const s = this.get(key);
      const i = s ? nearest(s.x, x) : -1;
      if (i < 0 || s.x[i] !== x) return false;
      s.y[i] = y; s.lo[i] = y; s.hi[i] = y;
      this.draw();
      return true;
    }
    draw() {
      if (this.pending) return;
      this.pending = true;
      requestAnimationFrame(() => { this.pending = false; this._draw(); });
    }

    // uPlot wants one x array per chart. The series of a chart are filled together (one
    // query, one record), so their x arrays agree; when they do not, uPlot.join aligns them.
    _data() {
      const xs = this.series[0].x;
      const same = this.series.every((s) => s.x === xs || (s.x.length === xs.length && s.x[0] === xs[0] && s.x[xs.length - 1] === xs[xs.length - 1]));
      const cols = [];
      for (const s of this.series) { cols.push(s.y); if (s.band) cols.push(s.lo, s.hi); }
      if (same) return [xs, ...cols];
      const tables = this.series.map((s) => (s.band ? [s.x, s.y, s.lo, s.hi] : [s.x, s.y]));
      return uPlot.join(tables);
    }
    // The plot keeps a fixed height; uPlot's legend goes below it, however many lines it wraps to.
    _size() { return { width: Math.max(50, this.container.clientWidth), height: PLOT_HEIGHT }; }
    _resize() { if (this.plot) this.plot.setSize(this._size()); }
    _destroy() { if (this.plot) { this.plot.destroy(); this.plot = null; } }
    _build(data) {
      const o = this.opts, self = this;
      const time = o.xKind === "time";
      const yf = o.yFormat;
      const series = [{ label: time ? "time" : "step", value: (u, v) => (v === null ? "–" : time ? ST.fmt.time(v) : ST.fmt.int(v)) }];
      const bands = [];
      this.legendHidden = [];
      for (const s of this.series) {
        const color = cssVar(s.color);
        const at = series.length;
        series.push({
          label: s.label, stroke: color, width: 1.6, spanGaps: false,
          points: s.dots ? { show: true, size: 5, fill: color, stroke: color } : { show: false },
          paths: s.dots ? () => null : undefined,
          value: (u, v, si, idx) => {
            if (v === null || v === undefined) return "–";
            if (!s.band || idx === null) return yf(v);
            const lo = u.data[at + 1][idx], hi = u.data[at + 2][idx];
            return lo !== hi && lo !== null && hi !== null ? `${yf(v)} [${yf(lo)} … ${yf(hi)}]` : yf(v);
          },
        });
        if (s.band) {
          for (const which of ["min", "max"]) {
            this.legendHidden.push(series.length);
            series.push({ label: `${s.label} ${which}`, stroke: "transparent", width: 0, points: { show: false } });
          }
          const fill = color + Math.round((parseFloat(cssVar("--band")) || 0.18) * 255).toString(16).padStart(2, "0");
          bands.push({ series: [at + 2, at + 1], fill });
        }
      }
      const axis = { stroke: cssVar("--muted"), grid: { stroke: cssVar("--grid"), width: 1 }, ticks: { stroke: cssVar("--grid"), width: 1 },
        font: "11px ui-monospace, Menlo, Consolas, monospace" };
      const yRange = (u, lo, hi) => {
        if (o.yMin !== null) lo = Math.min(lo, o.yMin);
        if (o.yMax !== null) hi = Math.max(hi, o.yMax);
        if (self.hline && isFinite(self.hline.value)) { lo = Math.min(lo, self.hline.value); hi = Math.max(hi, self.hline.value); }
        if (!(hi > lo)) { const d = Math.abs(lo) * 0.1 || 1; lo -= d; hi += d; }
        const pad = (hi - lo) * 0.06;
        return [o.yMin === 0 && lo >= 0 ? 0 : lo - pad, hi + pad];
      };
      const opts = {
        ...this._size(),
        series, bands,
        scales: { x: { time, range: (u, lo, hi) => (self.view ? self.view : hi > lo ? [lo, hi] : [lo, lo + 1]) }, y: { range: yRange } },
        axes: [
          { ...axis, values: time ? undefined : (u, splits) => splits.map((v) => ST.fmt.int(v)) },
          { ...axis, size: 74, values: (u, splits) => splits.map((v) => yf(v)) },
        ],
        legend: { live: true },
        cursor: { drag: { x: true, y: false, setScale: false }, points: { size: 6 } },
        hooks: {
          setSelect: [(u) => {
            if (u.select.width < 6) return;
            const lo = u.posToVal(u.select.left, "x"), hi = u.posToVal(u.select.left + u.select.width, "x");
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
            if (o.onZoom) o.onZoom([lo, hi]); else { self.view = [lo, hi]; self.draw(); }
          }],
          draw: [(u) => self._overlay(u)],
        },
      };
      this.plot = new uPlot(opts, data, this.container);
      this.plot.over.addEventListener("dblclick", () => { if (o.onZoom) o.onZoom(null); else { self.view = null; self.draw(); } });
      const rows = this.plot.root.querySelectorAll(".u-legend .u-series");
      for (const i of this.legendHidden) if (rows[i]) rows[i].classList.add("hidden");
    }
    // Anomaly markers and the reference line (device capacity), on top of the series.
    _overlay(u) {
      const ctx = u.ctx, { left, top, width, height } = u.bbox, px = uPlot.pxRatio;
      ctx.save();
      ctx.beginPath(); ctx.rect(left, top, width, height); ctx.clip();
      const [x0, x1] = [u.scales.x.min, u.scales.x.max];
      for (const m of this.markers) {
        if (m.x < x0 || m.x > x1) continue;
        const x = Math.round(u.valToPos(m.x, "x", true)) + 0.5;
        const color = cssVar(m.color || "--crit");
        ctx.strokeStyle = color; ctx.globalAlpha = 0.75; ctx.lineWidth = px; ctx.setLineDash([3 * px, 3 * px]);
        ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, top + height); ctx.stroke();
        ctx.setLineDash([]); ctx.globalAlpha = 1; ctx.fillStyle = color;
        ctx.beginPath(); ctx.moveTo(x - 4 * px, top); ctx.lineTo(x + 4 * px, top); ctx.lineTo(x, top + 6 * px); ctx.fill();
      }
      if (this.hline) {
        const y = Math.round(u.valToPos(this.hline.value, "y", true)) + 0.5;
        ctx.strokeStyle = cssVar("--crit"); ctx.lineWidth = px; ctx.setLineDash([6 * px, 4 * px]);
        ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + width, y); ctx.stroke(); ctx.setLineDash([]);
        ctx.fillStyle = cssVar("--crit"); ctx.font = `${11 * px}px ui-monospace, Menlo, Consolas, monospace`;
        const below = y - top < 14 * px;
        ctx.textAlign = "left";
        ctx.textBaseline = below ? "top" : "bottom";
        ctx.fillText(this.hline.label || "", left + 6 * px, below ? y + 3 * px : y - 2 * px);
      }
      ctx.restore();
    }
    _draw() {
      if (!this.container.clientWidth) return;
      const hasData = this.series.some((s) => s.y.some((v) => v !== null));
      this.empty.textContent = hasData ? "" : this.emptyText;
      this.empty.classList.toggle("hidden", hasData);
      if (!hasData) { this._destroy(); return; }
      const data = this._data();
      if (!this.plot) this._build(data);
      else this.plot.setData(data);
    }
  }

  ST.Chart = Chart;
})();
