/*
 * SenseVoice live captions in the page: the microphone streams to the server and the transcript
 * grows on screen while the person speaks. Plain browser script: no modules, no build step. Loaded
 * after richtext.js, review.js, app.js and live-worklet.js.
 *
 *   window.SenseVoiceLive = {
 *     boot(config, options),  // Gradio's load hook: the mode switch, the panel; config from ui.py
 *                             //   { enabled, streamPath, linkPath, uploadPath, submitPath,
 *                             //     keepSeconds }
 *     setOptions(options),    // { language, useItn }: the page's choices (used at the next start)
 *     setMode('file'|'live'), mode(),
 *     start(), stop(), save(),
 *     session(),              // a copy of what is on screen: { phase, error, finals, partial, ... }
 *     streamUrl, applyMessage, closeReason, errorText, describe, wavHeader, clock, limitText,
 *     micError, recordingName                                  // pure helpers (unit-tested)
 *   };
 *
 * The mode switch (File | Live) swaps the input column: Live hides the upload widget and the job
 * views (a saved job switches back to File, where they are) and shows the Start/Stop button, the
 * state, a level meter and the transcript. ``?mode=live`` in the URL opens the page in Live mode.
 *
 * Audio: getUserMedia -> an AudioContext at the device's rate -> the AudioWorklet "sv-pcm16"
 * (static/live-worklet.js: low-pass + downsampling to 16 kHz, 16-bit little-endian, 100 ms chunks)
 * -> binary frames on the WebSocket GET /api/stream?language=..&use_itn=..&sample_rate=<SAMPLE_RATE_HZ>
 * (chunks made before the socket opens are held and sent when it does). With an API token the
 * server wants a live link (?exp=..&sig=..): the page asks the UI for a fresh one at each start
 * (config.linkPath, the UI's "live_link" endpoint, behind its login). Stop: the microphone
 * closes, the worklet hands over what it holds, the page sends {"type":"end"}, the server answers
 * the last finals and closes with 1000.
 *
 * Transcript: each "final" is a settled utterance (its time, the chips of its raw tags drawn by
 * SenseVoiceRich, the text); the "partial" is the utterance in progress, in italics and greyed,
 * replaced in place by the next partial or by its final. Nothing is said about speech that the
 * server did not send.
 *
 * States, from what happened, never guessed: waiting for the microphone, connecting, listening
 * (with the time and a level meter), finishing the last words, stopped, error (red: what happened
 * and what to do; the server's refusals worded from their code: too many live streams, busy, not
 * ready, not signed in, idle, too long).
 *
 * Save as a job: the page keeps the PCM it sent (at most config.keepSeconds, the server's upload
 * and duration limits, said under the button), wraps it in a WAV and submits it through the UI's own
 * submit (the Gradio upload route, then its "submit" endpoint: the same handler, checks and login as
 * the Transcribe button); static/app.js then follows the job (state, result, review view, exports).
 *
 * Safety: the DOM is built with createElement + textContent only (server text is never markup).
 */
