// farm's own small SVG charts: line plots (and stacked bars) with nice ticks, a legend and a hover
// readout. No library: the console fetches nothing from the internet and runs under a strict CSP, so
// everything here is built with createElementNS and textContent, and listeners are attached in JS.
//
//   linePlot(container, {series: [{name, points: [[x, y], ...]}], xTime, xLabel, yLabel, yMin, yMax,
//                        xMin, xMax, percent, title, height, emptyText})
//   barPlot(container, {...the same, barWidth})   // stacked bars, one stack per x
//
// x is seconds since the epoch when xTime is set. A null y breaks a line (a gap). Re-rendering into
// the same container replaces everything in it, listeners included, so polling never leaks.

const SVG_NS = "http://www.w3.org/2000/svg";

// A fixed palette (colour-blind friendly enough, readable on white): series keep their colour by index.
export const PALETTE = [
  "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
  "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
];

const MARGIN = {top: 10, right: 14, bottom: 24, left: 56};

// ---- small helpers -----------------------------------------------------------------------------

function svgEl(tag, attrs = {}, text) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v !== undefined && v !== null) el.setAttribute(k, String(v));
  }
  if (text !== undefined) el.textContent = String(text);
  return el;
}

function div(cls, text) {
  const el = document.createElement("div");
  if (cls) el.className = cls;
  if (text !== undefined) el.textContent = String(text);
  return el;
}

const pad2 = (n) => String(n).padStart(2, "0");

// HH:MM in local time (HH:MM:SS when the ticks are closer than a minute).
export function formatClock(seconds, withSeconds = false) {
  const d = new Date(seconds * 1000);
  const hm = `${pad2(d.getHours())}:${pad2(d.getMinutes())}`;
  return withSeconds ? `${hm}:${pad2(d.getSeconds())}` : hm;
}

// MM-DD in local time, for ticks a day or more apart.
export function formatDate(seconds) {
  const d = new Date(seconds * 1000);
  return `${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}`;
}

// A number for an axis or a readout: short, with as many decimals as the step between ticks needs.
export function formatNumber(v, step) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a >= 1e9) return `${trim(v / 1e9)}G`;
  if (a >= 1e6) return `${trim(v / 1e6)}M`;
  if (a >= 1e4) return `${trim(v / 1e3)}k`;
  let decimals;
  if (step !== undefined && step > 0) {
    decimals = Math.max(0, Math.min(6, -Math.floor(Math.log10(step))));
  } else {
    decimals = a === 0 || Number.isInteger(v) ? 0 : a < 1 ? 3 : a < 100 ? 2 : 1;
  }
  return v.toFixed(decimals);
}

function trim(v) {
  return String(Number(v.toFixed(2)));
}

function formatPercent(v, step) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const decimals = step !== undefined && step > 0 ? Math.max(0, Math.min(3, -Math.floor(Math.log10(step * 100)))) : 1;
  return `${(v * 100).toFixed(decimals)}%`;
}

// ---- ticks -------------------------------------------------------------------------------------

// A "nice" step (1, 2 or 5 times a power of ten) that cuts [lo, hi] into about `count` pieces.
function niceStep(lo, hi, count) {
  const raw = (hi - lo) / Math.max(1, count);
  if (!(raw > 0) || !Number.isFinite(raw)) return 1;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const nice = norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10;
  return nice * mag;
}

function numberTicks(lo, hi, step) {
  const ticks = [];
  const first = Math.ceil(lo / step - 1e-9) * step;
  for (let t = first; t <= hi + step * 1e-9 && ticks.length < 50; t += step) {
    ticks.push(Math.abs(t) < step * 1e-9 ? 0 : t);
  }
  return ticks;
}

// Time steps a clock reader expects (seconds): ticks land on whole minutes and hours of local time.
const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

function timeTicks(lo, hi, count) {
  const range = hi - lo;
  const step = TIME_STEPS.find((s) => range / s <= count) || 86400 * Math.ceil(range / count / 86400);
  // Align to local time: shift by the zone offset so hour ticks fall on local hours.
  const offset = -new Date(lo * 1000).getTimezoneOffset() * 60;
  const first = Math.ceil((lo + offset) / step) * step - offset;
  const ticks = [];
  for (let t = first; t <= hi && ticks.length < 50; t += step) ticks.push(t);
  return {ticks, step};
}

// ---- data --------------------------------------------------------------------------------------

function cleanSeries(series) {
  return (series || []).map((s, i) => ({
    name: String(s.name ?? `series ${i + 1}`),
    color: s.color || PALETTE[i % PALETTE.length],
    points: (s.points || [])
      .filter((p) => p && Number.isFinite(Number(p[0])))
      .map((p) => [Number(p[0]), p[1] === null || p[1] === undefined || !Number.isFinite(Number(p[1])) ? null : Number(p[1])])
      .sort((a, b) => a[0] - b[0]),
  }));
}

