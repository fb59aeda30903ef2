// Auto-refresh toggle for the Redis Lua admin pages: reloads every 5 s while checked.
// The choice is remembered per browser (localStorage). No other behaviour, no external assets.
(function () {
  "use strict";
  var box = document.getElementById("redislua-autorefresh");
  if (!box) {
    return;
  }
  var STORAGE_KEY = "django_redislua.autorefresh";
  var PERIOD_MS = 5000;
  var timer = null;
  function arm() {
    window.clearTimeout(timer);
    if (box.checked) {
      timer = window.setTimeout(function () { window.location.reload(); }, PERIOD_MS);
    }
  }
  try {
    box.checked = window.localStorage.getItem(STORAGE_KEY) === "1";
  } catch (e) {
    box.checked = false;  // storage disabled: start unchecked
  }
  box.addEventListener("change", function () {
    try {
      window.localStorage.setItem(STORAGE_KEY, box.checked ? "1" : "0");
    } catch (e) {
      // storage disabled: the toggle still works for this page view
    }
    arm();
  });
  arm();
}());
