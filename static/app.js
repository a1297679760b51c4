/*
 * SenseVoice page script: what happens between the Submit click and the result on the screen.
 * Plain browser script: no modules, no build step. Loaded after richtext.js and review.js.
 *
 *   window.SenseVoiceApp = {
 *     boot(),              // Gradio's load hook: language switch, recent jobs, the job in the URL
 *     submitting(),        // Submit's js hook: the click time; Submit disabled at once
 *     accepted(viewJson),  // the submit's answer (the job's live view, or a refusal)
 *     submitEnded(),       // after the submit event, answered or not
 *     reset(),             // "New": clears input, state and result; returns Gradio's new values
 *     open(id, query),     // follow a job (a reload, the recent list)
 *     timings,             // performance.now() of click, accepted, first event, done, shown
 *     describe, parseSSE, pageQuery, jobFromSearch, asAudioFile, shortId, formatSeconds,
 *     errorText, recentAdd                                   // pure helpers (unit-tested)
 *   };
 *   window.SenseVoiceI18n = { lang(), setLang(l), t(key, vars) }  // English and Chinese words
 *
 * Server push: the page follows a job over GET /api/jobs/{id}/events (Server-Sent Events, read
 * with fetch so that an HTTP error is seen, and resumed when the connection drops): the server
 * sends each state the moment it changes, and the result the moment it is stored (a result too
 * large to push, result_omitted, is fetched once from the job's signed result link). The job id (and,
 * with an API token, its signed exp/sig) goes into the URL (?job=ID&exp=..&sig=..): a reload
 * follows the job again; the browser's recent jobs (localStorage) reopen the same way.
 *
 * States are worded from what the server says, never guessed: model loading, queued (position),
 * segmenting (%), transcribing (pieces k of n), done in the wall time from the click, failed (red,
 * plain words from the error code: what happened and what to do). Nothing is said about speech
 * until there is a result.
 *
 * Safety: the DOM is built with createElement + textContent only; no markup from data. URLs are
 * built here from the job id (encoded) and a query that must look like exp=<digits>&sig=<b64url>.
 */