function extent(values) {
  let lo = Infinity;
  let hi = -Infinity;
  for (const v of values) {
    if (v === null) continue;
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  return [lo, hi];
}

// The nearest point of a sorted [[x, y]] list to x (binary search).
function nearest(points, x) {
  if (!points.length) return null;
  let lo = 0;
  let hi = points.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (points[mid][0] <= x) lo = mid; else hi = mid;
  }
  return Math.abs(points[lo][0] - x) <= Math.abs(points[hi][0] - x) ? points[lo] : points[hi];
}

// ---- the frame shared by both kinds of plot ----------------------------------------------------

// Builds the container's contents (title, svg, legend, readout) and the scales; returns what the
// caller needs to draw marks, or null when there is too little data (the empty state is drawn).
function frame(container, opts, series, {xs, ys}) {
  container.replaceChildren();
  container.classList.add("plot");
  if (opts.title) container.append(div("plot-title", opts.title));

  const realYs = ys.filter((v) => v !== null);
  const distinctXs = new Set(xs);
  if (realYs.length < 2 || distinctXs.size < 2) {
    const empty = div("plot-empty", opts.emptyText || "no data yet");
    if (realYs.length === 1) {
      // One sample: say what it is rather than draw a lone dot with no scale.
      const s = series.find((ser) => ser.points.some((p) => p[1] !== null));
      const p = s.points.find((q) => q[1] !== null);
      const xText = opts.xTime ? formatClock(p[0], true) : formatNumber(p[0]);
      const yText = opts.percent ? formatPercent(p[1]) : formatNumber(p[1]);
      empty.textContent = `not enough data yet: one point (${s.name} ${yText} at ${xText})`;
    }
    container.append(empty);
    return null;
  }

  const width = Math.max(320, Math.round(container.clientWidth || 600));
  const height = opts.height || 200;
  const m = {...MARGIN, bottom: MARGIN.bottom + (opts.xLabel ? 14 : 0), left: MARGIN.left + (opts.yLabel ? 12 : 0)};
  const plotW = width - m.left - m.right;
  const plotH = height - m.top - m.bottom;

  // x domain: the data, or the caller's window (so plots of one window line up).
  let [x0, x1] = extent(xs);
  if (opts.xMin !== undefined && opts.xMin !== null) x0 = Math.min(x0, opts.xMin);
  if (opts.xMax !== undefined && opts.xMax !== null) x1 = Math.max(x1, opts.xMax);

  // y domain: the data widened to nice ticks, unless the caller fixed an end.
  let [y0, y1] = extent(realYs);
  if (opts.yMin !== undefined && opts.yMin !== null) y0 = Math.min(opts.yMin, y0);
  if (opts.yMax !== undefined && opts.yMax !== null) y1 = Math.max(opts.yMax, y1);
  if (y0 === y1) {
    // A flat line: give it room (all zeros: 0..1, not -1..1).
    const padY = y0 === 0 ? 1 : Math.abs(y0) * 0.1;
    if (y0 !== 0 && (opts.yMin === undefined || opts.yMin === null)) y0 -= padY;
    y1 += padY;
  }
  const yStep = niceStep(y0, y1, Math.max(2, Math.round(plotH / 40)));
  if (opts.yMin === undefined || opts.yMin === null) y0 = Math.floor(y0 / yStep) * yStep;
  if (opts.yMax === undefined || opts.yMax === null) y1 = Math.ceil(y1 / yStep) * yStep;

  const sx = (x) => m.left + ((x - x0) / (x1 - x0)) * plotW;
  const sy = (y) => m.top + plotH - ((y - y0) / (y1 - y0)) * plotH;
  const invX = (px) => x0 + ((px - m.left) / plotW) * (x1 - x0);

  const svg = svgEl("svg", {
    viewBox: `0 0 ${width} ${height}`, width: "100%", height, preserveAspectRatio: "none",
    class: "plot-svg", role: "img",
  });
  if (opts.title) svg.append(svgEl("title", {}, opts.title));

  // Grid and y ticks.
  const yFmt = opts.percent ? (v) => formatPercent(v, yStep) : (v) => formatNumber(v, yStep);
  const axes = svgEl("g", {class: "plot-axes"});
  for (const t of numberTicks(y0, y1, yStep)) {
    const y = sy(t);
    axes.append(svgEl("line", {x1: m.left, x2: m.left + plotW, y1: y, y2: y, class: "plot-grid"}));
    axes.append(svgEl("text", {x: m.left - 5, y: y + 3.5, "text-anchor": "end", class: "plot-tick"}, yFmt(t)));
  }
  // x ticks.
  const xCount = Math.max(2, Math.round(plotW / 90));
  let xFmt;
  let xTicks;
  if (opts.xTime) {
    const tt = timeTicks(x0, x1, xCount);
    xTicks = tt.ticks;
    // Day-sized steps (a window of days) are labelled with the date, everything else HH:MM.
    xFmt = tt.step >= 86400 ? formatDate : (v) => formatClock(v, tt.step < 60);
  } else {
    const step = niceStep(x0, x1, xCount);
    xTicks = numberTicks(x0, x1, step);
    xFmt = (v) => formatNumber(v, step);
  }
  for (const t of xTicks) {
    const x = sx(t);
    axes.append(svgEl("line", {x1: x, x2: x, y1: m.top + plotH, y2: m.top + plotH + 4, class: "plot-axis"}));
    axes.append(svgEl("text", {x, y: m.top + plotH + 15, "text-anchor": "middle", class: "plot-tick"}, xFmt(t)));
  }
  axes.append(svgEl("line", {x1: m.left, x2: m.left + plotW, y1: m.top + plotH, y2: m.top + plotH, class: "plot-axis"}));
  axes.append(svgEl("line", {x1: m.left, x2: m.left, y1: m.top, y2: m.top + plotH, class: "plot-axis"}));
  if (opts.xLabel) {
    axes.append(svgEl("text", {x: m.left + plotW / 2, y: height - 3, "text-anchor": "middle", class: "plot-label"}, opts.xLabel));
  }
  if (opts.yLabel) {
    const cy = m.top + plotH / 2;
    axes.append(svgEl("text", {x: 11, y: cy, "text-anchor": "middle", transform: `rotate(-90 11 ${cy})`, class: "plot-label"}, opts.yLabel));
  }
  svg.append(axes);

  const marks = svgEl("g", {class: "plot-marks"});
  svg.append(marks);
  container.append(svg);

  // The legend: one swatch per series (names are untrusted text: textContent only).
  const legend = div("plot-legend");
  for (const s of series) {
    const item = div("plot-legend-item");
    const sw = document.createElement("span");
    sw.className = "plot-swatch";
    sw.style.backgroundColor = s.color;
    item.append(sw, document.createTextNode(s.name));
    legend.append(item);
  }
  container.append(legend);

  const readout = div("plot-readout");
  readout.hidden = true;
  container.append(readout);

  return {svg, marks, readout, sx, sy, invX, x0, x1, y0, y1, m, plotW, plotH, width, height, xFmt, yFmt,
    fullXFmt: opts.xTime ? (v) => formatClock(v, true) : (v) => formatNumber(v)};
}

