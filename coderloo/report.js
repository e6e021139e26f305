// Draws a coderloo run report from the JSON block #run-data (coderloo/report.py) as SVG charts.
// Text from the run (task ids, completions, feedback) only ever goes in through textContent, so
// the browser shows it and never parses it as markup.
"use strict";

const data = JSON.parse(document.getElementById("run-data").textContent);
const SVG_NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#3b6fb6", "#e07b39", "#3f9e5a", "#c9453c", "#8a63b8", "#8c6d46", "#d06fb0", "#6b7785", "#b5a02c", "#2ea3b5"];
const W = 560, H = 250, M = { left: 46, right: 14, top: 10, bottom: 34 };

function html(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function svg(tag, attrs, parent) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (parent) parent.appendChild(node);
  return node;
}

function tooltip(node, text) {
  svg("title", {}, node).textContent = text;
}

function fmt(x, digits = 3) {
  return x === null || x === undefined ? "-" : Number(x.toFixed(digits)).toString();
}

function percent(x) {
  return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%";
}

// About `count` round tick values covering [lo, hi].
function ticks(lo, hi, count) {
  const raw = (hi - lo) / count, power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * power).find((s) => s >= raw);
  const out = [];
  for (let t = Math.ceil(lo / step - 1e-9) * step; t <= hi + 1e-9 * step; t += step) out.push(Number(t.toPrecision(12)));
  return out;
}

function valueRange(values, fixed) {
  if (fixed) return fixed;
  const finite = values.filter((v) => v !== null);
  let lo = Math.min(0, ...finite), hi = Math.max(...finite, lo);
  if (hi - lo < 1e-9) hi = lo + 1;  // all zero (or no values): still a readable axis
  const pad = (hi - lo) * 0.05;
  return [lo < 0 ? lo - pad : lo, hi + pad];
}

function card(parent, title, note, className = "") {
  const node = html("section", ("card " + className).trim());
  node.appendChild(html("h2", "", title));
  if (note) node.appendChild(html("p", "note", note));
  parent.appendChild(node);
  return node;
}

function notRecorded(parent, what) {
  parent.appendChild(html("div", "not-recorded", what + ": not recorded in this run's files"));
}

function legend(parent, names) {
  const box = html("div", "legend");
  names.forEach((name, i) => {
    const item = html("span");
    const swatch = html("span", "swatch");
    swatch.style.background = PALETTE[i % PALETTE.length];
    item.append(swatch, name);
    box.appendChild(item);
  });
  parent.appendChild(box);
}

// An empty chart with a y axis over `yRange` and horizontal grid lines; returns the SVG and the
// y scale. The x axis is the caller's.
function frame(parent, name, yRange, yTitle, height = H) {
  const chart = svg("svg", { class: "chart", "data-chart": name, viewBox: `0 0 ${W} ${height}`, role: "img" });
  const [lo, hi] = yRange, bottom = height - M.bottom;
  const y = (v) => bottom - ((v - lo) / (hi - lo)) * (bottom - M.top);
  for (const t of ticks(lo, hi, 5)) {
    svg("line", { class: "grid-line", x1: M.left, x2: W - M.right, y1: y(t), y2: y(t) }, chart);
    svg("text", { x: M.left - 6, y: y(t) + 4, "text-anchor": "end" }, chart).textContent = fmt(t);
  }
  svg("line", { class: "axis", x1: M.left, x2: W - M.right, y1: bottom, y2: bottom }, chart);
  if (yTitle) svg("text", { x: 12, y: M.top + (bottom - M.top) / 2, "text-anchor": "middle",
                            transform: `rotate(-90 12 ${M.top + (bottom - M.top) / 2})` }, chart).textContent = yTitle;
  parent.appendChild(chart);
  return { chart, y, bottom };
}

// Labels under the x axis at `marks` ([x, label] pairs), at most about ten of them.
function xAxis(chart, bottom, marks, title) {
  const every = Math.max(1, Math.ceil(marks.length / 10));
  marks.forEach(([x, label], i) => {
    if (i % every && i !== marks.length - 1) return;
    svg("text", { x, y: bottom + 14, "text-anchor": "middle" }, chart).textContent = label;
  });
  if (title) svg("text", { x: M.left + (W - M.left - M.right) / 2, y: bottom + 29, "text-anchor": "middle" }, chart).textContent = title;
}

