/*
 * SenseVoice kiosk mode for demo stations (issue 40): ``?kiosk=1`` on the page, or the server's
 * setting (SENSEVOICE_KIOSK, handed in by boot(config)).
 *
 *   - no history: this browser's recent jobs and the desk's calls are neither shown nor kept (the
 *     lists in localStorage are emptied at boot and on every visitor change; the recent list, the
 *     calls table and the review editor are hidden);
 *   - each visitor's result is cleared on "Next visitor", or after ``clear_s`` seconds without a
 *     touch, a click or a key once the visitor did something: the lists emptied, then the page
 *     replaced by a fresh one at the kiosk address (the recording, the result, the job's address
 *     all gone; replace: Back does not lead to the last visitor's job);
 *   - the demo notice always on screen (a bar pinned at the top, with the button).
 *
 * window.SenseVoiceKiosk = { boot(config), active(), nextVisitor() }
 */
(function (root) {
  'use strict';

  var doc = root.document;
  var KEPT_LISTS = ['sv-recent-jobs', 'sv-desk-jobs']; // what app.js and desk.js remember of jobs
  var MIN_CLEAR_S = 5;
  var MAX_CLEAR_S = 3600;
  var DEFAULT_CLEAR_S = 120;
  var WORDS = {
    en: {
      notice: 'Demo station: what you record here is shown to you only, and cleared for the next visitor.',
      next: 'Next visitor', idle: 'Cleared after {s} s without a touch.'
    },
    zh: {
      notice: '\u6f14\u793a\u7ad9\uff1a\u60a8\u5728\u8fd9\u91cc\u7684\u5f55\u97f3\u53ea\u663e\u793a\u7ed9\u60a8\uff0c\u5e76\u4f1a\u4e3a\u4e0b\u4e00\u4f4d\u8bbf\u5ba2\u6e05\u9664\u3002',
      next: '\u4e0b\u4e00\u4f4d\u8bbf\u5ba2', idle: '\u65e0\u64cd\u4f5c {s} \u79d2\u540e\u81ea\u52a8\u6e05\u9664\u3002'
    }
  };
  var HIDDEN = '#sv-recent, #sv-desk, #sv-editor';
  var STYLE = 'html.sv-kiosk ' + HIDDEN.split(', ').join(', html.sv-kiosk ') + ' { display: none !important; }' +
    'html.sv-kiosk #sv-kiosk-bar { position: sticky; top: 0; z-index: 1000; display: flex; gap: 12px;' +
    ' align-items: center; justify-content: space-between; padding: 10px 14px; background: #fff7e6;' +
    ' border-bottom: 2px solid #f59e0b; color: #1f2937; font-size: 1rem; }' +
    'html.sv-kiosk #sv-kiosk-next { font-size: 1.1rem; padding: 8px 18px; border-radius: 8px;' +
    ' border: 1px solid #b45309; background: #f59e0b; color: #111827; cursor: pointer; }';

  var state = { on: false, clearS: DEFAULT_CLEAR_S, timer: null, touched: false, leaving: false };

  function lang() {
    var I = root.SenseVoiceI18n;
    return I && I.lang && I.lang() === 'zh' ? 'zh' : 'en';
  }

  function t(key, vars) {
    var w = WORDS[lang()][key] || WORDS.en[key];
    return String(w).replace(/\{(\w+)\}/g, function (m, k) { return vars && vars[k] != null ? String(vars[k]) : m; });
  }

  function fromQuery() {
    try { return new URLSearchParams(root.location.search).get('kiosk') === '1'; } catch (e) { return false; }
  }

  function clearS(value) {
    var n = Number(value);
    if (!isFinite(n) || n <= 0) return DEFAULT_CLEAR_S;
    return Math.min(MAX_CLEAR_S, Math.max(MIN_CLEAR_S, n));
  }

  function forgetLists() {
    KEPT_LISTS.forEach(function (key) {
      try { if (root.localStorage) root.localStorage.removeItem(key); } catch (e) { /* storage off */ }
    });
    try { if (root.sessionStorage) root.sessionStorage.clear(); } catch (e) { /* storage off */ }
  }

  function kioskAddress() {
    return root.location.pathname + '?kiosk=1';
  }

  function nextVisitor() {
    if (!state.on || state.leaving) return;
    state.leaving = true;
    if (state.timer) root.clearTimeout(state.timer);
    var A = root.SenseVoiceApp;
    try { if (A && A.reset) A.reset(); } catch (e) { /* the page goes anyway */ }
    forgetLists();
    root.location.replace(kioskAddress());
  }

  function touched() {
    state.touched = true;
    if (state.timer) root.clearTimeout(state.timer);
    state.timer = root.setTimeout(nextVisitor, state.clearS * 1000);
  }

  function bar() {
    var b = doc.createElement('div');
    b.id = 'sv-kiosk-bar';
    b.setAttribute('role', 'note');
    var text = doc.createElement('span');
    text.className = 'sv-kiosk-notice';
    text.textContent = t('notice') + ' ' + t('idle', { s: Math.round(state.clearS) });
    var next = doc.createElement('button');
    next.type = 'button';
    next.id = 'sv-kiosk-next';
    next.textContent = t('next');
    next.addEventListener('click', function (ev) { ev.stopPropagation(); nextVisitor(); });
    b.appendChild(text);
    b.appendChild(next);
    return b;
  }

  function boot(config) {
    config = config || {};
    if (state.on || !(config.enabled === true || fromQuery())) return;
    state.on = true;
    state.clearS = clearS(config.clear_s);
    doc.documentElement.classList.add('sv-kiosk');
    var style = doc.createElement('style');
    style.textContent = STYLE;
    doc.head.appendChild(style);
    forgetLists(); // a visitor who left without the button, or the page's earlier non-kiosk use
    if (!fromQuery() && root.history && root.history.replaceState) {
      try { root.history.replaceState(null, '', kioskAddress()); } catch (e) { /* sandboxed */ }
    }
    doc.body.insertBefore(bar(), doc.body.firstChild);
    ['pointerdown', 'keydown', 'input', 'change', 'drop'].forEach(function (name) {
      doc.addEventListener(name, function (ev) {
        if (ev.target && ev.target.closest && ev.target.closest('#sv-kiosk-bar')) return;
        touched();
      }, true);
    });
  }

  root.SenseVoiceKiosk = Object.freeze({
    boot: boot,
    active: function () { return state.on; },
    nextVisitor: nextVisitor
  });
})(window);
