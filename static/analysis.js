/* rackbench analysis charts: redraw the server's SVG chart with uPlot (hover values, drag to zoom, double-click
   to reset) from the same data, embedded as JSON by the page, and offer it as a PNG. Without JavaScript, or without
   uPlot, the SVG stays. */
(function () {
  "use strict";
  var DPR = window.devicePixelRatio || 1;

  function fmt(v, binary) {
    if (v == null || !isFinite(v)) return "–";
    var units = binary ? [["TiB", Math.pow(1024, 4)], ["GiB", Math.pow(1024, 3)], ["MiB", 1048576], ["KiB", 1024]]
                       : [["T", 1e12], ["G", 1e9], ["M", 1e6], ["k", 1e3]];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(v) >= units[i][1]) return +(v / units[i][1]).toPrecision(3) + (binary ? " " : "") + units[i][0];
    }
    return String(+v.toPrecision(4));
  }

  function download(blob, name) {
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(function () { URL.revokeObjectURL(a.href); }, 1000);
  }

  function png(u, spec) {
    var src = u.ctx.canvas, row = 18 * DPR, out = document.createElement("canvas");
    out.width = src.width;
    out.height = src.height + row * (spec.series.length + spec.references.length) + 8 * DPR;
    var ctx = out.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, out.width, out.height);
    ctx.drawImage(src, 0, 0);
    ctx.font = 12 * DPR + "px system-ui, sans-serif";
    var entries = spec.series.map(function (s) { return [s.label, s.color, s.dashed]; })
      .concat(spec.references.map(function (r) { return [r.label + ": " + fmt(r.y / (spec.y_divisor || 1)), "#4b5563", true]; }));
    entries.forEach(function (e, i) {
      var y = src.height + row * (i + 1);
      ctx.strokeStyle = e[1];
      ctx.lineWidth = 2 * DPR;
      ctx.setLineDash(e[2] ? [6 * DPR, 4 * DPR] : []);
      ctx.beginPath();
      ctx.moveTo(10 * DPR, y - 4 * DPR);
      ctx.lineTo(34 * DPR, y - 4 * DPR);
      ctx.stroke();
      ctx.fillStyle = "#1d2430";
      ctx.fillText(e[0], 40 * DPR, y);
    });
    out.toBlob(function (blob) { download(blob, (spec.title || "chart").replace(/[^A-Za-z0-9_.-]+/g, "-") + ".png"); });
  }

  function yRange(u, min, max, refs, bars, solid) {  // from zero, holding the references, the visible error bars
    // and the measured lines: a dashed ideal line far above them is clipped, not allowed to squash them
    var top = isFinite(solid) ? solid : max;
    var low = Math.min(0, min), high = Math.max.apply(null, [top].concat(refs)), xs = u.data[0];
    var x0 = u.scales.x.min == null ? -Infinity : u.scales.x.min, x1 = u.scales.x.max == null ? Infinity : u.scales.x.max;
    bars.forEach(function (bar) {
      if (!u.series[bar.index].show) return;
      for (var i = 0; i < xs.length; i++) {
        if (xs[i] < x0 || xs[i] > x1 || bar.low[i] == null || bar.high[i] == null) continue;
        low = Math.min(low, bar.low[i]);
        high = Math.max(high, bar.high[i]);
      }
    });
    return [low, high * 1.05];
  }

  function drawErrorBars(u, bars, holder) {  // mean ± stdev per point, as the server's SVG draws them
    var ctx = u.ctx, xs = u.data[0], drawn = 0;
    ctx.save();
    ctx.beginPath();
    ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
    ctx.clip();
    ctx.lineWidth = DPR;
    bars.forEach(function (bar) {
      if (!u.series[bar.index].show) return;
      ctx.strokeStyle = bar.color;
      ctx.beginPath();
      for (var i = 0; i < xs.length; i++) {
        var low = bar.low[i], high = bar.high[i];
        if (low == null || high == null || !(high > low)) continue;
        var x = u.valToPos(xs[i], "x", true);
        ctx.moveTo(x, u.valToPos(low, "y", true));
        ctx.lineTo(x, u.valToPos(high, "y", true));
        drawn++;
      }
      ctx.stroke();
    });
    ctx.restore();
    holder.dataset.errorBars = String(drawn);
  }

  function enhance(figure) {
    var node = document.getElementById(figure.dataset.chart), box = figure.querySelector(".chart-svg");
    if (!node || !box || !window.uPlot) return;
    var spec = JSON.parse(node.textContent), binary = spec.x_unit === "B", yd = spec.y_divisor || 1;
    var fy = function (v) { return v == null ? fmt(v) : fmt(v / yd); };  // y in the axis title's unit
    var keep = spec.data[0].map(function (x) { return !spec.x_log || x > 0; });  // a log axis has no place for x <= 0
    var kept = function (col) { return col.filter(function (_, i) { return keep[i]; }); };
    var data = spec.data.map(kept), refs = spec.references.map(function (r) { return r.y; });
    var solidMax = -Infinity;  // the highest value of the measured (not dashed) lines
    spec.series.forEach(function (s, i) {
      if (s.dashed) return;
      data[i + 1].forEach(function (v) { if (v != null && v > solidMax) solidMax = v; });
    });
    var xText = {};  // the server's own texts (common.numbers) for hover values, by x and by point
    spec.data[0].forEach(function (x, i) { if (spec.x_text) xText[x] = spec.x_text[i]; });
    var series = [{ label: spec.x_label, value: function (u, v) { return v in xText ? xText[v] : fmt(v, binary); } }],
      bars = [], bands = [];
    spec.series.forEach(function (s, i) {
      var low = s.low ? kept(s.low) : null, high = s.high ? kept(s.high) : null, text = s.text ? kept(s.text) : null;
      series.push({
        label: s.label, stroke: s.color, width: 2, dash: s.dashed ? [6, 4] : undefined, spanGaps: true,
        points: { show: !s.dashed && !s.band },
        value: function (u, v, si, di) {  // a point's spread after its mean, as in the SVG's error bar
          var spread = !s.band && low && di != null && low[di] != null && high[di] > low[di];
          var shown = text && di != null && text[di] != null ? text[di] : fy(v);
          return shown + (spread ? " (" + fy(low[di]) + "–" + fy(high[di]) + ")" : "");
        }
      });
      if (low && high && !s.band) bars.push({ index: i + 1, color: s.color, low: low, high: high });
    });
    spec.series.forEach(function (s, i) {  // min/max bands of downsampled lines: two more series, filled between
      if (!s.band || !s.low || !s.high) return;
      var edge = { stroke: s.color + "66", width: 1, spanGaps: true, points: { show: false },
                   value: function (u, v) { return fy(v); } };
      series.push(Object.assign({ label: s.label + " · max" }, edge), Object.assign({ label: s.label + " · min" }, edge));
      data.push(kept(s.high), kept(s.low));
      bands.push({ series: [series.length - 2, series.length - 1], fill: s.color + "4d" });
    });
    var holder = document.createElement("div");
    holder.className = "chart-live";
    box.after(holder);
    var opts = {
      width: Math.max(320, box.clientWidth || 800), height: 340, series: series,
      scales: {
        x: { time: false, distr: spec.x_log ? 3 : 1, log: binary ? 2 : 10 },
        y: { range: function (u, min, max) { return yRange(u, min, max, refs, bars, solidMax); } }
      },
      axes: [
        { label: spec.x_label + (spec.x_log ? " (log scale)" : ""), values: function (u, v) { return v.map(function (x) { return fmt(x, binary); }); },
          incrs: spec.x_integer && !spec.x_log ? [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] : undefined },
        { label: spec.y_label, size: 70, values: function (u, v) { return v.map(function (y) { return fy(y); }); } }
      ],
      bands: bands,
      cursor: { drag: { x: true, y: false } },
      hooks: { draw: [function (u) { drawErrorBars(u, bars, holder); }, function (u) {
        spec.references.forEach(function (r) {
          var y = u.valToPos(r.y, "y", true), ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#4b5563";
          ctx.lineWidth = 1.5 * DPR;
          ctx.setLineDash([2 * DPR, 4 * DPR]);
          ctx.beginPath();
          ctx.moveTo(u.bbox.left, y);
          ctx.lineTo(u.bbox.left + u.bbox.width, y);
          ctx.stroke();
          ctx.fillStyle = "#1d2430";
          ctx.font = 11 * DPR + "px system-ui, sans-serif";
          ctx.fillText(r.label + ": " + fy(r.y), u.bbox.left + 4 * DPR, y - 4 * DPR);
          ctx.restore();
        });
      }] }
    };
    var plot = new window.uPlot(opts, data, holder);
    holder.dataset.bands = String(bands.length);
    box.hidden = true;
    var tools = figure.querySelector(".chart-tools"), button = document.createElement("button");
    button.type = "button";
    button.className = "button small";
    button.textContent = "Download PNG";
    button.addEventListener("click", function () { png(plot, spec); });
    tools.appendChild(button);
    window.addEventListener("resize", function () { plot.setSize({ width: Math.max(320, holder.clientWidth), height: 340 }); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("figure[data-chart]").forEach(enhance);
  });
})();