// Hover: a vertical guide at the nearest x, and a readout of every series there.
function attachHover(f, candidateXs, linesAt) {
  const {svg, readout, sx, invX, m, plotH, width} = f;
  const xsSorted = [...new Set(candidateXs)].sort((a, b) => a - b).map((x) => [x, 0]);
  const guide = svgEl("line", {y1: m.top, y2: m.top + plotH, class: "plot-guide", visibility: "hidden"});
  svg.append(guide);
  const overlay = svgEl("rect", {x: m.left, y: m.top, width: f.plotW, height: plotH, class: "plot-overlay"});
  svg.append(overlay);

  overlay.addEventListener("mousemove", (ev) => {
    const rect = svg.getBoundingClientRect();
    if (!rect.width) return;
    const px = (ev.clientX - rect.left) * (width / rect.width);
    const hit = nearest(xsSorted, invX(px));
    if (!hit) return;
    const x = hit[0];
    const gx = sx(x);
    guide.setAttribute("x1", gx);
    guide.setAttribute("x2", gx);
    guide.setAttribute("visibility", "visible");

    readout.replaceChildren(div("plot-readout-x", f.fullXFmt(x)));
    for (const {name, color, text} of linesAt(x)) {
      const line = div("plot-readout-line");
      const sw = document.createElement("span");
      sw.className = "plot-swatch";
      sw.style.backgroundColor = color;
      line.append(sw, document.createTextNode(`${name}: ${text}`));
      readout.append(line);
    }
    readout.hidden = false;
    // Keep the readout inside the plot: left of the cursor on the right half.
    const left = (gx / width) * rect.width;
    const onRight = left > rect.width / 2;
    readout.style.left = onRight ? "" : `${left + 12}px`;
    readout.style.right = onRight ? `${rect.width - left + 12}px` : "";
  });
  overlay.addEventListener("mouseleave", () => {
    guide.setAttribute("visibility", "hidden");
    readout.hidden = true;
  });
}

