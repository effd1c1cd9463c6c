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

ST.getJSON = async function (url) {
  const r = await fetch(url, { headers: { Accept: "application/json" }, cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
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