(function (root) {
  'use strict';

  var doc = root.document;
  var STORE_LANG = 'sv-lang';
  var STORE_RECENT = 'sv-recent-jobs';
  var RECENT_MAX = 8;
  var QUERY_RE = /^exp=\d{1,12}&sig=[A-Za-z0-9_-]{1,64}$/;
  var ID_RE = /^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$/;
  var AUDIO_EXT = /\.(wav|mp3|m4a|aac|ogg|oga|opus|flac|wma|amr|aif|aiff|caf|spx|weba)$/i;
  var MEDIA_EXT = /\.(mp4|m4v|mov|mkv|webm|avi|ts|mts|m2ts|wmv|3gp|ogv|flv|mpg|mpeg)$/i;
  var FINAL = { done: 1, failed: 1, purged: 1, refused: 1 };
  var RETRY_MS = [250, 500, 1000, 2000, 4000];

  // ---- words ----

  var WORDS = {
    en: {
      sending: 'Sending\u2026',
      opening: 'Opening the job\u2026',
      loading: 'The model is loading: your job starts as soon as it is ready',
      loading_pos: 'The model is loading: your job is number {position} in the queue',
      queued: 'Queued',
      queued_pos: 'Queued: number {position} in the queue',
      segmenting: 'Finding the speech in the recording\u2026 {percent} %',
      transcribing: 'Transcribing\u2026',
      transcribing_pieces: 'Transcribing: {done} of {total} pieces done',
      done: 'Done in {seconds}',
      done_detail: '{audio} of audio; {work} of work on the server',
      truncated: 'It looks truncated: {got} of the {announced} the file announces.',
      failed: 'Failed',
      job: 'Job',
      copy_id: 'Copy the full job id',
      copied: 'Copied',
      reconnecting: 'Connection lost: reconnecting\u2026',
      recent: 'Recent jobs in this browser',
      recent_clear: 'Clear',
      st_done: 'done', st_failed: 'failed', st_queued: 'queued', st_running: 'transcribing',
      st_transcribing: 'transcribing', st_segmenting: 'finding speech', st_loading: 'queued',
      no_speech: 'No speech detected',
      lang_switch: 'Interface language',
      e_no_file: ['No recording chosen', 'Choose a file, drop one on the box, or record with the microphone.'],
      e_no_audio_stream: ['This file has no audio track', 'Choose a recording, or a video with sound.'],
      e_unsupported_media: ['This file cannot be read as audio or video',
        'Use a common format: wav, mp3, m4a, ogg, opus, flac, webm, mp4, mov or mkv.'],
      e_empty_audio: ['The recording is empty', 'Record or choose a longer one.'],
      e_audio_too_long: ['The recording is too long', 'Shorten it or split it, then try again.'],
      e_audio_too_long_limit: ['The recording is too long', 'The limit here is {limit}: shorten it or split it, then try again.'],
      e_upload_too_large: ['The file is too large', 'Use a smaller file (compressed audio is much smaller than video).'],
      e_busy: ['The server is busy', 'Try again in {retry} s.'],
      e_not_ready: ['The service is not available right now', 'Try again in a minute.'],
      e_job_not_found: ['This job is not known here', 'It may belong to another server. Start a new one.'],
      e_job_purged: ['This job is no longer kept', 'Results are kept for a limited time: transcribe the recording again.'],
      e_segmentation_failed: ['Splitting the recording failed', 'Try again; the file may be damaged.'],
      e_path_refused: ['The upload has expired', 'Choose the file again.'],
      e_unauthorized: ['This link is not valid (any more)', 'Start a new job from this page.'],
      e_storage_full: ['The server has no room for new recordings', 'Try again later.'],
      e_no_answer: ['The server did not answer', 'Try again.'],
      e_other: ['The transcription failed', 'Try again; if it keeps failing, tell whoever runs this server.']
    },
    zh: {
      sending: '\u6b63\u5728\u53d1\u9001\u2026',
      opening: '\u6b63\u5728\u6253\u5f00\u4efb\u52a1\u2026',
      loading: '\u6a21\u578b\u6b63\u5728\u52a0\u8f7d\uff1a\u52a0\u8f7d\u5b8c\u6210\u540e\u5373\u5f00\u59cb\u8f6c\u5199',
      loading_pos: '\u6a21\u578b\u6b63\u5728\u52a0\u8f7d\uff1a\u60a8\u7684\u4efb\u52a1\u6392\u5728\u7b2c {position} \u4f4d',
      queued: '\u6392\u961f\u4e2d',
      queued_pos: '\u6392\u961f\u4e2d\uff1a\u7b2c {position} \u4f4d',
      segmenting: '\u6b63\u5728\u67e5\u627e\u5f55\u97f3\u4e2d\u7684\u8bed\u97f3\u2026 {percent} %',
      transcribing: '\u6b63\u5728\u8f6c\u5199\u2026',
      transcribing_pieces: '\u6b63\u5728\u8f6c\u5199\uff1a\u5df2\u5b8c\u6210 {done} / {total} \u6bb5',
      done: '\u5b8c\u6210\uff0c\u7528\u65f6 {seconds}',
      done_detail: '\u97f3\u9891 {audio}\uff1b\u670d\u52a1\u5668\u5904\u7406 {work}',
      truncated: '\u6587\u4ef6\u4f3c\u4e4e\u4e0d\u5b8c\u6574\uff1a\u53ea\u6709 {got}\uff0c\u6587\u4ef6\u6807\u79f0 {announced}\u3002',
      failed: '\u5931\u8d25',
      job: '\u4efb\u52a1',
      copy_id: '\u590d\u5236\u5b8c\u6574\u7684\u4efb\u52a1\u7f16\u53f7',
      copied: '\u5df2\u590d\u5236',
      reconnecting: '\u8fde\u63a5\u4e2d\u65ad\uff1a\u6b63\u5728\u91cd\u8fde\u2026',
      recent: '\u672c\u6d4f\u89c8\u5668\u6700\u8fd1\u7684\u4efb\u52a1',
      recent_clear: '\u6e05\u9664',
      st_done: '\u5b8c\u6210', st_failed: '\u5931\u8d25', st_queued: '\u6392\u961f\u4e2d',
      st_running: '\u8f6c\u5199\u4e2d', st_transcribing: '\u8f6c\u5199\u4e2d',
      st_segmenting: '\u6b63\u5728\u67e5\u627e\u8bed\u97f3', st_loading: '\u6392\u961f\u4e2d',
      no_speech: '\u672a\u68c0\u6d4b\u5230\u8bed\u97f3',
      lang_switch: '\u754c\u9762\u8bed\u8a00',
      e_no_file: ['\u8fd8\u6ca1\u6709\u9009\u62e9\u5f55\u97f3', '\u9009\u62e9\u6587\u4ef6\u3001\u62d6\u5230\u6846\u91cc\uff0c\u6216\u7528\u9ea6\u514b\u98ce\u5f55\u97f3\u3002'],
      e_no_audio_stream: ['\u8fd9\u4e2a\u6587\u4ef6\u6ca1\u6709\u97f3\u8f68', '\u8bf7\u9009\u62e9\u5f55\u97f3\uff0c\u6216\u6709\u58f0\u97f3\u7684\u89c6\u9891\u3002'],
      e_unsupported_media: ['\u65e0\u6cd5\u8bfb\u53d6\u8fd9\u4e2a\u6587\u4ef6\u7684\u97f3\u9891',
        '\u8bf7\u4f7f\u7528\u5e38\u89c1\u683c\u5f0f\uff1awav\u3001mp3\u3001m4a\u3001ogg\u3001opus\u3001flac\u3001webm\u3001mp4\u3001mov \u6216 mkv\u3002'],
      e_empty_audio: ['\u5f55\u97f3\u662f\u7a7a\u7684', '\u8bf7\u5f55\u5236\u6216\u9009\u62e9\u66f4\u957f\u7684\u5f55\u97f3\u3002'],
      e_audio_too_long: ['\u5f55\u97f3\u592a\u957f', '\u8bf7\u526a\u77ed\u6216\u5206\u6bb5\u540e\u518d\u8bd5\u3002'],
      e_audio_too_long_limit: ['\u5f55\u97f3\u592a\u957f', '\u8fd9\u91cc\u7684\u4e0a\u9650\u662f {limit}\uff1a\u8bf7\u526a\u77ed\u6216\u5206\u6bb5\u540e\u518d\u8bd5\u3002'],
      e_upload_too_large: ['\u6587\u4ef6\u592a\u5927', '\u8bf7\u4f7f\u7528\u66f4\u5c0f\u7684\u6587\u4ef6\uff08\u538b\u7f29\u97f3\u9891\u6bd4\u89c6\u9891\u5c0f\u5f97\u591a\uff09\u3002'],
      e_busy: ['\u670d\u52a1\u5668\u7e41\u5fd9', '\u8bf7 {retry} \u79d2\u540e\u518d\u8bd5\u3002'],
      e_not_ready: ['\u670d\u52a1\u6682\u65f6\u4e0d\u53ef\u7528', '\u8bf7\u7a0d\u540e\u518d\u8bd5\u3002'],
      e_job_not_found: ['\u8fd9\u91cc\u627e\u4e0d\u5230\u8fd9\u4e2a\u4efb\u52a1', '\u5b83\u53ef\u80fd\u5c5e\u4e8e\u53e6\u4e00\u53f0\u670d\u52a1\u5668\uff0c\u8bf7\u65b0\u5efa\u4efb\u52a1\u3002'],
      e_job_purged: ['\u8fd9\u4e2a\u4efb\u52a1\u5df2\u4e0d\u518d\u4fdd\u7559', '\u7ed3\u679c\u53ea\u4fdd\u7559\u4e00\u6bb5\u65f6\u95f4\uff1a\u8bf7\u91cd\u65b0\u8f6c\u5199\u3002'],
      e_segmentation_failed: ['\u5f55\u97f3\u5206\u6bb5\u5931\u8d25', '\u8bf7\u91cd\u8bd5\uff1b\u6587\u4ef6\u53ef\u80fd\u5df2\u635f\u574f\u3002'],
      e_path_refused: ['\u4e0a\u4f20\u7684\u6587\u4ef6\u5df2\u8fc7\u671f', '\u8bf7\u91cd\u65b0\u9009\u62e9\u6587\u4ef6\u3002'],
      e_unauthorized: ['\u8fd9\u4e2a\u94fe\u63a5\u65e0\u6548\u6216\u5df2\u8fc7\u671f', '\u8bf7\u5728\u672c\u9875\u65b0\u5efa\u4efb\u52a1\u3002'],
      e_storage_full: ['\u670d\u52a1\u5668\u5df2\u65e0\u7a7a\u95f4\u5b58\u653e\u65b0\u5f55\u97f3', '\u8bf7\u7a0d\u540e\u518d\u8bd5\u3002'],
      e_no_answer: ['\u670d\u52a1\u5668\u6ca1\u6709\u54cd\u5e94', '\u8bf7\u91cd\u8bd5\u3002'],
      e_other: ['\u8f6c\u5199\u5931\u8d25', '\u8bf7\u91cd\u8bd5\uff1b\u5982\u679c\u4e00\u76f4\u5931\u8d25\uff0c\u8bf7\u544a\u8bc9\u670d\u52a1\u5668\u7684\u7ba1\u7406\u8005\u3002']
    }
  };
  // error codes that share one wording
  var ERROR_ALIAS = {
    decoder_crashed: 'unsupported_media', decode_timeout: 'unsupported_media',
    decoder_out_of_memory: 'upload_too_large', queue_full: 'busy', too_many_uploads: 'busy',
    too_many_uploads_from_client: 'busy', gpu_memory_low: 'busy', backlog_full: 'busy',
    storage_error: 'busy', broker_unavailable: 'busy', model_unavailable: 'not_ready',
    audio_deleted: 'job_purged', request_timeout: 'no_answer'
  };

  function storageGet(key) {
    try { return root.localStorage ? root.localStorage.getItem(key) : null; } catch (e) { return null; }
  }

  function storageSet(key, value) {
    try {
      if (!root.localStorage) return;
      if (value === null) root.localStorage.removeItem(key); else root.localStorage.setItem(key, value);
    } catch (e) { /* private mode, full: the page works without */ }
  }

  function pickLang(stored, navLang) {
    if (stored === 'en' || stored === 'zh') return stored;
    return /^zh\b/i.test(String(navLang || '')) ? 'zh' : 'en';
  }

  var navLanguage = root.navigator ? root.navigator.language : 'en';
  var currentLang = pickLang(storageGet(STORE_LANG), navLanguage);
  // Gradio's own labels follow navigator.language: make it say the page's choice (this script
  // runs in the page head, before Gradio starts). Gradio takes a locale it knows ("zh-CN"), and
  // its look-up falls back from there to our "zh" words.
  if (storageGet(STORE_LANG) && root.navigator) {
    var forced = currentLang === 'zh' ? 'zh-CN' : 'en';
    try {
      Object.defineProperty(root.navigator, 'language', { configurable: true, get: function () { return forced; } });
      Object.defineProperty(root.navigator, 'languages', { configurable: true, get: function () { return [forced]; } });
    } catch (e) { /* read-only in this browser: Gradio's labels follow the browser */ }
  }

  function fill(text, vars) {
    return String(text).replace(/\{(\w+)\}/g, function (m, k) {
      return vars && vars[k] != null ? String(vars[k]) : m;
    });
  }

  function t(key, vars) {
    var w = WORDS[currentLang] && WORDS[currentLang][key] != null ? WORDS[currentLang][key] : WORDS.en[key];
    if (w == null) return key;
    return Array.isArray(w) ? w.map(function (s) { return fill(s, vars); }) : fill(w, vars);
  }

  var I18N = Object.freeze({
    lang: function () { return currentLang; },
    setLang: function (l) {
      currentLang = pickLang(l, navLanguage);
      storageSet(STORE_LANG, currentLang);
    },
    t: t,
    words: WORDS
  });
  root.SenseVoiceI18n = I18N;

  // ---- pure helpers ----

  function shortId(id) {
    return String(id == null ? '' : id).replace(/-/g, '').slice(0, 8);
  }

  function formatSeconds(s) {
    s = Number(s);
    if (!isFinite(s) || s < 0) return '';
    if (s < 10) return s.toFixed(2) + ' s';
    if (s < 60) return s.toFixed(1) + ' s';
    var m = Math.floor(s / 60);
    var r = Math.round(s - m * 60);
    if (r === 60) { m += 1; r = 0; }
    return m + ' min ' + (r < 10 ? '0' : '') + r + ' s';
  }

  // a limit in seconds, in the largest whole unit: "4 h", "10 min", "90 s"
  function formatLimit(s) {
    if (!isFinite(s) || s <= 0) return '';
    var zh = currentLang === 'zh';
    if (s % 3600 === 0) return (s / 3600) + (zh ? ' \u5c0f\u65f6' : ' h');
    if (s % 60 === 0) return (s / 60) + (zh ? ' \u5206\u949f' : ' min');
    return s + (zh ? ' \u79d2' : ' s');
  }

  // error code -> [what happened, what to do]
  function errorText(error) {
    var code = error && error.code ? String(error.code) : '';
    code = ERROR_ALIAS[code] || code;
    var key = 'e_' + code;
    // "too long" says the limit, from the server's message ("... than the 14400 s limit")
    var limit = code === 'audio_too_long' && error && /([\d.]+) s limit/.exec(String(error.message || ''));
    if (limit) key = 'e_audio_too_long_limit';
    var w = WORDS.en[key] ? t(key, { retry: error && error.retry_after != null ? error.retry_after : 5,
      limit: limit ? formatLimit(Number(limit[1])) : '' })
      : t('e_other');
    return { title: w[0], hint: w[1], code: code || 'other' };
  }

  // The state a job view is in, in words: { kind: busy|done|error, title, detail, hint,
  // progress (0..1 or null) }. ctx.wall: seconds from the click to now (when this page sent it).
  function describe(view, ctx) {
    view = view || {};
    ctx = ctx || {};
    var stage = String(view.stage || view.status || '');
    var pos = view.position;
    if (stage === 'done') {
      var wall = ctx.wall != null ? ctx.wall
        : (view.finished_at != null && view.created_at != null ? view.finished_at - view.created_at : null);
      var parts = {
        audio: formatSeconds(view.audio_seconds),
        work: formatSeconds(view.duration_s)
      };
      return {
        kind: 'done',
        title: wall != null ? t('done', { seconds: formatSeconds(wall) }) : t('done', { seconds: '' }).trim(),
        detail: view.audio_seconds != null && view.duration_s != null ? t('done_detail', parts) : '',
        hint: '', progress: null
      };
    }
    if (stage === 'failed' || stage === 'refused' || stage === 'purged' || stage === 'error') {
      var e = errorText(view.error || (stage === 'purged' ? { code: 'job_purged' } : null));
      return { kind: 'error', title: e.title, detail: '', hint: e.hint, code: e.code, progress: null };
    }
    if (stage === 'sending') return { kind: 'busy', title: t('sending'), detail: '', hint: '', progress: null };
    if (stage === 'opening') return { kind: 'busy', title: t('opening'), detail: '', hint: '', progress: null };
    if (stage === 'loading') {
      return { kind: 'busy', title: pos ? t('loading_pos', { position: pos }) : t('loading'),
        detail: '', hint: '', progress: null };
    }
    if (stage === 'segmenting') {
      var pc = Math.max(0, Math.min(100, Number(view.percent) || 0));
      return { kind: 'busy', title: t('segmenting', { percent: pc }), detail: '', hint: '', progress: pc / 100 };
    }
    if (stage === 'transcribing' || stage === 'running') {
      var total = Number(view.pieces) || 0;
      var done = Math.max(0, Math.min(total, Number(view.pieces_done) || 0));
      return total > 1
        ? { kind: 'busy', title: t('transcribing_pieces', { done: done, total: total }), detail: '',
          hint: '', progress: done / total }
        : { kind: 'busy', title: t('transcribing'), detail: '', hint: '', progress: null };
    }
    // queued (or anything not known yet)
    return { kind: 'busy', title: pos ? t('queued_pos', { position: pos }) : t('queued'), detail: '',
      hint: '', progress: null };
  }

  // Server-Sent Events: complete events out of a text buffer; the unfinished tail is kept.
  function parseSSE(buffer) {
    var text = String(buffer == null ? '' : buffer).replace(/\r\n?/g, '\n');
    var events = [];
    var end;
    while ((end = text.indexOf('\n\n')) >= 0) {
      var block = text.slice(0, end);
      text = text.slice(end + 2);
      var name = 'message';
      var data = [];
      block.split('\n').forEach(function (line) {
        if (!line || line.charAt(0) === ':') return;
        var colon = line.indexOf(':');
        var field = colon < 0 ? line : line.slice(0, colon);
        var value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') name = value;
        else if (field === 'data') data.push(value);
      });
      if (data.length) events.push({ event: name, data: data.join('\n') });
    }
    return { events: events, rest: text };
  }

  // The signed part of a job's page URL, when it is well-formed (else '').
  function pageQuery(q) {
    q = String(q == null ? '' : q).replace(/^\?/, '');
    return QUERY_RE.test(q) ? q : '';
  }

  // { id, query } of the job in a location.search string, or null.
  function jobFromSearch(search) {
    var params;
    try { params = new URLSearchParams(String(search || '')); } catch (e) { return null; }
    var id = params.get('job');
    if (!id || !ID_RE.test(id)) return null;
    var q = pageQuery('exp=' + (params.get('exp') || '') + '&sig=' + (params.get('sig') || ''));
    return { id: id, query: q };
  }

  function searchWithJob(search, id, query) {
    var params;
    try { params = new URLSearchParams(String(search || '')); } catch (e) { params = new URLSearchParams(); }
    ['job', 'exp', 'sig'].forEach(function (k) { params['delete'](k); });
    var rest = params.toString();
    var own = id ? 'job=' + encodeURIComponent(id) + (pageQuery(query) ? '&' + pageQuery(query) : '') : '';
    var all = [own, rest].filter(Boolean).join('&');
    return all ? '?' + all : '';
  }

  function eventsUrl(id, query) {
    var q = pageQuery(query);
    return '/api/jobs/' + encodeURIComponent(id) + '/events' + (q ? '?' + q : '');
  }

  // A video (or a container the browser calls video) handed to the Audio widget as audio: its
  // check is by type, and the server decodes the audio track of any container it knows.
  function asAudioFile(file) {
    if (!file) return file;
    var type = String(file.type || '');
    if (/^audio\//i.test(type)) return file;
    var ext = (String(file.name || '').match(MEDIA_EXT) || [])[1];
    if (!/^video\//i.test(type) && !ext) return file;
    var sub = type.split('/')[1] || String(ext || 'octet-stream').toLowerCase();
    try {
      return new File([file], file.name, { type: 'audio/' + sub, lastModified: file.lastModified });
    } catch (e) {
      return file;
    }
  }

  // The recent list with ``entry`` first (one per id), at most RECENT_MAX.
  function recentAdd(list, entry) {
    var out = [entry];
    (Array.isArray(list) ? list : []).forEach(function (e) {
      if (e && e.id && e.id !== entry.id && out.length < RECENT_MAX) out.push(e);
    });
    return out;
  }

  // ---- DOM helpers (createElement + textContent only) ----

  function el(tag, cls, text) {
    var e = doc.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function byId(id) {
    return doc.getElementById(id);
  }

  // The element to draw into (SenseVoiceRich.mountPoint: a child next to Gradio's own nodes, or
  // the element itself when it holds nothing else / already holds our ownClass view).
  function mount(id, hostClass, ownClass) {
    var R = root.SenseVoiceRich;
    return R && R.mountPoint ? R.mountPoint(id, hostClass, ownClass) : byId(id);
  }

  function clear(node) {
    while (node && node.firstChild) node.removeChild(node.firstChild);
  }

  function now() {
    return root.performance && root.performance.now ? root.performance.now() : Date.now();
  }

  // ---- the page's state ----

  var state = {
    view: null,        // the latest view of the job on screen
    id: '',
    query: '',
    follow: null,      // { ctrl, id, tries }
    clickAt: null,     // performance.now() of the Submit click that made this job
    submits: 0,
    answered: 0,
    busy: false,
    chosen: null       // { name, seconds }: the file last chosen in the widget, its announced length
  };
  var timings = { click: null, accepted: null, first: null, done: null, shown: null, runs: [] };

  function submitButton() {
    return byId('sv-submit');
  }

  function setBusy(busy) {
    state.busy = !!busy;
    var b = submitButton();
    if (!b) return;
    b.disabled = state.busy;
    b.setAttribute('aria-disabled', state.busy ? 'true' : 'false');
    b.classList.toggle('sv-running', state.busy);
  }

  function setUrl(id, query) {
    if (!root.history || !root.history.replaceState) return;
    var search = searchWithJob(root.location.search, id, query);
    if (search === root.location.search) return;
    try {
      root.history.replaceState(root.history.state, '', root.location.pathname + search + root.location.hash);
    } catch (e) { /* sandboxed */ }
  }

  // ---- rendering: the state line ----

  function renderState(view, extra) {
    var host = mount('sv-state-view', 'sv-state-host', 'sv-state');
    if (!host) return;
    clear(host);
    if (!view) return;
    var wall = null;
    if (view.stage === 'done' && state.clickAt != null && timings.done != null) {
      wall = (timings.done - state.clickAt) / 1000;
    }
    var d = describe(view, { wall: wall });
    var box = el('div', 'sv-state sv-state-' + d.kind + (view.stage ? ' sv-stage-' + String(view.stage) : ''));
    box.setAttribute('role', d.kind === 'error' ? 'alert' : 'status');
    box.setAttribute('aria-live', d.kind === 'error' ? 'assertive' : 'polite');
    box.setAttribute('data-stage', String(view.stage || ''));
    if (d.kind === 'busy') {
      var spin = el('span', 'sv-spinner');
      spin.setAttribute('aria-hidden', 'true');
      box.appendChild(spin);
    } else {
      var icon = el('span', 'sv-state-icon', d.kind === 'done' ? '\u2713' : '!');
      icon.setAttribute('aria-hidden', 'true');
      box.appendChild(icon);
    }
    var text = el('div', 'sv-state-text');
    text.appendChild(el('div', 'sv-state-title', d.title));
    if (d.detail) text.appendChild(el('div', 'sv-state-detail', d.detail));
    if (d.hint) text.appendChild(el('div', 'sv-state-hint', d.hint));
    if (extra) text.appendChild(el('div', 'sv-state-detail sv-state-extra', extra));
    var cut = view.stage === 'done' ? truncatedNote(view) : '';
    if (cut) text.appendChild(el('div', 'sv-state-warning', cut));
    if (d.progress != null) {
      var bar = el('progress', 'sv-progress');
      bar.max = 1;
      bar.value = d.progress;
      text.appendChild(bar);
    }
    box.appendChild(text);
    if (view.id) box.appendChild(jobIdChip(String(view.id)));
    host.appendChild(box);
  }

  // Whether a result of ``got`` seconds is shorter than the ``announced`` length of the file by more
  // than half a second (the CLI's rule, pipeline/audio/decode.py TRUNCATION_SLACK_SECONDS): a
  // truncated upload, where the page said "Done ... 0.16 s of audio" and nothing else.
  function truncated(got, announced) {
    if (got == null || announced == null) return false;
    got = Number(got);
    announced = Number(announced);
    return isFinite(got) && isFinite(announced) && announced > 0 && announced - got > 0.5;
  }

  // The warning for a job made from the file chosen in this page (matched by its name): both lengths.
  function truncatedNote(view) {
    var c = state.chosen;
    if (!c || !view || String(view.filename || '') !== c.name) return '';
    if (!truncated(view.audio_seconds, c.seconds)) return '';
    return t('truncated', { got: formatSeconds(view.audio_seconds), announced: formatSeconds(c.seconds) });
  }

  // Formats whose length the browser estimates from the bit rate rather than reads from a header
  // (as pipeline/audio/decode.py ESTIMATED_DURATION_DEMUXERS): no claim is made about those.
  var ESTIMATED_EXT = /\.(mp3|aac|adts|amr|ts|mts|m2ts)$/i;
  var ESTIMATED_TYPE = /^audio\/(mpeg|mp3|aac|aacp|amr|amr-wb)$|^video\/mp2t$/i;

  // The length a RIFF/WAVE header announces: its data chunk's stated size over the fmt chunk's byte
  // rate (what FFmpeg reports, and the CLI compares with). NaN when it does not say (not a WAV, a
  // streamed WAV's size 0 or 0xFFFFFFFF). ``buf``: the file's first bytes (an ArrayBuffer).
  function wavAnnounced(buf) {
    var v;
    try { v = new DataView(buf); } catch (e) { return NaN; }
    var tag = function (p) {
      return String.fromCharCode(v.getUint8(p), v.getUint8(p + 1), v.getUint8(p + 2), v.getUint8(p + 3));
    };
    if (v.byteLength < 12 || tag(0) !== 'RIFF' || tag(8) !== 'WAVE') return NaN;
    var byteRate = 0;
    var pos = 12;
    for (var i = 0; i < 64 && pos + 8 <= v.byteLength; i++) {
      var id = tag(pos);
      var size = v.getUint32(pos + 4, true);
      if (id === 'fmt ' && size >= 16 && pos + 20 <= v.byteLength) byteRate = v.getUint32(pos + 16, true);
      if (id === 'data') return byteRate > 0 && size > 0 && size !== 0xFFFFFFFF ? size / byteRate : NaN;
      pos += 8 + size + (size & 1);
    }
    return NaN;
  }

  // The length ``file`` announces: a WAV's header read here (the browser's own reading stops at
  // the end of the bytes), else as the browser reads it (a detached <audio>, metadata only). A
  // Promise of seconds, NaN when it cannot tell.
  function announcedSeconds(file) {
    if (!file) return Promise.resolve(NaN);
    var head = typeof file.slice === 'function' ? file.slice(0, 65536) : null;
    var read = head && typeof head.arrayBuffer === 'function' ? head.arrayBuffer() : Promise.resolve(null);
    return read.then(wavAnnounced, function () { return NaN; }).then(function (wav) {
      return isFinite(wav) ? wav : playerSeconds(file);
    });
  }

  function playerSeconds(file) {
    return new Promise(function (resolve) {
      var name = String(file.name || '');
      var type = String(file.type || '');
      // (a video's length is its longest track's, the decoder's the audio track's: no claim either)
      if (ESTIMATED_EXT.test(name) || ESTIMATED_TYPE.test(type) || MEDIA_EXT.test(name) ||
          /^video\//i.test(type) || !root.URL || typeof root.URL.createObjectURL !== 'function') {
        resolve(NaN);
        return;
      }
      var a = doc.createElement('audio');
      var url = root.URL.createObjectURL(file);
      var timer = 0;
      var end = function (v) {
        if (!url) return;
        root.clearTimeout(timer);
        a.removeAttribute('src');
        root.URL.revokeObjectURL(url);
        url = '';
        resolve(v);
      };
      timer = root.setTimeout(function () { end(NaN); }, 10000);
      a.preload = 'metadata';
      a.addEventListener('loadedmetadata', function () { end(Number(a.duration)); });
      a.addEventListener('error', function () { end(NaN); });
      a.src = url;
    });
  }

  // A file chosen or dropped in the widget: its announced length, kept for its job's result.
  function noteChosen(file) {
    if (!file) return;
    var entry = { name: String(file.name || ''), seconds: NaN };
    state.chosen = entry;
    announcedSeconds(file).then(function (s) {
      entry.seconds = s;
      var v = state.view;
      if (state.chosen === entry && v && v.stage === 'done' && truncatedNote(v)) renderState(v);
    });
  }

  // Two overlapping sheets, drawn (no icon font, no emoji).
  function copyIcon() {
    var NS = 'http://www.w3.org/2000/svg';
    var svg = doc.createElementNS(NS, 'svg');
    svg.setAttribute('viewBox', '0 0 16 16');
    svg.setAttribute('width', '14');
    svg.setAttribute('height', '14');
    svg.setAttribute('aria-hidden', 'true');
    [['5', '5', '9', '9'], ['2', '2', '9', '9']].forEach(function (r) {
      var rect = doc.createElementNS(NS, 'rect');
      rect.setAttribute('x', r[0]);
      rect.setAttribute('y', r[1]);
      rect.setAttribute('width', r[2]);
      rect.setAttribute('height', r[3]);
      rect.setAttribute('rx', '1.5');
      rect.setAttribute('fill', 'none');
      rect.setAttribute('stroke', 'currentColor');
      rect.setAttribute('stroke-width', '1.4');
      svg.appendChild(rect);
    });
    return svg;
  }

  function jobIdChip(id) {
    var wrap = el('span', 'sv-jobid');
    wrap.appendChild(el('span', 'sv-jobid-label', t('job') + ' '));
    var code = el('code', 'sv-jobid-short', shortId(id));
    code.title = id;
    wrap.appendChild(code);
    var btn = el('button', 'sv-btn sv-jobid-copy');
    btn.type = 'button';
    btn.title = t('copy_id');
    btn.setAttribute('aria-label', t('copy_id'));
    btn.appendChild(copyIcon());
    btn.addEventListener('click', function () {
      var R = root.SenseVoiceRich;
      var done = function () { btn.title = t('copied'); btn.classList.add('sv-copied'); };
      if (R && R.copyText) R.copyText(id).then(done, function () {});
    });
    wrap.appendChild(btn);
    return wrap;
  }

  // ---- rendering: the result ----

  // A recording the review view is for: timed segments at two or more places, or speakers (a
  // long recording's VAD pieces, a stereo call). A short clip (one piece, whatever the number of
  // its sub-segments) keeps the compact chips.
  function reviewable(view) {
    var segs = view && view.result && Array.isArray(view.result.segments) ? view.result.segments : [];
    var spans = {};
    var n = 0;
    for (var i = 0; i < segs.length; i++) {
      var s = segs[i];
      if (!s) continue;
      if (s.speaker != null && s.speaker !== '') return true;
      if (s.start == null && s.end == null) continue;
      var key = String(s.start) + '/' + String(s.end);
      if (!spans[key]) { spans[key] = 1; n += 1; }
      if (n > 1) return true;
    }
    return false;
  }

  function clearResult() {
    var R = root.SenseVoiceRich;
    var V = root.SenseVoiceReview;
    var res = mount('sv-result', 'sv-host', 'sv-rich');
    if (res) clear(res);
    if (V && V.renderInto) V.renderInto('sv-review', '');
    if (doc.body) doc.body.classList.remove('sv-reviewing');
    return R;
  }

  function renderResult(view) {
    var R = root.SenseVoiceRich;
    var V = root.SenseVoiceReview;
    clearResult();
    if (!view || view.stage !== 'done' || !view.result) return;
    var opts = {
      audioUrl: ownPath(view.links && view.links.audio) ||
        '/api/jobs/' + encodeURIComponent(String(view.id)) + '/audio',
      fallbackAudioUrl: pageAudio()
    };
    if (reviewable(view) && V) {
      // a timed recording: the review view is the result (summary, lanes, table)
      if (doc.body) doc.body.classList.add('sv-reviewing');
      V.renderInto('sv-review', view, opts);
      return;
    }
    if (R && R.renderInto) {
      var host = R.renderInto('sv-result', view.result.raw_text || '', { emptyText: t('no_speech') });
      if (host && V && V.exportsBar) {
        var bar = V.exportsBar(view, opts);
        var rich = host.querySelector('.sv-rich'); // (its colours: style.css's .sv-rich variables)
        if (bar) (rich || host).appendChild(bar);
      }
    }
  }

  function ownPath(u) {
    return typeof u === 'string' && u.charAt(0) === '/' && u.charAt(1) !== '/' && u.charAt(1) !== '\\' ? u : '';
  }

  function pageAudio() {
    var a = doc.querySelector('#sv-audio audio');
    return a && a.src ? a.src : '';
  }

  // ---- following a job ----

  function stopFollow() {
    if (state.follow) {
      try { state.follow.ctrl.abort(); } catch (e) { /* gone */ }
      if (state.follow.timer) root.clearTimeout(state.follow.timer);
    }
    state.follow = null;
  }

  // A long recording's result is not pushed with its final event (every follower of the job
  // would receive it): the event says result_omitted and the page fetches it once, signed link.
  function fetchOmitted(view) {
    var url = ownPath(view.links && view.links.result);
    var id = state.id;
    stopFollow();
    if (!url) { failWith('no_answer'); return; }
    renderState(view);
    root.fetch(url, { cache: 'no-store', credentials: 'same-origin' }).then(function (resp) {
      return resp.ok ? resp.json() : null;
    }).then(function (body) {
      if (state.id !== id) return;
      if (!body || !body.result) { failWith('no_answer'); return; }
      var full = {};
      Object.keys(view).forEach(function (k) { full[k] = view[k]; });
      full.result = body.result;
      full.result_omitted = false;
      show(full);
    }, function () {
      if (state.id === id) failWith('no_answer');
    });
  }

  function show(view) {
    if (!view) return;
    if (view.result_omitted && !view.result && String(view.stage) === 'done') {
      fetchOmitted(view);
      return;
    }
    var first = timings.first == null;
    if (first) timings.first = now();
    var stage = String(view.stage || view.status || '');
    var final = !!FINAL[stage];
    if (final && timings.done == null) timings.done = now();
    state.view = view;
    if (view.id && view.created_at != null) recentUpdate(view); // the server's views only
    renderState(view);
    if (final) {
      setBusy(false);
      stopFollow();
      renderResult(view);
      announce(view);
      if (stage === 'done') {
        timings.shown = now();
        if (state.clickAt != null) {
          timings.runs.push({ click: state.clickAt, accepted: timings.accepted, first: timings.first,
            done: timings.done, shown: timings.shown, server: view.duration_s });
        }
      }
    } else {
      setBusy(true);
      clearResult();
    }
  }

  // After a job ends the result is brought into view and focus moves to its state (a phone showed
  // it below the fold and focus fell to the page top), when this page sent or opened the job.
  function reveal() {
    var target = byId('sv-state-view');
    if (!target || !target.getBoundingClientRect) return;
    var box = target.getBoundingClientRect();
    var h = root.innerHeight || 0;
    if (box.top < 0 || box.top > h * 0.6) {
      try { target.scrollIntoView({ block: 'start', behavior: 'auto' }); } catch (e) { target.scrollIntoView(); }
    }
    if (!target.hasAttribute('tabindex')) target.setAttribute('tabindex', '-1');
    try { target.focus({ preventScroll: true }); } catch (e) { /* old browser */ }
  }

  // the review editor (desk.js) follows the job shown
  function announce(view) {
    reveal();
    if (!root.CustomEvent || !doc.dispatchEvent) return;
    doc.dispatchEvent(new root.CustomEvent('sv-job-shown', { detail: view }));
  }

  function failWith(code, extra) {
    show({ id: state.id || null, stage: 'failed', error: { code: code } });
    if (extra) renderState(state.view, extra);
  }

  // tries: failed attempts in a row so far (a retry carries them; any event resets them)
  function follow(id, query, tries) {
    stopFollow();
    var ctrl = root.AbortController ? new root.AbortController() : null;
    var f = { ctrl: ctrl || { abort: function () {} }, id: id, query: query, tries: tries || 0, timer: 0 };
    state.follow = f;
    var url = eventsUrl(id, query);
    var got = false;
    root.fetch(url, { signal: ctrl ? ctrl.signal : undefined, cache: 'no-store', credentials: 'same-origin',
      headers: { Accept: 'text/event-stream' } }).then(function (resp) {
      if (state.follow !== f) return null;
      if (!resp.ok) {
        return resp.json().then(function (body) {
          return body && body.error ? body.error : { code: 'status_' + resp.status };
        }, function () { return { code: 'status_' + resp.status }; }).then(function (error) {
          if (state.follow !== f) return;
          // a server restarting (pipeline/web/early.py) answers 503 "starting": the job is kept, follow again
          if (resp.status === 503 && error.code === 'starting') { retry(f, got); return; }
          state.follow = null;
          if (resp.status === 404 || resp.status === 410) recentForget(id);
          show({ id: id, stage: 'failed', error: error });
        });
      }
      var reader = resp.body.getReader();
      var decoder = new root.TextDecoder();
      var buf = '';
      function pump() {
        return reader.read().then(function (r) {
          if (state.follow !== f) { try { reader.cancel(); } catch (e) { /* gone */ } return null; }
          if (r.done) return ended();
          buf += decoder.decode(r.value, { stream: true });
          var parsed = parseSSE(buf);
          buf = parsed.rest;
          parsed.events.forEach(function (ev) {
            if (state.follow !== f) return;
            got = true;
            f.tries = 0;
            var data;
            try { data = JSON.parse(ev.data); } catch (e) { return; }
            if (ev.event === 'job') show(data);
            else if (ev.event === 'error') {
              recentForget(id);
              show({ id: id, stage: 'failed', error: data && data.error });
            }
          });
          return pump();
        });
      }
      function ended() {
        // the stream ended before a final state (its time limit, a restart): follow again
        if (state.follow === f && !(state.view && FINAL[state.view.stage])) retry(f, got);
        return null;
      }
      return pump();
    })['catch'](function () {
      if (state.follow === f) retry(f, got);
    });
  }

  function retry(f, got) {
    f.tries = got ? 0 : f.tries + 1;
    if (f.tries > RETRY_MS.length) {
      state.follow = null;
      failWith('no_answer');
      return;
    }
    if (f.tries > 1 && state.view) renderState(state.view, t('reconnecting'));
    f.timer = root.setTimeout(function () {
      if (state.follow === f) follow(f.id, f.query, f.tries);
    }, RETRY_MS[Math.max(0, f.tries - 1)] || 250);
  }

  // ---- recent jobs (this browser) ----

  function recentList() {
    try {
      var list = JSON.parse(storageGet(STORE_RECENT) || '[]');
      return Array.isArray(list) ? list.filter(function (e) { return e && ID_RE.test(String(e.id)); }) : [];
    } catch (e) {
      return [];
    }
  }

  function recentSave(list) {
    storageSet(STORE_RECENT, list.length ? JSON.stringify(list) : null);
    renderRecent();
  }

  function recentUpdate(view) {
    var list = recentList();
    var old = null;
    list.forEach(function (e) { if (e.id === view.id) old = e; });
    var q = pageQuery(view.links && view.links.page) || (old ? pageQuery(old.q) : '') ||
      (state.id === view.id ? state.query : '');
    var entry = {
      id: String(view.id),
      q: q,
      name: String(view.filename || (old && old.name) || ''),
      at: view.created_at || (old && old.at) || Date.now() / 1000,
      stage: String(view.stage || '')
    };
    if (old && old.q === entry.q && old.name === entry.name && old.stage === entry.stage &&
        list[0] && list[0].id === entry.id) return;
    recentSave(recentAdd(list, entry));
  }

  function recentForget(id) {
    recentSave(recentList().filter(function (e) { return e.id !== id; }));
  }

  function renderRecent() {
    var host = mount('sv-recent', 'sv-recent-host', 'sv-recent');
    if (!host) return;
    clear(host);
    var list = recentList();
    if (!list.length) return;
    var box = el('div', 'sv-recent');
    var head = el('div', 'sv-recent-head');
    head.appendChild(el('span', 'sv-recent-title', t('recent')));
    var clr = el('button', 'sv-btn sv-recent-clear', t('recent_clear'));
    clr.type = 'button';
    clr.addEventListener('click', function () { recentSave([]); });
    head.appendChild(clr);
    box.appendChild(head);
    var ul = el('ul', 'sv-recent-list');
    list.forEach(function (e) {
      var li = el('li', 'sv-recent-item' + (e.id === state.id ? ' sv-current' : ''));
      var b = el('button', 'sv-recent-open');
      b.type = 'button';
      b.setAttribute('data-job', e.id);
      b.appendChild(el('span', 'sv-recent-name', e.name || shortId(e.id)));
      var when = '';
      try { when = new Date(Number(e.at) * 1000).toLocaleString(currentLang === 'zh' ? 'zh-CN' : 'en'); } catch (x) { when = ''; }
      var stage = e.stage && WORDS.en['st_' + e.stage] ? t('st_' + e.stage) : '';
      b.appendChild(el('span', 'sv-recent-meta', [when, stage].filter(Boolean).join(' \u00b7 ')));
      b.title = e.id;
      b.addEventListener('click', function () { open(e.id, e.q); });
      li.appendChild(b);
      ul.appendChild(li);
    });
    box.appendChild(ul);
    host.appendChild(box);
  }

  // ---- the language switch ----

  function renderTopbar() {
    var host = mount('sv-topbar', 'sv-topbar-host', 'sv-langs');
    if (!host) return;
    clear(host);
    var nav = el('div', 'sv-langs');
    nav.setAttribute('role', 'group');
    nav.setAttribute('aria-label', t('lang_switch'));
    [['en', 'English'], ['zh', '\u4e2d\u6587']].forEach(function (l) {
      var b = el('button', 'sv-btn sv-lang-switch' + (l[0] === currentLang ? ' sv-current' : ''), l[1]);
      b.type = 'button';
      b.lang = l[0];
      b.setAttribute('data-lang', l[0]);
      b.setAttribute('aria-pressed', l[0] === currentLang ? 'true' : 'false');
      b.addEventListener('click', function () {
        if (l[0] === currentLang) return;
        I18N.setLang(l[0]);
        root.location.reload(); // Gradio's labels are read at start; the job is in the URL
      });
      nav.appendChild(b);
    });
    host.appendChild(nav);
  }

  // Gradio sets its locale before it adds this script to the page: a chosen language is handed to
  // its i18n store (the changeLocale export of its core module, found among the loaded assets).
  // Without it (another Gradio), Gradio's labels follow the browser and only this page's words
  // switch.
  function gradioLocale(locale) {
    try {
      var entries = root.performance && root.performance.getEntriesByType
        ? root.performance.getEntriesByType('resource') : [];
      for (var i = 0; i < entries.length; i++) {
        if (/\/assets\/core-[\w-]+\.js(\?.*)?$/.test(entries[i].name)) {
          return import(entries[i].name).then(function (m) {
            if (m && typeof m.changeLocale === 'function') m.changeLocale(locale);
          })['catch'](function () {});
        }
      }
    } catch (e) { /* not this Gradio */ }
    return null;
  }

  // ---- the widget takes video ----

  function inAudioWidget(node) {
    return !!(node && node.closest && node.closest('#sv-audio'));
  }

  function widenAccept(input) {
    if (input && input.type === 'file' && input.accept && input.accept.indexOf('video/*') < 0) {
      input.accept = input.accept + ', video/*, .mp4, .m4v, .mov, .mkv, .webm, .avi, .ts, .mts, .wmv';
    }
  }

  // A file the browser types as something other than audio or video (a .txt, a PDF, a picture):
  // Gradio's check answered it with a 200-character toast in English; the page says it itself.
  function notMedia(file) {
    var type = String(file && file.type || '');
    if (!type || /^(audio|video)\//i.test(type)) return false;
    var name = String(file.name || '');
    return !MEDIA_EXT.test(name) && !AUDIO_EXT.test(name);
  }

  function refuseFile() {
    stopFollow();
    state.id = '';
    show({ id: null, stage: 'refused', error: { code: 'unsupported_media' } });
  }

  function installMediaIntake() {
    // a video chosen in the file dialog: re-typed before Gradio's check sees it
    doc.addEventListener('change', function (ev) {
      var input = ev.target;
      if (!input || input.type !== 'file' || !inAudioWidget(input) || !input.files || !input.files.length) return;
      var files = Array.prototype.slice.call(input.files);
      if (files.some(notMedia)) {
        ev.stopImmediatePropagation();
        try { input.value = ''; } catch (e) { /* read-only */ }
        refuseFile();
        return;
      }
      noteChosen(files[0]);
      var typed = files.map(asAudioFile);
      if (typed.every(function (f, i) { return f === files[i]; })) return;
      ev.stopImmediatePropagation();
      var dt = new root.DataTransfer();
      typed.forEach(function (f) { dt.items.add(f); });
      input.files = dt.files;
      input.dispatchEvent(new root.Event('change', { bubbles: true }));
    }, true);
    // a video dropped on the widget: handed to its file input the same way
    doc.addEventListener('drop', function (ev) {
      if (!inAudioWidget(ev.target) || !ev.dataTransfer || !ev.dataTransfer.files.length) return;
      var files = Array.prototype.slice.call(ev.dataTransfer.files);
      if (files.some(notMedia)) {
        ev.preventDefault();
        ev.stopImmediatePropagation();
        refuseFile();
        return;
      }
      noteChosen(files[0]);
      if (files.every(function (f) { return asAudioFile(f) === f; })) return;
      var input = doc.querySelector('#sv-audio input[type=file]');
      if (!input) return;
      ev.preventDefault();
      ev.stopImmediatePropagation();
      var dt = new root.DataTransfer();
      files.forEach(function (f) { dt.items.add(f); });
      input.files = dt.files;
      input.dispatchEvent(new root.Event('change', { bubbles: true }));
    }, true);
    // the file dialog offers videos too
    doc.addEventListener('click', function (ev) {
      if (!inAudioWidget(ev.target)) return;
      var inputs = doc.querySelectorAll('#sv-audio input[type=file]');
      for (var i = 0; i < inputs.length; i++) widenAccept(inputs[i]);
    }, true);
  }

  // ---- Gradio's own English in a Chinese page ----

  // Words Gradio 6 draws in English whatever its locale: the empty upload widget's text (drawn once,
  // not from its zh-CN table) and the player's labels (English in its code). In a Chinese page they
  // are put in Chinese where they appear (Gradio's own zh-CN words where its table has them).
  function secondsZh(m, n) { return Math.round(Number(n) * 100) / 100 + ' \u79d2'; }
  var GRADIO_ZH = [
    [/^Drop Audio Here$/, '\u5c06\u97f3\u9891\u62d6\u653e\u5230\u6b64\u5904'],
    [/^- or -$/, '- \u6216 -'],
    [/^Click to Upload$/, '\u70b9\u51fb\u4e0a\u4f20'],
    [/^Loading\.*$/, '\u52a0\u8f7d\u4e2d'],
    [/^Drop an audio file here to upload$/, '\u5c06\u97f3\u9891\u6587\u4ef6\u62d6\u653e\u5230\u6b64\u5904\u4ee5\u4e0a\u4f20'],
    [/^(File upload|Upload file)$/, '\u4e0a\u4f20\u6587\u4ef6'],
    [/^Record audio$/, '\u5f55\u97f3'],
    [/^Adjust volume$/, '\u8c03\u8282\u97f3\u91cf'],
    [/^Reset audio$/, '\u91cd\u7f6e\u97f3\u9891'],
    [/^undo$/i, '\u64a4\u9500'],
    [/^Trim audio to selection$/, '\u88c1\u526a\u5230\u6240\u9009\u7247\u6bb5'],
    [/^Adjust playback speed to ([\d.]+)x$/, '\u64ad\u653e\u901f\u5ea6\u8c03\u4e3a $1\u00d7'],
    [/^Skip backwards by ([\d.]+) seconds?$/, function (m, n) { return '\u540e\u9000 ' + secondsZh(m, n); }],
    [/^Skip forward by ([\d.]+) seconds?$/, function (m, n) { return '\u524d\u8fdb ' + secondsZh(m, n); }]
  ];

  function gradioZh(text) {
    var s = String(text == null ? '' : text).trim();
    for (var i = 0; i < GRADIO_ZH.length; i++) {
      if (GRADIO_ZH[i][0].test(s)) return s.replace(GRADIO_ZH[i][0], GRADIO_ZH[i][1]);
    }
    return null;
  }

  var LABEL_ATTRS = ['aria-label', 'title', 'placeholder'];

  // Gradio's English inside the upload widget and in its screen-reader status lines, in Chinese
  // (their texts, and the widget's labels).
  function gradioWordsZh() {
    var box = doc.getElementById('sv-audio');
    if (currentLang !== 'zh') return;
    var spoken = doc.querySelectorAll('.sr-only[role=status]');
    var hosts = box ? [box] : [];
    for (var k = 0; k < spoken.length; k++) hosts.push(spoken[k]);
    hosts.forEach(function (host) {
      var walk = doc.createTreeWalker(host, 4 /* NodeFilter.SHOW_TEXT */);
      while (walk.nextNode()) {
        var zh = gradioZh(walk.currentNode.nodeValue);
        if (zh !== null) walk.currentNode.nodeValue = zh;
      }
    });
    if (!box) return;
    var labelled = box.querySelectorAll('[aria-label], [title], [placeholder]');
    for (var i = 0; i < labelled.length; i++) {
      LABEL_ATTRS.forEach(function (a) {
        var v = labelled[i].getAttribute(a);
        var zh = v ? gradioZh(v) : null;
        if (zh !== null) labelled[i].setAttribute(a, zh);
      });
    }
  }

  function installGradioWordsZh() {
    if (currentLang !== 'zh' || typeof root.MutationObserver !== 'function' || !doc.body) return;
    var queued = false;
    new root.MutationObserver(function () {
      if (queued) return;
      queued = true;
      root.setTimeout(function () { queued = false; gradioWordsZh(); }, 0);
    }).observe(doc.body, { subtree: true, childList: true, characterData: true, attributes: true,
      attributeFilter: LABEL_ATTRS });
    gradioWordsZh();
  }

  // ---- tag icons without an emoji font ----

  function emojiSupported() {
    try {
      var c = doc.createElement('canvas');
      c.width = 24;
      c.height = 24;
      var x = c.getContext('2d');
      if (!x) return true;
      x.textBaseline = 'top';
      x.font = '18px sans-serif';
      x.fillStyle = '#000';
      x.fillText('\ud83d\ude00', 0, 0);
      var d = x.getImageData(0, 0, 24, 24).data;
      for (var i = 0; i < d.length; i += 4) {
        if (d[i + 3] > 0 && (Math.abs(d[i] - d[i + 1]) > 8 || Math.abs(d[i + 1] - d[i + 2]) > 8)) return true;
      }
      return false; // a missing glyph box, or a monochrome font: draw CSS icons instead
    } catch (e) {
      return true;
    }
  }

  // ---- the Gradio hooks ----

  function submitting() {
    if (state.busy && state.view && !FINAL[state.view.stage]) return; // (Submit is disabled)
    stopFollow();
    state.submits += 1;
    state.clickAt = now();
    timings.click = state.clickAt;
    timings.accepted = timings.first = timings.done = timings.shown = null;
    state.id = '';
    state.query = '';
    state.view = null;
    setBusy(true);
    clearResult();
    renderState({ stage: 'sending' });
  }

  function accepted(json) {
    if (json == null || String(json).trim() === '') return;
    var view;
    try { view = JSON.parse(json); } catch (e) { return; }
    state.answered = state.submits;
    timings.accepted = now();
    if (!view || !view.id) {
      state.id = '';
      show({ id: null, stage: 'refused', error: view && view.error });
      return;
    }
    state.id = String(view.id);
    state.query = pageQuery(view.links && view.links.page);
    setUrl(state.id, state.query);
    show(view);
    if (!FINAL[String(view.stage)]) follow(state.id, state.query);
  }

  function submitEnded() {
    var n = state.submits;
    root.setTimeout(function () {
      if (state.answered < n && state.submits === n) {
        show({ id: null, stage: 'refused', error: { code: 'no_answer' } });
      }
    }, 100);
  }

  function open(id, query) {
    if (!ID_RE.test(String(id || ''))) return;
    stopFollow();
    state.id = String(id);
    state.query = pageQuery(query);
    state.clickAt = null;
    timings.accepted = timings.first = timings.done = timings.shown = null;
    state.view = null;
    setUrl(state.id, state.query);
    setBusy(true);
    clearResult();
    renderState({ id: state.id, stage: 'opening' });
    renderRecent();
    follow(state.id, state.query);
  }

  function reset() {
    stopFollow();
    state.id = '';
    state.query = '';
    state.view = null;
    state.clickAt = null;
    state.chosen = null;
    setUrl('', '');
    setBusy(false);
    clearResult();
    renderState(null);
    renderRecent();
    return [null, '', ''];
  }

  var booted = false;

  function boot() {
    if (booted) return;
    booted = true;
    if (doc.documentElement) doc.documentElement.lang = currentLang === 'zh' ? 'zh' : 'en';
    if (storageGet(STORE_LANG)) gradioLocale(currentLang === 'zh' ? 'zh-CN' : 'en');
    renderTopbar();
    renderRecent();
    installGradioWordsZh();
    var job = jobFromSearch(root.location.search);
    if (job) open(job.id, job.query);
  }

  if (doc && doc.addEventListener) {
    installMediaIntake();
    var mark = function () {
      if (!emojiSupported()) doc.documentElement.classList.add('sv-no-emoji');
    };
    if (doc.readyState === 'loading') doc.addEventListener('DOMContentLoaded', mark); else mark();
    // a click on Submit while a job runs does nothing (the button is disabled too)
    doc.addEventListener('click', function (ev) {
      var b = ev.target && ev.target.closest ? ev.target.closest('#sv-submit') : null;
      if (b && state.busy) { ev.preventDefault(); ev.stopImmediatePropagation(); }
    }, true);
  }

  var api = Object.freeze({
    boot: boot,
    submitting: submitting,
    accepted: accepted,
    submitEnded: submitEnded,
    reset: reset,
    open: open,
    timings: timings,
    describe: describe,
    parseSSE: parseSSE,
    pageQuery: pageQuery,
    jobFromSearch: jobFromSearch,
    searchWithJob: searchWithJob,
    asAudioFile: asAudioFile,
    shortId: shortId,
    formatSeconds: formatSeconds,
    errorText: errorText,
    recentAdd: recentAdd,
    truncated: truncated,
    wavAnnounced: wavAnnounced,
    announcedSeconds: announcedSeconds,
    gradioZh: gradioZh,
    reviewable: reviewable,
    pickLang: pickLang
  });
  root.SenseVoiceApp = api;
  if (typeof module === 'object' && module && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : this);
