// Gradient-flow heat map: one row per layer (forward order, top to bottom), one column per
// recording (every 50 steps, merged when the run is long). Colour = log10 of the layer's
// gradient norm; dead/vanishing and exploding cells get their own marks. Canvas, no library.
"use strict";
(function () {
  const ST = (window.steadytune = window.steadytune || {});
  const OK = 0, VANISHING = 1, DEAD = 2, EXPLODING = 3;
  const NAMES = ["ok", "vanishing", "dead", "exploding"];

  const cssVar = ST.cssVar;
  // Viridis (perceptually uniform, readable by colour-blind eyes, clear on dark and light cards).
  const STOPS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  function colour(t) {
    t = Math.max(0, Math.min(1, t)) * (STOPS.length - 1);
    const i = Math.min(STOPS.length - 2, Math.floor(t)), f = t - i, a = STOPS[i], b = STOPS[i + 1];
    return `rgb(${Math.round(a[0] + (b[0] - a[0]) * f)},${Math.round(a[1] + (b[1] - a[1]) * f)},${Math.round(a[2] + (b[2] - a[2]) * f)})`;
  }
  // A norm as sent: a number, null (not recorded) or "nan"/"inf" (not finite).
  const finite = (v) => typeof v === "number" && isFinite(v);
  const showNorm = (v) => (v === null || v === undefined ? "–" : typeof v === "string" ? v.toUpperCase() : ST.fmt.num(v, 3));
  // A threshold as the config writes it: 1e-3, 1e2, 5e-4.
  const sci = (v) => v.toExponential().replace("e+", "e");

  class HeatMap {
    constructor(container, legend) {
      this.container = container;
      this.legend = legend;
      this.canvas = document.createElement("canvas");
      this.tip = ST.el("div", { class: "tip" });
      container.append(this.canvas, this.tip);
      this.clear();
      this.pending = false;
      new ResizeObserver(() => this.draw()).observe(container);
      window.addEventListener("themechange", () => this.draw());
      this.canvas.addEventListener("mousemove", (e) => this._move(e));
      this.canvas.addEventListener("mouseleave", () => { this.tip.style.display = "none"; this.hover = null; this.draw(); });
      // A click picks a recording (its last step) for the page's other views; a double click lets go.
      this.onPick = null;
      this.canvas.addEventListener("click", (e) => {
        const g = this.geom, c = g ? this.columns[Math.floor((e.offsetX - g.L) / g.cw)] : null;
        if (c && this.onPick) this.onPick(c.last);
      });
      this.canvas.addEventListener("dblclick", () => { if (this.onPick) this.onPick(null); });
    }
    clear() { this.layers = []; this.columns = []; this.bucket = 1; this.total = 0; this.thresholds = null; }
    // The whole map from /gradflow.
    set(data) {
      this.layers = data.layers || [];
      this.columns = data.columns || [];
      this.bucket = data.bucket || 1;
      this.total = data.total || this.columns.length;
      // The limits the server judged the cells by (the run's detect.grad.layer_*): the legend states them.
      this.thresholds = data.thresholds || null;
      this.draw();
    }
    get lastStep() { return this.columns.length ? this.columns[this.columns.length - 1].last : -1; }
    // New recordings from the live stream; false when the page should refetch the whole map instead
    // (new layers, merged columns, or history rewritten by a restart).
    append(data) {
      const same = data.layers.length === this.layers.length && data.layers.every((l, i) => l === this.layers[i]);
      if (!this.layers.length && this.columns.length === 0) { this.set(data); return true; }
      if (!same || this.bucket !== 1) return false;
      for (const c of data.columns) {
        if (c.first <= this.lastStep) return false;
        this.columns.push(c);
        this.total += 1;
      }
      if (data.thresholds) this.thresholds = data.thresholds;
      this.draw();
      return true;
    }
    // For tests and the header note: cells drawn, and how many of each mark.
    cellCount() { return this.columns.reduce((n, c) => n + c.state.filter((s) => s !== null).length, 0); }
    flagged() {
      const out = { vanishing: 0, dead: 0, exploding: 0 };
      for (const c of this.columns) for (const s of c.state) if (s !== null && s !== OK) out[NAMES[s]] += 1;
      return out;
    }
    _domain() {
      let lo = Infinity, hi = -Infinity;
      for (const c of this.columns) c.norm.forEach((v, i) => {
        if (c.state[i] !== OK || !finite(v) || v <= 0) return;
        const l = Math.log10(v);
        if (l < lo) lo = l; if (l > hi) hi = l;
      });
      if (!isFinite(lo)) {
        // Nothing healthy to scale by: span the healthy band itself.
        const t = this.thresholds;
        lo = t ? Math.log10(t.vanish_norm) : -3; hi = t ? Math.log10(t.explode_norm) : 2;
      }
      if (hi - lo < 1) { const m = (lo + hi) / 2; lo = m - 0.5; hi = m + 0.5; }
      return [lo, hi];
    }
    draw() { ST.drawOncePerFrame(this); }
    _draw() {
      const nl = this.layers.length;
      // Tall enough to read every layer of a small model, capped for a 100-layer one.
      this.container.style.height = `${Math.max(150, Math.min(460, 28 + nl * 14))}px`;
      const frame = ST.canvasFrame(this.container, this.canvas);
      if (!frame) return;
      const { ctx, w, h } = frame;
      const muted = cssVar("--muted");
      this.geom = null;
      const [d0, d1] = this._domain();
      this._legend(d0, d1);
      if (!this.columns.length || !nl) {
        ctx.fillText("waiting for the first gradient-flow recording (every 50 optimizer steps)…", 12, 24);
        return;
      }
      const labelW = Math.min(150, Math.max(...this.layers.map((l) => ctx.measureText(l).width)) + 10);
      const L = labelW, R = 10, T = 6, B = 22;
      const pw = w - L - R, ph = h - T - B;
      const nc = this.columns.length, cw = pw / nc, ch = ph / nl;
      this.geom = { L, T, pw, ph, cw, ch };
      const vanish = cssVar("--muted"), explode = cssVar("--crit"), bg = cssVar("--card");
      for (let j = 0; j < nc; j++) {
        const c = this.columns[j], x = L + j * cw;
        for (let i = 0; i < nl; i++) {
          const s = c.state[i];
          if (s === null || s === undefined) continue;
          const y = T + i * ch, v = c.norm[i];
          if (s === EXPLODING) ctx.fillStyle = explode;
          else if (s === VANISHING || s === DEAD) ctx.fillStyle = vanish;
          else ctx.fillStyle = colour((Math.log10(v) - d0) / (d1 - d0));
          ctx.fillRect(x, y, Math.ceil(cw), Math.ceil(ch));
          // A second cue besides colour: a cross for exploding, a slash for dead/vanishing.
          if (s !== OK && cw >= 6 && ch >= 6) {
            ctx.strokeStyle = bg; ctx.lineWidth = 1.2;
            ctx.beginPath();
            ctx.moveTo(x + 2, y + ch - 2); ctx.lineTo(x + cw - 2, y + 2);
            if (s === EXPLODING) { ctx.moveTo(x + 2, y + 2); ctx.lineTo(x + cw - 2, y + ch - 2); }
            ctx.stroke();
          }
        }
      }
      // Layer names; with many layers, every k-th one.
      ctx.fillStyle = muted; ctx.textAlign = "right"; ctx.textBaseline = "middle";
      const every = Math.max(1, Math.ceil(12 / ch));
      for (let i = 0; i < nl; i += every) {
        let name = this.layers[i];
        while (name.length > 4 && ctx.measureText(name).width > labelW - 8) name = name.slice(0, -2);
        ctx.fillText(name === this.layers[i] ? name : name + "…", L - 6, T + (i + 0.5) * ch);
      }
      // Step labels under a few columns.
      ctx.textAlign = "center"; ctx.textBaseline = "top";
      const stride = Math.max(1, Math.ceil(70 / cw));
      for (let j = 0; j < nc; j += stride) ctx.fillText(ST.fmt.int(this.columns[j].last), L + (j + 0.5) * cw, T + ph + 5);
      if (this.hover) {
        ctx.strokeStyle = cssVar("--text"); ctx.lineWidth = 1;
        ctx.strokeRect(L + this.hover.j * cw + 0.5, T + this.hover.i * ch + 0.5, Math.max(1, cw - 1), Math.max(1, ch - 1));
      }
    }
    _legend(d0, d1) {
      if (!this.legend) return;
      const t = this.thresholds;
      const key = `${d0.toFixed(2)}:${d1.toFixed(2)}:${t ? [t.vanish_norm, t.explode_norm, t.zero_frac].join(":") : ""}`;
      if (this.legend.dataset.key === key) return;
      this.legend.dataset.key = key;
      const bar = document.createElement("canvas");
      bar.width = 120; bar.height = 8; bar.className = "scale";
      const b = bar.getContext("2d");
      for (let x = 0; x < 120; x++) { b.fillStyle = colour(x / 119); b.fillRect(x, 0, 1, 8); }
      const sw = (cls) => ST.el("i", { class: `swatch ${cls}` });
      this.legend.replaceChildren(
        ST.el("span", {}, `grad norm ${ST.fmt.num(10 ** d0, 2)} `, bar, ` ${ST.fmt.num(10 ** d1, 2)} (log scale)`),
        ST.el("span", { class: "legend-vanish" }, sw("vanish"),
          t ? `dead / vanishing (< ${sci(t.vanish_norm)}, or > ${+(100 * t.zero_frac).toFixed(1)}% zeros)` : "dead / vanishing"),
        ST.el("span", { class: "legend-explode" }, sw("explode"),
          t ? `exploding (> ${sci(t.explode_norm)} or not finite)` : "exploding (or not finite)"));
    }
    _move(e) {
      const g = this.geom;
      if (!g) return;
      const j = Math.floor((e.offsetX - g.L) / g.cw), i = Math.floor((e.offsetY - g.T) / g.ch);
      const c = this.columns[j];
      if (!c || i < 0 || i >= this.layers.length || c.state[i] === null || c.state[i] === undefined) {
        this.tip.style.display = "none"; this.hover = null; this.draw(); return;
      }
      this.hover = { i, j };
      const zf = c.zero_frac[i];
      const steps = c.first === c.last ? `step ${ST.fmt.int(c.first)}` : `steps ${ST.fmt.int(c.first)}–${ST.fmt.int(c.last)} (${c.n} recordings, worst shown)`;
      const lines = [
        ST.el("div", { class: "muted", text: steps }),
        ST.el("div", { text: `layer: ${this.layers[i]}` }),
        ST.el("div", { text: `grad norm: ${showNorm(c.norm[i])}` }),
        ST.el("div", { text: `zero fraction: ${zf === null || zf === undefined ? "–" : (100 * zf).toFixed(1) + "%"}` }),
      ];
      if (c.state[i] !== OK) lines.push(ST.el("div", { class: c.state[i] === EXPLODING ? "sev-critical" : "sev-warning", text: NAMES[c.state[i]] }));
      this.tip.replaceChildren(...lines);
      this.tip.style.display = "block";
      const left = e.offsetX + 14 + this.tip.offsetWidth > this.container.clientWidth ? e.offsetX - this.tip.offsetWidth - 14 : e.offsetX + 14;
      this.tip.style.left = `${left}px`; this.tip.style.top = `${Math.max(0, e.offsetY - 10)}px`;
      this.draw();
    }
  }

  ST.HeatMap = HeatMap;
})();
