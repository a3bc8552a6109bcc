/**
 * pedelec-pyodide for pages that load scripts without type="module":
 *
 *   <script src="http://127.0.0.1:8765/pedelec/pedelec-pyodide.classic.js"></script>
 *
 * Takes the same data- attributes as the module's script tag, sets window.pedelecReady at
 * once (so later scripts can await it), and starts the ES module next to this file.
 */
(function () {
  var script = document.currentScript;
  var options = {};
  var d = script.dataset;
  if (d.core) options.core = d.core;
  if (d.pyodide) options.pyodide = d.pyodide;
  if (d.lock) options.lock = d.lock;
  if (d.packages) options.packages = d.packages.split(",").map(function (p) { return p.trim(); }).filter(Boolean);
  if (d.snapshot === "off") options.snapshot = false;
  if (d.webmcp !== undefined && d.webmcp !== "off") options.webmcp = true;
  var url = new URL("pedelec-pyodide.js", script.src).href;
  var ready = import(url).then(function (module) { return module.start(options); }, function (err) {
    // the module's own errors cannot be used: it did not load. Its message form, its event.
    var error = new Error("pedelec: loading pedelec-pyodide.js: cannot import " + url +
      ": Core is not running at " + new URL(url).origin + " or not reachable from this page, " +
      "or its answer lacks the CORS header Access-Control-Allow-Origin (a pedelec Core " +
      "sends it; a proxy may strip it); the console has the browser's reason (" + err.message + ")",
      { cause: err });
    error.name = "PedelecError";
    error.step = "loading pedelec-pyodide.js";
    console.error(error.message);
    document.dispatchEvent(new CustomEvent("pedelec:error", { detail: error }));
    throw error;
  });
  ready.catch(function () {}); // logged by the module; callers still see the rejection
  window.pedelecReady = ready;
})();
