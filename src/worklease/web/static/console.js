// worklease operator console: live updates without a reload. The page's <main> is fetched
// again every second (only its HTML, X-Worklease-Partial: 1) while the tab is visible;
// countdowns tick between fetches; actions ask for confirmation first.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var status = document.getElementById("status");
  var PERIOD = 1000;
  var lastOk = Date.now();
  var fetchedAt = Date.now();

  function tick() {
    var elapsed = (Date.now() - fetchedAt) / 1000;
    var cells = document.querySelectorAll(".countdown[data-left]");
    for (var i = 0; i < cells.length; i++) {
      var raw = cells[i].getAttribute("data-left");
      if (raw === "" || raw === "None" || raw === null) { continue; }
      var left = Math.max(parseFloat(raw) - elapsed, 0);
      cells[i].textContent = left < 60 ? left.toFixed(1) + "s"
        : Math.floor(left / 60) + "m" + String(Math.floor(left % 60)).padStart(2, "0") + "s";
    }
    if (status) {
      var age = Math.round((Date.now() - lastOk) / 1000);
      status.textContent = document.hidden ? "paused" : (age > 3 ? "stale: " + age + "s" : "live");
      status.className = "status " + (age > 3 ? "stale" : "live");
    }
  }

  function refresh() {
    if (!main || main.getAttribute("data-live") !== "1" || document.hidden) { return; }
    var request = new XMLHttpRequest();
    request.open("GET", window.location.pathname + window.location.search);
    request.setRequestHeader("X-Worklease-Partial", "1");
    request.onload = function () {
      if (request.status >= 200 && request.status < 300) {
        var active = document.activeElement;
        if (active && main.contains(active) && (active.tagName === "INPUT" || active.tagName === "SELECT")) {
          lastOk = Date.now();
          return; // the operator is typing a filter: keep the form as it is
        }
        main.innerHTML = request.responseText;
        fetchedAt = Date.now();
        lastOk = Date.now();
        bind();
        tick();
      } else if (request.status === 401) {
        window.location.reload();
      }
    };
    request.send();
  }

  function bind() {
    // Bar widths from data-width: the page's CSP allows no inline style attribute.
    var fills = document.querySelectorAll(".bar .fill[data-width]");
    for (var j = 0; j < fills.length; j++) {
      var bar = fills[j].querySelector("i");
      if (bar) { bar.style.width = fills[j].getAttribute("data-width") + "%"; }
    }
    var forms = document.querySelectorAll("form.action[data-confirm]");
    for (var i = 0; i < forms.length; i++) {
      forms[i].addEventListener("submit", function (event) {
        if (!window.confirm(this.getAttribute("data-confirm") + ". Go on?")) {
          event.preventDefault();
        }
      });
    }
  }

  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } });
  bind();
  tick();
  setInterval(refresh, PERIOD);
  setInterval(tick, 250);
})();
