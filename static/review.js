/*
 * SenseVoice review view: player + summary + emotion/event timeline + segment table + exports.
 * Plain browser script: no modules, no build step. Meant for QA teams reviewing sample calls and
 * long recordings (built once per job; stays fast with thousands of segments).
 *
 *   window.SenseVoiceReview = {
 *     render(container, job, opts),        // returns the div.sv-review root
 *     renderInto(elemId, jobJson, opts),   // jobJson: the job JSON string (or the object);
 *                                          //   returns the host element, or null if not found
 *     formatTime(seconds)                  // "mm:ss.s" ("h:mm:ss.s" from one hour)
 *   };
 *
 *   job  = the API's job JSON (pipeline/web/api.py job_json):
 *          { id, status, filename, audio_seconds,
 *            result: { text, raw_text, segments: [{ language, emotion, events, itn, text,
 *                                                   start, end, speaker }] } }
 *   opts = { audioUrl,          // the server's copy of the audio
 *            fallbackAudioUrl,  // used once if audioUrl fails (e.g. the user's own upload)
 *            exportBase }       // default '/api/jobs': links go to {base}/{id}/result?format=..
 *                               //   unless job.links.result (a path on this server, signed when
 *                               //   the server has an API token) is given: {links.result}&format=..
 *
 * Emoji, labels and colours come from window.SenseVoiceRich.TAGS (static/richtext.js), the one
 * table; without it the view degrades to plain labels. Styles: static/review.css (next to
 * static/style.css, whose .sv-chip / .sv-lang rules the chips reuse).
 *
 * Safety: the DOM is built with createElement / createElementNS + textContent only; no markup is
 * ever built from job data. Source is pure ASCII (emoji as \u escapes).
 */
