// Gradient values per layer at one gradient-flow recording: for each layer (a row), the share
// of its non-zero |grad| entries in each log10 bin (a column), plus its share of exact zeros.
// Healthy layers show a hump well inside the range; a pile-up at the right edge explodes, one
// at the left edge (or a wide zeros bar) vanishes. Canvas, like the heat map above it.
"use strict";
(function () {
  const ST = (window.steadytune = window.steadytune || {});
  const cssVar = ST.cssVar;
  const edge = (e) => `1e${e}`;

  class GradHist {
    constructor(container) {
      this.container = container;
      this.canvas = document.createElement("canvas");
      this.tip = ST.el("div", { class: "tip" });
      container.append(this.canvas, this.tip);
      this.data = null;
      this.pending = false;
      this.bars = 0;
      new ResizeObserver(() => this.draw()).observe(container);
      window.addEventListener("themechange", () => this.draw());
      this.canvas.addEventListener("mousemove", (e) => this._move(e));
      this.canvas.addEventListener("mouseleave", () => { this.tip.style.display = "none"; });
    }
    get step() { return this.data && this.data.step !== null ? this.data.step : null; }
    get layers() { return this.data && this.data.layers ? this.data.layers : []; }
    // For tests: bars painted (non-empty bins over all layers).
    barCount() { return this.bars; }
    set(data) { this.data = data; this.draw(); }
    draw() { ST.drawOncePerFrame(this); }
    _draw() {
      const nl = this.layers.length;
      this.container.style.height = `${Math.max(120, Math.min(560, 34 + nl * 26))}px`;
      const frame = ST.canvasFrame(this.container, this.canvas);
      if (!frame) return;
      const { ctx, w, h } = frame;
      const muted = cssVar("--muted");
      this.geom = null;
      this.bars = 0;
      const d = this.data;
      if (!d || d.step === null || !nl || !d.bins || d.bins.length < 2) {
        ctx.fillText("no gradient histogram recorded yet (one per gradient-flow recording)", 12, 24);
        return;
      }
      const nb = d.bins.length - 1;
      const labelW = Math.min(150, Math.max(...d.layers.map((l) => ctx.measureText(l).width)) + 10);
      const zeroW = 56, L = labelW, R = 10 + zeroW, T = 6, B = 22;
      const pw = w - L - R, ph = h - T - B, cw = pw / nb, ch = ph / nl;
      this.geom = { L, T, pw, ph, cw, ch, nb, zeroW };
      const bar = cssVar("--c1"), edgeBar = cssVar("--crit"), grid = cssVar("--grid");
      for (let i = 0; i < nl; i++) {
        const row = d.hist[i] || [], y0 = T + i * ch;
        const top = Math.max(1, ...row);
        ctx.strokeStyle = grid; ctx.lineWidth = 1;
        ctx.beginPath(); ctx.moveTo(L, Math.round(y0 + ch) - 0.5); ctx.lineTo(L + pw, Math.round(y0 + ch) - 0.5); ctx.stroke();
        for (let k = 0; k < nb; k++) {
          const n = row[k] || 0;
          if (!n) continue;
          const bh = Math.max(1, (ch - 3) * (n / top));
          // The edge bins also hold what lies beyond the range: marked, they are where trouble piles up.
          ctx.fillStyle = k === nb - 1 ? edgeBar : bar;
          ctx.fillRect(L + k * cw + 1, y0 + ch - 1 - bh, Math.max(1, cw - 2), bh);
          this.bars += 1;
        }
        const zf = d.zero_frac[i];
        if (zf !== null && zf !== undefined) {
          ctx.fillStyle = muted;
          ctx.fillRect(L + pw + 8, y0 + ch - 1 - Math.max(1, (ch - 3) * zf), 10, Math.max(1, (ch - 3) * zf));
          ctx.textAlign = "left"; ctx.textBaseline = "middle";
          ctx.fillText(`${(100 * zf).toFixed(0)}%`, L + pw + 22, y0 + ch / 2);
        }
      }
      ctx.fillStyle = muted; ctx.textAlign = "right"; ctx.textBaseline = "middle";
      const every = Math.max(1, Math.ceil(12 / ch));
      for (let i = 0; i < nl; i += every) {
        let name = d.layers[i];
        while (name.length > 4 && ctx.measureText(name).width > labelW - 8) name = name.slice(0, -2);
        ctx.fillText(name === d.layers[i] ? name : name + "…", L - 6, T + (i + 0.5) * ch);
      }
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      const stride = Math.max(1, Math.ceil(44 / cw));
      for (let k = 0; k <= nb; k += stride) ctx.fillText(edge(d.bins[k]), L + k * cw, T + ph + 5);
      ctx.fillText("zeros", L + pw + zeroW / 2 + 4, T + ph + 5);
    }
    _move(e) {
      const g = this.geom, d = this.data;
      if (!g || !d) return;
      const k = Math.floor((e.offsetX - g.L) / g.cw), i = Math.floor((e.offsetY - g.T) / g.ch);
      if (i < 0 || i >= d.layers.length || k < 0 || k >= g.nb) { this.tip.style.display = "none"; return; }
      const row = d.hist[i] || [], n = row[k] || 0, total = row.reduce((a, b) => a + b, 0);
      const lo = k === 0 ? `≤ ${edge(d.bins[1])}` : k === g.nb - 1 ? `≥ ${edge(d.bins[k])}` : `${edge(d.bins[k])} – ${edge(d.bins[k + 1])}`;
      const zf = d.zero_frac[i];
      this.tip.replaceChildren(
        ST.el("div", { class: "muted", text: `step ${ST.fmt.int(d.step)}` }),
        ST.el("div", { text: `layer: ${d.layers[i]}` }),
        ST.el("div", { text: `|grad| ${lo}: ${ST.fmt.int(n)} (${total ? ((100 * n) / total).toFixed(1) : "0"}% of non-zero)` }),
        ST.el("div", { text: `exact zeros: ${zf === null || zf === undefined ? "–" : (100 * zf).toFixed(1) + "%"}` }));
      this.tip.style.display = "block";
      const left = e.offsetX + 14 + this.tip.offsetWidth > this.container.clientWidth ? e.offsetX - this.tip.offsetWidth - 14 : e.offsetX + 14;
      this.tip.style.left = `${left}px`; this.tip.style.top = `${Math.max(0, e.offsetY - 10)}px`;
    }
  }

  ST.GradHist = GradHist;
})();
