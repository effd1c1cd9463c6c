// A small canvas line chart: min/max bands, mean lines, markers, a reference line,
// hover read-out and drag-to-zoom. No library: the dashboard works offline.
"use strict";
(function () {
  const ST = (window.steadytune = window.steadytune || {});

  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
  }

  // "Nice" tick values (1, 2, 5 × 10^k) covering [lo, hi].
  function ticks(lo, hi, count) {
    if (!(hi > lo)) return [lo];
    const raw = (hi - lo) / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Math.abs(v) < step * 1e-9 ? 0 : v);
    return out;
  }

  class Series {
    constructor(opts) {
      Object.assign(this, { key: opts.key, label: opts.label, color: opts.color || "--c1", band: opts.band !== false,
        dots: !!opts.dots });
      this.clear();
    }
    clear() { this.x = []; this.y = []; this.lo = []; this.hi = []; }
    set(x, y, lo, hi) { this.x = x; this.y = y; this.lo = lo || y; this.hi = hi || y; }
    push(x, y) {
      if (y === null || y === undefined || Number.isNaN(y)) { this.x.push(x); this.y.push(null); this.lo.push(null); this.hi.push(null); return; }
      this.x.push(x); this.y.push(y); this.lo.push(y); this.hi.push(y);
    }
    get length() { return this.x.length; }
    // Halve the number of points by merging neighbours (min of lows, max of highs):
    // a week-long live session stays as cheap to draw as the first minute.
    compact() {
      const n = Math.floor(this.x.length / 2);
      const x = [], y = [], lo = [], hi = [];
      for (let i = 0; i < n; i++) {
        const a = 2 * i, b = a + 1;
        x.push(this.x[b]);
        y.push(this.y[b] ?? this.y[a]);
        lo.push(minN(this.lo[a], this.lo[b]));
        hi.push(maxN(this.hi[a], this.hi[b]));
      }
      if (this.x.length % 2) { const k = this.x.length - 1; x.push(this.x[k]); y.push(this.y[k]); lo.push(this.lo[k]); hi.push(this.hi[k]); }
      this.set(x, y, lo, hi);
    }
  }
  function minN(a, b) { return a === null ? b : b === null ? a : Math.min(a, b); }
  function maxN(a, b) { return a === null ? b : b === null ? a : Math.max(a, b); }

  class Chart {
    constructor(container, opts) {
      this.opts = Object.assign({ xKind: "step", yFormat: ST.fmt.num, maxPoints: 3000, yMin: null, yMax: null }, opts);
      this.series = opts.series.map((s) => new Series(s));
      this.markers = [];
      this.hline = null;
      this.view = null; // [lo, hi] on x when zoomed
      this.canvas = document.createElement("canvas");
      this.tip = ST.el("div", { class: "tip" });
      container.append(this.canvas, this.tip);
      this.container = container;
      this.pending = false;
      this.hover = null;
      this.drag = null;
      new ResizeObserver(() => this.draw()).observe(container);
      window.addEventListener("themechange", () => this.draw());
      this.canvas.addEventListener("mousemove", (e) => this._move(e));
      this.canvas.addEventListener("mouseleave", () => { this.hover = null; this.tip.style.display = "none"; this.draw(); });
      this.canvas.addEventListener("mousedown", (e) => { this.drag = { x0: e.offsetX, x1: e.offsetX }; });
      window.addEventListener("mouseup", () => this._endDrag());
      this.canvas.addEventListener("dblclick", () => { if (this.opts.onZoom) this.opts.onZoom(null); });
    }
    get(key) { return this.series.find((s) => s.key === key); }
    pointCount() { return this.series.reduce((n, s) => n + s.y.filter((v) => v !== null).length, 0); }
    setMarkers(m) { this.markers = m; this.draw(); }
    setHLine(value, label) { this.hline = value === null || value === undefined ? null : { value, label }; this.draw(); }
    push(key, x, y) {
      const s = this.get(key);
      if (!s) return;
      s.push(x, y);
      if (s.length > this.opts.maxPoints * 2) s.compact();
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
    _extent() {
      let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
      for (const s of this.series) for (let i = 0; i < s.x.length; i++) {
        const x = s.x[i];
        if (this.view && (x < this.view[0] || x > this.view[1])) continue;
        if (x < x0) x0 = x; if (x > x1) x1 = x;
        const lo = s.band ? s.lo[i] : s.y[i], hi = s.band ? s.hi[i] : s.y[i];
        if (lo !== null && isFinite(lo) && lo < y0) y0 = lo;
        if (hi !== null && isFinite(hi) && hi > y1) y1 = hi;
      }
      if (this.view) { x0 = this.view[0]; x1 = this.view[1]; }
      if (this.hline && isFinite(this.hline.value)) { y0 = Math.min(y0, this.hline.value); y1 = Math.max(y1, this.hline.value); }
      if (this.opts.yMin !== null) y0 = Math.min(y0, this.opts.yMin);
      if (this.opts.yMax !== null) y1 = Math.max(y1, this.opts.yMax);
      if (!isFinite(x0)) return null;
      if (x1 === x0) x1 = x0 + 1;
      if (!isFinite(y0)) { y0 = 0; y1 = 1; }
      if (y1 === y0) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
      const pad = (y1 - y0) * 0.06;
      return { x0, x1, y0: this.opts.yMin === 0 && y0 >= 0 ? 0 : y0 - pad, y1: y1 + pad };
    }
    _draw() {
      const dpr = window.devicePixelRatio || 1;
      const w = this.container.clientWidth, h = this.container.clientHeight;
      if (!w || !h) return;
      if (this.canvas.width !== Math.round(w * dpr) || this.canvas.height !== Math.round(h * dpr)) {
        this.canvas.width = Math.round(w * dpr); this.canvas.height = Math.round(h * dpr);
      }
      const ctx = this.canvas.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, h);
      const ext = this._extent();
      const L = 58, R = 10, T = 8, B = 22;
      const pw = w - L - R, ph = h - T - B;
      ctx.font = "11px ui-monospace, Menlo, Consolas, monospace";
      ctx.fillStyle = cssVar("--muted");
      if (!ext) { ctx.fillText("waiting for data…", L + 8, T + 18); this.geom = null; return; }
      const sx = (x) => L + ((x - ext.x0) / (ext.x1 - ext.x0)) * pw;
      const sy = (y) => T + ph - ((y - ext.y0) / (ext.y1 - ext.y0)) * ph;
      this.geom = { ext, sx, L, pw, T, ph };
      // grid + axes
      ctx.strokeStyle = cssVar("--grid"); ctx.lineWidth = 1;
      ctx.textAlign = "right"; ctx.textBaseline = "middle";
      for (const v of ticks(ext.y0, ext.y1, Math.max(2, Math.floor(ph / 40)))) {
        const y = Math.round(sy(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(L + pw, y); ctx.stroke();
        ctx.fillText(this.opts.yFormat(v), L - 6, y);
      }
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      // Short time spans need seconds on the axis, or every label reads the same minute.
      const xf = this.opts.xKind !== "time" ? ST.fmt.int : ext.x1 - ext.x0 < 900 ? ST.fmt.time : ST.fmt.clock;
      for (const v of ticks(ext.x0, ext.x1, Math.max(2, Math.floor(pw / 110)))) {
        const x = Math.round(sx(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(x, T); ctx.lineTo(x, T + ph); ctx.stroke();
        ctx.fillText(xf(v), x, T + ph + 5);
      }
      ctx.save();
      ctx.beginPath(); ctx.rect(L, T, pw, ph); ctx.clip();
      // anomaly markers
      for (const m of this.markers) {
        if (m.x < ext.x0 || m.x > ext.x1) continue;
        const x = Math.round(sx(m.x)) + 0.5;
        ctx.strokeStyle = cssVar(m.color || "--crit"); ctx.globalAlpha = 0.75; ctx.setLineDash([3, 3]);
        ctx.beginPath(); ctx.moveTo(x, T); ctx.lineTo(x, T + ph); ctx.stroke();
        ctx.setLineDash([]); ctx.globalAlpha = 1;
        ctx.fillStyle = cssVar(m.color || "--crit");
        ctx.beginPath(); ctx.moveTo(x - 4, T); ctx.lineTo(x + 4, T); ctx.lineTo(x, T + 6); ctx.fill();
      }
      // reference line (memory capacity)
      if (this.hline) {
        const y = Math.round(sy(this.hline.value)) + 0.5;
        ctx.strokeStyle = cssVar("--crit"); ctx.setLineDash([6, 4]);
        ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(L + pw, y); ctx.stroke(); ctx.setLineDash([]);
        ctx.fillStyle = cssVar("--crit"); ctx.textAlign = "left";
        ctx.textBaseline = y - T < 14 ? "top" : "bottom";
        ctx.fillText(this.hline.label || "", L + 6, y - T < 14 ? y + 3 : y - 2);
      }
      for (const s of this.series) {
        const color = cssVar(s.color);
        // band: min..max of each bucket, so a spike inside a bucket still shows
        if (s.band) {
          ctx.fillStyle = color; ctx.globalAlpha = parseFloat(cssVar("--band")) || 0.18;
          let open = false;
          for (let i = 0; i < s.x.length; i++) {
            if (s.lo[i] === null || s.hi[i] === null || s.lo[i] === s.hi[i]) continue;
            const x = sx(s.x[i]);
            ctx.fillRect(x - 0.5, sy(s.hi[i]), 1.5, Math.max(1, sy(s.lo[i]) - sy(s.hi[i])));
            open = true;
          }
          ctx.globalAlpha = 1;
          void open;
        }
        ctx.strokeStyle = color; ctx.fillStyle = color; ctx.lineWidth = 1.6;
        if (s.dots) {
          for (let i = 0; i < s.x.length; i++) if (s.y[i] !== null) { ctx.beginPath(); ctx.arc(sx(s.x[i]), sy(s.y[i]), 2.5, 0, 6.3); ctx.fill(); }
        }
        ctx.beginPath();
        let pen = false;
        for (let i = 0; i < s.x.length; i++) {
          const v = s.y[i];
          if (v === null || !isFinite(v)) { pen = false; continue; }
          const x = sx(s.x[i]), y = sy(v);
          if (pen) ctx.lineTo(x, y); else { ctx.moveTo(x, y); pen = true; }
        }
        ctx.stroke();
      }
      // drag selection + hover line
      if (this.drag && Math.abs(this.drag.x1 - this.drag.x0) > 3) {
        ctx.fillStyle = cssVar("--accent"); ctx.globalAlpha = 0.15;
        ctx.fillRect(Math.min(this.drag.x0, this.drag.x1), T, Math.abs(this.drag.x1 - this.drag.x0), ph);
        ctx.globalAlpha = 1;
      }
      if (this.hover !== null) {
        ctx.strokeStyle = cssVar("--muted"); ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(this.hover + 0.5, T); ctx.lineTo(this.hover + 0.5, T + ph); ctx.stroke();
      }
      ctx.restore();
    }
    _move(e) {
      if (this.drag) { this.drag.x1 = e.offsetX; }
      const g = this.geom;
      if (!g) return;
      const xv = g.ext.x0 + ((e.offsetX - g.L) / g.pw) * (g.ext.x1 - g.ext.x0);
      this.hover = e.offsetX;
      const lines = [];
      const xf = this.opts.xKind === "time" ? ST.fmt.time : (v) => "step " + ST.fmt.int(v);
      let xShown = null;
      for (const s of this.series) {
        const i = nearest(s.x, xv);
        if (i < 0 || s.y[i] === null) continue;
        if (xShown === null) xShown = s.x[i];
        const band = s.band && s.lo[i] !== s.hi[i] ? `  [${this.opts.yFormat(s.lo[i])} … ${this.opts.yFormat(s.hi[i])}]` : "";
        lines.push(`${s.label}: ${this.opts.yFormat(s.y[i])}${band}`);
      }
      for (const m of this.markers) if (Math.abs(g.sx(m.x) - e.offsetX) < 4) lines.push(`⚑ ${m.label}`);
      if (!lines.length) { this.tip.style.display = "none"; this.draw(); return; }
      this.tip.textContent = "";
      this.tip.append(ST.el("div", { class: "muted", text: xf(xShown) }), ...lines.map((t) => ST.el("div", { text: t })));
      this.tip.style.display = "block";
      const left = e.offsetX + 14 + this.tip.offsetWidth > this.container.clientWidth ? e.offsetX - this.tip.offsetWidth - 14 : e.offsetX + 14;
      this.tip.style.left = `${left}px`; this.tip.style.top = `${Math.max(0, e.offsetY - 10)}px`;
      this.draw();
    }
    _endDrag() {
      const d = this.drag; this.drag = null;
      if (!d || !this.geom || Math.abs(d.x1 - d.x0) < 6) { this.draw(); return; }
      const g = this.geom;
      const toX = (px) => g.ext.x0 + ((px - g.L) / g.pw) * (g.ext.x1 - g.ext.x0);
      const lo = toX(Math.min(d.x0, d.x1)), hi = toX(Math.max(d.x0, d.x1));
      if (this.opts.onZoom) this.opts.onZoom([lo, hi]); else { this.view = [lo, hi]; this.draw(); }
    }
  }

  function nearest(xs, x) {
    let lo = 0, hi = xs.length - 1;
    if (hi < 0) return -1;
    while (hi - lo > 1) { const mid = (lo + hi) >> 1; if (xs[mid] < x) lo = mid; else hi = mid; }
    return Math.abs(xs[lo] - x) <= Math.abs(xs[hi] - x) ? lo : hi;
  }

  ST.Chart = Chart;
  ST.ticks = ticks;
})();