// ---- redraw on resize --------------------------------------------------------------------------

// The SVG is drawn at its container's width; when the window changes size, plots still on the page are
// drawn again (those that left the page are forgotten, so nothing accumulates).
const drawn = new Map();
let resizeTimer = null;

function remember(container, draw, opts) {
  for (const c of drawn.keys()) if (!c.isConnected) drawn.delete(c);
  drawn.set(container, {draw, opts});
}

window.addEventListener("resize", () => {
  clearTimeout(resizeTimer);
  resizeTimer = setTimeout(() => {
    for (const [container, {draw, opts}] of drawn) {
      if (container.isConnected) draw(container, opts); else drawn.delete(container);
    }
  }, 150);
});

// ---- line plot ---------------------------------------------------------------------------------

export function linePlot(container, opts = {}) {
  remember(container, linePlot, opts);
  const series = cleanSeries(opts.series);
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1]));
  const f = frame(container, opts, series, {xs, ys});
  if (!f) return;

  for (const s of series) {
    // Split the series at nulls: each run of real points is one polyline; a lone point is a dot.
    let run = [];
    const flush = () => {
      if (run.length === 1) {
        f.marks.append(svgEl("circle", {cx: f.sx(run[0][0]), cy: f.sy(run[0][1]), r: 2.5, fill: s.color}));
      } else if (run.length > 1) {
        const pts = run.map(([x, y]) => `${f.sx(x).toFixed(1)},${f.sy(y).toFixed(1)}`).join(" ");
        f.marks.append(svgEl("polyline", {points: pts, fill: "none", stroke: s.color, "stroke-width": 1.6,
          "stroke-linejoin": "round", "vector-effect": "non-scaling-stroke"}));
      }
      run = [];
    };
    for (const p of s.points) {
      if (p[1] === null) flush(); else run.push(p);
    }
    flush();
  }

  const fmt = opts.percent ? (v) => formatPercent(v) : (v) => formatNumber(v);
  attachHover(f, xs, (x) => series.map((s) => {
    const p = nearest(s.points, x);
    // Only a point at (or very near) this x counts; otherwise the series has nothing here.
    const near = p && Math.abs(p[0] - x) <= (f.x1 - f.x0) / 200;
    return {name: s.name, color: s.color, text: near ? fmt(p[1]) : "–"};
  }));
}

// ---- stacked bars ------------------------------------------------------------------------------

// One stack per x (e.g. an activity bucket's start), each series a segment; barWidth is in x units.
export function barPlot(container, opts = {}) {
  remember(container, barPlot, opts);
  const series = cleanSeries(opts.series);
  const xSet = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
  const value = (s, x) => {
    const p = s.points.find((q) => q[0] === x);
    return p && p[1] !== null ? p[1] : 0;
  };
  const totals = xSet.map((x) => series.reduce((sum, s) => sum + value(s, x), 0));
  let barWidth = opts.barWidth;
  if (!(barWidth > 0)) barWidth = xSet.length > 1 ? xSet[1] - xSet[0] : 1;
  // Stacks start at 0 and the y extent is the tallest; the x domain runs to the end of the last bar.
  const f = frame(container, {...opts, yMin: opts.yMin ?? 0}, series,
    {xs: xSet.length ? [...xSet, xSet[xSet.length - 1] + barWidth] : [], ys: totals.length ? [...totals, 0] : []});
  if (!f) return;

  const gap = 0.12;
  xSet.forEach((x) => {
    let base = 0;
    const left = f.sx(x + barWidth * gap / 2);
    const w = Math.max(1, f.sx(x + barWidth * (1 - gap / 2)) - left);
    for (const s of series) {
      const v = value(s, x);
      if (v <= 0) continue;
      const top = f.sy(base + v);
      const bottom = f.sy(base);
      f.marks.append(svgEl("rect", {x: left.toFixed(1), y: top.toFixed(1), width: w.toFixed(1),
        height: Math.max(0.5, bottom - top).toFixed(1), fill: s.color}));
      base += v;
    }
  });

  // Hover picks the nearest bar centre, then reads that bar's stack.
  const fmt = opts.percent ? (v) => formatPercent(v) : (v) => formatNumber(v);
  const startOf = new Map(xSet.map((x) => [x + barWidth / 2, x]));
  attachHover(f, [...startOf.keys()], (centre) => {
    const x = startOf.get(centre);
    const lines = series.map((s) => ({name: s.name, color: s.color, text: fmt(value(s, x))}));
    lines.push({name: "total", color: "transparent", text: fmt(series.reduce((sum, s) => sum + value(s, x), 0))});
    return lines;
  });
}
