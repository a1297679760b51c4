/*
 * SenseVoice review view: player + summary + emotion/event timeline + segment table + exports.
 * Plain browser script: no modules, no build step. Meant for QA teams reviewing sample calls and
 * long recordings (built once per job; stays fast with thousands of segments).
 *
 *   window.SenseVoiceReview = {
 *     render(container, job, opts),        // returns the div.sv-review root
 *     renderInto(elemId, jobJson, opts),   // jobJson: the job JSON string (or the object);
 *                                          //   returns the host element, or null if not found
 *     exportsBar(job, opts),               // the download links alone (a short clip's result)
 *     formatTime(seconds),                 // "mm:ss.s" ("h:mm:ss.s" from one hour)
 *     exportName(job, format),             // "<recording name>.<format>"
 *     renameSpeakers(format, text, names)  // an export with the speakers' given names
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
 * static/style.css, whose .sv-chip / .sv-lang rules the chips reuse). Words: English, or Chinese
 * when window.SenseVoiceI18n (static/app.js) says so.
 *
 * Speakers can be renamed (e.g. left -> Agent): the names show in the lanes, the table and the
 * filters, are kept per job in localStorage, and go into the downloads (fetched, renamed, saved
 * under the recording's own name; "Tags in subtitles" on asks the server for &tags=true). The
 * table filters by emotion, event, speaker and text; on a narrow view its rows become stacked
 * cards, text first (review.css). Several untimed segments of one timed piece (what one VAD piece
 * gives when the model starts a new segment inside it) share the piece's span by text length
 * instead of each claiming all of it (marked approximate).
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
  var SUBTITLES = ['srt', 'vtt']; // "Tags in subtitles" asks the server for &tags=true on these
  var WORDS = {
    en: {
      gone: 'Audio no longer kept: the timeline and the table below still work.',
      fallback: 'Playing your own upload: the server copy is not available.',
      emo_time: 'Emotion, share of time', emo_segs: 'Emotion, share of segments',
      events: 'Events', languages: 'Languages', download: 'Download', speakers: 'Speakers',
      tags: 'Tags in subtitles', download_failed: 'Download failed: try again.',
      col_time: 'Time', col_speaker: 'Speaker', col_language: 'Language', col_emotion: 'Emotion',
      col_events: 'Events', col_text: 'Text', all: 'All', no_speaker: '(no speaker)',
      segment: 'segment', segments: 'segments', speaker: 'speaker', speakers_n: 'speakers',
      no_speech: 'No speech detected', no_result: 'No result yet: the job is {status}.',
      no_result_failed: 'No result: the job {status}.', unreadable: 'Could not read the job result.',
      seek: 'Timeline: click to seek', all_emotions: 'All emotions', all_events: 'All events',
      all_speakers: 'All speakers', search: 'Search the text', shown: '{n} of {m} segments',
      rename: 'Name of {speaker}', no_speech_lang: 'No speech', recording: 'Recording'
    },
    zh: {
      gone: '\u97f3\u9891\u5df2\u4e0d\u518d\u4fdd\u7559\uff1a\u4e0b\u9762\u7684\u65f6\u95f4\u8f74\u548c\u8868\u683c\u4ecd\u53ef\u7528\u3002',
      fallback: '\u6b63\u5728\u64ad\u653e\u60a8\u4e0a\u4f20\u7684\u6587\u4ef6\uff1a\u670d\u52a1\u5668\u4e0a\u7684\u526f\u672c\u4e0d\u53ef\u7528\u3002',
      emo_time: '\u60c5\u7eea\uff08\u6309\u65f6\u957f\uff09', emo_segs: '\u60c5\u7eea\uff08\u6309\u6bb5\u6570\uff09',
      events: '\u58f0\u97f3\u4e8b\u4ef6', languages: '\u8bed\u79cd', download: '\u4e0b\u8f7d', speakers: '\u8bf4\u8bdd\u4eba',
      tags: '\u5b57\u5e55\u4e2d\u542b\u6807\u7b7e', download_failed: '\u4e0b\u8f7d\u5931\u8d25\uff1a\u8bf7\u91cd\u8bd5\u3002',
      col_time: '\u65f6\u95f4', col_speaker: '\u8bf4\u8bdd\u4eba', col_language: '\u8bed\u79cd', col_emotion: '\u60c5\u7eea',
      col_events: '\u4e8b\u4ef6', col_text: '\u6587\u5b57', all: '\u5168\u90e8', no_speaker: '\uff08\u65e0\u8bf4\u8bdd\u4eba\uff09',
      segment: '\u6bb5', segments: '\u6bb5', speaker: '\u4f4d\u8bf4\u8bdd\u4eba', speakers_n: '\u4f4d\u8bf4\u8bdd\u4eba',
      no_speech: '\u672a\u68c0\u6d4b\u5230\u8bed\u97f3', no_result: '\u8fd8\u6ca1\u6709\u7ed3\u679c\uff1a\u4efb\u52a1{status}\u3002',
      no_result_failed: '\u6ca1\u6709\u7ed3\u679c\uff1a\u4efb\u52a1{status}\u3002', unreadable: '\u65e0\u6cd5\u8bfb\u53d6\u4efb\u52a1\u7ed3\u679c\u3002',
      seek: '\u65f6\u95f4\u8f74\uff1a\u70b9\u51fb\u8df3\u8f6c', all_emotions: '\u5168\u90e8\u60c5\u7eea', all_events: '\u5168\u90e8\u4e8b\u4ef6',
      all_speakers: '\u5168\u90e8\u8bf4\u8bdd\u4eba', search: '\u641c\u7d22\u6587\u5b57', shown: '{n} / {m} \u6bb5',
      rename: '{speaker} \u7684\u540d\u5b57', no_speech_lang: '\u65e0\u8bed\u97f3', recording: '\u5f55\u97f3'
    }
  };

  function hasOwn(obj, key) {
    return obj != null && Object.prototype.hasOwnProperty.call(obj, key);
  }

  // The page's words (English unless static/app.js chose Chinese).
  function tr(key, vars) {
    var I = root.SenseVoiceI18n;
    var lang = I && typeof I.lang === 'function' ? I.lang() : 'en';
    var w = hasOwn(WORDS, lang) && hasOwn(WORDS[lang], key) ? WORDS[lang][key] : WORDS.en[key];
    return String(w).replace(/\{(\w+)\}/g, function (m, k) {
      return vars && vars[k] != null ? String(vars[k]) : m;
    });
  }

  // Looked up at render time, so the load order of the two scripts does not matter.
  function tagEntry(kind, name) {
    var R = root.SenseVoiceRich;
    var T = R && R.TAGS;
    if (!T || !T[kind] || !name || !hasOwn(T[kind], name)) return null;
    return T[kind][name];
  }

  // A tag as the page shows it: the model's name, or its Chinese word on a Chinese page (richtext.js).
  function tagLabel(kind, name) {
    var e = tagEntry(kind, name);
    return e && e.label ? e.label : name;
  }

  // The language tag of a segment without speech (the server's vocabulary, pipeline/web/vocab.py).
  function noSpeech() {
    return root.SenseVoiceVocab ? root.SenseVoiceVocab.noSpeech : null;
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
    c.appendChild(el('span', 'sv-label', tagLabel(kind, name)));
    if (value != null) {
      c.appendChild(document.createTextNode(' '));
      c.appendChild(el('span', 'sv-sum-value', value));
    }
    return c;
  }

  // A language by the name its speakers use (English, \u4e2d\u6587, ...); the code in the title.
  function langName(code) {
    var e = tagEntry('language', code);
    if (!e) return code.toUpperCase();
    return code === noSpeech() ? tr('no_speech_lang') : e.name;
  }

  function langBadge(code) {
    var e = tagEntry('language', code);
    var b = el('span', 'sv-lang ' + (e ? e.cls : 'sv-lang-other'));
    b.setAttribute('data-tag', code);
    b.title = e ? e.title + ' (' + code + ')' : 'Language: ' + code;
    b.style.setProperty('--sv-c', e ? e.color : GREY);
    if (e) b.lang = e.htmlLang;
    b.appendChild(el('span', 'sv-lang-name', langName(code)));
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

  // Consecutive segments (in transcript order) with one and the same timed span and speaker are
  // the model's sub-segments of one piece: they share the span by text length (approximate).
  function spreadShared(segs) {
    var i = 0;
    while (i < segs.length) {
      var s = segs[i];
      var j = i + 1;
      if (s.start !== null && s.end !== null && s.end > s.start) {
        while (j < segs.length && segs[j].start === s.start && segs[j].end === s.end &&
               segs[j].speaker === s.speaker) j++;
      }
      if (j - i > 1) {
        var group = segs.slice(i, j);
        var weights = group.map(function (g) { return Math.max(1, g.text.length); });
        var total = weights.reduce(function (a, b) { return a + b; }, 0);
        var from = s.start;
        var to = s.end;
        var at = from;
        group.forEach(function (g, k) {
          g.start = at;
          at += (to - from) * weights[k] / total;
          g.end = k === group.length - 1 ? to : at;
          g.approx = true;
        });
      }
      i = j;
    }
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
      spreadShared(segs);
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
      if (s.language && s.language !== noSpeech()) {
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
      var g = summaryGroup('sv-sum-emotions', byTime ? tr('emo_time') : tr('emo_segs'));
      idx.forEach(function (i) {
        var c = chip('emotion', emoNames[i], pct[i] + '%');
        c.className += ' sv-sum-emo';
        c.setAttribute('data-share', String(pct[i]));
        g.appendChild(c);
      });
      box.appendChild(g);
    }
    if (evNames.length) {
      var ge = summaryGroup('sv-sum-events', tr('events'));
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
      var gl = summaryGroup('sv-sum-languages', tr('languages'));
      langNames.slice().sort(function (a, b) {
        return langTime[b] - langTime[a] || langNames.indexOf(a) - langNames.indexOf(b);
      }).forEach(function (n) {
        var b = langBadge(n);
        b.className += ' sv-sum-lang';
        gl.appendChild(b);
      });
      box.appendChild(gl);
    }
    return box;
  }

  // ---- timeline ----

  // The tick step: at most maxTicks labels (default 8) over the axis.
  function niceStep(duration, maxTicks) {
    var most = maxTicks || 8;
    var steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
    for (var i = 0; i < steps.length; i++) {
      if (duration / steps[i] <= most) return steps[i];
    }
    return Math.ceil(duration / most / 3600) * 3600;
  }

  // How many time labels the axis has room for: one per ~64 px of the track (a phone's track
  // of ~300 px held 8 and their labels ran together, "00:0000:05").
  function tickRoom(node) {
    var w = (node && node.clientWidth) || (root.innerWidth ? Math.min(root.innerWidth, 1400) - 100 : 700);
    return Math.max(2, Math.min(8, Math.floor(w / 64)));
  }

  function laneName(speaker, single, names) {
    if (speaker !== null) return names && hasOwn(names, speaker) && names[speaker] ? names[speaker] : speaker;
    return single ? tr('all') : tr('no_speaker');
  }

  function segTitle(s) {
    var parts = [(s.approx ? '\u2248 ' : '') + formatTime(s.start) + NDASH + formatTime(s.end)];
    if (s.speaker !== null) parts.push(s.speaker);
    if (s.emotion) parts.push(emojiOf('emotion', s.emotion) + tagLabel('emotion', s.emotion));
    var text = s.text.length > 200 ? s.text.slice(0, 200) + '\u2026' : s.text;
    if (text) parts.push(text);
    return parts.join(DOT);
  }

  function buildTimeline(L, names) {
    var D = L.duration;
    var H = L.lanes.length * LANE_H;
    var wrap = el('div', 'sv-tl-wrap');
    var labels = el('div', 'sv-tl-labels');
    var track = el('div', 'sv-tl-track');
    var s = svg('svg', {
      'class': 'sv-timeline', width: '100%', height: H,
      viewBox: '0 0 ' + D + ' ' + H, preserveAspectRatio: 'none',
      role: 'slider', tabindex: '0', 'aria-label': tr('seek'),
      'aria-valuemin': '0', 'aria-valuemax': String(D), 'aria-valuenow': '0'
    });
    var single = L.lanes.length === 1;
    var groups = L.lanes.map(function (sp, i) {
      var name = laneName(sp, single, names);
      var lab = el('div', 'sv-tl-label', name);
      lab.title = name;
      lab.style.height = LANE_H + 'px';
      lab.setAttribute('data-lane', String(i));
      if (sp !== null) lab.setAttribute('data-speaker', sp);
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
        svgTitle(m, (ev && ev.emoji ? ev.emoji + ' ' : '') + tagLabel('event', name) + DOT + formatTime(seg.start));
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
    var step = niceStep(D, tickRoom(wrap.parentNode ? wrap : null));
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

  function buildTable(L, names) {
    var wrap = el('div', 'sv-table-wrap');
    // review.css lays rows out as grids (fast with thousands of rows): the roles keep the
    // table semantics for assistive technology
    // one unnamed speaker: no Speaker column (a column of dashes said nothing)
    var oneSpeaker = !L.segs.some(function (s) { return s.speaker !== null; });
    var table = el('table', 'sv-segments' + (oneSpeaker ? ' sv-one-speaker' : ''));
    table.setAttribute('role', 'table');
    table.setAttribute('aria-label', 'Segments');
    table.setAttribute('aria-rowcount', String(L.segs.length + 1));
    var thead = el('thead');
    thead.setAttribute('role', 'rowgroup');
    var hr = el('tr');
    hr.setAttribute('role', 'row');
    ['time', 'speaker', 'language', 'emotion', 'events', 'text'].forEach(function (h) {
      var th = el('th', 'sv-col-' + h, tr('col_' + h));
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
      var row = el('tr', 'sv-row');
      row.setAttribute('role', 'row');
      row.setAttribute('data-start', String(s.start));
      row.setAttribute('data-end', String(s.end));
      row.setAttribute('data-index', String(s.index));
      row.setAttribute('data-k', String(k));
      row.tabIndex = 0;
      row.appendChild(td('sv-col-time',
        (s.approx ? '\u2248 ' : '') + formatTime(s.start) + NDASH + formatTime(s.end)));
      var tdS = td('sv-col-speaker' + (s.speaker === null ? ' sv-none' : ''),
        s.speaker === null ? DASH : laneName(s.speaker, false, names));
      if (s.speaker !== null) {
        tdS.title = s.speaker;
        row.setAttribute('data-speaker', s.speaker);
      }
      row.appendChild(tdS);
      var tdL = td('sv-col-language');
      if (s.language) tdL.appendChild(langBadge(s.language));
      row.appendChild(tdL);
      var tdE = td('sv-col-emotion');
      if (s.emotion) tdE.appendChild(chip('emotion', s.emotion));
      row.appendChild(tdE);
      var tdV = td('sv-col-events');
      s.events.forEach(function (e) { if (e) tdV.appendChild(chip('event', e)); });
      row.appendChild(tdV);
      var tdT = td('sv-col-text', s.text);
      tdT.dir = 'auto';
      row.appendChild(tdT);
      frag.appendChild(row);
      rows.push(row);
    });
    tbody.appendChild(frag);
    table.appendChild(tbody);
    wrap.appendChild(table);
    return { wrap: wrap, table: table, tbody: tbody, rows: rows };
  }

  // ---- speakers' names (kept per job in this browser) ----

  var NAMES_KEY = 'sv-speakers:';

  function each(list, fn) {
    for (var i = 0; i < list.length; i++) fn(list[i], i);
  }

  // A name as it may appear in a download: one line, no cue-timing arrow, at most 40 characters.
  function cleanName(v) {
    return str(v).replace(/[\u0000-\u001f\u007f\u0085\u2028\u2029]+/g, ' ').replace(/-->/g, '->')
      .replace(/\s+/g, ' ').trim().slice(0, 40);
  }

  // localStorage, or null where the page may not use it (an opaque origin throws on access)
  function storage() {
    try { return root.localStorage || null; } catch (e) { return null; }
  }

  function loadNames(id) {
    var out = Object.create(null);
    var store = storage();
    if (id == null || !store) return out;
    try {
      var saved = JSON.parse(store.getItem(NAMES_KEY + String(id)) || '{}');
      Object.keys(saved || {}).forEach(function (k) {
        var v = cleanName(saved[k]);
        if (v) out[k] = v;
      });
    } catch (e) { /* unreadable: no names */ }
    return out;
  }

  function saveNames(id, names) {
    var store = storage();
    if (id == null || !store) return;
    try {
      var keys = Object.keys(names);
      if (keys.length) store.setItem(NAMES_KEY + String(id), JSON.stringify(names));
      else store.removeItem(NAMES_KEY + String(id));
    } catch (e) { /* private mode, full */ }
  }

  function buildSpeakers(L, names, onRename) {
    var speakers = L.lanes.filter(function (sp) { return sp !== null; });
    if (!speakers.length) return null;
    var g = el('div', 'sv-sum-group sv-speakers');
    g.appendChild(el('span', 'sv-sum-heading', tr('speakers')));
    speakers.forEach(function (sp) {
      var input = el('input', 'sv-speaker-name');
      input.type = 'text';
      input.value = hasOwn(names, sp) ? names[sp] : '';
      input.placeholder = sp;
      input.maxLength = 40;
      input.size = 10;
      input.title = sp;
      input.setAttribute('data-speaker', sp);
      input.setAttribute('aria-label', tr('rename', { speaker: sp }));
      input.addEventListener('input', function () { onRename(sp, input.value); });
      g.appendChild(input);
    });
    return g;
  }

  // ---- filters ----

  function buildFilters(L, names) {
    var bar = el('div', 'sv-filters');
    function select(cls, label, values, text) {
      var sel = el('select', 'sv-filter ' + cls);
      sel.setAttribute('aria-label', label);
      var all = el('option', '', label);
      all.value = '';
      sel.appendChild(all);
      values.forEach(function (v) {
        var o = el('option', '', text(v));
        o.value = v;
        sel.appendChild(o);
      });
      sel.disabled = values.length < 2;
      bar.appendChild(sel);
      return sel;
    }
    var emos = [];
    var evs = [];
    L.segs.forEach(function (s) {
      if (s.emotion && emos.indexOf(s.emotion) < 0) emos.push(s.emotion);
      s.events.forEach(function (e) { if (e && evs.indexOf(e) < 0) evs.push(e); });
    });
    var speakers = L.lanes.filter(function (sp) { return sp !== null; });
    var emotion = select('sv-filter-emotion', tr('all_emotions'), emos, function (v) {
      return emojiOf('emotion', v) + tagLabel('emotion', v);
    });
    var event = select('sv-filter-event', tr('all_events'), evs, function (v) {
      return emojiOf('event', v) + tagLabel('event', v);
    });
    var speaker = select('sv-filter-speaker', tr('all_speakers'), speakers, function (v) {
      return laneName(v, false, names);
    });
    if (!speakers.length) speaker.hidden = true;
    var search = el('input', 'sv-filter sv-filter-search');
    search.type = 'search';
    search.placeholder = tr('search');
    search.setAttribute('aria-label', tr('search'));
    bar.appendChild(search);
    var count = el('span', 'sv-filter-count');
    count.setAttribute('role', 'status');
    bar.appendChild(count);
    return { bar: bar, emotion: emotion, event: event, speaker: speaker, search: search, count: count };
  }

  // ---- downloads ----

  // "<recording name>.<format>" (the upload's name without its extension), else transcript-<id>.
  function exportName(job, format) {
    var name = str(job && job.filename).replace(/\.[A-Za-z0-9]{1,5}$/, '')
      .replace(/[\u0000-\u001f\u007f<>:"\/\\|?*]+/g, ' ').replace(/\s+/g, ' ').trim().slice(0, 120);
    if (!name || /^\.+$/.test(name)) name = 'transcript-' + str(job && job.id).slice(0, 8);
    return name + '.' + format;
  }

  function escapeRe(s) {
    return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  }

  function vttText(s) {
    return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
  }

  // An export (pipeline/domain/exports.py's formats) with each speaker under its given name;
  // one pass, so swapped names stay swapped.
  function renameSpeakers(format, text, names) {
    text = str(text);
    var map = Object.create(null);
    Object.keys(names || {}).forEach(function (k) {
      var v = cleanName(names[k]);
      if (v && v !== k) map[k] = v;
    });
    var keys = Object.keys(map).sort(function (a, b) { return b.length - a.length; });
    if (!keys.length) return text;
    if (format === 'json') {
      try {
        var doc = JSON.parse(text);
        var segs = doc && doc.result && Array.isArray(doc.result.segments) ? doc.result.segments : [];
        segs.forEach(function (s) {
          if (s && typeof s.speaker === 'string' && hasOwn(map, s.speaker)) s.speaker = map[s.speaker];
        });
        return JSON.stringify(doc, null, 2) + '\n';
      } catch (e) {
        return text;
      }
    }
    if (format === 'vtt') {
      var v = new RegExp('<v (' + keys.map(function (k) { return escapeRe(vttText(k)); }).join('|') + ')>', 'g');
      var back = Object.create(null);
      keys.forEach(function (k) { back[vttText(k)] = vttText(map[k]); });
      return text.replace(v, function (m, k) { return '<v ' + back[k] + '>'; });
    }
    var alt = keys.map(escapeRe).join('|');
    var re = format === 'txt'
      ? new RegExp('^(\\[[^\\]\\n]*\\] )?(' + alt + '): ', 'gm')
      : new RegExp('^()(' + alt + '): ', 'gm');
    return text.replace(re, function (m, pre, k) { return (pre || '') + map[k] + ': '; });
  }

  function saveBlob(text, media, name) {
    var url = root.URL.createObjectURL(new Blob([text], { type: media }));
    var a = el('a');
    a.href = url;
    a.download = name;
    a.style.display = 'none';
    document.body.appendChild(a);
    a.click();
    document.body.removeChild(a);
    root.setTimeout(function () { root.URL.revokeObjectURL(url); }, 10000);
  }

  function buildExports(job, opts, getNames) {
    if (job.id == null || str(job.id) === '' || !job.result) return null;
    var ex = el('div', 'sv-exports');
    ex.appendChild(el('span', 'sv-sum-heading', tr('download')));
    var base = str(opts.exportBase || '/api/jobs').replace(/\/+$/, '');
    // the job's own result link (signed when the server has an API token), if it is a path on
    // this server; else {base}/{id}/result
    var own = job.links && typeof job.links.result === 'string' ? job.links.result : '';
    if (own.charAt(0) !== '/' || own.charAt(1) === '/' || own.charAt(1) === '\\') own = '';
    var links = [];
    var tagsOn = false; // the server's default for subtitles: no tags (txt keeps them)
    var status = el('span', 'sv-export-status');
    status.setAttribute('role', 'status');
    function href(format) {
      var h = own
        ? own + (own.indexOf('?') < 0 ? '?' : '&') + 'format=' + format
        : base + '/' + encodeURIComponent(String(job.id)) + '/result?format=' + format;
      return tagsOn && SUBTITLES.indexOf(format) >= 0 ? h + '&tags=true' : h;
    }
    FORMATS.forEach(function (f) {
      var a = el('a', 'sv-export', f[1]);
      a.href = href(f[0]);
      a.setAttribute('download', exportName(job, f[0]));
      a.setAttribute('data-format', f[0]);
      a.rel = 'noopener';
      a.addEventListener('click', function (ev) {
        if (ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.altKey || !root.fetch) return;
        // fetched, so that the file keeps the recording's name (a download attribute loses to
        // the server's Content-Disposition) and carries the speakers' given names
        ev.preventDefault();
        status.textContent = '';
        root.fetch(a.href, { credentials: 'same-origin' }).then(function (r) {
          if (!r.ok) throw new Error(String(r.status));
          var media = r.headers.get('content-type') || 'application/octet-stream';
          return r.text().then(function (text) {
            saveBlob(renameSpeakers(f[0], text, getNames()), media, exportName(job, f[0]));
          });
        })['catch'](function () { status.textContent = tr('download_failed'); });
      });
      ex.appendChild(a);
      links.push(a);
    });
    var label = el('label', 'sv-export-tags');
    var box = el('input', 'sv-export-tags-box');
    box.type = 'checkbox';
    box.checked = false;
    box.addEventListener('change', function () {
      tagsOn = box.checked;
      links.forEach(function (a) { a.href = href(a.getAttribute('data-format')); });
    });
    label.appendChild(box);
    label.appendChild(document.createTextNode(' ' + tr('tags')));
    ex.appendChild(label);
    ex.appendChild(status);
    return ex;
  }

  function exportsBar(job, opts) {
    job = job && typeof job === 'object' ? job : {};
    var ex = buildExports(job, opts || {}, function () { return loadNames(job.id); });
    if (ex) ex.className += ' sv-exports-bar';
    return ex;
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

    var names = loadNames(job.id);

    // header
    var head = el('div', 'sv-review-head');
    var title = str(job.filename) || str(job.id) || tr('recording');
    head.appendChild(el('span', 'sv-review-title', title));
    // whole seconds, rounded as the state line's "9 min 19 s" is (truncated, it said 09:18)
    var meta = [formatTime(L.unknownDuration ? null : Math.round(L.duration)).replace(/\.\d$/, ''),
      n + ' ' + (n === 1 ? tr('segment') : tr('segments'))];
    var named = L.lanes.filter(function (sp) { return sp !== null; }).length;
    if (named) meta.push(named + ' ' + (named === 1 ? tr('speaker') : tr('speakers_n')));
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
          audioNote.textContent = tr('fallback');
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
      audioNote.textContent = tr('gone');
      audioNote.className = 'sv-review-note sv-audio-note sv-audio-gone';
      audioNote.hidden = false;
    }
    audio.addEventListener('error', function () {
      if (!audioGone) nextSource();
    });

    if (!job.result && !n) {
      var st = str(job.status) || 'unknown';
      rootEl.appendChild(note('sv-review-empty', st === 'failed' || st === 'cancelled'
        ? tr('no_result_failed', { status: st +
          (job.error && job.error.message ? ' (' + str(job.error.message) + ')' : '') })
        : tr('no_result', { status: st })));
    } else if (!n) {
      rootEl.appendChild(note('sv-review-empty', tr('no_speech')));
    }

    var tl = null;
    var tb = null;
    var filters = null;
    if (n) {
      var sum = buildSummary(segs);
      var editor = buildSpeakers(L, names, rename);
      if (editor) sum.appendChild(editor);
      rootEl.appendChild(sum);
      tl = buildTimeline(L, names);
      rootEl.appendChild(tl.wrap);
      tb = buildTable(L, names);
      if (n > 1) {
        filters = buildFilters(L, names);
        rootEl.appendChild(filters.bar);
      }
      rootEl.appendChild(tb.wrap);
    }

    // exports
    var ex = buildExports(job, opts, function () { return names; });
    if (ex) rootEl.appendChild(ex);

    // ---- speakers' names: lanes, table, filter, downloads ----
    function rename(sp, value) {
      var clean = cleanName(value);
      if (clean && clean !== sp) names[sp] = clean; else delete names[sp];
      saveNames(job.id, names);
      var shown = laneName(sp, false, names);
      each(rootEl.querySelectorAll('.sv-tl-label'), function (lab) {
        if (lab.getAttribute('data-speaker') === sp) { lab.textContent = shown; lab.title = shown; }
      });
      if (tb) {
        tb.rows.forEach(function (row) {
          if (row.getAttribute('data-speaker') !== sp) return;
          var cell = row.querySelector('.sv-col-speaker');
          if (cell) cell.textContent = shown;
        });
      }
      if (filters) {
        each(filters.speaker.options, function (o) {
          if (o.value === sp) o.textContent = shown;
        });
      }
    }

    // ---- filters: emotion, event, speaker, text ----
    var lowered = segs.map(function (s) { return s.text.toLowerCase(); });
    function applyFilters() {
      if (!filters) return;
      var emo = filters.emotion.value;
      var ev = filters.event.value;
      var sp = filters.speaker.value;
      var q = filters.search.value.trim().toLowerCase();
      var shown = 0;
      for (var k = 0; k < n; k++) {
        var s = segs[k];
        var ok = (!emo || s.emotion === emo) && (!ev || s.events.indexOf(ev) >= 0) &&
          (!sp || s.speaker === sp) && (!q || lowered[k].indexOf(q) >= 0);
        if (tb.rows[k].hidden === ok) tb.rows[k].hidden = !ok;
        tl.rects[k].classList.toggle('sv-dim', !ok);
        if (ok) shown += 1;
      }
      filters.count.textContent = shown === n ? '' : tr('shown', { n: shown, m: n });
      rootEl.classList.toggle('sv-filtered', shown !== n);
    }
    if (filters) {
      [filters.emotion, filters.event, filters.speaker].forEach(function (sel) {
        sel.addEventListener('change', applyFilters);
      });
      filters.search.addEventListener('input', applyFilters);
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
        bad.appendChild(note('sv-review-error', tr('unreadable')));
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
    exportsBar: exportsBar,
    formatTime: formatTime,
    exportName: exportName,
    renameSpeakers: renameSpeakers
  });
  root.SenseVoiceReview = api;
  if (typeof module === 'object' && module && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : this);
