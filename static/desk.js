/*
 * The QA reviewer's desk (issue 23): many calls at once, the calls table, and the review editor.
 * Plain browser script, loaded after app.js (uses SenseVoiceApp.open, SenseVoiceI18n, and the tag
 * table of richtext.js, SenseVoiceRich.TAGS: no vocabulary is copied here).
 *
 *   window.SenseVoiceDesk = {
 *     boot(),                       // draws #sv-desk (intake + table) and follows opened jobs
 *     owned(), remember(jobs),      // the jobs this browser owns: [{id, q}] in localStorage
 *     refresh(),                    // the table again (POST /api/calls)
 *     keys(ev),                     // the review keyboard (space, J, K, L, E, F)
 *     shareBar, fmtClock            // pure helpers (unit-tested)
 *   };
 *
 * * Intake: several files, a folder, or zips -> POST /api/batches (a few files per request); each
 *   call's state is shown as it goes (one POST /api/calls per second for the whole batch, not one
 *   stream per call).
 * * Table: server-side paged, sorted (click a header), filtered (search, quick filters in one
 *   click: angry > 20 %, crying, laughter, flagged, not reviewed; a language), CSV of the filtered
 *   table. A row opens the call in the review view; Previous / Next call walk the table's order.
 * * Review editor (#sv-editor, under the review view of any finished job): each segment's text is
 *   editable (the model's text kept beside it, a "corrected" mark), a flag with a note, the call
 *   marked reviewed; playback speed 0.75-2x; keys (outside text fields): space play/pause,
 *   J/K previous/next segment, L loop the segment, E edit, F flag. Every change is a PATCH of the
 *   job's review (kept by the server with the job; its exports carry it) through the job's review
 *   link (links.review of its view: its download link only reads).
 *
 * Safety: DOM by createElement + textContent only (a note or a file name is never markup); URLs
 * from encoded ids and a query that must look like exp=<digits>&sig=<b64url>.
 */
