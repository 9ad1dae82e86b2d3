// zobench's dashboard: what every page shares. The numbers are computed by zobench publish
// (harness/analysis/site.py), with the functions the CLI uses; the pages draw and filter them.
// Text from results (target names, errors, commit messages) only ever becomes a text node or
// an attribute, never markup; Plotly's labels, which render a few tags, get it escaped (esc).
"use strict";

const Z = {
  params() { return new URLSearchParams(location.search); },

  // the view's state in the URL, so that a link pasted into a pull request opens the same view
  setParams(values) {
    const p = Z.params();
    for (const [k, v] of Object.entries(values)) {
      if (v === null || v === undefined || v === "") p.delete(k); else p.set(k, v);
    }
    const q = p.toString();
    history.replaceState(null, "", location.pathname + (q ? "?" + q : ""));
  },

  async json(path) {
    if (location.protocol === "file:") {    // browsers refuse to fetch from a page opened from disk
      const folder = decodeURIComponent(location.pathname.replace(/\/[^/]*$/, "")) || ".";
      const page = location.pathname.replace(/.*\//, "") + location.search;
      throw new Error(`This page loads ${path}, and a browser loads no data into a page opened from disk ` +
                      `(file://); only the overview (index.html) works from there. Serve the site: ` +
                      `python3 -m http.server -d '${folder}' (or zobench publish --serve), ` +
                      `then open http://localhost:8000/${page}`);
    }
    const r = await fetch(path);
    if (!r.ok) throw new Error(`${path}: not published (HTTP ${r.status})`);
    return r.json();
  },

  el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
    return e;
  },

  link(href, text, attrs) { return Z.el("a", { href, ...(attrs || {}) }, text); },
  keyHref(id, extra) { return "key.html?" + new URLSearchParams({ k: id, ...(extra || {}) }); },
  compareHref(a, b, extra) { return "compare.html?" + new URLSearchParams({ a: Z.short(a), b: Z.short(b), ...(extra || {}) }); },
  machineHref(fp) { return "machine.html?" + new URLSearchParams({ f: fp.slice(0, 16) }); },
  short(c) { return String(c).slice(0, 12); },
  fmt(x, digits) { return x === null || x === undefined ? "-" : Number(x).toPrecision(digits || 4); },
  esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  },

  nav(title) {
    const header = document.getElementById("nav");
    header.append(Z.el("strong", {}, "zobench"), " ", Z.link("index.html", "overview"), " ",
                  Z.link("machine.html", "machines"));
    document.getElementById("title").textContent = title;
    document.title = "zobench: " + title;
  },

  fail(e) {
    document.getElementById("main").append(Z.el("p", { class: "error" }, String(e && e.message || e)));
  },

  // a series' step times as a small line, drawn here as SVG (the overview loads no chart library)
  sparkline(values, verdict) {
    const ns = "http://www.w3.org/2000/svg", w = 120, h = 24;
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h); svg.setAttribute("class", "spark " + verdict);
    const ys = values.filter(v => v !== null);
    if (ys.length) {
      const lo = Math.min(...ys), hi = Math.max(...ys), span = hi - lo || 1;
      const step = values.length > 1 ? (w - 4) / (values.length - 1) : 0;
      const pts = [];
      values.forEach((v, i) => { if (v !== null) pts.push(`${(2 + i * step).toFixed(1)},${(h - 2 - (v - lo) / span * (h - 4)).toFixed(1)}`); });
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("points", pts.join(" "));
      svg.append(line);
    }
    return svg;
  },
};
