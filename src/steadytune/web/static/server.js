// GPU server page: each GPU's memory (used, reserved, free) and the queue, polled every 2 s.
"use strict";
(function () {
  const ST = window.steadytune, fmt = ST.fmt, el = ST.el;
  ST.theme.init();
  const FINAL = new Set(["done", "failed", "cancelled"]);

  function pct(part, total) { return total ? `${Math.max(0, Math.min(100, (100 * part) / total)).toFixed(2)}%` : "0%"; }

  function bar(g) {
    // Reserved memory that a job has not allocated yet is not in "used": it is taken out of "free".
    const reserved = Math.min(g.reserved_bytes, g.free_bytes), free = g.free_bytes - reserved;
    const seg = (cls, bytes, label) => {
      const d = el("div", { class: `seg ${cls}`, title: `${label}: ${fmt.bytes(bytes)}` });
      d.style.width = pct(bytes, g.total_bytes);
      return d;
    };
    return el("div", { class: "membar" },
      seg("mem-used", g.used_bytes, "used"), seg("mem-reserved", reserved, "reserved"), seg("mem-free", free, "left"));
  }

  function gpuRow(g) {
    const util = g.util_ratio === null || g.util_ratio === undefined ? "–" : `${Math.round(100 * g.util_ratio)}%`;
    const foreign = g.foreign.length ? `foreign pids ${g.foreign.map((p) => p.pid).join(", ")}` : "";
    return el("div", { class: "gpu", "data-gpu": String(g.index) },
      el("div", { class: "gpu-head" },
        el("span", { class: "mono", text: `GPU ${g.index}` }), el("span", { class: "muted", text: g.name || "" }),
        el("span", { class: "mono", text: `used ${fmt.bytes(g.used_bytes)} · reserved ${fmt.bytes(g.reserved_bytes)} · left ${fmt.bytes(Math.max(0, g.free_bytes - g.reserved_bytes))} of ${fmt.bytes(g.total_bytes)}` }),
        el("span", { class: "muted", text: `util ${util}` }),
        el("span", { text: g.jobs.length ? `jobs ${g.jobs.join(", ")}` : "" }),
        foreign ? el("span", { class: "sev-warning", text: foreign }) : null),
      bar(g));
  }

  async function act(job, op) {
    if (!ST.token.get()) {
      const t = prompt("The operator token of this dashboard:");
      if (!t) return;
      ST.token.set(t.trim());
    }
    try { await ST.postJSON(`/api/server/jobs/${encodeURIComponent(job)}/${op}`, { confirm: true }); refresh(); }
    catch (err) { alert(`${op} ${job} failed: ${err.message}`); }
  }

  function buttons(j) {
    const ops = j.state === "held" ? ["release", "cancel"] : j.state === "queued" ? ["hold", "cancel"]
      : FINAL.has(j.state) || j.cancel_requested ? [] : ["cancel"];
    return el("td", {}, ...ops.map((op) => {
      const b = el("button", { type: "button", class: op === "cancel" ? "danger" : "", text: op });
      b.addEventListener("click", () => { if (op !== "cancel" || confirm(`Cancel ${j.id}?`)) act(j.id, op); });
      return b;
    }));
  }

  // The server's part in a job's size: each resize (GPUs before -> after), refusal, pause and resume.
  function history(j) {
    const gpus = (l) => (l && l.length ? l.join(",") : "–");
    const all = j.history || [], SHOWN = 6;  // the latest; `steadytune queue` lists them all
    const items = all.slice(-SHOWN).map((h) => {
      const when = new Date(1000 * h.ts).toLocaleTimeString();
      const what = h.kind === "grow" || h.kind === "shrink" ? `${h.kind} ${gpus(h.from)} → ${gpus(h.to)}`
        : h.kind === "pause" || h.kind === "shrink_asked" || h.kind === "shrink_refused" ? `${h.kind}${h.gpu === undefined || h.gpu === null ? "" : ` (GPU ${h.gpu})`}`
        : h.kind;
      return el("div", { class: "mono", title: h.reason || "", text: `${when} ${what}` });
    });
    const earlier = all.length > SHOWN ? el("div", { class: "muted", text: `+${all.length - SHOWN} earlier` }) : null;
    return el("td", { class: "history" }, earlier, ...items);
  }

  function jobRow(j) {
    const run = j.run || {};
    const step = run.step === null || run.step === undefined ? "–" : run.max_steps ? `${fmt.int(run.step)} / ${fmt.int(run.max_steps)}` : fmt.int(run.step);
    const state = j.state === "done" ? "completed" : j.state;
    return el("tr", { "data-job": j.id },
      el("td", { class: "mono", text: j.id }),
      el("td", {}, ST.stateBadge(state)),
      el("td", { class: "num", text: String(j.priority) }),
      el("td", { class: "num", text: `${fmt.bytes(j.need_bytes)} × ${j.gpus_wanted}`, title: j.spec.need || j.need_source }),
      el("td", { class: "mono", text: j.gpus.length ? j.gpus.join(",") : "–" }),
      el("td", {}, j.run_id && j.state !== "queued" && j.state !== "held"
        ? el("a", { href: `/run/${encodeURIComponent(j.run_id)}`, text: j.run_id }) : el("span", { class: "muted", text: j.spec.label || "" })),
      el("td", { class: "num", text: step }),
      history(j),
      el("td", { class: "muted wrap", text: j.paused ? `paused by the server: ${j.paused}` : j.reason }),
      buttons(j));
  }

  const dot = document.getElementById("live");
  async function refresh() {
    try {
      const snap = await ST.getJSON("/api/server");
      document.getElementById("headroom").textContent = `headroom ${fmt.bytes(snap.headroom_bytes)} per GPU`;
      document.getElementById("gpus").replaceChildren(...snap.gpus.map(gpuRow));
      const jobs = snap.jobs.slice().reverse();
      document.querySelector("#jobs tbody").replaceChildren(...jobs.map(jobRow));
      document.getElementById("empty").classList.toggle("hidden", jobs.length > 0);
      dot.classList.add("on");
    } catch (err) {
      dot.classList.remove("on");
    }
  }
  refresh();
  setInterval(refresh, 2000);
})();
