/*
 * SenseVoice live captions: the microphone's audio as 16 kHz 16-bit little-endian mono PCM, made in
 * an AudioWorklet (off the page's main thread). Plain browser script: no modules, no build step.
 *
 * The page inlines this file like the others; it defines
 *
 *   window.SenseVoiceLiveWorklet = {
 *     body,       // function (scope): the worklet's code; static/live.js loads it into the audio
 *                 //   thread as a blob module "(" + body + ")(globalThis)" (no route, no file URL)
 *     Resampler,  // new Resampler(inRate, outRate): push(Float32Array) -> [samples at outRate]
 *     toPcm16     // (numbers) -> ArrayBuffer of 16-bit little-endian samples, clipped
 *   };
 *
 * In the audio thread ``body`` registers the processor "sv-pcm16": processorOptions { inRate
 * (the context's rate), outRate (required: the server's SAMPLE_RATE_HZ), chunk (output samples
 * per message, 1600 = 100 ms) }; it posts { pcm: ArrayBuffer, level: 0..1 (the chunk's peak) } per
 * chunk, and on a { flush: true } message the samples it still holds, then { flushed: true }.
 *
 * Downsampling: a windowed-sinc low-pass (Blackman, cut at 45 % of the output rate) on every input
 * sample, then linear interpolation at the output instants: any input rate (48 kHz, 44.1 kHz, ...)
 * to 16 kHz, without aliasing of the speech band. About 70 multiply-adds per input sample at
 * 48 kHz: nothing for the audio thread. The page sends 1/3 of the bytes the context's rate would.
 */
(function (root) {
  'use strict';

  function body(scope) {
    'use strict';

    function lowPass(ratio) {
      var taps = Math.max(15, Math.ceil(ratio * 24)) | 1; // odd: a whole-sample delay
      var fc = 0.45 / ratio; // cut-off, cycles per input sample
      var mid = (taps - 1) / 2;
      var h = new Float32Array(taps);
      var sum = 0;
      for (var k = 0; k < taps; k++) {
        var x = k - mid;
        var sinc = x === 0 ? 2 * fc : Math.sin(2 * Math.PI * fc * x) / (Math.PI * x);
        var w = 0.42 - 0.5 * Math.cos(2 * Math.PI * k / (taps - 1)) + 0.08 * Math.cos(4 * Math.PI * k / (taps - 1));
        h[k] = sinc * w;
        sum += h[k];
      }
      for (k = 0; k < taps; k++) h[k] /= sum; // unit gain at 0 Hz
      return h;
    }

    function Resampler(inRate, outRate) {
      this.ratio = inRate / outRate;
      this.pass = !(this.ratio > 1.0001) && !(this.ratio < 0.9999);
      this.h = this.pass ? null : lowPass(Math.max(1, this.ratio));
      this.hist = this.h ? new Float32Array(this.h.length) : null;
      this.at = 0; // where the next input sample goes in hist (a ring)
      this.t = 0; // the next output instant, in input samples from the newest one (<= 0: due)
      this.prev = 0; // the previous filtered sample
    }

    // The output samples (at outRate, as numbers in -1..1) the new input samples complete.
    Resampler.prototype.push = function (input) {
      var out = [];
      var i;
      if (this.pass) {
        for (i = 0; i < input.length; i++) out.push(input[i]);
        return out;
      }
      var h = this.h;
      var hist = this.hist;
      var n = h.length;
      for (i = 0; i < input.length; i++) {
        hist[this.at] = input[i];
        this.at = (this.at + 1) % n;
        var y = 0;
        var j = this.at; // the oldest sample
        for (var k = 0; k < n; k++) {
          y += h[k] * hist[j];
          j = j + 1 === n ? 0 : j + 1;
        }
        while (this.t <= 0) {
          out.push(this.prev + (y - this.prev) * (1 + this.t));
          this.t += this.ratio;
        }
        this.t -= 1;
        this.prev = y;
      }
      return out;
    };

    function toPcm16(samples) {
      var buf = new ArrayBuffer(samples.length * 2);
      var view = new DataView(buf);
      for (var i = 0; i < samples.length; i++) {
        var s = samples[i];
        s = s > 1 ? 1 : s < -1 ? -1 : s || 0;
        view.setInt16(i * 2, Math.round(s < 0 ? s * 32768 : s * 32767), true);
      }
      return buf;
    }

    if (typeof scope.registerProcessor === 'function' && typeof scope.AudioWorkletProcessor === 'function') {
      // (a class: AudioWorkletProcessor is constructed only through super())
      class Pcm16 extends scope.AudioWorkletProcessor {
        constructor(options) {
          super();
          var o = (options && options.processorOptions) || {};
          var self = this;
          if (!(Number(o.outRate) > 0)) {
            throw new Error('processorOptions.outRate (the server\'s sample rate) is required');
          }
          this.resampler = new Resampler(Number(o.inRate) || scope.sampleRate, Number(o.outRate));
          this.chunk = Math.max(128, Number(o.chunk) || 1600);
          this.held = [];
          this.peak = 0;
          this.port.onmessage = function (ev) {
            if (ev.data && ev.data.flush) {
              self.send();
              self.port.postMessage({ flushed: true });
            }
          };
        }

        send() {
          if (!this.held.length) return;
          var buf = toPcm16(this.held);
          this.port.postMessage({ pcm: buf, level: Math.min(1, this.peak) }, [buf]);
          this.held = [];
          this.peak = 0;
        }

        process(inputs) {
          var channel = inputs[0] && inputs[0][0]; // the node mixes its input down to one channel
          if (channel) {
            var got = this.resampler.push(channel);
            for (var i = 0; i < got.length; i++) {
              var a = got[i] < 0 ? -got[i] : got[i];
              if (a > this.peak) this.peak = a;
              this.held.push(got[i]);
            }
            if (this.held.length >= this.chunk) this.send();
          }
          return true; // kept alive until the page disconnects it
        }
      }
      scope.registerProcessor('sv-pcm16', Pcm16);
    }
    return { Resampler: Resampler, toPcm16: toPcm16 };
  }

  var own = body({});
  var api = Object.freeze({ body: body, Resampler: own.Resampler, toPcm16: own.toPcm16 });
  root.SenseVoiceLiveWorklet = api;
  if (typeof module === 'object' && module && module.exports) module.exports = api;
})(typeof window !== 'undefined' ? window : this);