(function (root) {
  'use strict';

  var doc = root.document;
  var VOCAB = root.SenseVoiceVocab; // the server's vocabulary (pipeline/web/vocab.py), on the page first
  var OUT_RATE = VOCAB.sampleRateHz; // Hz: what the worklet makes and the server is told
  var CHUNK = 1600; // samples per worklet message (100 ms)
  var PENDING_MAX = 30 * OUT_RATE; // samples held before the socket opens (30 s)
  var STOP_WAIT_MS = 20000; // after "end": the last finals, then the server's close
  var FLUSH_WAIT_MS = 500; // the worklet's last samples
  var SLOW_BYTES = 3 * OUT_RATE * 2; // unsent audio beyond 3 s: the connection is behind
  var LANG_RE = /^[a-z]{2,8}$/;
  var PATH_RE = /^\/[A-Za-z0-9/_.-]*$/;
  var QUERY_RE = /^[A-Za-z0-9_.~=&%-]*$/;
  var ACTIVE = { connecting: 1, listening: 1, stopping: 1 };

  // ---- words ----

  var WORDS = {
    en: {
      mode_label: 'Input',
      mode_file: 'File',
      mode_live: 'Live',
      mode_live_title: 'Live captions from the microphone',
      start: 'Start live captions',
      stop: 'Stop',
      mic_wait: 'Waiting for the microphone\u2026',
      mic_wait_hint: 'Allow this page to use the microphone if the browser asks.',
      connecting: 'Connecting to the server\u2026',
      listening: 'Listening: speak, and the text appears as you talk',
      stopping: 'Finishing the last words\u2026',
      stopped: 'Stopped',
      recorded: '{time} recorded',
      idle_hint: 'Press Start and speak: the transcript appears while you talk, with its language, emotion and sound events.',
      slow: 'The connection is slow: the captions lag behind.',
      no_end: 'The last words did not arrive in time: what arrived is shown.',
      keep_note: 'The first {limit} of a live recording can be saved as a job (review view and downloads).',
      keep_full: 'Only the first {limit} is kept for saving; the captions go on.',
      save: 'Save as a job',
      save_hint: 'Transcribes the whole recording again as a job: review view, table and downloads.',
      saved: 'Saved as a job',
      transcript: 'Live transcript',
      copy: 'Copy',
      copy_title: 'Copy the settled text',
      copied: 'Copied',
      provisional: 'provisional',
      level: 'Microphone level',
      e_insecure: ['Live captions need a secure page', 'Open this page over https (or on this computer, as localhost).'],
      e_no_worklet: ['This browser cannot stream audio', 'Use a current Chrome, Edge, Firefox or Safari.'],
      e_mic_denied: ['The microphone is blocked', 'Allow this page to use the microphone (the icon in the address bar), then start again.'],
      e_mic_missing: ['No microphone found', 'Connect a microphone, then start again.'],
      e_mic_busy: ['The microphone cannot be opened', 'Another application may be using it: close it, then start again.'],
      e_connect: ['Could not connect to the live service', 'Check the connection, or reload the page, then try again.'],
      e_lost: ['The connection to the server was lost', 'What was transcribed stays here; start again to go on.'],
      e_ended: ['The server ended the live captions', 'What was transcribed stays here; start again to go on.'],
      e_refused: ['The server refused the live connection', 'Reload the page, then try again.'],
      e_too_many_streams: ['Too many live captions are running on this server', 'Try again in a minute, or transcribe a recording instead.'],
      e_busy: ['The server is busy', 'Try again in {retry} s.'],
      e_not_ready: ['The speech model is not ready yet', 'Try again in a minute.'],
      e_unauthorized: ['Not signed in for live captions', 'Reload the page and sign in again.'],
      e_idle: ['Stopped: no audio reached the server for a while', 'Check the microphone, then start again.'],
      e_too_long: ['The live session reached its time limit', 'Start again to go on.'],
      e_invalid: ['The server did not accept the live settings', 'Reload the page, then try again.'],
      e_nothing: ['Nothing was recorded', 'Start live captions and speak first.'],
      e_other: ['Live captions stopped', 'Start again; if it keeps failing, tell whoever runs this server.']
    },
    zh: {
      mode_label: '\u8f93\u5165',
      mode_file: '\u6587\u4ef6',
      mode_live: '\u5b9e\u65f6',
      mode_live_title: '\u9ea6\u514b\u98ce\u5b9e\u65f6\u5b57\u5e55',
      start: '\u5f00\u59cb\u5b9e\u65f6\u5b57\u5e55',
      stop: '\u505c\u6b62',
      mic_wait: '\u6b63\u5728\u7b49\u5f85\u9ea6\u514b\u98ce\u2026',
      mic_wait_hint: '\u5982\u679c\u6d4f\u89c8\u5668\u8be2\u95ee\uff0c\u8bf7\u5141\u8bb8\u672c\u9875\u4f7f\u7528\u9ea6\u514b\u98ce\u3002',
      connecting: '\u6b63\u5728\u8fde\u63a5\u670d\u52a1\u5668\u2026',
      listening: '\u6b63\u5728\u8046\u542c\uff1a\u8bf4\u8bdd\u65f6\u6587\u5b57\u5373\u65f6\u51fa\u73b0',
      stopping: '\u6b63\u5728\u5b8c\u6210\u6700\u540e\u7684\u53e5\u5b50\u2026',
      stopped: '\u5df2\u505c\u6b62',
      recorded: '\u5df2\u5f55\u5236 {time}',
      idle_hint: '\u70b9\u51fb\u5f00\u59cb\u5e76\u8bf4\u8bdd\uff1a\u8f6c\u5199\u7ed3\u679c\u8fb9\u8bf4\u8fb9\u51fa\u73b0\uff0c\u5e76\u6807\u51fa\u8bed\u79cd\u3001\u60c5\u7eea\u548c\u58f0\u97f3\u4e8b\u4ef6\u3002',
      slow: '\u7f51\u7edc\u8f83\u6162\uff1a\u5b57\u5e55\u6709\u5ef6\u8fdf\u3002',
      no_end: '\u6700\u540e\u7684\u53e5\u5b50\u672a\u80fd\u53ca\u65f6\u5230\u8fbe\uff1a\u663e\u793a\u7684\u662f\u5df2\u6536\u5230\u7684\u5185\u5bb9\u3002',
      keep_note: '\u5b9e\u65f6\u5f55\u97f3\u7684\u524d {limit} \u53ef\u4ee5\u4fdd\u5b58\u4e3a\u4efb\u52a1\uff08\u5ba1\u9605\u89c6\u56fe\u548c\u4e0b\u8f7d\uff09\u3002',
      keep_full: '\u53ea\u4fdd\u7559\u524d {limit} \u7528\u4e8e\u4fdd\u5b58\uff1b\u5b57\u5e55\u7ee7\u7eed\u8fdb\u884c\u3002',
      save: '\u4fdd\u5b58\u4e3a\u4efb\u52a1',
      save_hint: '\u5c06\u6574\u6bb5\u5f55\u97f3\u4f5c\u4e3a\u4efb\u52a1\u91cd\u65b0\u8f6c\u5199\uff1a\u5ba1\u9605\u89c6\u56fe\u3001\u8868\u683c\u548c\u4e0b\u8f7d\u3002',
      saved: '\u5df2\u4fdd\u5b58\u4e3a\u4efb\u52a1',
      transcript: '\u5b9e\u65f6\u8f6c\u5199',
      copy: '\u590d\u5236',
      copy_title: '\u590d\u5236\u5df2\u786e\u5b9a\u7684\u6587\u5b57',
      copied: '\u5df2\u590d\u5236',
      provisional: '\u4e34\u65f6',
      level: '\u9ea6\u514b\u98ce\u97f3\u91cf',
      e_insecure: ['\u5b9e\u65f6\u5b57\u5e55\u9700\u8981\u5b89\u5168\u8fde\u63a5', '\u8bf7\u901a\u8fc7 https\uff08\u6216\u5728\u672c\u673a\u7528 localhost\uff09\u6253\u5f00\u672c\u9875\u3002'],
      e_no_worklet: ['\u8fd9\u4e2a\u6d4f\u89c8\u5668\u65e0\u6cd5\u4f20\u8f93\u97f3\u9891', '\u8bf7\u4f7f\u7528\u6700\u65b0\u7248 Chrome\u3001Edge\u3001Firefox \u6216 Safari\u3002'],
      e_mic_denied: ['\u9ea6\u514b\u98ce\u88ab\u7981\u7528', '\u8bf7\u5141\u8bb8\u672c\u9875\u4f7f\u7528\u9ea6\u514b\u98ce\uff08\u5730\u5740\u680f\u4e2d\u7684\u56fe\u6807\uff09\uff0c\u7136\u540e\u91cd\u65b0\u5f00\u59cb\u3002'],
      e_mic_missing: ['\u6ca1\u6709\u627e\u5230\u9ea6\u514b\u98ce', '\u8bf7\u8fde\u63a5\u9ea6\u514b\u98ce\u540e\u91cd\u65b0\u5f00\u59cb\u3002'],
      e_mic_busy: ['\u65e0\u6cd5\u6253\u5f00\u9ea6\u514b\u98ce', '\u53ef\u80fd\u6709\u5176\u4ed6\u7a0b\u5e8f\u6b63\u5728\u4f7f\u7528\u5b83\uff1a\u5173\u95ed\u540e\u91cd\u65b0\u5f00\u59cb\u3002'],
      e_connect: ['\u65e0\u6cd5\u8fde\u63a5\u5b9e\u65f6\u670d\u52a1', '\u8bf7\u68c0\u67e5\u7f51\u7edc\u6216\u5237\u65b0\u9875\u9762\u540e\u91cd\u8bd5\u3002'],
      e_lost: ['\u4e0e\u670d\u52a1\u5668\u7684\u8fde\u63a5\u5df2\u65ad\u5f00', '\u5df2\u8f6c\u5199\u7684\u5185\u5bb9\u4fdd\u7559\u5728\u8fd9\u91cc\uff1b\u91cd\u65b0\u5f00\u59cb\u5373\u53ef\u7ee7\u7eed\u3002'],
      e_ended: ['\u670d\u52a1\u5668\u7ed3\u675f\u4e86\u5b9e\u65f6\u5b57\u5e55', '\u5df2\u8f6c\u5199\u7684\u5185\u5bb9\u4fdd\u7559\u5728\u8fd9\u91cc\uff1b\u91cd\u65b0\u5f00\u59cb\u5373\u53ef\u7ee7\u7eed\u3002'],
      e_refused: ['\u670d\u52a1\u5668\u62d2\u7edd\u4e86\u5b9e\u65f6\u8fde\u63a5', '\u8bf7\u5237\u65b0\u9875\u9762\u540e\u91cd\u8bd5\u3002'],
      e_too_many_streams: ['\u672c\u670d\u52a1\u5668\u4e0a\u8fdb\u884c\u4e2d\u7684\u5b9e\u65f6\u5b57\u5e55\u592a\u591a', '\u8bf7\u4e00\u5206\u949f\u540e\u518d\u8bd5\uff0c\u6216\u6539\u4e3a\u8f6c\u5199\u5f55\u97f3\u6587\u4ef6\u3002'],
      e_busy: ['\u670d\u52a1\u5668\u7e41\u5fd9', '\u8bf7 {retry} \u79d2\u540e\u518d\u8bd5\u3002'],
      e_not_ready: ['\u8bed\u97f3\u6a21\u578b\u8fd8\u6ca1\u6709\u51c6\u5907\u597d', '\u8bf7\u4e00\u5206\u949f\u540e\u518d\u8bd5\u3002'],
      e_unauthorized: ['\u672a\u767b\u5f55\uff0c\u65e0\u6cd5\u4f7f\u7528\u5b9e\u65f6\u5b57\u5e55', '\u8bf7\u5237\u65b0\u9875\u9762\u5e76\u91cd\u65b0\u767b\u5f55\u3002'],
      e_idle: ['\u5df2\u505c\u6b62\uff1a\u4e00\u6bb5\u65f6\u95f4\u5185\u670d\u52a1\u5668\u6ca1\u6709\u6536\u5230\u97f3\u9891', '\u8bf7\u68c0\u67e5\u9ea6\u514b\u98ce\u540e\u91cd\u65b0\u5f00\u59cb\u3002'],
      e_too_long: ['\u5b9e\u65f6\u4f1a\u8bdd\u5df2\u8fbe\u5230\u65f6\u957f\u4e0a\u9650', '\u91cd\u65b0\u5f00\u59cb\u5373\u53ef\u7ee7\u7eed\u3002'],
      e_invalid: ['\u670d\u52a1\u5668\u4e0d\u63a5\u53d7\u5b9e\u65f6\u8bbe\u7f6e', '\u8bf7\u5237\u65b0\u9875\u9762\u540e\u91cd\u8bd5\u3002'],
      e_nothing: ['\u6ca1\u6709\u5f55\u5230\u5185\u5bb9', '\u8bf7\u5148\u5f00\u59cb\u5b9e\u65f6\u5b57\u5e55\u5e76\u8bf4\u8bdd\u3002'],
      e_other: ['\u5b9e\u65f6\u5b57\u5e55\u5df2\u505c\u6b62', '\u8bf7\u91cd\u65b0\u5f00\u59cb\uff1b\u5982\u679c\u4e00\u76f4\u5931\u8d25\uff0c\u8bf7\u544a\u8bc9\u670d\u52a1\u5668\u7684\u7ba1\u7406\u8005\u3002']
    }
  };
  // the server's error codes that share one wording: the live stream's refusals
  // (pipeline/web/routes/stream.py) and those of the job submit behind "Save as a job"
  var ERROR_ALIAS = {
    too_many_streams: 'too_many_streams',
    live_overloaded: 'busy', queue_full: 'busy', gpu_memory_low: 'busy', backlog_full: 'busy',
    broker_unavailable: 'busy', storage_error: 'busy', too_many_uploads: 'busy',
    too_many_uploads_from_client: 'busy', model_unavailable: 'not_ready',
    idle_timeout: 'idle', stream_too_long: 'too_long', audio_too_long: 'too_long',
    stream_time_limit: 'too_long', quiet_stream_yielded: 'idle',
    invalid_option: 'invalid', invalid_message: 'invalid',
    cross_site_request: 'refused', host_not_allowed: 'refused'
  };

  function hasOwn(obj, key) {
    return obj != null && Object.prototype.hasOwnProperty.call(obj, key);
  }

  function lang() {
    var I = root.SenseVoiceI18n;
    var l = I && typeof I.lang === 'function' ? I.lang() : 'en';
    return hasOwn(WORDS, l) ? l : 'en';
  }

  function fill(text, vars) {
    return String(text).replace(/\{(\w+)\}/g, function (m, k) {
      return vars && vars[k] != null ? String(vars[k]) : m;
    });
  }

  function t(key, vars) {
    var l = lang();
    var w = hasOwn(WORDS[l], key) ? WORDS[l][key] : WORDS.en[key];
    if (w == null) return key;
    return Array.isArray(w) ? w.map(function (s) { return fill(s, vars); }) : fill(w, vars);
  }

  // ---- pure helpers ----

  // "m:ss" (or "h:mm:ss") of seconds from the stream's start.
  function clock(s) {
    s = Math.max(0, Math.floor(Number(s) || 0));
    var h = Math.floor(s / 3600);
    var m = Math.floor((s % 3600) / 60);
    var r = s % 60;
    var mm = h ? (m < 10 ? '0' : '') + m : String(m);
    return (h ? h + ':' : '') + mm + ':' + (r < 10 ? '0' : '') + r;
  }

  // A duration limit in words: "45 s", "30 min", "2 h", "1 h 30 min".
  function limitText(seconds) {
    var s = Math.max(0, Math.floor(Number(seconds) || 0));
    if (s < 60) return s + ' s';
    var m = Math.floor(s / 60);
    if (m < 60) return m + ' min';
    var h = Math.floor(m / 60);
    m -= h * 60;
    return h + ' h' + (m ? ' ' + m + ' min' : '');
  }

  // The stream's WebSocket URL on this page's origin. opts: { language, useItn }; path: a path
  // on this server (else /api/stream); extra: more query (the server's login ticket), if any.
  function streamUrl(loc, path, opts, extra) {
    opts = opts || {};
    var language = LANG_RE.test(String(opts.language || '')) ? String(opts.language) : VOCAB.auto;
    path = PATH_RE.test(String(path || '')) && String(path).charAt(1) !== '/' ? String(path) : '/api/stream';
    var q = 'language=' + language + '&use_itn=' + (opts.useItn === false ? 'false' : 'true') +
      '&sample_rate=' + OUT_RATE;
    extra = String(extra || '').replace(/^[?&]/, '');
    if (extra && QUERY_RE.test(extra)) q += '&' + extra;
    return (loc.protocol === 'https:' ? 'wss:' : 'ws:') + '//' + loc.host + path + '?' + q;
  }

  function num(v) {
    var n = Number(v);
    return v != null && isFinite(n) ? n : null;
  }

  function utterance(msg) {
    return {
      text: msg.text == null ? '' : String(msg.text),
      raw_text: msg.raw_text == null ? '' : String(msg.raw_text),
      start: num(msg.start),
      end: num(msg.end),
      segment: msg.segment && typeof msg.segment === 'object' ? msg.segment : null
    };
  }

  // One server message applied to the transcript { finals: [], partial, error }: a partial
  // replaces the one in progress; a final settles it (and ends any partial); an error is kept.
  // Returns what changed: 'partial' | 'final' | 'error' | null (not a message of the protocol).
  function applyMessage(model, msg) {
    if (!model || !msg || typeof msg !== 'object') return null;
    if (msg.type === 'partial') {
      model.partial = utterance(msg);
      return 'partial';
    }
    if (msg.type === 'final') {
      model.finals.push(utterance(msg));
      model.partial = null;
      return 'final';
    }
    if (msg.type === 'error') {
      model.error = { code: String(msg.code || 'other'), message: String(msg.message || '') };
      var retry = num(msg.retry_after);
      if (retry != null) model.error.retry_after = retry;
      return 'error';
    }
    return null;
  }

  // Why a stream ended, as an error code; null when it ended as asked (after "end", with 1000).
  // serverError: the server's error message, if it sent one; opened: the socket had opened;
  // stopping: the page had sent "end".
  function closeReason(code, serverError, opened, stopping) {
    if (serverError && serverError.code) return String(serverError.code);
    if (!opened) return 'connect';
    if (stopping && (code === 1000 || code === 1005)) return null;
    if (code === 1013) return 'busy';
    if (code === 1008) return 'refused';
    if (code === 1000) return 'ended';
    if (code === 1011) return 'other';
    return 'lost';
  }

  // error { code, retry_after } -> { title, hint, code } in the page's words.
  function errorText(error) {
    var code = error && error.code ? String(error.code) : '';
    code = hasOwn(ERROR_ALIAS, code) ? ERROR_ALIAS[code] : code;
    var key = 'e_' + code;
    var retry = error && num(error.retry_after) != null ? num(error.retry_after) : 5;
    var w = hasOwn(WORDS.en, key) ? t(key, { retry: retry }) : t('e_other');
    return { title: w[0], hint: w[1], code: hasOwn(WORDS.en, key) ? code : 'other' };
  }

  // The panel's state line: { kind: busy|live|done|error|idle, title, detail, hint }.
  // s: { phase, mic (true once the microphone is open), error, seconds, note }.
  function describe(s) {
    s = s || {};
    var phase = String(s.phase || 'idle');
    var detail = s.note ? t(s.note) : '';
    if (phase === 'connecting') {
      return s.mic ? { kind: 'busy', title: t('connecting'), detail: '', hint: '' }
        : { kind: 'busy', title: t('mic_wait'), detail: '', hint: t('mic_wait_hint') };
    }
    if (phase === 'listening') return { kind: 'live', title: t('listening'), detail: detail, hint: '' };
    if (phase === 'stopping') return { kind: 'busy', title: t('stopping'), detail: '', hint: '' };
    if (phase === 'stopped') {
      return { kind: 'done', title: t('stopped'),
        detail: [s.seconds ? t('recorded', { time: clock(s.seconds) }) : '', detail].filter(Boolean).join(' '),
        hint: '' };
    }
    if (phase === 'error') {
      var e = errorText(s.error);
      return { kind: 'error', title: e.title, detail: '', hint: e.hint, code: e.code };
    }
    return { kind: 'idle', title: '', detail: '', hint: t('idle_hint') };
  }

  // The 44-byte header of a 16-bit mono PCM WAV of ``samples`` samples at ``rate`` Hz.
  function wavHeader(samples, rate) {
    var bytes = samples * 2;
    var buf = new ArrayBuffer(44);
    var v = new DataView(buf);
    var ascii = function (at, s) { for (var i = 0; i < s.length; i++) v.setUint8(at + i, s.charCodeAt(i)); };
    ascii(0, 'RIFF');
    v.setUint32(4, 36 + bytes, true);
    ascii(8, 'WAVE');
    ascii(12, 'fmt ');
    v.setUint32(16, 16, true); // fmt chunk size
    v.setUint16(20, 1, true); // PCM
    v.setUint16(22, 1, true); // mono
    v.setUint32(24, rate, true);
    v.setUint32(28, rate * 2, true); // bytes per second
    v.setUint16(32, 2, true); // bytes per frame
    v.setUint16(34, 16, true); // bits per sample
    ascii(36, 'data');
    v.setUint32(40, bytes, true);
    return buf;
  }

  // getUserMedia's error -> an error code of this page.
  function micError(err) {
    var name = err && err.name ? String(err.name) : '';
    if (err && err.svCode) return String(err.svCode);
    if (name === 'NotAllowedError' || name === 'SecurityError' || name === 'PermissionDeniedError') return 'mic_denied';
    if (name === 'NotFoundError' || name === 'OverconstrainedError' || name === 'DevicesNotFoundError') return 'mic_missing';
    if (name === 'NotReadableError' || name === 'AbortError' || name === 'TrackStartError') return 'mic_busy';
    return 'other';
  }

  // "live-2026-12-01-1405.wav": the saved job's name (its exports are named after it).
  function recordingName(date) {
    var d = date instanceof Date ? date : new Date();
    var p = function (n) { return (n < 10 ? '0' : '') + n; };
    return 'live-' + d.getFullYear() + '-' + p(d.getMonth() + 1) + '-' + p(d.getDate()) + '-' +
      p(d.getHours()) + p(d.getMinutes()) + p(d.getSeconds()) + '.wav';
  }

  // ---- DOM helpers (createElement + textContent only) ----

  function el(tag, cls, text) {
    var e = doc.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  }

  function clear(node) {
    while (node && node.firstChild) node.removeChild(node.firstChild);
  }

  function mount(id, hostClass, ownClass) {
    var R = root.SenseVoiceRich;
    return R && R.mountPoint ? R.mountPoint(id, hostClass, ownClass) : doc.getElementById(id);
  }

  // ---- the page's state ----

  var config = {
    enabled: true,
    streamPath: '/api/stream',
    linkPath: '', // the UI's live_link endpoint when the server has an API token
    uploadPath: '/ui/gradio_api/upload',
    submitPath: '/ui/gradio_api/run/submit',
    keepSeconds: 1800
  };
  var options = { language: VOCAB.auto, useItn: true };
  var currentMode = 'file';
  var S = null; // the live session on screen (the last one, once it has ended)
  var sessions = 0;
  var workletUrl = null;
  var view = { list: null, partial: null, status: null, clock: null, level: null, note: null };

  function newSession() {
    sessions += 1;
    return {
      n: sessions, phase: 'connecting', mic: false, error: null, note: '', opts: {
        language: options.language, useItn: options.useItn },
      ws: null, opened: false, ending: false, ctx: null, stream: null, node: null, source: null,
      pending: [], pendingSamples: 0, finals: [], partial: null, serverError: null,
      kept: [], keptSamples: 0, keptFull: false, sentSamples: 0, level: 0, slow: false,
      timers: [], savedAs: ''
    };
  }

  function active(s) {
    return !!(s && hasOwn(ACTIVE, s.phase));
  }

  function keepMax() {
    return Math.max(0, Math.floor((Number(config.keepSeconds) || 0) * OUT_RATE));
  }

  // ---- audio ----

  function workletModule() {
    if (workletUrl) return workletUrl;
    var W = root.SenseVoiceLiveWorklet;
    if (!W || typeof W.body !== 'function' || !root.Blob || !root.URL || !root.URL.createObjectURL) return null;
    var src = '(' + String(W.body) + ')(globalThis);\n';
    workletUrl = root.URL.createObjectURL(new root.Blob([src], { type: 'text/javascript' }));
    return workletUrl;
  }

  function coded(code) {
    var e = new Error(code);
    e.svCode = code;
    return e;
  }

  function openMic() {
    var md = root.navigator && root.navigator.mediaDevices;
    if (root.isSecureContext === false || !md || typeof md.getUserMedia !== 'function') {
      return Promise.reject(coded('insecure'));
    }
    var Ctx = root.AudioContext || root.webkitAudioContext;
    if (!Ctx || !root.AudioWorkletNode || !root.WebSocket) return Promise.reject(coded('no_worklet'));
    return md.getUserMedia({ audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true,
      autoGainControl: true }, video: false });
  }

  function audioGraph(s) {
    var Ctx = root.AudioContext || root.webkitAudioContext;
    var url = workletModule();
    if (!url) return Promise.reject(coded('no_worklet'));
    var ctx;
    try {
      ctx = new Ctx({ latencyHint: 'interactive' });
    } catch (e) {
      return Promise.reject(coded('no_worklet'));
    }
    s.ctx = ctx;
    if (!ctx.audioWorklet) return Promise.reject(coded('no_worklet'));
    return ctx.audioWorklet.addModule(url).then(function () {
      if (S !== s || s.phase !== 'connecting') return;
      var node = new root.AudioWorkletNode(ctx, 'sv-pcm16', {
        numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1],
        channelCount: 1, channelCountMode: 'explicit', channelInterpretation: 'speakers',
        processorOptions: { inRate: ctx.sampleRate, outRate: OUT_RATE, chunk: CHUNK }
      });
      node.port.onmessage = function (ev) { onAudio(s, ev.data); };
      var source = ctx.createMediaStreamSource(s.stream);
      source.connect(node);
      node.connect(ctx.destination); // (silent: the processor writes no output) keeps it pulled
      s.node = node;
      s.source = source;
      return ctx.resume();
    }, function () {
      throw coded('no_worklet');
    });
  }

  function releaseAudio(s) {
    if (s.stream) {
      try { s.stream.getTracks().forEach(function (tr) { tr.stop(); }); } catch (e) { /* gone */ }
      s.stream = null;
    }
    if (s.source) { try { s.source.disconnect(); } catch (e) { /* gone */ } s.source = null; }
    if (s.node) {
      try { s.node.port.onmessage = null; s.node.disconnect(); } catch (e) { /* gone */ }
      s.node = null;
    }
    if (s.ctx) {
      var ctx = s.ctx;
      s.ctx = null;
      try { ctx.close()['catch'](function () {}); } catch (e) { /* closed */ }
    }
    s.level = 0;
  }

  function onAudio(s, data) {
    if (!data || S !== s) return;
    if (data.pcm && (s.phase === 'connecting' || s.phase === 'listening' || s.phase === 'stopping')) {
      var buf = data.pcm;
      var n = buf.byteLength >> 1;
      keep(s, buf, n);
      send(s, buf, n);
      s.level = Number(data.level) || 0;
      renderMeter();
    }
    if (data.flushed && s.phase === 'stopping') sendEnd(s);
  }

  function keep(s, buf, n) {
    var room = keepMax() - s.keptSamples;
    if (room <= 0) {
      if (!s.keptFull) { s.keptFull = true; renderNote(); }
      return;
    }
    if (n > room) {
      buf = buf.slice(0, room * 2);
      n = room;
      s.keptFull = true;
      renderNote();
    }
    s.kept.push(buf);
    s.keptSamples += n;
  }

  function send(s, buf, n) {
    var ws = s.ws;
    if (ws && ws.readyState === 1) {
      ws.send(buf);
      s.sentSamples += n;
      var slow = ws.bufferedAmount > SLOW_BYTES;
      if (slow !== s.slow) {
        s.slow = slow;
        s.note = slow ? 'slow' : '';
        renderStatus();
      }
    } else if (!s.opened) {
      s.pending.push(buf);
      s.pendingSamples += n;
      while (s.pendingSamples > PENDING_MAX && s.pending.length) {
        s.pendingSamples -= s.pending.shift().byteLength >> 1;
      }
    }
  }

  // ---- the stream ----

  // A fresh live link (exp=..&sig=..) from the UI when the server has a token; '' otherwise (and
  // when the UI does not answer: the server then says what is missing).
  function liveLink() {
    if (!config.linkPath || !root.fetch) return Promise.resolve('');
    return root.fetch(config.linkPath, { method: 'POST', credentials: 'same-origin',
      headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ data: [] }) })
      .then(function (resp) { return resp.ok ? resp.json() : null; })
      .then(function (body) {
        var q = body && Array.isArray(body.data) ? String(body.data[0] || '') : '';
        return QUERY_RE.test(q) ? q : '';
      })['catch'](function () { return ''; });
  }

  function connect(s, link) {
    if (S !== s || !active(s)) return;
    var ws;
    try {
      ws = new root.WebSocket(streamUrl(root.location, config.streamPath, s.opts, link));
    } catch (e) {
      fail(s, 'connect');
      return;
    }
    ws.binaryType = 'arraybuffer';
    s.ws = ws;
    ws.onopen = function () {
      if (S !== s || s.ws !== ws) return;
      s.opened = true;
      var held = s.pending;
      s.pending = [];
      s.pendingSamples = 0;
      held.forEach(function (buf) { ws.send(buf); s.sentSamples += buf.byteLength >> 1; });
      s.phase = 'listening';
      renderPanel();
    };
    ws.onmessage = function (ev) {
      if (S !== s || s.ws !== ws || typeof ev.data !== 'string') return;
      var msg;
      try { msg = JSON.parse(ev.data); } catch (e) { return; }
      var model = { finals: s.finals, partial: s.partial, error: null };
      var what = applyMessage(model, msg);
      s.partial = model.partial;
      if (what === 'error') s.serverError = model.error;
      else if (what === 'final') renderFinal(s.finals[s.finals.length - 1], s.finals.length - 1);
      if (what === 'final' || what === 'partial') renderPartial();
    };
    ws.onclose = function (ev) {
      if (s.ws !== ws) return;
      s.ws = null;
      closed(s, ev.code);
    };
  }

  function closed(s, code) {
    s.timers.forEach(function (id) { root.clearTimeout(id); });
    s.timers = [];
    var why = closeReason(code, s.serverError, s.opened, s.ending);
    releaseAudio(s);
    if (S !== s) return;
    if (why === null) {
      finish(s);
      return;
    }
    fail(s, why, s.serverError);
  }

  function finish(s) {
    s.phase = 'stopped';
    s.partial = null; // (after "end" every utterance is final: a partial left here never settled)
    renderPartial();
    renderPanel();
  }

  function fail(s, code, error) {
    s.phase = 'error';
    s.error = { code: code };
    if (error && error.retry_after != null) s.error.retry_after = error.retry_after;
    s.partial = null;
    var ws = s.ws;
    s.ws = null;
    if (ws) { try { ws.close(1000); } catch (e) { /* closed */ } }
    s.timers.forEach(function (id) { root.clearTimeout(id); });
    s.timers = [];
    releaseAudio(s);
    if (S !== s) return;
    renderPartial();
    renderPanel();
  }

  function sendEnd(s) {
    if (s.ending || S !== s || s.phase !== 'stopping') return;
    s.ending = true;
    releaseAudio(s);
    var ws = s.ws;
    if (ws && ws.readyState === 1) ws.send(JSON.stringify({ type: 'end' }));
    s.timers.push(root.setTimeout(function () {
      if (S !== s || s.phase !== 'stopping') return;
      s.note = 'no_end'; // the server kept us waiting: what arrived stays
      var w = s.ws;
      s.ws = null;
      if (w) { try { w.close(1000); } catch (e) { /* closed */ } }
      releaseAudio(s);
      finish(s);
    }, STOP_WAIT_MS));
  }

  // ---- the controls ----

  function start() {
    if (active(S)) return;
    var s = newSession();
    S = s;
    clearTranscript();
    renderPanel();
    var link = liveLink();
    openMic().then(function (stream) {
      if (S !== s || !active(s)) {
        stream.getTracks().forEach(function (tr) { tr.stop(); });
        return null;
      }
      s.stream = stream;
      s.mic = true;
      renderStatus();
      return audioGraph(s).then(function () { return link; }).then(function (q) { connect(s, q); });
    })['catch'](function (err) {
      if (S === s && active(s)) fail(s, micError(err));
    });
  }

  function stop() {
    var s = S;
    if (!s || !active(s) || s.phase === 'stopping') return;
    if (!s.opened) { // still waiting for the microphone or the server: nothing reached it
      s.phase = 'stopped';
      var ws0 = s.ws;
      s.ws = null;
      if (ws0) { try { ws0.close(1000); } catch (e) { /* closed */ } }
      releaseAudio(s);
      renderPanel();
      return;
    }
    s.phase = 'stopping';
    s.note = '';
    renderPanel();
    if (s.stream) s.stream.getTracks().forEach(function (tr) { tr.stop(); }); // no more sound
    if (s.node) {
      try { s.node.port.postMessage({ flush: true }); } catch (e) { /* gone */ }
      s.timers.push(root.setTimeout(function () { sendEnd(s); }, FLUSH_WAIT_MS));
    } else {
      sendEnd(s);
    }
  }

  function toggle() {
    if (active(S)) stop(); else start();
  }

  // A recording to offer as a job: a stream that ran (not one refused as it opened: the server
  // answers refusals right after the upgrade).
  function worthSaving(s) {
    return !!(s && !active(s) && s.opened && s.keptSamples &&
      (s.phase === 'stopped' || s.finals.length || s.sentSamples >= OUT_RATE));
  }

  // The kept recording as a WAV file.
  function recordingFile(s) {
    var parts = [wavHeader(s.keptSamples, OUT_RATE)].concat(s.kept);
    var name = recordingName(new Date());
    try {
      return new root.File(parts, name, { type: 'audio/wav' });
    } catch (e) {
      var b = new root.Blob(parts, { type: 'audio/wav' });
      b.name = name;
      return b;
    }
  }

  function refusal(code) {
    return JSON.stringify({ id: null, stage: 'failed', status: 'refused', error: { code: code } });
  }

  function httpError(resp) {
    return resp.json().then(function (body) {
      var code = body && body.error && body.error.code ? String(body.error.code) : '';
      return code || (resp.status === 413 ? 'upload_too_large' : resp.status === 401 || resp.status === 403
        ? 'unauthorized' : 'no_answer');
    }, function () {
      return resp.status === 413 ? 'upload_too_large' : resp.status === 401 || resp.status === 403
        ? 'unauthorized' : 'no_answer';
    });
  }

  // Save the kept recording as a job, through the UI's own submit; app.js follows it.
  function save() {
    var s = S;
    var App = root.SenseVoiceApp;
    if (!s || active(s) || !App || s.savedAs === 'saving') return null;
    if (!worthSaving(s)) {
      s.phase = 'error';
      s.error = { code: 'nothing' };
      renderPanel();
      return null;
    }
    var file = recordingFile(s);
    s.savedAs = 'saving';
    renderActions();
    setMode('file');
    App.submitting();
    var form = new root.FormData();
    form.append('files', file, file.name);
    var opts = s.opts;
    var done = function (json) {
      var v = null;
      try { v = JSON.parse(json); } catch (e) { v = null; }
      s.savedAs = v && v.id ? String(v.id) : '';
      renderActions();
      App.accepted(json);
    };
    return root.fetch(config.uploadPath, { method: 'POST', body: form, credentials: 'same-origin' })
      .then(function (resp) {
        if (!resp.ok) return httpError(resp).then(function (code) { done(refusal(code)); });
        return resp.json().then(function (paths) {
          var path = Array.isArray(paths) ? paths[0] : null;
          if (typeof path !== 'string') { done(refusal('no_answer')); return null; }
          var data = [{ path: path, orig_name: file.name, mime_type: 'audio/wav', size: file.size,
            meta: { _type: 'gradio.FileData' } }, opts.language, !!opts.useItn, false, ''];  // split, hotwords
          return root.fetch(config.submitPath, {
            method: 'POST', credentials: 'same-origin', headers: { 'Content-Type': 'application/json' },
            body: JSON.stringify({ data: data })
          }).then(function (r) {
            if (!r.ok) return httpError(r).then(function (code) { done(refusal(code)); });
            return r.json().then(function (body) {
              var out = body && Array.isArray(body.data) ? body.data : [];
              done(typeof out[2] === 'string' && out[2] ? out[2] : refusal('no_answer'));
            });
          });
        });
      })['catch'](function () { done(refusal('no_answer')); });
  }

  // ---- rendering ----

  function renderModes() {
    var host = mount('sv-modes', 'sv-modes-host', 'sv-modes');
    if (!host) return;
    clear(host);
    if (!config.enabled) return; // (live captions are off on this server: files only)
    var nav = el('div', 'sv-modes');
    nav.setAttribute('role', 'group');
    nav.setAttribute('aria-label', t('mode_label'));
    [['file', t('mode_file')], ['live', t('mode_live')]].forEach(function (m) {
      var b = el('button', 'sv-btn sv-mode' + (m[0] === currentMode ? ' sv-current' : ''));
      b.type = 'button';
      b.setAttribute('data-mode', m[0]);
      b.setAttribute('aria-pressed', m[0] === currentMode ? 'true' : 'false');
      if (m[0] === 'live') {
        var dot = el('span', 'sv-live-dot');
        dot.setAttribute('aria-hidden', 'true');
        b.appendChild(dot);
        b.title = t('mode_live_title');
      }
      b.appendChild(el('span', 'sv-mode-name', m[1]));
      b.addEventListener('click', function () { setMode(m[0]); });
      nav.appendChild(b);
    });
    host.appendChild(nav);
  }

  function setMode(m) {
    currentMode = m === 'live' && config.enabled ? 'live' : 'file';
    if (doc.body) doc.body.classList.toggle('sv-live-mode', currentMode === 'live');
    modeInUrl(currentMode === 'live');
    renderModes();
  }

  // ?mode=live while in Live (a reload, the language switch, a demo station's bookmark keep it)
  function modeInUrl(live) {
    if (!root.history || !root.history.replaceState || !root.URLSearchParams) return;
    try {
      var params = new URLSearchParams(root.location.search);
      if ((params.get('mode') === 'live') === live) return;
      if (live) params.set('mode', 'live'); else params['delete']('mode');
      var q = params.toString();
      root.history.replaceState(root.history.state, '', root.location.pathname + (q ? '?' + q : '') +
        root.location.hash);
    } catch (e) { /* sandboxed */ }
  }

  // While the microphone is on, the captions come first and the controls are compact (live.css):
  // on a phone the captions grew out of sight under the controls. The page goes to its top once.
  function recordingLayout(on) {
    if (!doc.body) return;
    var was = doc.body.classList.contains('sv-live-recording');
    doc.body.classList.toggle('sv-live-recording', !!on);
    if (on && !was && root.scrollTo) root.scrollTo(0, 0);
  }

  function renderPanel() {
    var host = mount('sv-live', 'sv-live-host', 'sv-live-panel');
    if (!host) return;
    clear(host);
    var s = S || { phase: 'idle' };
    recordingLayout(active(s));
    var panel = el('div', 'sv-live-panel sv-live-' + s.phase);
    panel.setAttribute('data-phase', s.phase);
    var row = el('div', 'sv-live-controls');
    var on = active(s);
    var btn = el('button', 'sv-live-toggle ' + (on ? 'sv-live-stop' : 'sv-live-start'));
    btn.type = 'button';
    btn.disabled = s.phase === 'stopping';
    var icon = el('span', on ? 'sv-live-icon-stop' : 'sv-live-icon-mic');
    icon.setAttribute('aria-hidden', 'true');
    btn.appendChild(icon);
    btn.appendChild(el('span', 'sv-live-toggle-label', on ? t('stop') : t('start')));
    btn.addEventListener('click', toggle);
    row.appendChild(btn);
    var clockEl = el('span', 'sv-live-clock');
    var meter = el('span', 'sv-live-level');
    meter.setAttribute('role', 'meter');
    meter.setAttribute('aria-label', t('level'));
    meter.setAttribute('aria-valuemin', '0');
    meter.setAttribute('aria-valuemax', '100');
    meter.appendChild(el('span', 'sv-live-level-bar'));
    row.appendChild(clockEl);
    row.appendChild(meter);
    panel.appendChild(row);
    var status = el('div', 'sv-live-status');
    panel.appendChild(status);
    var note = el('div', 'sv-live-note');
    panel.appendChild(note);
    var actions = el('div', 'sv-live-actions');
    panel.appendChild(actions);
    host.appendChild(panel);
    view.status = status;
    view.clock = clockEl;
    view.level = meter;
    view.note = note;
    view.actions = actions;
    renderStatus();
    renderMeter();
    renderNote();
    renderActions();
  }

  function renderStatus() {
    var host = view.status;
    if (!host) return;
    clear(host);
    var s = S || { phase: 'idle' };
    var d = describe({ phase: s.phase, mic: s.mic, error: s.error, seconds: s.sentSamples / OUT_RATE,
      note: s.note });
    if (d.kind === 'idle') {
      host.appendChild(el('div', 'sv-live-hint', d.hint));
      return;
    }
    var box = el('div', 'sv-state sv-live-state sv-state-' + (d.kind === 'live' ? 'busy' : d.kind) +
      ' sv-live-state-' + d.kind);
    box.setAttribute('role', d.kind === 'error' ? 'alert' : 'status');
    box.setAttribute('aria-live', d.kind === 'error' ? 'assertive' : 'polite');
    box.setAttribute('data-phase', s.phase);
    if (d.code) box.setAttribute('data-code', d.code);
    var icon;
    if (d.kind === 'busy') icon = el('span', 'sv-spinner');
    else if (d.kind === 'live') icon = el('span', 'sv-live-dot sv-live-on');
    else icon = el('span', 'sv-state-icon', d.kind === 'done' ? '\u2713' : '!');
    icon.setAttribute('aria-hidden', 'true');
    box.appendChild(icon);
    var text = el('div', 'sv-state-text');
    text.appendChild(el('div', 'sv-state-title', d.title));
    if (d.detail) text.appendChild(el('div', 'sv-state-detail', d.detail));
    if (d.hint) text.appendChild(el('div', 'sv-state-hint', d.hint));
    box.appendChild(text);
    host.appendChild(box);
  }

  function renderMeter() {
    var s = S;
    var on = !!(s && active(s) && s.mic);
    if (view.clock) view.clock.textContent = s && (on || s.sentSamples) ? clock(s.sentSamples / OUT_RATE) : '';
    if (!view.level) return;
    var pct = on ? Math.round(Math.min(1, Math.sqrt(s.level || 0)) * 100) : 0;
    view.level.hidden = !on;
    view.level.setAttribute('aria-valuenow', String(pct));
    var bar = view.level.firstChild;
    if (bar) bar.style.width = pct + '%';
  }

  function renderNote() {
    if (!view.note) return;
    var s = S;
    var limit = limitText(config.keepSeconds);
    view.note.textContent = s && s.keptFull ? t('keep_full', { limit: limit }) : t('keep_note', { limit: limit });
    view.note.classList.toggle('sv-live-note-full', !!(s && s.keptFull));
  }

  function renderActions() {
    var host = view.actions;
    if (!host) return;
    clear(host);
    var s = S;
    if (!worthSaving(s)) return;
    var b = el('button', 'sv-btn sv-live-save', s.savedAs && s.savedAs !== 'saving' ? t('saved') : t('save'));
    b.type = 'button';
    b.title = t('save_hint');
    b.disabled = !!s.savedAs;
    b.addEventListener('click', save);
    host.appendChild(b);
  }

  // the transcript: settled utterances, then the one in progress

  function transcriptHost() {
    return mount('sv-live-transcript', 'sv-live-transcript-host', 'sv-live-view');
  }

  function clearTranscript() {
    var host = transcriptHost();
    view.list = view.partial = null;
    if (!host) return;
    clear(host);
    var box = el('div', 'sv-live-view sv-rich');
    var head = el('div', 'sv-live-head');
    head.appendChild(el('span', 'sv-live-title', t('transcript')));
    var copy = el('button', 'sv-btn sv-live-copy', t('copy'));
    copy.type = 'button';
    copy.title = t('copy_title');
    var done = el('span', 'sv-copy-status');
    done.setAttribute('role', 'status');
    copy.addEventListener('click', function () {
      var R = root.SenseVoiceRich;
      var text = (S ? S.finals : []).map(function (u) { return u.text; }).filter(Boolean).join('\n');
      done.textContent = '';
      if (R && R.copyText) R.copyText(text).then(function () { done.textContent = t('copied'); }, function () {});
    });
    head.appendChild(copy);
    head.appendChild(done);
    box.appendChild(head);
    var list = el('ol', 'sv-live-list');
    list.setAttribute('role', 'log');
    list.setAttribute('aria-live', 'polite');
    box.appendChild(list);
    host.appendChild(box);
    view.list = list;
  }

  function utteranceNode(u, cls, index) {
    var R = root.SenseVoiceRich;
    var li = el('li', 'sv-live-utt ' + cls);
    if (u.start != null) li.setAttribute('data-start', String(u.start));
    if (u.end != null) li.setAttribute('data-end', String(u.end));
    li.appendChild(el('span', 'sv-live-time', u.start != null ? clock(u.start) : ''));
    var segs = el('div', 'sv-segments');
    var parsed = R && R.parse && u.raw_text ? R.parse(u.raw_text) : [];
    if (parsed.length && R.segmentNode) {
      parsed.forEach(function (seg, i) { segs.appendChild(R.segmentNode(seg, i)); });
    } else {
      var row = el('div', 'sv-seg');
      row.appendChild(el('span', 'sv-text', u.text));
      segs.appendChild(row);
    }
    li.appendChild(segs);
    if (index != null) li.setAttribute('data-index', String(index));
    return li;
  }

  function nearBottom(node) {
    return node.scrollHeight - node.scrollTop - node.clientHeight < 48;
  }

  function keepScrolled(fn) {
    var list = view.list;
    var follow = list ? nearBottom(list) : false;
    fn();
    if (list && follow) list.scrollTop = list.scrollHeight;
  }

  function renderFinal(u, index) {
    if (!view.list) clearTranscript();
    if (!view.list) return;
    keepScrolled(function () {
      var node = utteranceNode(u, 'sv-live-final', index);
      if (view.partial && view.partial.parentNode === view.list) view.list.insertBefore(node, view.partial);
      else view.list.appendChild(node);
    });
  }

  function renderPartial() {
    if (!view.list) clearTranscript();
    if (!view.list) return;
    var u = S ? S.partial : null;
    keepScrolled(function () {
      var old = view.partial;
      view.partial = null;
      if (!u || !u.text.trim()) { // (an empty partial takes back one that was not speech)
        if (old && old.parentNode) old.parentNode.removeChild(old);
        return;
      }
      var node = utteranceNode(u, 'sv-live-partial');
      node.setAttribute('aria-hidden', 'true'); // (not read out at every change; its final is)
      node.title = t('provisional');
      if (old && old.parentNode) old.parentNode.replaceChild(node, old);
      else view.list.appendChild(node);
      view.partial = node;
    });
  }

  // ---- hooks ----

  var booted = false;

  function bootConfig(c) {
    if (!c || typeof c !== 'object') return;
    if (c.enabled != null) config.enabled = !!c.enabled;
    ['streamPath', 'linkPath', 'uploadPath', 'submitPath'].forEach(function (k) {
      if (typeof c[k] === 'string' && PATH_RE.test(c[k]) && c[k].charAt(1) !== '/') config[k] = c[k];
    });
    if (num(c.keepSeconds) != null && c.keepSeconds >= 0) config.keepSeconds = Number(c.keepSeconds);
  }

  function setOptions(o) {
    if (!o || typeof o !== 'object') return;
    if (o.language != null) {
      options.language = LANG_RE.test(String(o.language)) ? String(o.language) : VOCAB.auto;
    }
    if (o.useItn != null) options.useItn = !!o.useItn;
  }

  function boot(c, o) {
    bootConfig(c);
    setOptions(o);
    if (booted) return;
    booted = true;
    var params;
    try { params = new URLSearchParams(root.location.search); } catch (e) { params = null; }
    var live = config.enabled && params && params.get('mode') === 'live' && !params.get('job');
    setMode(live ? 'live' : 'file');
    renderPanel();
    clearTranscript();
  }

  function session() {
    var s = S;
    if (!s) return null;
    return {
      phase: s.phase, mic: s.mic, opened: s.opened, error: s.error, note: s.note,
      finals: s.finals.slice(), partial: s.partial, sentSamples: s.sentSamples,
      keptSamples: s.keptSamples, keptFull: s.keptFull, savedAs: s.savedAs,
      sampleRate: s.ctx ? s.ctx.sampleRate : null
    };
  }

  if (doc && doc.addEventListener) {
    // leaving the page ends the stream and frees the microphone
    root.addEventListener('pagehide', function () {
      var s = S;
      if (!s || !active(s)) return;
      var ws = s.ws;
      s.ws = null;
      if (ws) { try { ws.close(1000); } catch (e) { /* closed */ } }
      releaseAudio(s);
    });
  }

  var api = Object.freeze({
    boot: boot,
    setOptions: setOptions,
    setMode: setMode,
    mode: function () { return currentMode; },
    start: start,
    stop: stop,
    save: save,
    session: session,
    streamUrl: streamUrl,
    applyMessage: applyMessage,
    closeReason: closeReason,
    errorText: errorText,
    describe: describe,
    wavHeader: wavHeader,
    clock: clock,
    limitText: limitText,
    micError: micError,
    recordingName: recordingName,
    words: WORDS
  });
  root.SenseVoiceLive = api;
  if (typeof module === 'object' && module && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : this);