(function (root) {
  'use strict';

  var SVG_NS = 'http://www.w3.org/2000/svg';
  var LANE_H = 40; // px (and viewBox units) per speaker lane
  var GREY = '148 163 184';
  var DASH = '\u2014';
  var NDASH = ' \u2013 ';
  var DOT = ' \u00b7 ';
  var FORMATS = [['txt', 'TXT'], ['json', 'JSON'], ['srt', 'SRT'], ['vtt', 'VTT']];
  var GONE_TEXT = 'Audio no longer kept: the timeline and the table below still work.';

  function hasOwn(obj, key) {
    return obj != null && Object.prototype.hasOwnProperty.call(obj, key);
  }

  // Looked up at render time, so the load order of the two scripts does not matter.
  function tagEntry(kind, name) {
    var R = root.SenseVoiceRich;
    var T = R && R.TAGS;
    if (!T || !T[kind] || !name || !hasOwn(T[kind], name)) return null;
    return T[kind][name];
  }

  function str(v) {
    return v == null ? '' : String(v);
  }

  function num(v) {
    if (v === null || v === undefined || v === '' || typeof v === 'boolean') return null;
    var n = Number(v);
    return isFinite(n) ? n : null;
  }

  function rgb(triple) {
    return 'rgb(' + String(triple || GREY).split(' ').join(', ') + ')';
  }

  function pad2(n) {
    return n < 10 ? '0' + n : String(n);
  }

  function formatTime(seconds) {
    var s = num(seconds);
    if (s === null) return '--:--.-';
    if (s < 0) s = 0;
    var tenths = Math.round(s * 10);
    var totalSec = Math.floor(tenths / 10);
    var frac = tenths % 10;
    var h = Math.floor(totalSec / 3600);
    var m = Math.floor((totalSec % 3600) / 60);
    var sec = totalSec % 60;
    var tail = pad2(sec) + '.' + frac;
    return h > 0 ? h + ':' + pad2(m) + ':' + tail : pad2(m) + ':' + tail;
  }

  // ---- DOM helpers ----

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function svg(tag, attrs) {
    var e = document.createElementNS(SVG_NS, tag);
    if (attrs) {
      for (var k in attrs) {
        if (hasOwn(attrs, k)) e.setAttribute(k, String(attrs[k]));
      }
    }
    return e;
  }

  function svgTitle(parent, text) {
    var t = document.createElementNS(SVG_NS, 'title');
    t.textContent = text;
    parent.appendChild(t);
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  // A chip in the shape richtext.js uses: span.sv-chip.<kind> + the TAGS class, --sv-c colour,
  // span.sv-emoji, span.sv-label, and optionally span.sv-sum-value.
  function chip(kind, name, value) {
    var e = tagEntry(kind, name);
    var base = kind === 'emotion' ? 'sv-chip sv-emo' : 'sv-chip sv-event';
    var c = el('span', base + ' ' + (e ? e.cls : 'sv-unknown'));
    c.setAttribute('data-tag', name);
    c.title = e ? e.title : (kind === 'emotion' ? 'Emotion: ' : 'Event: ') + name;
    c.style.setProperty('--sv-c', e ? e.color : GREY);
    if (e && e.emoji) {
      var em = el('span', 'sv-emoji', e.emoji);
      em.setAttribute('aria-hidden', 'true');
      c.appendChild(em);
      c.appendChild(document.createTextNode(' '));
    }
    c.appendChild(el('span', 'sv-label', name));
    if (value != null) {
      c.appendChild(document.createTextNode(' '));
      c.appendChild(el('span', 'sv-sum-value', value));
    }
    return c;
  }

  function langBadge(code, full) {
    var e = tagEntry('language', code);
    var b = el('span', 'sv-lang ' + (e ? e.cls : 'sv-lang-other'));
    b.setAttribute('data-tag', code);
    b.title = e ? e.title : 'Language: ' + code;
    b.style.setProperty('--sv-c', e ? e.color : GREY);
    if (!e) {
      b.textContent = code.toUpperCase();
    } else if (full) {
      b.appendChild(el('span', 'sv-lang-code', e.code));
      b.appendChild(document.createTextNode(DOT));
      b.appendChild(el('span', 'sv-lang-name', e.name));
    } else {
      b.textContent = e.code;
    }
    return b;
  }

  function emojiOf(kind, name) {
    var e = tagEntry(kind, name);
    return e && e.emoji ? e.emoji + ' ' : '';
  }

  // ---- the job's segments, on one time axis ----

  function segmentsOf(job) {
    var res = job && job.result;
    var list = res && Array.isArray(res.segments) ? res.segments : [];
    if (!list.length && res && res.raw_text) {
      var R = root.SenseVoiceRich;
      if (R && typeof R.parse === 'function') list = R.parse(res.raw_text);
    }
    return list.map(function (s, i) {
      s = s || {};
      var sp = s.speaker;
      return {
        index: i,
        language: str(s.language),
        emotion: str(s.emotion),
        events: Array.isArray(s.events) ? s.events.map(str) : [],
        text: str(s.text),
        speaker: sp == null || sp === '' ? null : String(sp),
        start: num(s.start),
        end: num(s.end),
        approx: false
      };
    });
  }

  function layout(job) {
    var segs = segmentsOf(job);
    var audioSec = num(job && job.audio_seconds);
    var duration = audioSec !== null && audioSec > 0 ? audioSec : 0;
    var i;
    segs.forEach(function (s) {
      if (s.start !== null && s.start > duration) duration = s.start;
      if (s.end !== null && s.end > duration) duration = s.end;
    });
    var known = false;
    for (i = 0; i < segs.length; i++) {
      if (segs[i].start !== null || segs[i].end !== null) { known = true; break; }
    }
    var unknownDuration = !(duration > 0);
    if (unknownDuration) duration = 1; // nothing to go on: the view still draws, times approximate

    if (!known && segs.length === 1) {
      // a short clip: one segment, untimed = the whole recording
      segs[0].start = 0;
      segs[0].end = duration;
      segs[0].approx = unknownDuration;
    } else if (!known) {
      // several untimed segments: spread over the recording by text length (marked approximate)
      var weights = segs.map(function (s) { return Math.max(1, s.text.length); });
      var total = weights.reduce(function (a, b) { return a + b; }, 0);
      var at = 0;
      segs.forEach(function (s, k) {
        s.start = at;
        at += duration * weights[k] / total;
        s.end = k === segs.length - 1 ? duration : at;
        s.approx = true;
      });
    } else {
      // fill the gaps: a missing start is the previous end, a missing end the next start
      var prevEnd = 0;
      for (i = 0; i < segs.length; i++) {
        if (segs[i].start === null) {
          segs[i].start = prevEnd;
          segs[i].approx = true;
        }
        prevEnd = segs[i].end !== null ? segs[i].end : segs[i].start;
      }
      var nextStart = duration;
      for (i = segs.length - 1; i >= 0; i--) {
        if (segs[i].end === null) {
          segs[i].end = Math.max(segs[i].start, nextStart);
          segs[i].approx = true;
        }
        nextStart = segs[i].start;
      }
    }
    segs.forEach(function (s) {
      s.start = Math.min(Math.max(0, s.start), duration);
      s.end = Math.min(Math.max(s.start, s.end), duration);
    });
    // time order (stable), for the table and for the binary search
    var order = segs.slice().sort(function (a, b) {
      return a.start - b.start || a.index - b.index;
    });
    var lanes = [];
    var laneOf = Object.create(null);
    order.forEach(function (s) {
      var key = s.speaker === null ? '\u0000none' : 's:' + s.speaker;
      if (!(key in laneOf)) {
        laneOf[key] = lanes.length;
        lanes.push(s.speaker);
      }
      s.lane = laneOf[key];
    });
    if (!lanes.length) lanes.push(null);
    return { segs: order, lanes: lanes, duration: duration, unknownDuration: unknownDuration };
  }

  // ---- summary ----

  // Largest-remainder rounding: integer percentages that sum to exactly 100.
  function percentages(values) {
    var total = values.reduce(function (a, b) { return a + b; }, 0);
    if (!(total > 0)) return values.map(function () { return 0; });
    var raw = values.map(function (v) { return v * 100 / total; });
    var out = raw.map(Math.floor);
    var left = 100 - out.reduce(function (a, b) { return a + b; }, 0);
    var byRem = raw.map(function (v, i) { return i; }).sort(function (a, b) {
      return (raw[b] - out[b]) - (raw[a] - out[a]) || a - b;
    });
    for (var i = 0; i < left && i < byRem.length; i++) out[byRem[i]] += 1;
    return out;
  }

  function summaryGroup(cls, heading) {
    var g = el('div', 'sv-sum-group ' + cls);
    g.appendChild(el('span', 'sv-sum-heading', heading));
    return g;
  }

  function buildSummary(segs) {
    var box = el('div', 'sv-summary');
    var emoTime = Object.create(null);
    var emoCount = Object.create(null);
    var emoNames = [];
    var evCount = Object.create(null);
    var evNames = [];
    var langTime = Object.create(null);
    var langNames = [];
    segs.forEach(function (s) {
      var d = s.end - s.start;
      if (s.emotion) {
        if (!(s.emotion in emoTime)) {
          emoTime[s.emotion] = 0;
          emoCount[s.emotion] = 0;
          emoNames.push(s.emotion);
        }
        emoTime[s.emotion] += d;
        emoCount[s.emotion] += 1;
      }
      s.events.forEach(function (e) {
        if (!e || e === 'Speech') return;
        if (!(e in evCount)) { evCount[e] = 0; evNames.push(e); }
        evCount[e] += 1;
      });
      if (s.language && s.language !== 'nospeech') {
        if (!(s.language in langTime)) { langTime[s.language] = 0; langNames.push(s.language); }
        langTime[s.language] += Math.max(d, 1e-6);
      }
    });

    if (emoNames.length) {
      var byTime = emoNames.some(function (n) { return emoTime[n] > 0; });
      var weights = emoNames.map(function (n) { return byTime ? emoTime[n] : emoCount[n]; });
      var pct = percentages(weights);
      var idx = emoNames.map(function (n, i) { return i; }).sort(function (a, b) {
        return weights[b] - weights[a] || a - b;
      });
      var g = summaryGroup('sv-sum-emotions',
        byTime ? 'Emotion, share of time' : 'Emotion, share of segments');
      idx.forEach(function (i) {
        var c = chip('emotion', emoNames[i], pct[i] + '%');
        c.className += ' sv-sum-emo';
        c.setAttribute('data-share', String(pct[i]));
        g.appendChild(c);
      });
      box.appendChild(g);
    }
    if (evNames.length) {
      var ge = summaryGroup('sv-sum-events', 'Events');
      evNames.slice().sort(function (a, b) {
        return evCount[b] - evCount[a] || evNames.indexOf(a) - evNames.indexOf(b);
      }).forEach(function (n) {
        var c = chip('event', n, '\u00d7' + evCount[n]);
        c.className += ' sv-sum-event';
        c.setAttribute('data-count', String(evCount[n]));
        ge.appendChild(c);
      });
      box.appendChild(ge);
    }
    if (langNames.length) {
      var gl = summaryGroup('sv-sum-languages', 'Languages');
      langNames.slice().sort(function (a, b) {
        return langTime[b] - langTime[a] || langNames.indexOf(a) - langNames.indexOf(b);
      }).forEach(function (n) {
        var b = langBadge(n, true);
        b.className += ' sv-sum-lang';
        gl.appendChild(b);
      });
      box.appendChild(gl);
    }
    return box;
  }

  // ---- timeline ----

  function niceStep(duration) {
    var steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
    for (var i = 0; i < steps.length; i++) {
      if (duration / steps[i] <= 8) return steps[i];
    }
    return Math.ceil(duration / 8 / 3600) * 3600;
  }

  function laneName(speaker, single) {
    if (speaker !== null) return speaker;
    return single ? 'All' : '(no speaker)';
  }

  function segTitle(s) {
    var parts = [(s.approx ? '\u2248 ' : '') + formatTime(s.start) + NDASH + formatTime(s.end)];
    if (s.speaker !== null) parts.push(s.speaker);
    if (s.emotion) parts.push(emojiOf('emotion', s.emotion) + s.emotion);
    var text = s.text.length > 200 ? s.text.slice(0, 200) + '\u2026' : s.text;
    if (text) parts.push(text);
    return parts.join(DOT);
  }

  function buildTimeline(L) {
    var D = L.duration;
    var H = L.lanes.length * LANE_H;
    var wrap = el('div', 'sv-tl-wrap');
    var labels = el('div', 'sv-tl-labels');
    var track = el('div', 'sv-tl-track');
    var s = svg('svg', {
      'class': 'sv-timeline', width: '100%', height: H,
      viewBox: '0 0 ' + D + ' ' + H, preserveAspectRatio: 'none',
      role: 'slider', tabindex: '0', 'aria-label': 'Timeline: click to seek',
      'aria-valuemin': '0', 'aria-valuemax': String(D), 'aria-valuenow': '0'
    });
    var single = L.lanes.length === 1;
    var groups = L.lanes.map(function (sp, i) {
      var name = laneName(sp, single);
      var lab = el('div', 'sv-tl-label', name);
      lab.title = name;
      lab.style.height = LANE_H + 'px';
      lab.setAttribute('data-lane', String(i));
      labels.appendChild(lab);
      var g = svg('g', { 'class': 'sv-tl-lane', 'data-lane': i });
      if (sp !== null) g.setAttribute('data-speaker', sp);
      svgTitle(g, name);
      g.appendChild(svg('rect', {
        'class': 'sv-tl-lane-bg', x: 0, y: i * LANE_H, width: D, height: LANE_H
      }));
      s.appendChild(g);
      return g;
    });
    var rects = [];
    var evFrag = document.createDocumentFragment();
    var minW = D / 2000;
    var flagW = D / 300;
    L.segs.forEach(function (seg, k) {
      var top = seg.lane * LANE_H;
      var emo = tagEntry('emotion', seg.emotion);
      var r = svg('rect', {
        'class': 'sv-tl-seg', x: seg.start, y: top + 8,
        width: Math.max(seg.end - seg.start, minW), height: LANE_H - 16,
        fill: seg.emotion ? rgb(emo ? emo.color : GREY) : rgb(GREY),
        'data-start': seg.start, 'data-end': seg.end, 'data-index': seg.index,
        'data-k': k, 'data-lane': seg.lane, 'data-emotion': seg.emotion
      });
      svgTitle(r, segTitle(seg));
      groups[seg.lane].appendChild(r);
      rects.push(r);
      var n = 0;
      seg.events.forEach(function (name) {
        if (!name || name === 'Speech') return;
        var ev = tagEntry('event', name);
        var color = rgb(ev ? ev.color : GREY);
        var m = svg('g', {
          'class': 'sv-tl-event', 'data-event': name, 'data-start': seg.start,
          'data-lane': seg.lane, 'data-index': seg.index
        });
        svgTitle(m, (ev && ev.emoji ? ev.emoji + ' ' : '') + name + ' at ' + formatTime(seg.start));
        m.appendChild(svg('line', {
          x1: seg.start, x2: seg.start, y1: top + 2, y2: top + LANE_H - 2,
          stroke: color, 'stroke-width': 2, 'vector-effect': 'non-scaling-stroke'
        }));
        m.appendChild(svg('rect', {
          x: seg.start, y: top + 2 + (n % 5) * 7, width: flagW, height: 6, fill: color
        }));
        n += 1;
        evFrag.appendChild(m);
      });
    });
    s.appendChild(evFrag); // markers above every lane's segments
    var head = svg('line', {
      'class': 'sv-tl-playhead', x1: 0, x2: 0, y1: 0, y2: H,
      'stroke-width': 2, 'vector-effect': 'non-scaling-stroke'
    });
    s.appendChild(head);
    track.appendChild(s);

    var axis = el('div', 'sv-tl-axis');
    var step = niceStep(D);
    for (var t = 0; t <= D + 1e-9; t += step) {
      var tick = el('span', 'sv-tl-tick', formatTime(t).replace(/\.\d$/, ''));
      tick.style.left = (t / D * 100) + '%';
      axis.appendChild(tick);
    }
    track.appendChild(axis);
    wrap.appendChild(labels);
    wrap.appendChild(track);
    return { wrap: wrap, svg: s, rects: rects, playhead: head };
  }

  // ---- table ----

  function buildTable(L) {
    var wrap = el('div', 'sv-table-wrap');
    // review.css lays rows out as grids (fast with thousands of rows): the roles keep the
    // table semantics for assistive technology
    var table = el('table', 'sv-segments');
    table.setAttribute('role', 'table');
    table.setAttribute('aria-label', 'Segments');
    table.setAttribute('aria-rowcount', String(L.segs.length + 1));
    var thead = el('thead');
    thead.setAttribute('role', 'rowgroup');
    var hr = el('tr');
    hr.setAttribute('role', 'row');
    ['Time', 'Speaker', 'Language', 'Emotion', 'Events', 'Text'].forEach(function (h) {
      var th = el('th', 'sv-col-' + h.toLowerCase(), h);
      th.scope = 'col';
      th.setAttribute('role', 'columnheader');
      hr.appendChild(th);
    });
    thead.appendChild(hr);
    table.appendChild(thead);
    var tbody = el('tbody');
    tbody.setAttribute('role', 'rowgroup');
    var frag = document.createDocumentFragment();
    var rows = [];
    function td(cls, text) {
      var c = el('td', cls, text);
      c.setAttribute('role', 'cell');
      return c;
    }
    L.segs.forEach(function (s, k) {
      var tr = el('tr', 'sv-row');
      tr.setAttribute('role', 'row');
      tr.setAttribute('data-start', String(s.start));
      tr.setAttribute('data-end', String(s.end));
      tr.setAttribute('data-index', String(s.index));
      tr.setAttribute('data-k', String(k));
      tr.tabIndex = 0;
      tr.appendChild(td('sv-col-time',
        (s.approx ? '\u2248 ' : '') + formatTime(s.start) + NDASH + formatTime(s.end)));
      var tdS = td('sv-col-speaker' + (s.speaker === null ? ' sv-none' : ''),
        s.speaker === null ? DASH : s.speaker);
      if (s.speaker !== null) tdS.title = s.speaker;
      tr.appendChild(tdS);
      var tdL = td('sv-col-language');
      if (s.language) tdL.appendChild(langBadge(s.language, false));
      tr.appendChild(tdL);
      var tdE = td('sv-col-emotion');
      if (s.emotion) tdE.appendChild(chip('emotion', s.emotion));
      tr.appendChild(tdE);
      var tdV = td('sv-col-events');
      s.events.forEach(function (e) { if (e) tdV.appendChild(chip('event', e)); });
      tr.appendChild(tdV);
      var tdT = td('sv-col-text', s.text);
      tdT.dir = 'auto';
      tr.appendChild(tdT);
      frag.appendChild(tr);
      rows.push(tr);
    });
    tbody.appendChild(frag);
    table.appendChild(tbody);
    wrap.appendChild(table);
    return { wrap: wrap, table: table, tbody: tbody, rows: rows };
  }

  // ---- rendering ----

  var cleanups = typeof WeakMap === 'function' ? new WeakMap() : null;

  function cleanupOld(container) {
    if (cleanups && cleanups.has(container)) {
      try { cleanups.get(container)(); } catch (e) { /* already gone */ }
      cleanups['delete'](container);
    }
  }

  function note(cls, text) {
    return el('div', 'sv-review-note ' + cls, text);
  }

  function render(container, job, opts) {
    if (!container || typeof container.appendChild !== 'function') {
      throw new TypeError('SenseVoiceReview.render: container must be a DOM element');
    }
    opts = opts || {};
    job = job && typeof job === 'object' ? job : {};
    cleanupOld(container);
    clear(container);
    var rootEl = el('div', 'sv-review');
    if (job.id != null) rootEl.setAttribute('data-job', String(job.id));

    var L = layout(job);
    if (L.duration >= 3600) rootEl.className += ' sv-hours'; // wider time column
    var segs = L.segs;
    var n = segs.length;

    // header
    var head = el('div', 'sv-review-head');
    var title = str(job.filename) || str(job.id) || 'Recording';
    head.appendChild(el('span', 'sv-review-title', title));
    var meta = [formatTime(L.unknownDuration ? null : L.duration).replace(/\.\d$/, ''),
      n + (n === 1 ? ' segment' : ' segments')];
    var named = L.lanes.filter(function (sp) { return sp !== null; }).length;
    if (named) meta.push(named + (named === 1 ? ' speaker' : ' speakers'));
    if (job.status && job.status !== 'done') meta.push(String(job.status));
    head.appendChild(el('span', 'sv-review-meta', meta.join(DOT)));
    rootEl.appendChild(head);

    // player
    var playerBox = el('div', 'sv-player-wrap');
    var audio = el('audio', 'sv-player');
    audio.controls = true;
    audio.preload = 'metadata';
    var audioNote = note('sv-audio-note', '');
    audioNote.hidden = true;
    audioNote.setAttribute('role', 'status');
    playerBox.appendChild(audio);
    playerBox.appendChild(audioNote);
    rootEl.appendChild(playerBox);

    var urls = [];
    [opts.audioUrl, opts.fallbackAudioUrl].forEach(function (u) {
      u = str(u);
      if (u && urls.indexOf(u) < 0) urls.push(u);
    });
    var sourceNames = [];
    if (str(opts.audioUrl)) sourceNames.push('primary');
    if (str(opts.fallbackAudioUrl) && str(opts.fallbackAudioUrl) !== str(opts.audioUrl)) {
      sourceNames.push('fallback');
    }
    var tried = 0;
    var audioGone = false;
    function nextSource() {
      if (tried < urls.length) {
        audio.setAttribute('data-source', sourceNames[tried]);
        if (sourceNames[tried] === 'fallback' && tried > 0) {
          audioNote.textContent = 'Playing your own upload: the server copy is not available.';
          audioNote.className = 'sv-review-note sv-audio-note sv-audio-fallback';
          audioNote.hidden = false;
        }
        audio.src = urls[tried++];
        return;
      }
      audioGone = true;
      audio.setAttribute('data-source', 'none');
      audio.removeAttribute('src');
      audio.hidden = true;
      audioNote.textContent = GONE_TEXT;
      audioNote.className = 'sv-review-note sv-audio-note sv-audio-gone';
      audioNote.hidden = false;
    }
    audio.addEventListener('error', function () {
      if (!audioGone) nextSource();
    });

    if (!job.result && !n) {
      var st = str(job.status) || 'unknown';
      rootEl.appendChild(note('sv-review-empty', st === 'failed' || st === 'cancelled'
        ? 'No result: the job ' + st +
          (job.error && job.error.message ? ' (' + str(job.error.message) + ')' : '') + '.'
        : 'No result yet: the job is ' + st + '.'));
    } else if (!n) {
      rootEl.appendChild(note('sv-review-empty', 'No speech detected'));
    }

    var tl = null;
    var tb = null;
    if (n) {
      rootEl.appendChild(buildSummary(segs));
      tl = buildTimeline(L);
      rootEl.appendChild(tl.wrap);
      tb = buildTable(L);
      rootEl.appendChild(tb.wrap);
    }

    // exports
    if (job.id != null && str(job.id) !== '' && job.result) {
      var ex = el('div', 'sv-exports');
      ex.appendChild(el('span', 'sv-sum-heading', 'Download'));
      var base = str(opts.exportBase || '/api/jobs').replace(/\/+$/, '');
      // the job's own result link (signed when the server has an API token), if it is a path on
      // this server; else {base}/{id}/result
      var own = job.links && typeof job.links.result === 'string' ? job.links.result : '';
      if (own.charAt(0) !== '/' || own.charAt(1) === '/' || own.charAt(1) === '\\') own = '';
      FORMATS.forEach(function (f) {
        var a = el('a', 'sv-export', f[1]);
        a.href = own
          ? own + (own.indexOf('?') < 0 ? '?' : '&') + 'format=' + f[0]
          : base + '/' + encodeURIComponent(String(job.id)) + '/result?format=' + f[0];
        a.setAttribute('download', 'transcript-' + String(job.id) + '.' + f[0]);
        a.setAttribute('data-format', f[0]);
        a.rel = 'noopener';
        ex.appendChild(a);
      });
      rootEl.appendChild(ex);
    }

    // ---- behaviour: one binary search per time update, only changed rows touched ----
    var starts = new Float64Array(n);
    var maxEnd = new Float64Array(n);
    var running = 0;
    segs.forEach(function (s, k) {
      starts[k] = s.start;
      running = Math.max(running, s.end);
      maxEnd[k] = running;
    });
    var active = [];
    var selected = -1;
    var virtualTime = 0;
    var raf = 0;

    function activeAt(t) {
      var lo = 0;
      var hi = n; // first k with start > t
      while (lo < hi) {
        var mid = (lo + hi) >> 1;
        if (starts[mid] <= t) lo = mid + 1; else hi = mid;
      }
      var out = [];
      for (var k = lo - 1, steps = 0; k >= 0 && maxEnd[k] > t && steps < 256; k--, steps++) {
        if (segs[k].end > t) out.unshift(k);
      }
      var last = lo > 0 ? segs[lo - 1] : null;
      if (!out.length && last && last.end === last.start && last.start === t) out.push(lo - 1);
      return out;
    }

    function keepVisible(row) {
      var w = tb.wrap;
      var r = row.getBoundingClientRect();
      var b = w.getBoundingClientRect();
      var headH = tb.table.tHead ? tb.table.tHead.getBoundingClientRect().height : 0;
      if (r.top < b.top + headH || r.bottom > b.bottom) {
        w.scrollTop += r.top - b.top - headH - (b.height - headH) / 3;
      }
    }

    function currentTime() {
      if (audioGone) return virtualTime;
      var t = audio.currentTime;
      return isFinite(t) ? t : virtualTime;
    }

    function update(t, follow) {
      if (!n) return;
      var x = Math.min(Math.max(t, 0), L.duration);
      tl.playhead.setAttribute('x1', String(x));
      tl.playhead.setAttribute('x2', String(x));
      tl.svg.setAttribute('aria-valuenow', String(Math.round(x * 10) / 10));
      tl.svg.setAttribute('aria-valuetext', formatTime(x));
      var now = activeAt(t);
      var same = now.length === active.length &&
        now.every(function (k, i) { return k === active[i]; });
      if (same) return;
      active.forEach(function (k) {
        if (now.indexOf(k) < 0) {
          tb.rows[k].classList.remove('sv-active');
          tl.rects[k].classList.remove('sv-active');
        }
      });
      now.forEach(function (k) {
        tb.rows[k].classList.add('sv-active');
        tl.rects[k].classList.add('sv-active');
      });
      active = now;
      if (follow && now.length) keepVisible(tb.rows[now[0]]);
    }

    function seek(t, play) {
      t = Math.min(Math.max(num(t) || 0, 0), L.duration);
      virtualTime = t;
      if (!audioGone && urls.length) {
        try { audio.currentTime = t; } catch (e) { /* not seekable yet */ }
        if (play) {
          try {
            var p = audio.play();
            if (p && typeof p['catch'] === 'function') p['catch'](function () {});
          } catch (e) { /* autoplay refused */ }
        }
      }
      update(t, false);
    }

    function tick() {
      raf = 0;
      if (!rootEl.isConnected || audio.paused) return;
      update(currentTime(), true);
      raf = root.requestAnimationFrame ? root.requestAnimationFrame(tick) : 0;
    }

    if (n) {
      audio.addEventListener('timeupdate', function () { update(currentTime(), !audio.paused); });
      audio.addEventListener('seeked', function () { update(currentTime(), false); });
      audio.addEventListener('play', function () {
        if (!raf && root.requestAnimationFrame) raf = root.requestAnimationFrame(tick);
      });

      tl.svg.addEventListener('click', function (ev) {
        var box = tl.svg.getBoundingClientRect();
        if (!(box.width > 0)) return;
        seek((ev.clientX - box.left) / box.width * L.duration, false);
      });
      tl.svg.addEventListener('keydown', function (ev) {
        var d = ev.key === 'ArrowLeft' ? -5 : ev.key === 'ArrowRight' ? 5 : 0;
        if (ev.key === 'Home') { seek(0, false); ev.preventDefault(); }
        else if (ev.key === 'End') { seek(L.duration, false); ev.preventDefault(); }
        else if (d) { seek(currentTime() + d, false); ev.preventDefault(); }
      });

      var pick = function (row) {
        var k = Number(row.getAttribute('data-k'));
        if (selected >= 0 && tb.rows[selected]) tb.rows[selected].classList.remove('sv-selected');
        selected = k;
        row.classList.add('sv-selected');
        seek(segs[k].start, true);
      };
      tb.tbody.addEventListener('click', function (ev) {
        var row = ev.target && ev.target.closest ? ev.target.closest('tr.sv-row') : null;
        if (!row || !tb.tbody.contains(row)) return;
        var sel = root.getSelection ? root.getSelection() : null;
        if (sel && !sel.isCollapsed && row.contains(sel.anchorNode)) return; // selecting text
        pick(row);
      });
      tb.tbody.addEventListener('keydown', function (ev) {
        if (ev.key !== 'Enter' && ev.key !== ' ') return;
        var row = ev.target;
        if (!row || !row.classList || !row.classList.contains('sv-row')) return;
        ev.preventDefault();
        pick(row);
      });
    }

    container.appendChild(rootEl);
    if (cleanups) {
      cleanups.set(container, function () {
        if (raf && root.cancelAnimationFrame) root.cancelAnimationFrame(raf);
        raf = 0;
        try { audio.pause(); } catch (e) { /* ignore */ }
      });
    }
    nextSource(); // after the error listener: a missing URL shows the note at once
    if (n) update(0, false);
    return rootEl;
  }

  // ---- renderInto (for the Gradio page) ----

  var lastRendered = typeof WeakMap === 'function' ? new WeakMap() : null;

  // Renders into the element found by SenseVoiceRich.mountPoint (static/richtext.js, needed on
  // the page for this): the element itself, or a child div.sv-review-host next to Gradio's own
  // nodes. Called again with the same JSON and options it keeps the existing view (the player is
  // not reset mid-playback); opts.force re-renders anyway. A blank string empties the view.
  function renderInto(elemId, jobJson, opts) {
    var R = root.SenseVoiceRich;
    var host = R && R.mountPoint ? R.mountPoint(elemId, 'sv-review-host', 'sv-review') : null;
    if (!host) {
      if (root.console) root.console.warn('SenseVoiceReview.renderInto: no element #' + elemId);
      return null;
    }
    opts = opts || {};
    var key;
    try {
      key = (typeof jobJson === 'string' ? jobJson : JSON.stringify(jobJson)) + '\u0000' +
        JSON.stringify([str(opts.audioUrl), str(opts.fallbackAudioUrl), str(opts.exportBase)]);
    } catch (e) {
      key = null;
    }
    if (!opts.force && key !== null && lastRendered && lastRendered.get(host) === key &&
        host.querySelector('.sv-review')) {
      return host;
    }
    if (lastRendered) lastRendered['delete'](host);

    var job = jobJson;
    if (typeof jobJson === 'string') {
      if (jobJson.replace(/\s+/g, '') === '') {
        cleanupOld(host);
        clear(host);
        return host;
      }
      try {
        job = JSON.parse(jobJson);
      } catch (e) {
        cleanupOld(host);
        clear(host);
        var bad = el('div', 'sv-review');
        bad.appendChild(note('sv-review-error', 'Could not read the job result.'));
        host.appendChild(bad);
        return host;
      }
    }
    if (job == null) {
      cleanupOld(host);
      clear(host);
      return host;
    }
    render(host, job, opts);
    if (lastRendered && key !== null) lastRendered.set(host, key);
    return host;
  }

  var api = Object.freeze({
    render: render,
    renderInto: renderInto,
    formatTime: formatTime
  });
  root.SenseVoiceReview = api;
  if (typeof module === 'object' && module && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : this);