// Lines over x = `x` (numbers) or, with `labels`, over evenly spaced categories. A point per
// value (class "point"), one path per series (class "line"), gaps where a value is null.
function lineChart(parent, name, { x, labels, series, yRange, xTitle, yTitle, radius = 2 }) {
  const { chart, y, bottom } = frame(parent, name, valueRange(series.flatMap((s) => s.values), yRange), yTitle);
  const left = M.left + 8, right = W - M.right - 8;
  let positions, marks;
  if (labels) {
    const n = labels.length;
    positions = labels.map((_, i) => (n === 1 ? (left + right) / 2 : left + (i * (right - left)) / (n - 1)));
    marks = labels.map((label, i) => [positions[i], label]);
  } else {
    const lo = Math.min(...x), hi = Math.max(...x, lo + 1), xPos = (v) => left + ((v - lo) / (hi - lo)) * (right - left);
    positions = x.map(xPos);
    marks = ticks(lo, hi, 6).filter(Number.isInteger).map((t) => [xPos(t), String(t)]);
  }
  xAxis(chart, bottom, marks, xTitle);
  series.forEach((s, k) => {
    const color = PALETTE[k % PALETTE.length];
    let d = "", pen = "M";
    s.values.forEach((v, i) => {
      if (v === null) { pen = "M"; return; }
      d += `${pen}${positions[i].toFixed(1)},${y(v).toFixed(1)}`;
      pen = "L";
    });
    svg("path", { class: "line", d, fill: "none", stroke: color, "stroke-width": 1.8, "stroke-linejoin": "round" }, chart);
    s.values.forEach((v, i) => {
      if (v === null) return;
      const dot = svg("circle", { class: "point", cx: positions[i], cy: y(v), r: radius, fill: color }, chart);
      tooltip(dot, `${labels ? labels[i] : (xTitle || "x") + " " + x[i]}: ${s.name} ${fmt(v)}`);
    });
  });
  legend(parent, series.map((s) => s.name));
}

// One stacked bar per step (class "bar" on every segment); missing parts count as 0.
function stackedBars(parent, name, { x, parts, yTitle, xTitle }) {
  const names = Object.keys(parts);
  const totals = x.map((_, i) => names.reduce((sum, p) => sum + (parts[p][i] || 0), 0));
  const { chart, y, bottom } = frame(parent, name, valueRange(totals), yTitle);
  const slot = (W - M.left - M.right) / x.length, width = Math.max(1, slot * 0.75);
  const positions = x.map((_, i) => M.left + slot * (i + 0.5));
  x.forEach((step, i) => {
    let base = 0;
    names.forEach((p, k) => {
      const v = parts[p][i] || 0;
      const bar = svg("rect", { class: "bar", x: positions[i] - width / 2, y: y(base + v), width,
                                height: Math.max(0, y(base) - y(base + v)), fill: PALETTE[k % PALETTE.length] }, chart);
      tooltip(bar, `step ${step}: ${p} ${fmt(v)} s`);
      base += v;
    });
  });
  xAxis(chart, bottom, x.map((step, i) => [positions[i], String(step)]), xTitle);
  legend(parent, names);
}

// Horizontal bars: a row per group (difficulty level, task family), a bar per column (evaluation).
function groupedBars(parent, name, { columns, rows }, width = W) {
  const groups = Object.keys(rows);
  const barH = 9, rowH = columns.length * (barH + 2) + 10;
  const labelW = Math.min(220, 12 + 6.4 * Math.max(...groups.map((g) => g.length)));
  const height = M.top + groups.length * rowH + 30;
  const chart = svg("svg", { class: "chart", "data-chart": name, viewBox: `0 0 ${width} ${height}`, role: "img" });
  const left = labelW, right = width - M.right - 34, bottom = height - 24;
  const x = (v) => left + v * (right - left);
  for (const t of [0, 0.25, 0.5, 0.75, 1]) {
    svg("line", { class: "grid-line", x1: x(t), x2: x(t), y1: M.top, y2: bottom }, chart);
    svg("text", { x: x(t), y: bottom + 14, "text-anchor": "middle" }, chart).textContent = percent(t).replace(".0", "");
  }
  groups.forEach((group, r) => {
    const top = M.top + r * rowH + 5;
    svg("text", { x: left - 8, y: top + (columns.length * (barH + 2)) / 2 + 3, "text-anchor": "end" }, chart).textContent = group;
    columns.forEach((column, c) => {
      const v = rows[group][c];
      if (v === null) return;
      const bar = svg("rect", { class: "bar", x: left, y: top + c * (barH + 2), width: Math.max(0.5, x(v) - left), height: barH,
                                fill: PALETTE[c % PALETTE.length] }, chart);
      tooltip(bar, `${group}, ${column}: ${percent(v)}`);
      if (c === columns.length - 1) svg("text", { x: x(v) + 4, y: top + c * (barH + 2) + barH - 1 }, chart).textContent = percent(v);
    });
  });
  parent.appendChild(chart);
  legend(parent, columns);
}