(function (root) {
  'use strict';

  var doc = root.document;
  var STORE = 'sv-desk-jobs';
  var STORE_RECENT = 'sv-recent-jobs';
  var MAX_OWNED = 20000;
  var PER_REQUEST = 4; // files per batch request (each request is one upload under the limits)
  var QUERY_RE = /^exp=\d{1,12}&sig=[A-Za-z0-9_-]{1,64}$/;
  var ID_RE = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
  var SPEEDS = [0.75, 1, 1.25, 1.5, 2];
  var FINAL = { done: 1, failed: 1, purged: 1 };

  var WORDS = {
    en: {
      desk: 'Calls', intake: 'Add calls: several files, a folder, or a zip of recordings',
      choose_files: 'Choose files', choose_folder: 'Choose a folder', drop: 'or drop them here',
      uploading: 'uploading', queued: 'queued', running: 'transcribing', done: 'done', failed: 'failed',
      refused: 'refused', search: 'Search names, text and notes', all_langs: 'All languages',
      f_angry: 'Angry > 20 %', f_cry: 'Has crying', f_laugh: 'Has laughter', f_flagged: 'Flagged',
      f_unreviewed: 'Not reviewed', csv: 'Download CSV', prev_page: 'Previous page', next_page: 'Next page',
      page: 'Page {p} of {n} \u00b7 {total} calls', none: 'No calls yet: add some above.',
      c_name: 'Name', c_date: 'Date', c_dur: 'Length', c_langs: 'Languages', c_spk: 'Speakers',
      c_emo: 'Emotion', c_events: 'Events', c_flags: 'Flags', c_rev: 'Reviewed', yes: 'yes', no: 'no',
      editor: 'Review', reviewed: 'Reviewed', speed: 'Speed', prev_call: 'Previous call',
      next_call: 'Next call', edit: 'Edit', save: 'Save', cancel: 'Cancel', flag: 'Flag', unflag: 'Unflag',
      note: 'Note', corrected: 'corrected', model: 'Model:', revert: 'Use the model\u2019s text',
      saved: 'Saved', save_failed: 'Not saved: {why}', keys: 'Keys: space play/pause \u00b7 J/K previous/next segment \u00b7 L loop \u00b7 E edit \u00b7 F flag',
      speaker_all: 'one speaker', loop_on: 'Looping this segment',
      c_exp: 'Kept until', c_act: 'Actions', keep: 'Keep', del: 'Delete',
      del_confirm: 'Delete “{name}”: its recording, transcript and review? This cannot be undone.',
      act_failed: 'Not done: {why}'
    },
    zh: {
      desk: '\u901a\u8bdd', intake: '\u6dfb\u52a0\u901a\u8bdd\uff1a\u591a\u4e2a\u6587\u4ef6\u3001\u4e00\u4e2a\u6587\u4ef6\u5939\u6216\u5f55\u97f3\u538b\u7f29\u5305\uff08zip\uff09',
      choose_files: '\u9009\u62e9\u6587\u4ef6', choose_folder: '\u9009\u62e9\u6587\u4ef6\u5939', drop: '\u6216\u62d6\u5230\u8fd9\u91cc',
      uploading: '\u4e0a\u4f20\u4e2d', queued: '\u6392\u961f\u4e2d', running: '\u8f6c\u5199\u4e2d', done: '\u5b8c\u6210', failed: '\u5931\u8d25',
      refused: '\u88ab\u62d2\u7edd', search: '\u641c\u7d22\u540d\u79f0\u3001\u6587\u5b57\u548c\u5907\u6ce8', all_langs: '\u6240\u6709\u8bed\u8a00',
      f_angry: '\u6124\u6012 > 20 %', f_cry: '\u6709\u54ed\u58f0', f_laugh: '\u6709\u7b11\u58f0', f_flagged: '\u5df2\u6807\u8bb0',
      f_unreviewed: '\u672a\u5ba1\u6838', csv: '\u4e0b\u8f7d CSV', prev_page: '\u4e0a\u4e00\u9875', next_page: '\u4e0b\u4e00\u9875',
      page: '\u7b2c {p} / {n} \u9875 \u00b7 \u5171 {total} \u4e2a\u901a\u8bdd', none: '\u8fd8\u6ca1\u6709\u901a\u8bdd\uff1a\u8bf7\u5728\u4e0a\u65b9\u6dfb\u52a0\u3002',
      c_name: '\u540d\u79f0', c_date: '\u65e5\u671f', c_dur: '\u65f6\u957f', c_langs: '\u8bed\u8a00', c_spk: '\u8bf4\u8bdd\u4eba',
      c_emo: '\u60c5\u7eea', c_events: '\u4e8b\u4ef6', c_flags: '\u6807\u8bb0', c_rev: '\u5df2\u5ba1\u6838', yes: '\u662f', no: '\u5426',
      editor: '\u5ba1\u6838', reviewed: '\u5df2\u5ba1\u6838', speed: '\u500d\u901f', prev_call: '\u4e0a\u4e00\u4e2a\u901a\u8bdd',
      next_call: '\u4e0b\u4e00\u4e2a\u901a\u8bdd', edit: '\u7f16\u8f91', save: '\u4fdd\u5b58', cancel: '\u53d6\u6d88', flag: '\u6807\u8bb0', unflag: '\u53d6\u6d88\u6807\u8bb0',
      note: '\u5907\u6ce8', corrected: '\u5df2\u66f4\u6b63', model: '\u6a21\u578b\uff1a', revert: '\u6539\u56de\u6a21\u578b\u7684\u6587\u5b57',
      saved: '\u5df2\u4fdd\u5b58', save_failed: '\u672a\u4fdd\u5b58\uff1a{why}', keys: '\u6309\u952e\uff1a\u7a7a\u683c \u64ad\u653e/\u6682\u505c \u00b7 J/K \u4e0a/\u4e0b\u4e00\u6bb5 \u00b7 L \u5faa\u73af \u00b7 E \u7f16\u8f91 \u00b7 F \u6807\u8bb0',
      speaker_all: '\u4e00\u4f4d\u8bf4\u8bdd\u4eba', loop_on: '\u6b63\u5728\u5faa\u73af\u672c\u6bb5',
      c_exp: '\u4fdd\u7559\u81f3', c_act: '\u64cd\u4f5c', keep: '\u4fdd\u7559', del: '\u5220\u9664',
      del_confirm: '\u5220\u9664\u201c{name}\u201d\u7684\u5f55\u97f3\u3001\u8f6c\u5199\u548c\u5ba1\u6838\uff1f\u6b64\u64cd\u4f5c\u65e0\u6cd5\u64a4\u9500\u3002',
      act_failed: '\u672a\u5b8c\u6210\uff1a{why}'
    }
  };

  function lang() {
    var I = root.SenseVoiceI18n;
    return I && I.lang && I.lang() === 'zh' ? 'zh' : 'en';
  }

  function t(key, vars) {
    var w = WORDS[lang()][key] != null ? WORDS[lang()][key] : WORDS.en[key];
    return String(w == null ? key : w).replace(/\{(\w+)\}/g, function (m, k) {
      return vars && vars[k] != null ? String(vars[k]) : m;
    });
  }

  function el(tag, cls, text) {
    var e = doc.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = String(text);
    return e;
  }

  function button(cls, text, onClick) {
    var b = el('button', 'sv-btn ' + cls, text);
    b.type = 'button';
    b.addEventListener('click', onClick);
    return b;
  }

  function storageGet(key) {
    try { return root.localStorage ? root.localStorage.getItem(key) : null; } catch (e) { return null; }
  }

  function storageSet(key, value) {
    try { if (root.localStorage) root.localStorage.setItem(key, value); } catch (e) { /* full */ }
  }

  function queryOf(url) {
    var s = String(url || '');
    var i = s.indexOf('?');
    var q = i >= 0 ? s.slice(i + 1) : '';
    return QUERY_RE.test(q) ? q : '';
  }

  // ---- the jobs this browser owns ----

  function owned() {
    var out = [];
    var seen = Object.create(null);
    function add(e) {
      if (!e || !ID_RE.test(String(e.id)) || seen[e.id]) return;
      seen[e.id] = 1;
      out.push({ id: String(e.id), q: QUERY_RE.test(String(e.q || '')) ? String(e.q) : '' });
    }
    [STORE, STORE_RECENT].forEach(function (key) {
      try {
        var list = JSON.parse(storageGet(key) || '[]');
        if (Array.isArray(list)) list.forEach(add);
      } catch (e) { /* unreadable: ignored */ }
    });
    return out;
  }

  function remember(jobs) {
    var list = owned();
    var have = Object.create(null);
    list.forEach(function (e) { have[e.id] = 1; });
    jobs.forEach(function (j) {
      if (j && j.id && !have[j.id] && ID_RE.test(String(j.id))) {
        list.push({ id: String(j.id), q: queryOf(j.links && j.links.result) });
        have[j.id] = 1;
      }
    });
    storageSet(STORE, JSON.stringify(list.slice(-MAX_OWNED)));
  }

  function jobsBody(list) {
    return list.map(function (e) {
      var o = { id: e.id };
      var m = /^exp=(\d+)&sig=([A-Za-z0-9_-]+)$/.exec(e.q || '');
      if (m) { o.exp = m[1]; o.sig = m[2]; }
      return o;
    });
  }

  function postCalls(body) {
    return root.fetch('/api/calls', {
      method: 'POST', credentials: 'same-origin', cache: 'no-store',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body)
    });
  }

  // ---- pure helpers ----

  function fmtClock(s) {
    s = Number(s);
    if (!isFinite(s) || s < 0) return '';
    var m = Math.floor(s / 60);
    var r = Math.floor(s - m * 60);
    var h = Math.floor(m / 60);
    m = m % 60;
    var mm = (h ? (m < 10 ? '0' : '') : '') + m;
    return (h ? h + ':' : '') + mm + ':' + (r < 10 ? '0' : '') + r;
  }

  // [{emotion, share}] of one speaker, largest first, shares over 2 %
  function shareBar(shares) {
    return Object.keys(shares || {}).map(function (k) { return { emotion: k, share: Number(shares[k]) || 0 }; })
      .filter(function (x) { return x.share > 0.02; })
      .sort(function (a, b) { return b.share - a.share; });
  }

  function tag(kind, name) {
    var R = root.SenseVoiceRich;
    return R && R.TAGS && R.TAGS[kind] ? R.TAGS[kind][name] : null;
  }

  // ---- the desk: intake and table ----

  var state = {
    page: 1, per_page: 25, sort: 'created_at', desc: true, q: '', lang: '',
    filters: {}, order: [], total: 0, batch: [], batchTimer: 0, current: null, segIndex: 0,
    loop: false, editing: -1
  };
  var nodes = {};

  // the quick filters and the tag columns' sort keys: the server's (pipeline/domain/calls.py)
  var DESK = (root.SenseVoiceVocab && root.SenseVoiceVocab.desk) || { quick: [], columns: {} };
  var QUICK = DESK.quick;

  function query() {
    var q = { sort: state.sort, desc: state.desc, page: state.page, per_page: state.per_page };
    if (state.q) q.q = state.q;
    if (state.lang) q.languages = [state.lang];
    QUICK.forEach(function (f) {
      if (!state.filters[f[0]]) return;
      Object.keys(f[1]).forEach(function (k) {
        var v = f[1][k];
        q[k] = Array.isArray(v) ? (q[k] || []).concat(v) : v;
      });
    });
    return q;
  }

  function renderDesk() {
    var host = doc.getElementById('sv-desk');
    if (!host) return;
    while (host.firstChild) host.removeChild(host.firstChild);
    var box = el('section', 'sv-desk');
    box.appendChild(el('h2', 'sv-desk-title', t('desk')));
    // intake
    var intake = el('div', 'sv-intake');
    intake.appendChild(el('div', 'sv-intake-label', t('intake')));
    var files = el('input');
    files.type = 'file';
    files.multiple = true;
    files.accept = 'audio/*,video/*,.zip,application/zip';
    files.id = 'sv-batch-files';
    files.className = 'sv-visually-hidden';
    var folder = el('input');
    folder.type = 'file';
    folder.multiple = true;
    folder.setAttribute('webkitdirectory', '');
    folder.id = 'sv-batch-folder';
    folder.className = 'sv-visually-hidden';
    [files, folder].forEach(function (inp) {
      inp.addEventListener('change', function () { sendBatch(Array.prototype.slice.call(inp.files || [])); inp.value = ''; });
    });
    intake.appendChild(files);
    intake.appendChild(folder);
    intake.appendChild(button('sv-batch-choose', t('choose_files'), function () { files.click(); }));
    intake.appendChild(button('sv-batch-folder-btn', t('choose_folder'), function () { folder.click(); }));
    intake.appendChild(el('span', 'sv-intake-drop', t('drop')));
    intake.addEventListener('dragover', function (ev) { ev.preventDefault(); intake.classList.add('sv-drag'); });
    intake.addEventListener('dragleave', function () { intake.classList.remove('sv-drag'); });
    intake.addEventListener('drop', function (ev) {
      ev.preventDefault();
      intake.classList.remove('sv-drag');
      sendBatch(Array.prototype.slice.call((ev.dataTransfer && ev.dataTransfer.files) || []));
    });
    nodes.batch = el('ul', 'sv-batch');
    intake.appendChild(nodes.batch);
    box.appendChild(intake);
    // toolbar
    var bar = el('div', 'sv-desk-bar');
    var search = el('input', 'sv-desk-search');
    search.type = 'search';
    search.placeholder = t('search');
    search.setAttribute('aria-label', t('search'));
    search.value = state.q;
    var timer = 0;
    search.addEventListener('input', function () {
      root.clearTimeout(timer);
      timer = root.setTimeout(function () { state.q = search.value.trim().slice(0, 200); state.page = 1; refresh(); }, 250);
    });
    bar.appendChild(search);
    var langSel = el('select', 'sv-desk-lang');
    langSel.setAttribute('aria-label', t('c_langs'));
    var opt = el('option', '', t('all_langs'));
    opt.value = '';
    langSel.appendChild(opt);
    var L = root.SenseVoiceRich && root.SenseVoiceRich.TAGS ? root.SenseVoiceRich.TAGS.language : {};
    Object.keys(L).forEach(function (code) {
      if (root.SenseVoiceVocab && code === root.SenseVoiceVocab.noSpeech) return;
      var o = el('option', '', L[code].name);
      o.value = code;
      langSel.appendChild(o);
    });
    langSel.value = state.lang;
    langSel.addEventListener('change', function () { state.lang = langSel.value; state.page = 1; refresh(); });
    bar.appendChild(langSel);
    QUICK.forEach(function (f) {
      var b = button('sv-chip-filter' + (state.filters[f[0]] ? ' sv-on' : ''), t(f[0]), function () {
        state.filters[f[0]] = !state.filters[f[0]];
        b.classList.toggle('sv-on', !!state.filters[f[0]]);
        b.setAttribute('aria-pressed', state.filters[f[0]] ? 'true' : 'false');
        state.page = 1;
        refresh();
      });
      b.setAttribute('data-filter', f[0]);
      b.setAttribute('aria-pressed', state.filters[f[0]] ? 'true' : 'false');
      bar.appendChild(b);
    });
    bar.appendChild(button('sv-desk-csv', t('csv'), downloadCsv));
    box.appendChild(bar);
    nodes.table = el('div', 'sv-desk-table-wrap');
    box.appendChild(nodes.table);
    nodes.pager = el('div', 'sv-desk-pager');
    box.appendChild(nodes.pager);
    host.appendChild(box);
  }

  var COLUMNS = [
    ['c_name', 'name'], ['c_date', 'created_at'], ['c_dur', 'audio_seconds'], ['c_langs', 'languages'],
    ['c_spk', 'speakers'], ['c_emo', DESK.columns.emotion], ['c_events', DESK.columns.event], ['c_flags', 'flags'],
    ['c_rev', 'reviewed']
  ];

  function refresh() {
    var list = owned();
    if (!nodes.table) return Promise.resolve();
    return postCalls({ jobs: jobsBody(list), query: query() }).then(function (r) {
      return r.ok ? r.json() : null;
    }).then(function (page) {
      if (page) renderTable(page);
    }, function () {});
  }

  function renderTable(page) {
    var wrap = nodes.table;
    while (wrap.firstChild) wrap.removeChild(wrap.firstChild);
    state.total = page.total;
    state.order = page.rows.map(function (r) { return { id: r.id, q: queryOf(r.links && r.links.result) }; });
    if (!page.rows.length) {
      wrap.appendChild(el('p', 'sv-desk-none', t('none')));
    } else {
      var table = el('table', 'sv-desk-table');
      var head = el('tr');
      COLUMNS.forEach(function (c) {
        var th = el('th', 'sv-sortable', t(c[0]));
        th.setAttribute('data-sort', c[1]);
        th.tabIndex = 0;
        if (state.sort === c[1]) th.setAttribute('aria-sort', state.desc ? 'descending' : 'ascending');
        var go = function () {
          if (state.sort === c[1]) state.desc = !state.desc; else { state.sort = c[1]; state.desc = c[1] !== 'name'; }
          state.page = 1;
          refresh();
        };
        th.addEventListener('click', go);
        th.addEventListener('keydown', function (ev) { if (ev.key === 'Enter') go(); });
        head.appendChild(th);
      });
      head.appendChild(el('th', 'sv-call-exp-h', t('c_exp')));  // (not sortable: the server sorts the others)
      head.appendChild(el('th', 'sv-call-act-h', t('c_act')));
      var thead = el('thead');
      thead.appendChild(head);
      table.appendChild(thead);
      var body = el('tbody');
      page.rows.forEach(function (r) { body.appendChild(row(r)); });
      table.appendChild(body);
      wrap.appendChild(table);
    }
    var pages = Math.max(1, Math.ceil(page.total / state.per_page));
    var p = nodes.pager;
    while (p.firstChild) p.removeChild(p.firstChild);
    var prev = button('sv-page-prev', t('prev_page'), function () { state.page -= 1; refresh(); });
    prev.disabled = state.page <= 1;
    var next = button('sv-page-next', t('next_page'), function () { state.page += 1; refresh(); });
    next.disabled = state.page >= pages;
    p.appendChild(prev);
    p.appendChild(el('span', 'sv-page-info', t('page', { p: state.page, n: pages, total: page.total })));
    p.appendChild(next);
  }

  function row(r) {
    var tr = el('tr', 'sv-call-row' + (state.current && state.current.id === r.id ? ' sv-current' : ''));
    tr.setAttribute('data-job', r.id);
    tr.tabIndex = 0;
    var when = '';
    try { when = new Date(r.created_at * 1000).toLocaleString(lang() === 'zh' ? 'zh-CN' : 'en'); } catch (e) { when = ''; }
    var cells = [r.filename || r.id.slice(0, 8), when, fmtClock(r.audio_seconds)];
    cells.forEach(function (c, i) { tr.appendChild(el('td', i === 0 ? 'sv-call-name' : '', c)); });
    tr.appendChild(el('td', 'sv-call-langs', (r.languages || []).map(function (l) {
      var x = tag('language', l);
      return x ? x.name : l;
    }).join(', ')));
    tr.appendChild(el('td', '', (r.speakers || []).length > 1 ? String(r.speakers.length) : (r.state === 'done' ? '1' : '')));
    var emo = el('td', 'sv-call-emo');
    Object.keys(r.emotion_shares || {}).sort().forEach(function (spk) {
      var bar = el('span', 'sv-share-bar');
      bar.title = (spk || t('speaker_all')) + ': ' + shareBar(r.emotion_shares[spk]).map(function (x) {
        var info = tag('emotion', x.emotion);
        return (info ? info.label : x.emotion) + ' ' + Math.round(x.share * 100) + ' %';
      }).join(', ');
      shareBar(r.emotion_shares[spk]).forEach(function (x) {
        var seg = el('span', 'sv-share');
        seg.style.width = (x.share * 100).toFixed(1) + '%';
        var info = tag('emotion', x.emotion);
        if (info) seg.style.background = 'rgb(' + info.color.split(' ').join(',') + ')';
        seg.setAttribute('data-emotion', x.emotion);
        bar.appendChild(seg);
      });
      emo.appendChild(bar);
    });
    tr.appendChild(emo);
    var ev = el('td', 'sv-call-events');
    Object.keys(r.events || {}).sort().forEach(function (name) {
      var info = tag('event', name);
      var s = el('span', 'sv-call-event', (info ? info.emoji : name) + '\u00d7' + r.events[name]);
      s.title = info ? info.label : name;
      ev.appendChild(s);
    });
    tr.appendChild(ev);
    tr.appendChild(el('td', 'sv-call-flags', r.flags ? '\u2691 ' + r.flags : ''));
    var stateWord = r.state === 'done' ? (r.reviewed ? t('yes') : t('no')) : t(r.state === 'running' ? 'running' : r.state);
    tr.appendChild(el('td', 'sv-call-reviewed', stateWord));
    var exp = el('td', 'sv-call-exp', fmtDate(r.expires_at));
    tr.appendChild(exp);
    tr.appendChild(actions(r, exp));
    var open = function () { openCall(r.id, queryOf(r.links && r.links.result)); };
    tr.addEventListener('click', open);
    tr.addEventListener('keydown', function (e) { if (e.key === 'Enter') open(); });
    return tr;
  }

  function fmtDate(unix) {
    if (typeof unix !== 'number' || !isFinite(unix)) return '';
    try { return new Date(unix * 1000).toLocaleString(lang() === 'zh' ? 'zh-CN' : 'en'); } catch (e) { return ''; }
  }

  // a finished call's Keep and Delete: only where its review link is held (whoever may edit its
  // review may keep or delete it: DELETE /api/jobs/{id}, POST /api/jobs/{id}/keep)
  function actionUrl(r, suffix) {
    var link = String((r.links && r.links.review) || '');
    var m = /^(\/api\/jobs\/[^/?]+)\/review(\?exp=\d{1,12}&sig=[A-Za-z0-9_-]{1,64})?$/.exec(link);
    return m ? m[1] + suffix + (m[2] || '') : null;
  }

  function failed(td, r) {
    return r.json().then(function (b) { return (b && b.error && b.error.message) || r.status; }, function () { return r.status; })
      .then(function (why) { td.title = t('act_failed', { why: why }); td.classList.add('sv-act-failed'); });
  }

  function actions(r, expCell) {
    var td = el('td', 'sv-call-actions');
    var del = actionUrl(r, '');
    if (!del || !FINAL[r.state] || r.state === 'purged') return td;
    td.addEventListener('click', function (e) { e.stopPropagation(); });
    td.addEventListener('keydown', function (e) { e.stopPropagation(); });
    td.appendChild(button('sv-call-keep', t('keep'), function () {
      root.fetch(actionUrl(r, '/keep'), { method: 'POST', credentials: 'same-origin' }).then(function (resp) {
        if (!resp.ok) return failed(td, resp);
        return resp.json().then(function (b) { expCell.textContent = fmtDate(b.expires_at); });
      }, function () {});
    }));
    td.appendChild(button('sv-call-delete', t('del'), function () {
      if (!root.confirm(t('del_confirm', { name: r.filename || r.id.slice(0, 8) }))) return;
      root.fetch(del, { method: 'DELETE', credentials: 'same-origin' }).then(function (resp) {
        if (!resp.ok && resp.status !== 410) return failed(td, resp);
        forget(r.id);
        if (state.current && state.current.id === r.id) state.current = null;
        return refresh();
      }, function () {});
    }));
    return td;
  }

  function forget(id) {  // this browser's lists lose the deleted call too
    [STORE, STORE_RECENT].forEach(function (key) {
      try {
        var list = JSON.parse(storageGet(key) || '[]');
        if (Array.isArray(list)) storageSet(key, JSON.stringify(list.filter(function (e) { return !e || e.id !== id; })));
      } catch (e) { /* unreadable: left */ }
    });
  }

  function openCall(id, q) {
    state.current = { id: id, q: q };
    var A = root.SenseVoiceApp;
    if (A && A.open) A.open(id, q);
    Array.prototype.forEach.call(doc.querySelectorAll('.sv-call-row'), function (tr) {
      tr.classList.toggle('sv-current', tr.getAttribute('data-job') === id);
    });
  }

  function step(delta) {
    if (!state.current) return;
    var i = -1;
    state.order.forEach(function (e, k) { if (e.id === state.current.id) i = k; });
    var j = i + delta;
    if (i < 0) return;
    if (j >= 0 && j < state.order.length) {
      openCall(state.order[j].id, state.order[j].q);
      return;
    }
    // past the page's first or last row: the table turns the page, the call there opens
    var pages = Math.max(1, Math.ceil(state.total / state.per_page));
    if (state.page + delta < 1 || state.page + delta > pages) return;
    state.page += delta;
    refresh().then(function () {
      var e = state.order[delta > 0 ? 0 : state.order.length - 1];
      if (e) openCall(e.id, e.q);
    });
  }

  function downloadCsv() {
    var q = query();
    delete q.page;
    delete q.per_page;
    return postCalls({ jobs: jobsBody(owned()), query: q, format: 'csv' }).then(function (r) {
      return r.ok ? r.blob() : null;
    }).then(function (blob) {
      if (!blob) return;
      var a = el('a');
      a.href = root.URL.createObjectURL(blob);
      a.download = 'calls.csv';
      doc.body.appendChild(a);
      a.click();
      root.setTimeout(function () { root.URL.revokeObjectURL(a.href); a.remove(); }, 1000);
    });
  }

  // ---- many calls at once ----

  function sendBatch(files) {
    files = files.filter(function (f) { return f && f.size > 0 && !/(^|\/)\./.test(f.webkitRelativePath || f.name); });
    if (!files.length) return;
    var items = files.map(function (f) { return { name: f.name, state: 'uploading', id: null }; });
    state.batch = state.batch.concat(items);
    renderBatch();
    var announced = Object.create(null); // file name -> the length its header announces (a truncated file)
    var A = root.SenseVoiceApp;
    files.forEach(function (f) {
      if (A && A.announcedSeconds) A.announcedSeconds(f).then(function (s) { announced[f.name] = s; });
    });
    var groups = [];
    for (var i = 0; i < files.length; i += PER_REQUEST) groups.push(i);
    var chain = Promise.resolve();
    groups.forEach(function (start) {
      chain = chain.then(function () {
        var fd = new root.FormData();
        files.slice(start, start + PER_REQUEST).forEach(function (f) { fd.append('files', f, f.name); });
        var mine = items.slice(start, start + PER_REQUEST);
        return root.fetch('/api/batches', { method: 'POST', body: fd, credentials: 'same-origin' }).then(function (r) {
          return r.json().then(function (b) { return { ok: r.ok, body: b }; });
        }).then(function (res) {
          if (!res.ok) {
            mine.forEach(function (it) { it.state = 'refused'; it.error = res.body && res.body.error && res.body.error.message; });
            return;
          }
          var jobs = res.body.jobs || [];
          remember(jobs.filter(function (j) { return j.id; }));
          // a zip becomes its recordings: the item list follows the answer
          var at = state.batch.indexOf(mine[0]);
          var made = jobs.map(function (j) {
            return { name: j.name, id: j.id || null, state: j.id ? j.status : 'refused',
              error: j.error ? j.error.message : '', announced: function () { return announced[j.name]; } };
          });
          state.batch.splice.apply(state.batch, [at, mine.length].concat(made));
        }, function () {
          mine.forEach(function (it) { it.state = 'refused'; });
        }).then(function () { renderBatch(); watchBatch(); });
      });
    });
    return chain;
  }

  // A done call much shorter than its file announces: the page's truncation warning (app.js).
  function truncatedNote(it) {
    var A = root.SenseVoiceApp;
    var I = root.SenseVoiceI18n;
    var said = it.announced ? it.announced() : NaN;
    if (it.state !== 'done' || !A || !A.truncated || !I || !A.truncated(it.seconds, said)) return '';
    return I.t('truncated', { got: A.formatSeconds(it.seconds), announced: A.formatSeconds(said) });
  }

  function renderBatch() {
    var ul = nodes.batch;
    if (!ul) return;
    while (ul.firstChild) ul.removeChild(ul.firstChild);
    state.batch.forEach(function (it) {
      var li = el('li', 'sv-batch-item sv-batch-' + it.state);
      if (it.id) li.setAttribute('data-job', it.id);
      li.appendChild(el('span', 'sv-batch-name', it.name));
      li.appendChild(el('span', 'sv-batch-state', t(it.state) + (it.error ? ': ' + it.error : '')));
      var cut = truncatedNote(it);
      if (cut) li.appendChild(el('span', 'sv-batch-warning', cut));
      ul.appendChild(li);
    });
  }

  function watchBatch() {
    root.clearTimeout(state.batchTimer);
    var waiting = state.batch.filter(function (it) { return it.id && !FINAL[it.state]; });
    if (!waiting.length) { refresh(); return; }
    var byId = Object.create(null);
    owned().forEach(function (e) { byId[e.id] = e; });
    postCalls({ jobs: jobsBody(waiting.map(function (it) { return byId[it.id] || { id: it.id }; })),
      query: { per_page: 500 } }).then(function (r) { return r.ok ? r.json() : null; }).then(function (page) {
      if (page) {
        var st = Object.create(null);
        page.rows.forEach(function (r) { st[r.id] = r; });
        waiting.forEach(function (it) {
          if (!st[it.id]) return;
          it.state = st[it.id].state;
          it.seconds = st[it.id].audio_seconds;
        });
        renderBatch();
      }
      state.batchTimer = root.setTimeout(watchBatch, 1000);
    }, function () { state.batchTimer = root.setTimeout(watchBatch, 2000); });
  }

  // ---- the review editor ----

  // the job's review link (links.review: with a token, signed for editing the review; a download
  // link only reads it, a PATCH with one is refused 403 read_only_link)
  function reviewUrl(view) {
    var base = '/api/jobs/' + encodeURIComponent(String(view.id)) + '/review';
    var review = view.links && view.links.review;
    var q = typeof review === 'string' && review.split('?')[0] === base ? queryOf(review)
      : queryOf(view.links && view.links.result);
    return base + (q ? '?' + q : '');
  }

  function audioUrl(view) {
    var a = view.links && view.links.audio;
    return typeof a === 'string' && a.charAt(0) === '/' && a.charAt(1) !== '/' ? a
      : '/api/jobs/' + encodeURIComponent(String(view.id)) + '/audio';
  }

  function editorHost() {
    return doc.getElementById('sv-editor');
  }

  function onShown(view) {
    var host = editorHost();
    if (!host) return;
    while (host.firstChild) host.removeChild(host.firstChild);
    if (!view || String(view.stage || view.status) !== 'done' || !view.result || !view.id) {
      state.view = null;
      return;
    }
    if (!state.current || state.current.id !== view.id) state.current = { id: view.id, q: queryOf(view.links && view.links.result) };
    var listed = state.order.some(function (e) { return e.id === String(view.id); });
    remember([view]);
    // a job sent from this page or opened from a link: the table lists it from now on (the page's
    // own jobs were "known" from the recent list, and the table said "No calls yet" until a reload)
    if (!listed) refresh();
    state.view = view;
    state.segIndex = 0;
    state.loop = false;
    state.editing = -1;
    renderEditor();
  }

  function segs() {
    var r = state.view && state.view.result;
    return r && Array.isArray(r.segments) ? r.segments : [];
  }

  function renderEditor() {
    var host = editorHost();
    var view = state.view;
    if (!host || !view) return;
    while (host.firstChild) host.removeChild(host.firstChild);
    var box = el('section', 'sv-editor');
    var head = el('div', 'sv-editor-head');
    head.appendChild(el('h3', 'sv-editor-title', t('editor') + ' \u00b7 ' + (view.filename || String(view.id).slice(0, 8))));
    head.appendChild(button('sv-prev-call', t('prev_call'), function () { step(-1); }));
    head.appendChild(button('sv-next-call', t('next_call'), function () { step(1); }));
    var rev = el('label', 'sv-reviewed');
    var cb = el('input');
    cb.type = 'checkbox';
    cb.id = 'sv-reviewed-box';
    cb.checked = !!(view.review && view.review.reviewed);
    cb.addEventListener('change', function () { save({ reviewed: cb.checked }); });
    rev.appendChild(cb);
    rev.appendChild(el('span', '', t('reviewed')));
    head.appendChild(rev);
    var sp = el('label', 'sv-speed');
    sp.appendChild(el('span', '', t('speed')));
    var sel = el('select');
    sel.id = 'sv-speed';
    SPEEDS.forEach(function (s) {
      var o = el('option', '', s + '\u00d7');
      o.value = String(s);
      sel.appendChild(o);
    });
    sel.value = String(state.speed || 1);
    sel.addEventListener('change', function () { state.speed = Number(sel.value); if (nodes.audio) nodes.audio.playbackRate = state.speed; });
    sp.appendChild(sel);
    head.appendChild(sp);
    box.appendChild(head);
    var audio = el('audio', 'sv-editor-audio');
    audio.controls = true;
    audio.preload = 'metadata';
    audio.src = audioUrl(view);
    audio.playbackRate = state.speed || 1;
    audio.addEventListener('loadedmetadata', function () { audio.playbackRate = state.speed || 1; });
    audio.addEventListener('timeupdate', function () {
      var s = segs()[state.segIndex];
      if (state.loop && s && s.end != null && audio.currentTime >= s.end) audio.currentTime = s.start || 0;
    });
    nodes.audio = audio;
    box.appendChild(audio);
    box.appendChild(el('p', 'sv-editor-keys', t('keys')));
    nodes.status = el('p', 'sv-editor-status');
    nodes.status.setAttribute('role', 'status');
    box.appendChild(nodes.status);
    var list = el('ol', 'sv-edit-list');
    segs().forEach(function (s, i) { list.appendChild(segRow(s, i)); });
    nodes.list = list;
    box.appendChild(list);
    host.appendChild(box);
  }

  function segRow(s, i) {
    var li = el('li', 'sv-edit-seg' + (i === state.segIndex ? ' sv-current' : '') +
      (s.corrected ? ' sv-corrected' : '') + (s.flagged ? ' sv-flagged' : ''));
    li.setAttribute('data-index', String(i));
    var time = el('button', 'sv-edit-time', s.start != null ? fmtClock(s.start) : '\u2014');
    time.type = 'button';
    time.addEventListener('click', function () { select(i, true); });
    li.appendChild(time);
    if (s.speaker) li.appendChild(el('span', 'sv-edit-speaker', s.speaker));
    var main = el('div', 'sv-edit-main');
    if (state.editing === i) {
      var input = el('textarea', 'sv-edit-input');
      input.value = s.text || '';
      input.maxLength = 5000;
      input.rows = 2;
      input.addEventListener('keydown', function (ev) {
        if (ev.key === 'Enter' && !ev.shiftKey) { ev.preventDefault(); commitEdit(i, input.value); }
        if (ev.key === 'Escape') { state.editing = -1; renderList(); }
      });
      main.appendChild(input);
      main.appendChild(button('sv-edit-save', t('save'), function () { commitEdit(i, input.value); }));
      main.appendChild(button('sv-edit-cancel', t('cancel'), function () { state.editing = -1; renderList(); }));
      root.setTimeout(function () { input.focus(); }, 0);
    } else {
      main.appendChild(el('span', 'sv-edit-text', s.text));
      if (s.corrected) {
        main.appendChild(el('span', 'sv-corrected-mark', t('corrected')));
        var m = el('div', 'sv-edit-model');
        m.appendChild(el('span', 'sv-edit-model-label', t('model') + ' '));
        m.appendChild(el('span', 'sv-edit-model-text', s.model_text));
        m.appendChild(button('sv-edit-revert', t('revert'), function () { save({ segments: [{ index: i, text: null }] }); }));
        main.appendChild(m);
      }
    }
    if (s.flagged || state.noting === i) {
      var note = el('input', 'sv-edit-note');
      note.type = 'text';
      note.maxLength = 1000;
      note.placeholder = t('note');
      note.setAttribute('aria-label', t('note'));
      note.value = s.note || '';
      note.addEventListener('change', function () { save({ segments: [{ index: i, flagged: true, note: note.value }] }); });
      note.addEventListener('keydown', function (ev) { if (ev.key === 'Enter') note.blur(); });
      main.appendChild(note);
      if (state.noting === i) root.setTimeout(function () { note.focus(); state.noting = -1; }, 0);
    }
    li.appendChild(main);
    var acts = el('div', 'sv-edit-acts');
    acts.appendChild(button('sv-edit-btn', t('edit'), function () { state.editing = i; renderList(); }));
    acts.appendChild(button('sv-flag-btn' + (s.flagged ? ' sv-on' : ''), s.flagged ? t('unflag') : t('flag'), function () { toggleFlag(i); }));
    li.appendChild(acts);
    return li;
  }

  function renderList() {
    if (!nodes.list) return;
    var list = nodes.list;
    while (list.firstChild) list.removeChild(list.firstChild);
    segs().forEach(function (s, i) { list.appendChild(segRow(s, i)); });
  }

  function select(i, play) {
    var list = segs();
    if (!list.length) return;
    state.segIndex = Math.max(0, Math.min(list.length - 1, i));
    var s = list[state.segIndex];
    if (nodes.audio && s.start != null) {
      try { nodes.audio.currentTime = s.start; } catch (e) { /* not loaded yet */ }
      if (play) nodes.audio.play()['catch'](function () {});
    }
    Array.prototype.forEach.call(doc.querySelectorAll('.sv-edit-seg'), function (li) {
      var on = Number(li.getAttribute('data-index')) === state.segIndex;
      li.classList.toggle('sv-current', on);
      if (on && li.scrollIntoView) li.scrollIntoView({ block: 'nearest' });
    });
  }

  function commitEdit(i, text) {
    state.editing = -1;
    save({ segments: [{ index: i, text: String(text).slice(0, 5000) }] });
  }

  function toggleFlag(i) {
    var s = segs()[i];
    if (!s) return;
    if (s.flagged) { save({ segments: [{ index: i, flagged: false }] }); return; }
    state.noting = i;
    save({ segments: [{ index: i, flagged: true }] });
  }

  function save(patch) {
    var view = state.view;
    if (!view) return Promise.resolve();
    return root.fetch(reviewUrl(view), {
      method: 'PATCH', credentials: 'same-origin', headers: { 'Content-Type': 'application/json' },
      body: JSON.stringify(patch)
    }).then(function (r) {
      return r.json().then(function (b) { return { ok: r.ok, body: b }; });
    }).then(function (res) {
      if (!res.ok) {
        nodes.status.textContent = t('save_failed', { why: res.body && res.body.error ? res.body.error.message : '' });
        return;
      }
      if (state.view !== view) return;
      view.result = res.body.result;
      view.review = res.body.review;
      nodes.status.textContent = t('saved');
      renderList();
      var cb = doc.getElementById('sv-reviewed-box');
      if (cb) cb.checked = !!res.body.review.reviewed;
      refresh();
    }, function () { nodes.status.textContent = t('save_failed', { why: '' }); });
  }

  function typing(target) {
    var tag = target && target.tagName ? target.tagName.toLowerCase() : '';
    return tag === 'input' || tag === 'textarea' || tag === 'select' || (target && target.isContentEditable);
  }

  function keys(ev) {
    if (!state.view || ev.ctrlKey || ev.metaKey || ev.altKey || typing(ev.target)) return false;
    var k = ev.key;
    var a = nodes.audio;
    if (k === ' ' || k === 'Spacebar') {
      if (a) { if (a.paused) a.play()['catch'](function () {}); else a.pause(); }
    } else if (k === 'j' || k === 'J') {
      select(state.segIndex - 1, true);
    } else if (k === 'k' || k === 'K') {
      select(state.segIndex + 1, true);
    } else if (k === 'l' || k === 'L') {
      state.loop = !state.loop;
      if (nodes.status) nodes.status.textContent = state.loop ? t('loop_on') : '';
      if (state.loop) select(state.segIndex, true);
    } else if (k === 'e' || k === 'E') {
      state.editing = state.segIndex;
      renderList();
    } else if (k === 'f' || k === 'F') {
      toggleFlag(state.segIndex);
    } else {
      return false;
    }
    ev.preventDefault();
    return true;
  }

  var booted = false;

  function boot() {
    if (booted) return;
    booted = true;
    renderDesk();
    refresh();
    doc.addEventListener('keydown', keys);
    doc.addEventListener('sv-job-shown', function (ev) { onShown(ev.detail); });
    doc.addEventListener('sv-lang-changed', function () { renderDesk(); refresh(); renderEditor(); });
  }

  var api = Object.freeze({
    boot: boot, owned: owned, remember: remember, refresh: refresh, keys: keys,
    shareBar: shareBar, fmtClock: fmtClock, sendBatch: sendBatch, state: state
  });
  root.SenseVoiceDesk = api;
  if (typeof module === 'object' && module && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : this);
