// Shared helpers: formatting, theme, JSON fetch with the operator token.
"use strict";
const ST = (window.steadytune = window.steadytune || {});

ST.fmt = {
  num(v, digits = 4) {
    if (v === null || v === undefined || Number.isNaN(v)) return "–";
    const a = Math.abs(v);
    if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(2);
    return Number(v.toPrecision(digits)).toString();
  },
  int(v) { return v === null || v === undefined ? "–" : Math.round(v).toLocaleString("en-US"); },
  bytes(v) {
    if (v === null || v === undefined) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; let x = Math.abs(v);
    while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return (v < 0 ? "-" : "") + x.toFixed(x < 10 && i ? 2 : 1) + " " + u[i];
  },
  dur(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    s = Math.max(0, Math.round(s));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
    if (d) return `${d}d ${h}h`; if (h) return `${h}h ${m}m`; if (m) return `${m}m ${s % 60}s`; return `${s}s`;
  },
  ago(ts) { return ts ? ST.fmt.dur(Date.now() / 1000 - ts) + " ago" : "–"; },
  time(ts) { return ts ? new Date(ts * 1000).toLocaleTimeString([], { hour12: false }) : "–"; },
  clock(ts) { const d = new Date(ts * 1000); return d.toLocaleTimeString([], { hour12: false, hour: "2-digit", minute: "2-digit" }); },
};

ST.cssVar = function (name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
};

// A canvas drawn at most once a frame: obj.draw() asks, obj._draw() paints.
ST.drawOncePerFrame = function (obj) {
  if (obj.pending) return;
  obj.pending = true;
  requestAnimationFrame(() => { obj.pending = false; obj._draw(); });
};

// The canvas sized to its container at the screen's pixel density and cleared, with the
// dashboard's small monospace font and muted ink: {ctx, w, h}, or null while it is not shown.
ST.canvasFrame = function (container, canvas) {
  const dpr = window.devicePixelRatio || 1;
  const w = container.clientWidth, h = container.clientHeight;
  if (!w || !h) return null;
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "11px ui-monospace, Menlo, Consolas, monospace";
  ctx.fillStyle = ST.cssVar("--muted");
  return { ctx, w, h };
};

ST.el = function (tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
};

ST.token = {
  get() { return sessionStorage.getItem("steadytune-token") || ""; },
  set(t) { if (t) sessionStorage.setItem("steadytune-token", t); else sessionStorage.removeItem("steadytune-token"); },
};

// Served to other machines, every read needs the token: in a header, like the controls, never a cookie.
ST.authHeaders = function (headers) {
  const t = ST.token.get();
  return t ? Object.assign({}, headers, { "X-Steadytune-Token": t }) : headers;
};

// Asked once per tab (the token stays in its session storage), then the page starts again.
ST.askToken = function () {
  if (document.getElementById("token-gate")) return;
  const input = ST.el("input", { type: "password", id: "gate-token", placeholder: "dashboard token", autocomplete: "off", size: "24" });
  const form = ST.el("form", { class: "token-gate", id: "token-gate" },
    ST.el("span", { text: "This dashboard is reachable from other machines: enter its token to see the runs." }),
    input, ST.el("button", { type: "submit", text: "open" }));
  form.addEventListener("submit", (e) => { e.preventDefault(); ST.token.set(input.value.trim()); location.reload(); });
  (document.querySelector("main") || document.body).prepend(form);
  input.focus();
};

ST.getJSON = async function (url) {
  const r = await fetch(url, { headers: ST.authHeaders({ Accept: "application/json" }), cache: "no-store" });
  if (r.status === 401) { ST.askToken(); throw new Error("this dashboard needs its token"); }
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
};

// Server-Sent Events read with fetch, because EventSource cannot send the token header.
// url: a string, or a function called at each (re)connection; on: {event name: fn(data)};
// live(bool): connected or not. Reconnects after the server's `retry:` (or its Retry-After on 503).
ST.stream = function (url, on, live) {
  let stopped = false, ctrl = null, retry = 1000;
  const dispatch = (frame) => {
    let name = "message";
    const data = [];
    for (const line of frame.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("retry:")) retry = Number(line.slice(6)) || retry;
    }
    if (!data.length || !on[name]) return;
    try { on[name](JSON.parse(data.join("\n"))); } catch (err) { console.error(`stream ${name}:`, err); }
  };
  (async function run() {
    while (!stopped) {
      let wait = retry;
      ctrl = new AbortController();
      try {
        const r = await fetch(typeof url === "function" ? url() : url,
          { headers: ST.authHeaders({ Accept: "text/event-stream" }), cache: "no-store", signal: ctrl.signal });
        if (r.status === 401) { live(false); ST.askToken(); return; }
        if (r.status === 503) wait = 1000 * (Number(r.headers.get("Retry-After")) || 5);
        if (!r.ok || !r.body) throw new Error(`HTTP ${r.status}`);
        live(true);
        const reader = r.body.getReader(), dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) { dispatch(buf.slice(0, i)); buf = buf.slice(i + 2); }
        }
      } catch (err) {
        if (stopped) return;
      }
      live(false);
      await new Promise((res) => setTimeout(res, wait));
    }
  })();
  return { close() { stopped = true; if (ctrl) ctrl.abort(); } };
};

ST.postJSON = async function (url, body) {
  // The token travels in a header, never a cookie, so another site cannot make the browser send it.
  const r = await fetch(url, {
    method: "POST", cache: "no-store",
    headers: { "Content-Type": "application/json", "X-Steadytune-Token": ST.token.get() },
    body: JSON.stringify(body),
  });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
  return data;
};

ST.theme = {
  init() {
    const saved = localStorage.getItem("steadytune-theme");
    const light = saved ? saved === "light" : window.matchMedia("(prefers-color-scheme: light)").matches;
    document.documentElement.dataset.theme = light ? "light" : "dark";
    const b = document.getElementById("theme");
    if (b) b.addEventListener("click", () => {
      const next = document.documentElement.dataset.theme === "light" ? "dark" : "light";
      document.documentElement.dataset.theme = next;
      localStorage.setItem("steadytune-theme", next);
      window.dispatchEvent(new Event("themechange"));
    });
  },
};

ST.stateBadge = function (state) {
  const s = (state || "unknown").toLowerCase();
  return ST.el("span", { class: `badge s-${s.replace(/[^a-z]/g, "")}`, text: s });
};
