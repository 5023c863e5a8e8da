// Renders the page's Vega-Lite specs (vegaEmbed is inlined above) and links their
// time axes: brushing the timeline's overview sets the `xzoom` signal of every view.
(function () {
  "use strict";
  const specs = JSON.parse(document.getElementById("specs").textContent);
  if (typeof vegaEmbed === "undefined") {  // a page of a report folder, opened without the folder's vega-embed-*.js
    document.querySelectorAll(".chart").forEach(function (el) {
      el.innerHTML = '<p class="error">the charts need the vega-embed-*.js file of the folder this page was written ' +
                     'into (open the page there, or `diloco-chaos report RUN_DIR` writes a page that holds it)</p>';
    });
    document.body.dataset.ready = "1";
    return;
  }
  const views = {};
  const opts = { renderer: "svg", actions: { export: true, source: false, compiled: false, editor: false },
                 tooltip: { theme: "light" } };
  let zoom = null;

  function setZoom(range) {
    zoom = range && range[1] > range[0] ? [range[0], range[1]] : null;
    const label = document.getElementById("zoom-label");
    if (label) label.textContent = zoom ? zoom[0].toFixed(1) + " – " + zoom[1].toFixed(1) + " s" : "whole run";
    return Promise.all(Object.values(views).map(function (v) {
      try { return v.signal("xzoom", zoom).runAsync(); } catch (e) { return null; }  // a view without a time axis
    }));
  }
  window.chaosZoom = setZoom;

  const jobs = Object.keys(specs).map(function (key) {
    const el = document.getElementById("chart-" + key);
    if (!el) return Promise.resolve();
    return vegaEmbed(el, specs[key], opts).then(function (res) {
      views[key] = res.view;
      el.dataset.rendered = "1";
    }).catch(function (err) {
      el.innerHTML = '<p class="error"></p>';
      el.firstChild.textContent = "this chart failed to render: " + err;
      console.error(err);
    });
  });

  window.chaosReady = Promise.all(jobs).then(function () {
    const tl = views.timeline;
    if (tl) {
      tl.addSignalListener("brush", function (_name, value) {
        const r = value && Object.values(value)[0];
        setZoom(r && r.length === 2 ? r : null);
      });
    }
    document.querySelectorAll("[data-zoom]").forEach(function (b) {
      b.addEventListener("click", function () {
        const z = b.dataset.zoom.split(",").map(Number);
        setZoom(z);
        document.getElementById("timeline").scrollIntoView({ behavior: "smooth" });
      });
    });
    document.querySelectorAll("[data-reset-zoom]").forEach(function (b) {
      b.addEventListener("click", function () { setZoom(null); });
    });
    document.addEventListener("keydown", function (e) { if (e.key === "Escape") setZoom(null); });
    document.querySelectorAll("[data-copy]").forEach(function (b) {
      b.addEventListener("click", function () {
        const text = document.getElementById(b.dataset.copy).textContent;
        const done = function () { b.textContent = "copied"; setTimeout(function () { b.textContent = "copy"; }, 1500); };
        if (navigator.clipboard && window.isSecureContext) {
          navigator.clipboard.writeText(text).then(done, function () { selectText(b.dataset.copy); });
        } else { selectText(b.dataset.copy); }
      });
    });
    document.body.dataset.ready = "1";
  });

  function selectText(id) {
    const range = document.createRange();
    range.selectNodeContents(document.getElementById(id));
    const sel = window.getSelection();
    sel.removeAllRanges();
    sel.addRange(range);
  }
})();