function table(parent, className, header, rows) {
  const node = html("table", className);
  const head = node.createTHead().insertRow();
  header.forEach(([text, cls]) => { const th = html("th", cls || "", text); head.appendChild(th); });
  const body = node.createTBody();
  rows.forEach((cells) => {
    const tr = body.insertRow();
    cells.forEach(([content, cls]) => {
      const td = tr.insertCell();
      if (cls) td.className = cls;
      if (content instanceof Node) td.appendChild(content); else td.textContent = content;
    });
  });
  parent.appendChild(node);
  return node;
}

function header(root) {
  const box = html("header", "card");
  box.appendChild(html("h1", "", "coderloo run " + data.run));
  if (data.span) box.appendChild(html("div", "muted", data.span));
  const chips = html("div", "chips");
  for (const [label, value] of data.highlights) {
    const chip = html("span", "chip");
    chip.append(label + " ", html("b", "", value));
    chips.appendChild(chip);
  }
  if (!data.highlights.length) chips.appendChild(html("span", "muted", "config.yaml: not in the run directory"));
  box.appendChild(chips);
  const stages = [["base", "start"], ["after_sft", "after SFT"], ["final", "final"]];
  if (data.summary) {
    const present = stages.filter(([key]) => data.summary[key]);
    const metrics = [...new Set(present.flatMap(([key]) => Object.keys(data.summary[key])))];
    table(box, "summary", [["held-out"], ...metrics.map((m) => [m.replaceAll("_", " "), "num"])],
          present.map(([key, label]) => [[label], ...metrics.map((m) => [percent(data.summary[key][m]), "num"])]));
  } else {
    box.appendChild(html("div", "muted", "summary.json: not in the run directory (the run has not finished)"));
  }
  root.appendChild(box);
}

