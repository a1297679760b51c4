/*
 * SenseVoice rich-text renderer. Plain browser script: no modules, no build step.
 *
 * The server returns the raw model text (tags included); every piece of presentation happens
 * here, from the one table TAGS (emoji, label, CSS class and colour per tag), made from the
 * vocabulary the server puts on the page first (window.SenseVoiceVocab, pipeline/web/vocab.py).
 *
 *   window.SenseVoiceRich = {
 *     TAGS,                          // { language, emotion, event, itn }: tag name -> entry
 *     parse(raw),                    // -> [{ language, emotion, events, itn, text }]
 *     plainText(raw),                // tags removed, segment texts joined by one space
 *     render(container, raw, opts),  // returns the .sv-rich root; opts: { showRaw: false,
 *                                    //   emptyText: 'No speech detected' ('' = show nothing) }
 *     renderInto(elemId, raw, opts), // finds the element by id; returns the host or null
 *     mountPoint(elemId, hostClass, ownClass), // the element to render into (shared with review.js)
 *     segmentNode(seg, index),       // one parsed segment as its div.sv-seg (live.js: utterances)
 *     copyText(text),                // Promise: navigator.clipboard, textarea fallback
 *     escapeHtml(s)
 *   };
 *
 * parse() mirrors pipeline/domain/richtext.py parse_rich_text() exactly (same tag pattern, same
 * segmentation rule, same trimmed whitespace); tests/test_richtext_js.py checks the parity.
 *
 * Safety: the DOM is built with createElement + textContent only. No markup is ever built from
 * model output, and CSS classes come from TAGS, never from a tag name.
 */
