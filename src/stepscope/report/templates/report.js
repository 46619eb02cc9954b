// stepscope report: embeds the Vega-Lite charts, sorts and filters the tables, expands shortened names.
(function () {
  "use strict";
  function embedCharts() {
    var boxes = document.querySelectorAll("div.chart[data-spec]");
    boxes.forEach(function (box) {
      var holder = document.getElementById(box.getAttribute("data-spec"));
      if (!holder || typeof window.vegaEmbed !== "function") { return; }
      var spec = JSON.parse(holder.textContent);
      // ast + the expression interpreter: no eval, so the page's CSP needs no 'unsafe-eval'
      window.vegaEmbed(box, spec, { mode: "vega-lite", renderer: "svg", ast: true,
                                    actions: { export: true, source: false, compiled: false, editor: false } })
        .catch(function (err) {
          var p = document.createElement("p");
          p.className = "chart-error";
          p.textContent = "chart could not be drawn: " + err;
          box.appendChild(p);
        });
    });
  }

  function cellValue(cell, numeric) {
    var v = cell.getAttribute("data-v");
    if (v === null) { v = cell.textContent; }
    if (numeric) { var n = parseFloat(v); return isNaN(n) ? -Infinity : n; }
    return v.toLowerCase();
  }

  function sortBy(th) {
    var table = th.closest("table");
    var body = table.tBodies[0];
    var index = Array.prototype.indexOf.call(th.parentNode.children, th);
    var numeric = th.getAttribute("data-type") === "num";
    // numbers sort largest first on the first click, text A-Z
    var desc = th.classList.contains("sorted-desc") ? false : th.classList.contains("sorted-asc") ? true : numeric;
    table.querySelectorAll("th").forEach(function (h) { h.classList.remove("sorted-asc", "sorted-desc"); });
    th.classList.add(desc ? "sorted-desc" : "sorted-asc");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a.cells[index], numeric), y = cellValue(b.cells[index], numeric);
      var c = x < y ? -1 : x > y ? 1 : 0;
      return desc ? -c : c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }

  function filterRows(input) {
    var table = document.getElementById(input.getAttribute("data-table"));
    var needle = input.value.toLowerCase();
    Array.prototype.forEach.call(table.tBodies[0].rows, function (r) {
      r.style.display = !needle || r.textContent.toLowerCase().indexOf(needle) >= 0 ||
        Array.prototype.some.call(r.querySelectorAll("td[data-full]"), function (c) {
          return c.getAttribute("data-full").toLowerCase().indexOf(needle) >= 0; }) ? "" : "none";
    });
  }

  function toggleName(td) {
    if (!td.hasAttribute("data-full")) { return; }
    if (!td.hasAttribute("data-short")) { td.setAttribute("data-short", td.textContent); }
    var open = td.classList.toggle("open");
    td.textContent = open ? td.getAttribute("data-full") : td.getAttribute("data-short");
  }

  document.addEventListener("click", function (e) {
    var t = e.target;
    if (t.tagName === "TH" && t.closest("table.sortable")) { sortBy(t); }
    else if (t.tagName === "TD" && t.classList.contains("name")) { toggleName(t); }
  });
  document.addEventListener("input", function (e) {
    if (e.target.classList && e.target.classList.contains("filter")) { filterRows(e.target); }
  });
  embedCharts();
})();