function charts(root) {
  const grid = html("div", "grid");
  root.appendChild(grid);

  const train = card(grid, "Training reward and pass rate", "Mean reward and share of passing completions of each RL step's samples.");
  if (data.train.step.length) {
    lineChart(train, "train", { x: data.train.step, xTitle: "RL step", radius: 1.8,
      series: [{ name: "mean reward", values: data.train.reward_mean }, { name: "pass rate", values: data.train.pass_rate }] });
  } else notRecorded(train, "RL steps");

  const policy = card(grid, "Policy entropy", "Mean token entropy (nats) of the policy on each RL step's trained tokens: "
    + "exploration collapsing shows here first.");
  if (data.train.entropy.some((v) => v !== null)) {
    lineChart(policy, "entropy", { x: data.train.step, xTitle: "RL step", radius: 1.8, series: [{ name: "entropy", values: data.train.entropy }] });
  } else notRecorded(policy, "Policy entropy");

  const clipping = card(grid, "Clipped tokens", "Share of each RL step's trained tokens whose ratio was clipped: below 1 - eps_low "
    + "with a negative advantage, above 1 + eps_high with a positive one.");
  if (data.train.clip_fraction_high.some((v) => v !== null)) {
    lineChart(clipping, "clipping", { x: data.train.step, xTitle: "RL step", radius: 1.8,
      series: [{ name: "low", values: data.train.clip_fraction_low }, { name: "high", values: data.train.clip_fraction_high }] });
  } else notRecorded(clipping, "Clipped tokens");

  if (data.train.value_loss.some((v) => v !== null)) {  // PPO's value model: only runs that have one
    const value = card(grid, "Value model", "PPO's value model on each RL step: explained variance of the returns by its estimates "
      + "before the step (1: it predicts them; 0: no better than their mean), and its clipped value loss.");
    lineChart(value, "value", { x: data.train.step, xTitle: "RL step", radius: 1.8,
      series: [{ name: "explained variance", values: data.train.explained_variance }, { name: "value loss", values: data.train.value_loss }] });
  }

  const components = Object.entries(data.train.components);
  if (components.length) {  // reward.components: only runs that plug some in
    const plugged = card(grid, "Reward components", "Mean score in [0, 1] of each plugged-in reward component over each RL "
      + "step's samples (reward.components).");
    lineChart(plugged, "components", { x: data.train.step, xTitle: "RL step", radius: 1.8,
      series: components.map(([name, values]) => ({ name, values })) });
  }

  const sft = card(grid, "SFT loss", "Next-token loss on reference solutions, per warm-up step.");
  if (data.sft.step.length && data.sft.loss.some((v) => v !== null)) {
    lineChart(sft, "sft", { x: data.sft.step, xTitle: "SFT step", radius: 1.8, series: [{ name: "SFT loss", values: data.sft.loss }] });
  } else notRecorded(sft, "SFT steps");

  const held = card(grid, "Held-out evaluation", "pass@k (unbiased estimator) and greedy pass@1 at every evaluation.");
  const metrics = [...new Set(data.evals.flatMap((e) => Object.keys(e).filter((k) => k !== "label")))];
  if (data.evals.length && metrics.length) {
    lineChart(held, "eval", { x: data.evals.map((_, i) => i), labels: data.evals.map((e) => e.label), yRange: [0, 1], radius: 3,
      series: metrics.map((m) => ({ name: m, values: data.evals.map((e) => (e[m] === undefined ? null : e[m])) })) });
  } else notRecorded(held, "Evaluations");

  const byDifficulty = card(grid, "Held-out pass rate by difficulty", "Share of passing evaluation samples per difficulty level.");
  if (data.by_difficulty) {
    const rows = Object.fromEntries(Object.entries(data.by_difficulty.rows).map(([level, v]) => ["level " + level, v]));
    groupedBars(byDifficulty, "by_difficulty", { columns: data.by_difficulty.columns, rows });
  } else notRecorded(byDifficulty, "Pass rate by difficulty");

  const timeline = card(grid, "Step timeline", "Seconds of each RL step, by part; the stack is the step's time (time_step_s). "
    + "Evaluations run between steps, in no step's time; the step after one may find its rollouts made already.");
  if (data.timeline) {
    stackedBars(timeline, "timeline", { x: data.timeline.step, parts: data.timeline.step_parts, yTitle: "seconds", xTitle: "RL step" });
  } else notRecorded(timeline, "Step times");

  const rollouts = card(grid, "Rollouts of each step", "Generating the step's samples and scoring the last ones. They are made in the background "
    + "while earlier steps learn (and evaluate), so they are not part of the step timeline's stack.");
  if (data.timeline && data.timeline.rollout_parts) {
    stackedBars(rollouts, "rollouts", { x: data.timeline.step, parts: data.timeline.rollout_parts, yTitle: "seconds", xTitle: "RL step" });
  } else notRecorded(rollouts, "Rollout times");

  const byFamily = card(grid, "Held-out pass rate by task family", "Share of passing evaluation samples per family.", "wide");
  if (data.by_family) groupedBars(byFamily, "by_family", data.by_family, 2 * W);
  else notRecorded(byFamily, "Pass rate by task family");
}

function samples(root) {
  const box = card(root, "Sampled completions", "The group shown for each of the latest RL steps: every completion, its reward and the reward service's feedback.");
  if (!data.samples.length) { notRecorded(box, "Samples"); return; }
  for (const group of data.samples) {
    box.appendChild(html("h3", "", `step ${group.step} · ${group.task}`));
    table(box, "samples", [["#", "num"], ["reward", "num"], ["completion"], ["feedback"]], group.rows.map((row, i) => {
      let feedback;
      if (row.feedback === null) feedback = ["not recorded", "muted"];
      else if (row.feedback === "") feedback = ["passed", "passed"];  // the service's feedback is empty for a pass
      else feedback = [html("pre", "", row.feedback)];
      return [[String(i + 1), "num"], [row.reward === null ? "-" : row.reward.toFixed(2), "num"], [html("pre", "", row.text)], feedback];
    }));
  }
}

const root = document.getElementById("report");
header(root);
charts(root);
samples(root);
