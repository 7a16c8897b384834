// Ledger dashboard: progressive enhancement, no library, no build step.
//
// Every page works without this script. With it:
// - the board follows /ui/board/events ("changed") and the campaign page follows
//   the campaign's journal (/campaigns/{id}/events, the API's own stream), and
//   each swaps in fresh server-rendered copies of its [data-live-region] parts;
// - the campaign page appends journal events as they arrive, resuming after the
//   newest seq the server rendered (so a reload resumes where the page stands);
// - an attempt's page, while the attempt runs, follows the same stream and
//   appends that attempt's output and events as they are journaled;
// - live output and journal panels follow new lines while they are scrolled to
//   the bottom (where they start), and stay put once the operator scrolled up;
// - the board can be driven from the keyboard: j/k (or arrows) move between
//   campaigns, Enter opens one, / goes to the search field;
// - rows picked on the board (its checkboxes) stay picked across live refreshes,
//   and "pick all" picks the page;
// - the theme toggle switches light / dark / auto at once and keeps the choice
//   in the ledger_theme cookie (the server renders it on the next page);
// - a page with data-refresh-every (the workers view) refreshes on that tick;
// - streams close while the tab is hidden (Page Visibility API) and reopen,
//   with one refresh, when it is shown again;
// - forms with data-confirm ask before they post.
(function () {
  "use strict";

  var body = document.body;
  var live = document.getElementById("live");

  function setLive(state, title) {
    if (!live) return;
    live.dataset.state = state;
    live.textContent = state;
    live.title = title || state;
  }

  // --- live regions -----------------------------------------------------------
  var refreshing = false;
  var pending = false;
  var timer = null;

  function refresh() {
    if (refreshing) { pending = true; return; }
    refreshing = true;
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store",
                                  headers: { "X-Ledger-Refresh": "1" } })
      .then(function (r) {
        if (r.redirected && r.url.indexOf("/ui/login") !== -1) { window.location.reload(); return null; }
        return r.ok ? r.text() : null;
      })
      .then(function (html) {
        if (html === null || html === undefined) return;
        var fresh = new DOMParser().parseFromString(html, "text/html");
        // Keep the keyboard where it was: a refreshed card takes the focus back.
        var focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.campaign : null;
        document.querySelectorAll("[data-live-region]").forEach(function (region) {
          var next = fresh.getElementById(region.id);
          if (!next || next.innerHTML === region.innerHTML) return;
          // Keep picked what the operator picked (a checkbox's state is not markup).
          region.querySelectorAll("input[form=picked]:checked").forEach(function (box) {
            var twin = next.querySelector('input[form=picked][value="' + CSS.escape(box.value) + '"]');
            if (twin) twin.checked = true;
          });
          var all = region.querySelector("#pick-all");
          var allTwin = next.querySelector("#pick-all");
          if (all && allTwin) allTwin.checked = all.checked;
          // Keep open what the operator opened.
          region.querySelectorAll("details[open][id]").forEach(function (d) {
            var twin = next.querySelector("#" + CSS.escape(d.id));
            if (twin) twin.open = true;
          });
          region.replaceWith(next);
        });
        if (focused && !document.activeElement.closest("[data-live-region]")) {
          var again = document.querySelector('#lanes .card[data-campaign="' + focused + '"]');
          if (again) again.focus({ preventScroll: true });
        }
        countPicked();
        body.dataset.refreshes = String(Number(body.dataset.refreshes || "0") + 1);
      })
      .catch(function () { /* the next event or tick tries again */ })
      .then(function () {
        refreshing = false;
        if (pending) { pending = false; schedule(100); }
      });
  }

  function schedule(delay) {
    if (timer !== null) return;
    timer = window.setTimeout(function () { timer = null; refresh(); }, delay);
  }

  // --- a stream that pauses while the tab is hidden ------------------------------
  function follow(url, attach) {
    var source = null;
    var ended = false;

    function open() {
      if (source || ended || document.hidden) return;
      source = new EventSource(url());
      source.onopen = function () { setLive("live", "Live: updates as they happen"); };
      source.onerror = function () {
        if (source && source.readyState === EventSource.CLOSED) {
          // The server said there is nothing more (e.g. 204 after the end).
          source = null; ended = true;
          setLive("ended", "The stream has ended");
        } else {
          setLive("reconnecting", "Reconnecting…");
        }
      };
      attach(source, function () { ended = true; if (source) source.close(); source = null; setLive("ended", "The stream has ended"); });
    }

    function close() {
      if (source) { source.close(); source = null; }
      setLive("paused", "Paused while this tab is hidden");
    }

    document.addEventListener("visibilitychange", function () {
      if (document.hidden) { close(); }
      else if (!ended) { open(); schedule(0); }
    });
    open();
  }

  // --- the board ---------------------------------------------------------------
  var boardStream = body.dataset.stream;
  if (boardStream) {
    follow(function () { return boardStream; }, function (source) {
      source.addEventListener("changed", function () { schedule(150); });
    });
  }

  // --- journal streams (a campaign's page, an attempt's page) ----------------------
  var journalStream = body.dataset.journalStream;
  var types = (body.dataset.eventTypes || "").split(",").filter(Boolean);

  function cell(cls, text, tag) {
    var el = document.createElement(tag || "span");
    el.className = cls;
    el.textContent = text;
    return el;
  }

  function describe(e) {
    var p = e.payload || {};
    if (e.type === "transition") {
      var line = (p.transition || "closed") + ": " + (p.from || "–") + " → " + p.to;
      var extra = p.reason || p.failure_reason;
      return extra ? line + " (" + extra + ")" : line;
    }
    if (e.type === "output") return String(p.text || "");
    var text = Object.keys(p).sort().map(function (key) {
      var value = typeof p[key] === "string" ? p[key] : JSON.stringify(p[key]);
      return key + "=" + (value.length > 40 ? value.slice(0, 40) + "…" : value);
    }).join("  ");
    return text.length > 200 ? text.slice(0, 200) + "…" : text;
  }

  // --- panels that follow new lines -----------------------------------------------
  // A panel follows (keeps its newest line in view) while it is scrolled to the
  // bottom, which is where it starts; scrolling up stops that, and a "newer
  // lines" button appears when lines arrive meanwhile; scrolling back down (or
  // the button) follows again.
  function follower(panel) {
    var following = true;
    var jump = document.createElement("button");
    jump.type = "button";
    jump.className = "jump small";
    jump.hidden = true;
    jump.textContent = "newer lines below ↓";
    panel.insertAdjacentElement("afterend", jump);
    function atBottom() { return panel.scrollHeight - panel.scrollTop - panel.clientHeight < 24; }
    function mark() { panel.dataset.following = following ? "true" : "false"; if (following) jump.hidden = true; }
    function toBottom() { panel.scrollTop = panel.scrollHeight; following = true; mark(); }
    panel.addEventListener("scroll", function () { following = atBottom(); mark(); });
    jump.addEventListener("click", toBottom);
    toBottom();
    return function (node) {
      panel.appendChild(node);
      if (following) panel.scrollTop = panel.scrollHeight;
      else jump.hidden = false;
    };
  }

  function appendEvent(list, e) {
    var li = document.createElement("li");
    li.dataset.seq = String(e.seq);
    li.className = "ev fresh ev-" + String(e.type).replace(/\./g, "-");
    var t = new Date(e.created_at);
    li.appendChild(cell("seq", String(e.seq)));
    li.appendChild(cell("t", t.toISOString().slice(11, 19)));
    li.appendChild(cell("type", e.type));
    li.appendChild(cell("actor", e.actor));
    li.appendChild(e.type === "output" ? cell("out", describe(e), "pre") : cell("what", describe(e)));
    return li;
  }

  // Follow the journal from the head the server rendered; each event once,
  // however often the stream reconnects (?from= on a new connection, and the
  // browser's own Last-Event-ID when it reconnects by itself).
  function followJournal(head, onEvent) {
    var lastSeq = head;
    follow(function () { return journalStream + "?from=" + lastSeq; }, function (source, end) {
      function handle(message) {
        var e;
        try { e = JSON.parse(message.data); } catch (err) { return; }
        if (e.seq <= lastSeq && !e.synthetic) return;  // already handled
        if (!e.synthetic) lastSeq = e.seq;
        onEvent(e);
        if (e.type === "transition" && ["confirmed", "dismissed", "abandoned"].indexOf((e.payload || {}).to) !== -1) end();
      }
      types.forEach(function (type) { source.addEventListener(type, handle); });
      source.onmessage = handle;
    });
  }

  var journal = document.getElementById("journal");
  if (journalStream && journal && body.dataset.page === "campaign") {
    var addToJournal = follower(journal);
    followJournal(Number(body.dataset.journalHead || "0"), function (e) {
      if (!e.synthetic) { journal.dataset.head = String(e.seq); addToJournal(appendEvent(journal, e)); }
      // Output is shown as it comes; anything else may change the rest of the page.
      if (e.type !== "output") schedule(250);
    });
  }

  var output = document.getElementById("output");
  var attemptJournal = document.getElementById("attempt-journal");
  if (journalStream && output && body.dataset.page === "attempt") {
    var generation = Number(body.dataset.generation);
    var shown = Number(body.dataset.shownHead || "0");
    var addOutput = follower(output);
    var addToAttemptJournal = attemptJournal ? follower(attemptJournal) : null;
    followJournal(Number(body.dataset.journalHead || "0"), function (e) {
      if (e.synthetic || e.seq <= shown) { schedule(250); return; }
      if (e.generation === generation) {
        if (e.type === "output") {
          output.classList.remove("empty-log");
          addOutput(document.createTextNode(String((e.payload || {}).text || "")));
        } else if (addToAttemptJournal) {
          addToAttemptJournal(appendEvent(attemptJournal, e));
        }
      }
      // A transition (recorded, failed, reaped, abandoned) ends or moves the
      // attempt: refresh its header and log tail.
      if (e.type !== "output") schedule(250);
    });
  }

  // --- keyboard navigation of the board ------------------------------------------------
  if (body.dataset.page === "board") {
    var typing = function (el) {
      return el && (el.tagName === "INPUT" || el.tagName === "SELECT" || el.tagName === "TEXTAREA" || el.isContentEditable);
    };
    document.addEventListener("keydown", function (event) {
      if (event.altKey || event.ctrlKey || event.metaKey || typing(document.activeElement)) return;
      var cards = Array.prototype.slice.call(document.querySelectorAll("#lanes .card, #campaign-list tbody tr[data-campaign] a:first-child"));
      var at = cards.indexOf(document.activeElement);
      var step = { j: 1, ArrowDown: 1, k: -1, ArrowUp: -1 }[event.key];
      if (step && cards.length) {
        event.preventDefault();
        var next = at === -1 ? (step > 0 ? 0 : cards.length - 1) : Math.min(Math.max(at + step, 0), cards.length - 1);
        cards[next].focus();
        cards[next].scrollIntoView({ block: "nearest" });
      } else if (event.key === "/") {
        var search = document.querySelector("#filters input[name=q]");
        if (search) { event.preventDefault(); search.focus(); }
      }
    });
  }

  // --- rows picked for a bulk action -----------------------------------------------
  function countPicked() {
    var counter = document.getElementById("picked-count");
    if (!counter) return;
    var n = document.querySelectorAll("input[form=picked][name=id]:checked").length;
    counter.dataset.count = String(n);
    counter.textContent = n ? n + " picked" : "pick rows to act on them";
    document.querySelectorAll("#abandon-picked, #reopen-picked").forEach(function (b) { b.disabled = n === 0; });
  }
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box || box.type !== "checkbox") return;
    if (box.id === "pick-all") {
      document.querySelectorAll("input[form=picked][name=id]").forEach(function (b) { b.checked = box.checked; });
    }
    if (box.id === "pick-all" || box.getAttribute("form") === "picked") countPicked();
  });
  countPicked();

  // --- the theme toggle: auto -> dark -> light -> auto --------------------------------
  var themeForm = document.getElementById("theme-form");
  if (themeForm) {
    themeForm.addEventListener("submit", function (event) {
      event.preventDefault();
      var chosen = themeForm.elements.theme.value;
      var root = document.documentElement;
      if (chosen === "auto") {
        delete root.dataset.theme;
        document.cookie = "ledger_theme=; Path=/ui; Max-Age=0; SameSite=Lax";
      } else {
        root.dataset.theme = chosen;
        document.cookie = "ledger_theme=" + chosen + "; Path=/ui; Max-Age=31536000; SameSite=Lax" +
          (window.location.protocol === "https:" ? "; Secure" : "");
      }
      var after = { auto: "dark", dark: "light", light: "auto" }[chosen];
      var button = document.getElementById("theme-toggle");
      themeForm.elements.theme.value = after;
      button.dataset.theme = chosen;
      button.textContent = "theme: " + chosen;
      button.title = "Theme: " + chosen + " (click for " + after + ")";
      button.setAttribute("aria-label", "Theme: " + chosen + "; switch to " + after);
    });
  }

  // --- pages that refresh on a tick (the registry changes without events) ------------
  var every = Number(body.dataset.refreshEvery || "0");
  if (every > 0) {
    setLive("live", "Refreshed every " + every + " s");
    window.setInterval(function () { if (!document.hidden) schedule(0); }, every * 1000);
  }

  // --- confirmations ------------------------------------------------------------------
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form && form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
})();