(function (root) {
  'use strict';

  // A tag is <|name|>, name = one or more chars other than < > | ASCII controls and space.
  var TAG_RE = /<\|([^<>|\x00-\x20\x7f]+)\|>/g;
  // Same set as WHITESPACE in pipeline/domain/richtext.py.
  var WS = '[ \t\n\r\f\v\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]';
  var TRIM_RE = new RegExp('^' + WS + '+|' + WS + '+$', 'g');
  var NO_SPEECH = 'No speech detected';
  // the few words this file draws itself, in Chinese when the page is (SenseVoiceI18n, app.js)
  var UI_ZH = {
    'Copy': '\u590d\u5236', 'Copy the plain text': '\u590d\u5236\u7eaf\u6587\u672c',
    'Show raw': '\u663e\u793a\u539f\u59cb\u8f93\u51fa', 'Hide raw': '\u9690\u85cf\u539f\u59cb\u8f93\u51fa',
    'Copied': '\u5df2\u590d\u5236', 'Copy failed': '\u590d\u5236\u5931\u8d25',
    'No speech detected': '\u672a\u68c0\u6d4b\u5230\u8bed\u97f3',
    'No speech': '\u65e0\u8bed\u97f3', 'Unknown tag': '\u672a\u77e5\u6807\u7b7e'
  };

  function zhPage() {
    var I = root.SenseVoiceI18n;
    return !!(I && I.lang && I.lang() === 'zh');
  }

  function word(s) {
    return zhPage() && UI_ZH[s] ? UI_ZH[s] : s;
  }

  // A table entry whose label and title follow the page's language, read when a chip is drawn:
  // the model's tag name and an English title, or the tag's Chinese word (the server's table).
  function worded(entry, en, zh) {
    ['label', 'title'].forEach(function (k) {
      Object.defineProperty(entry, k, {
        enumerable: true,
        get: function () { return zhPage() ? zh[k] : en[k]; }
      });
    });
    return entry;
  }
  var SLOT_OF_KIND = { language: 'language', emotion: 'emotion', itn: 'itn' };

  function hasOwn(obj, key) {
    return Object.prototype.hasOwnProperty.call(obj, key);
  }

  // The vocabulary comes from the server (pipeline/domain/tags.py browser_table(), put on the
  // page as window.SenseVoiceVocab by pipeline/web/vocab.py before this script): no copy here.
  var VOCAB = root.SenseVoiceVocab;
  if (!VOCAB || !VOCAB.language) {
    throw new Error('SenseVoiceVocab is missing: the page must load the server\'s vocabulary first');
  }

  function table(rows, key, make) {
    var t = Object.create(null); // no prototype: names like "constructor" stay unknown
    rows.forEach(function (r) {
      t[r[key]] = Object.freeze(make(r));
    });
    return Object.freeze(t);
  }

  function slug(name) {
    return name.toLowerCase().replace(/_/g, '-');
  }

  // The one table, made from the server's rows. color: an "R G B" triple, applied as the CSS
  // custom property --sv-c.
  var TAGS = Object.freeze({
    // name: what its speakers call it (shown); english: the English name (in the title);
    // htmlLang: the BCP 47 tag of its text ('' = none)
    language: table(VOCAB.language, 'code', function (r) {
      return worded({ code: r.badge, name: r.native, english: r.english, color: r.color,
        cls: 'sv-lang-' + slug(r.code), htmlLang: r.html_lang },
      { label: r.native, title: 'Language: ' + r.english },
      { label: r.native, title: '\u8bed\u79cd\uff1a' + (UI_ZH[r.native] || r.native) });
    }),
    emotion: table(VOCAB.emotion, 'name', function (r) {
      return worded({ emoji: r.emoji, color: r.color, cls: 'sv-emo-' + slug(r.name) },
        { label: r.name, title: 'Emotion: ' + r.word },
        { label: r.word_zh, title: '\u60c5\u7eea\uff1a' + r.word_zh });
    }),
    event: table(VOCAB.event, 'name', function (r) {
      return worded({ emoji: r.emoji, color: r.color, cls: 'sv-event-' + slug(r.name) },
        { label: r.name, title: 'Event: ' + r.word },
        { label: r.word_zh, title: '\u4e8b\u4ef6\uff1a' + r.word_zh });
    }),
    itn: table(VOCAB.itn, 'name', function (r) {
      return worded({ cls: 'sv-itn-' + r.name }, { label: r.label, title: r.title },
        { label: r.label_zh, title: r.title_zh });
    })
  });
  var UNKNOWN = Object.freeze(worded({ emoji: '\ud83c\udff7\ufe0f', color: '148 163 184', cls: 'sv-unknown' },
    { label: '', title: 'Unknown tag' }, { label: '', title: UI_ZH['Unknown tag'] }));

  function kindOf(name) {
    var kinds = ['language', 'emotion', 'event', 'itn'];
    for (var i = 0; i < kinds.length; i++) {
      if (hasOwn(TAGS[kinds[i]], name)) return kinds[i];
    }
    return null;
  }

  function trim(s) {
    return s.replace(TRIM_RE, '');
  }

  function escapeHtml(s) {
    return String(s == null ? '' : s)
      .replace(/&/g, '&amp;')
      .replace(/</g, '&lt;')
      .replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;')
      .replace(/'/g, '&#39;')
      .replace(/`/g, '&#96;');
  }

  // ---- parsing (mirror of pipeline/domain/richtext.py) ----

  function newSeg() {
    return { slots: Object.create(null), events: [], parts: [], hasText: false };
  }

  function addText(seg, s) {
    seg.parts.push(s);
    if (!seg.hasText && trim(s) !== '') seg.hasText = true;
  }

  function isEmpty(seg) {
    return !seg.hasText && seg.events.length === 0 && Object.keys(seg.slots).length === 0;
  }

  function build(seg) {
    return {
      language: seg.slots.language || '',
      emotion: seg.slots.emotion || '',
      events: seg.events.slice(),
      itn: seg.slots.itn || '',
      text: trim(seg.parts.join(''))
    };
  }

  function parse(raw) {
    raw = raw == null ? '' : String(raw);
    var out = [];
    if (!raw) return out;
    var cur = newSeg();
    var pos = 0;
    var m;
    TAG_RE.lastIndex = 0;
    while ((m = TAG_RE.exec(raw)) !== null) {
      addText(cur, raw.slice(pos, m.index));
      pos = TAG_RE.lastIndex;
      var name = m[1];
      var kind = kindOf(name);
      var slot = kind && hasOwn(SLOT_OF_KIND, kind) ? SLOT_OF_KIND[kind] : null;
      if (cur.hasText || (slot !== null && slot in cur.slots)) {
        out.push(build(cur));
        cur = newSeg();
      }
      if (slot === null) cur.events.push(name); // a known event, or an unknown tag verbatim
      else cur.slots[slot] = name;
    }
    addText(cur, raw.slice(pos));
    if (!isEmpty(cur)) out.push(build(cur));
    return out;
  }

  function joinText(segments) {
    return segments
      .map(function (s) { return s.text; })
      .filter(function (t) { return t !== ''; })
      .join(' ');
  }

  function plainText(raw) {
    return joinText(parse(raw));
  }

  // ---- DOM helpers: createElement + textContent, nothing else ----

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  function chip(classes, entry, labelText, tagName) {
    var c = el('span', classes + ' ' + entry.cls);
    c.title = entry.title;
    c.setAttribute('data-tag', tagName);
    if (entry.color) c.style.setProperty('--sv-c', entry.color);
    if (entry.emoji) {
      var em = el('span', 'sv-emoji', entry.emoji);
      em.setAttribute('aria-hidden', 'true');
      c.appendChild(em);
      c.appendChild(document.createTextNode(' '));
    }
    c.appendChild(el('span', 'sv-label', labelText));
    return c;
  }

  function renderSegment(seg, index) {
    var row = el('div', 'sv-seg');
    row.setAttribute('data-index', String(index));
    row.setAttribute('data-lang', seg.language);
    row.setAttribute('data-emotion', seg.emotion);
    row.setAttribute('data-events', seg.events.join(' '));
    row.setAttribute('data-itn', seg.itn);
    var tags = el('div', 'sv-tags');

    if (seg.language && hasOwn(TAGS.language, seg.language)) {
      var L = TAGS.language[seg.language];
      var badge = el('span', 'sv-lang ' + L.cls);
      badge.title = L.title + ' (' + seg.language + ')';
      badge.setAttribute('data-tag', seg.language);
      badge.style.setProperty('--sv-c', L.color);
      badge.appendChild(el('span', 'sv-lang-name', word(L.name)));
      tags.appendChild(badge);
    }
    if (seg.emotion && hasOwn(TAGS.emotion, seg.emotion)) {
      var E = TAGS.emotion[seg.emotion];
      tags.appendChild(chip('sv-chip sv-emo', E, E.label, seg.emotion));
    }
    seg.events.forEach(function (name) {
      if (hasOwn(TAGS.event, name)) {
        tags.appendChild(chip('sv-chip sv-event', TAGS.event[name], TAGS.event[name].label, name));
      } else {
        tags.appendChild(chip('sv-chip', UNKNOWN, '<|' + name + '|>', name));
      }
    });
    if (seg.itn && hasOwn(TAGS.itn, seg.itn)) {
      var I = TAGS.itn[seg.itn];
      var itn = el('span', 'sv-itn ' + I.cls, I.label);
      itn.title = I.title;
      itn.setAttribute('data-tag', seg.itn);
      tags.appendChild(itn);
    }
    if (tags.firstChild) row.appendChild(tags);
    var text = el('span', 'sv-text', seg.text);
    if (seg.text === '') text.className += ' sv-text-empty';
    row.appendChild(text);
    return row;
  }

  // ---- clipboard ----

  function fallbackCopy(text) {
    var ta = document.createElement('textarea');
    ta.value = text;
    ta.setAttribute('readonly', '');
    ta.style.position = 'fixed';
    ta.style.top = '-1000px';
    ta.style.opacity = '0';
    document.body.appendChild(ta);
    var ok = false;
    try {
      ta.select();
      ok = document.execCommand('copy');
    } catch (e) {
      ok = false;
    } finally {
      document.body.removeChild(ta);
    }
    if (!ok) throw new Error('copy failed');
    return true;
  }

  function copyText(text) {
    text = text == null ? '' : String(text);
    var nav = root.navigator;
    if (nav && nav.clipboard && typeof nav.clipboard.writeText === 'function') {
      var p;
      try {
        p = Promise.resolve(nav.clipboard.writeText(text));
      } catch (e) {
        p = Promise.reject(e);
      }
      return p.then(function () { return true; }, function () { return fallbackCopy(text); });
    }
    return Promise.resolve().then(function () { return fallbackCopy(text); });
  }

  // ---- rendering ----

  var uid = 0;

  function render(container, raw, opts) {
    if (!container || typeof container.appendChild !== 'function') {
      throw new TypeError('SenseVoiceRich.render: container must be a DOM element');
    }
    opts = opts || {};
    raw = raw == null ? '' : String(raw);
    clear(container);
    var rich = el('div', 'sv-rich');
    container.appendChild(rich);
    if (trim(raw) === '') {
      var empty = opts.emptyText == null ? word(NO_SPEECH) : String(opts.emptyText);
      if (empty !== '') rich.appendChild(el('div', 'sv-empty', empty));
      return rich;
    }
    var segments = parse(raw);
    var plain = joinText(segments);

    var bar = el('div', 'sv-toolbar');
    var toggle = el('button', 'sv-btn sv-toggle-raw');
    var copy = el('button', 'sv-btn sv-copy', word('Copy'));
    var status = el('span', 'sv-copy-status');
    toggle.type = 'button';
    copy.type = 'button';
    copy.title = word('Copy the plain text');
    status.setAttribute('role', 'status');
    status.setAttribute('aria-live', 'polite');
    bar.appendChild(toggle);
    bar.appendChild(copy);
    bar.appendChild(status);
    rich.appendChild(bar);

    var list = el('div', 'sv-segments');
    segments.forEach(function (seg, i) { list.appendChild(renderSegment(seg, i)); });
    rich.appendChild(list);
    if (plain === '') rich.appendChild(el('div', 'sv-empty', word(NO_SPEECH)));

    var pre = el('pre', 'sv-raw', raw);
    pre.id = 'sv-raw-' + (++uid);
    rich.appendChild(pre);
    toggle.setAttribute('aria-controls', pre.id);

    function setRaw(show) {
      pre.hidden = !show;
      toggle.textContent = word(show ? 'Hide raw' : 'Show raw');
      toggle.setAttribute('aria-expanded', show ? 'true' : 'false');
    }
    setRaw(!!opts.showRaw);
    toggle.addEventListener('click', function () { setRaw(pre.hidden); });
    copy.addEventListener('click', function () {
      status.textContent = '';
      copyText(plain).then(
        function () { status.textContent = word('Copied'); },
        function () { status.textContent = word('Copy failed'); }
      );
    });
    return rich;
  }

  function findElement(elemId) {
    if (elemId && typeof elemId === 'object' && elemId.nodeType === 1) return elemId;
    var id = String(elemId == null ? '' : elemId).replace(/^#/, '');
    if (!id) return null;
    var found = document.getElementById(id);
    if (found) return found;
    // Gradio renders without a shadow root by default; look inside one if an app uses it.
    var apps = document.querySelectorAll('gradio-app');
    for (var i = 0; i < apps.length; i++) {
      var sr = apps[i].shadowRoot;
      if (sr && typeof sr.getElementById === 'function') {
        found = sr.getElementById(id);
        if (found) return found;
      }
    }
    return null;
  }

  // The element to render into: the target itself when it is empty or already holds our view
  // (a child of class ownClass); otherwise a child div of class hostClass, so nodes owned by
  // Gradio's own rendering are never removed. Null when no element has that id. Shared with
  // static/review.js.
  function mountPoint(elemId, hostClass, ownClass) {
    var target = findElement(elemId);
    if (!target) return null;
    for (var c = target.firstElementChild; c; c = c.nextElementSibling) {
      if (c.classList.contains(hostClass)) return c;
    }
    var first = target.firstElementChild;
    if (!first || first.classList.contains(ownClass)) return target;
    var host = el('div', hostClass);
    target.appendChild(host);
    return host;
  }

  function renderInto(elemId, raw, opts) {
    var host = mountPoint(elemId, 'sv-host', 'sv-rich');
    if (!host) {
      if (root.console) root.console.warn('SenseVoiceRich.renderInto: no element #' + elemId);
      return null;
    }
    render(host, raw, opts);
    return host;
  }

  var api = Object.freeze({
    TAGS: TAGS,
    parse: parse,
    plainText: plainText,
    render: render,
    renderInto: renderInto,
    mountPoint: mountPoint,
    segmentNode: renderSegment,
    copyText: copyText,
    escapeHtml: escapeHtml
  });
  root.SenseVoiceRich = api;
  if (typeof module === 'object' && module && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : this);
