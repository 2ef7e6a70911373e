/* Self-check questions on the published page: no kernel, no network, no answer in the page.
 *
 * Each .selfcheck element carries, in data-selfcheck, a salt, the rules for normalising an answer
 * (kind: number, shape or choice; sig, decimals, unit, symbols), the SHA-256 of the normalised
 * right answer and, for known wrong answers, their hashes with a hint. The reader's answer is
 * normalised exactly as _ext/selfcheck.py normalises the book's (same rules, tested on both
 * sides), hashed and compared. The solution is stored encoded and opened after a right answer
 * or "Show me". Progress is kept in localStorage and counted at the top of the page.
 */
(function () {
  "use strict";

  // ---- SHA-256 (FIPS 180-4), on UTF-8 bytes; works on file:// and plain http as well ----------
  var K = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
  ];

  function sha256Bytes(bytes) {
    var h = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
    var n = bytes.length;
    var total = ((n + 9 + 63) >> 6) << 6;
    var m = new Uint8Array(total);
    m.set(bytes);
    m[n] = 0x80;
    var bits = n * 8;
    m[total - 4] = (bits >>> 24) & 0xff;
    m[total - 3] = (bits >>> 16) & 0xff;
    m[total - 2] = (bits >>> 8) & 0xff;
    m[total - 1] = bits & 0xff;
    m[total - 5] = Math.floor(bits / 0x100000000) & 0xff;
    var w = new Array(64);
    for (var off = 0; off < total; off += 64) {
      for (var i = 0; i < 16; i++) {
        var j = off + 4 * i;
        w[i] = ((m[j] << 24) | (m[j + 1] << 16) | (m[j + 2] << 8) | m[j + 3]) >>> 0;
      }
      for (i = 16; i < 64; i++) {
        var a15 = w[i - 15], a2 = w[i - 2];
        var s0 = ((a15 >>> 7) | (a15 << 25)) ^ ((a15 >>> 18) | (a15 << 14)) ^ (a15 >>> 3);
        var s1 = ((a2 >>> 17) | (a2 << 15)) ^ ((a2 >>> 19) | (a2 << 13)) ^ (a2 >>> 10);
        w[i] = (w[i - 16] + s0 + w[i - 7] + s1) >>> 0;
      }
      var a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
      for (i = 0; i < 64; i++) {
        var S1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
        var ch = (e & f) ^ (~e & g);
        var t1 = (k + S1 + ch + K[i] + w[i]) >>> 0;
        var S0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
        var maj = (a & b) ^ (a & c) ^ (b & c);
        var t2 = (S0 + maj) >>> 0;
        k = g; g = f; f = e; e = (d + t1) >>> 0; d = c; c = b; b = a; a = (t1 + t2) >>> 0;
      }
      h[0] = (h[0] + a) >>> 0; h[1] = (h[1] + b) >>> 0; h[2] = (h[2] + c) >>> 0; h[3] = (h[3] + d) >>> 0;
      h[4] = (h[4] + e) >>> 0; h[5] = (h[5] + f) >>> 0; h[6] = (h[6] + g) >>> 0; h[7] = (h[7] + k) >>> 0;
    }
    var out = new Uint8Array(32);
    for (i = 0; i < 8; i++) {
      out[4 * i] = h[i] >>> 24; out[4 * i + 1] = (h[i] >>> 16) & 0xff;
      out[4 * i + 2] = (h[i] >>> 8) & 0xff; out[4 * i + 3] = h[i] & 0xff;
    }
    return out;
  }

  function utf8(text) { return new TextEncoder().encode(text); }

  function hex(bytes) {
    var s = "";
    for (var i = 0; i < bytes.length; i++) s += (bytes[i] < 16 ? "0" : "") + bytes[i].toString(16);
    return s;
  }

  function digest(salt, normalised) { return hex(sha256Bytes(utf8(salt + ":" + normalised))); }

  // ---- normalisation, the same rules as _ext/selfcheck.py ---------------------------------------
  function NotAnswer(message) { this.message = message; }

  function parseDecimal(text) {
    var s = String(text).replace(/[\s_,\u2009\u202f]/g, "").toLowerCase().replace(/\u2212/g, "-");
    s = s.replace("\u00d710^", "e").replace("x10^", "e").replace("*10^", "e");
    var m = /^([+-]?)(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?$/.exec(s);
    if (!m || !(m[2] || m[3])) throw new NotAnswer("number");
    var frac = m[3] || "";
    var digits = ((m[2] || "") + frac).replace(/^0+/, "");
    return { neg: m[1] === "-", digits: digits, exp: parseInt(m[4] || "0", 10) - frac.length };
  }

  function quantize(d, q) {
    // round half up (away from zero) to a multiple of 10^q
    if (!d.digits || d.exp >= q) return d;
    var cut = q - d.exp;
    var keep = d.digits.length > cut ? d.digits.slice(0, d.digits.length - cut) : "";
    var first = d.digits.length >= cut ? d.digits.charAt(d.digits.length - cut) : "0";
    if (first >= "5") {
      var arr = ("0" + keep).split("");
      for (var i = arr.length - 1; i >= 0; i--) {
        if (arr[i] === "9") { arr[i] = "0"; } else { arr[i] = String(+arr[i] + 1); break; }
      }
      keep = arr.join("");
    }
    return { neg: d.neg, digits: keep.replace(/^0+/, ""), exp: q };
  }

  function canonical(d) {
    var digits = d.digits.replace(/^0+/, "");
    if (!digits) return "0";
    var stripped = digits.replace(/0+$/, "");
    var exp = d.exp + digits.length - stripped.length;
    digits = stripped;
    var body;
    if (exp >= 0) body = digits + new Array(exp + 1).join("0");
    else if (-exp >= digits.length) body = "0." + new Array(-exp - digits.length + 1).join("0") + digits;
    else body = digits.slice(0, digits.length + exp) + "." + digits.slice(digits.length + exp);
    return (d.neg ? "-" : "") + body;
  }

  function roundNumber(text, rules) {
    var d = parseDecimal(text);
    if (rules.sig != null && d.digits) {
      var adjusted = d.exp + d.digits.length - 1;
      d = quantize(d, adjusted - rules.sig + 1);
    } else if (rules.decimals != null) {
      d = quantize(d, -rules.decimals);
    }
    return canonical(d);
  }

  function symbolKey(name) { return name.replace(/[_{}\s\\]/g, "").toLowerCase(); }

  function normaliseShape(text, symbols) {
    var s = String(text).trim().replace(/^torch\.size/i, "").trim();
    s = s.replace(/^[()\[\] ]+|[()\[\] ]+$/g, "");
    var dims = s.split(/[,\u00d7]|\s+x\s+/).map(function (x) { return x.trim(); });
    if (dims.length && dims[dims.length - 1] === "") dims.pop();
    var out = dims.map(function (dim) {
      dim = dim.replace(/^[()\[\] ]+|[()\[\] ]+$/g, "");
      if (/^\d+$/.test(dim)) return dim.replace(/^0+(?=\d)/, "");
      var key = symbolKey(dim);
      return symbols && Object.prototype.hasOwnProperty.call(symbols, key) ? String(symbols[key]) : key;
    });
    if (!out.length || out.some(function (x) { return x === ""; })) throw new NotAnswer("shape");
    return "(" + out.join(",") + ")";
  }

  function normalise(rules, text) {
    if (rules.kind === "number") {
      var s = String(text).trim();
      if (rules.unit) {
        var unit = rules.unit.toLowerCase();
        if (s.toLowerCase().slice(-unit.length) === unit) s = s.slice(0, s.length - unit.length);
      }
      return roundNumber(s, rules);
    }
    if (rules.kind === "shape") return normaliseShape(text, rules.symbols);
    return String(text).replace(/\s+/g, " ").trim().toLowerCase();
  }

  // ---- the encoded solution ----------------------------------------------------------------------
  function decodeSolution(salt, encoded) {
    var raw = atob(encoded);
    var data = new Uint8Array(raw.length);
    var stream = [];
    for (var counter = 0; stream.length < raw.length; counter++) {
      var block = sha256Bytes(utf8(salt + ":" + counter));
      for (var b = 0; b < block.length; b++) stream.push(block[b]);
    }
    for (var i = 0; i < raw.length; i++) data[i] = raw.charCodeAt(i) ^ stream[i];
    return new TextDecoder().decode(data);
  }

  // ---- progress, kept in the browser -------------------------------------------------------------
  var STORE = "selfcheck:";
  function load(id) { try { return window.localStorage.getItem(STORE + id); } catch (e) { return null; } }
  function save(id, state) {
    try {
      if (state) window.localStorage.setItem(STORE + id, state);
      else window.localStorage.removeItem(STORE + id);
    } catch (e) { /* storage off: progress lasts for this visit only */ }
  }

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text != null) node.textContent = text;
    return node;
  }

  var questions = [];
  var summary = null;

  function updateSummary() {
    if (!summary) return;
    var right = 0, shown = 0;
    questions.forEach(function (q) {
      if (q.state === "right") right++;
      else if (q.state === "shown") shown++;
    });
    summary.count.textContent =
      "Self-checks on this page: " + right + " of " + questions.length + " answered right" +
      (shown ? ", " + shown + " solution" + (shown > 1 ? "s" : "") + " shown" : "") + ".";
    summary.reset.hidden = !(right || shown);
  }

  function howToAnswer(rules) {
    if (rules.kind === "shape") {
      return "Type a shape such as (2, 3, 4)" + (rules.symbols ? ", in numbers or in the question's symbols." : ".");
    }
    if (rules.kind === "choice") return "Choose one.";
    var unit = rules.unit ? " (in " + rules.unit + ")" : "";
    if (rules.sig != null) return "Type a number" + unit + ", rounded to " + rules.sig + " significant digit" + (rules.sig > 1 ? "s" : "") + ".";
    if (rules.decimals != null) return "Type a number" + unit + ", rounded to " + rules.decimals + " decimal place" + (rules.decimals === 1 ? "" : "s") + ".";
    return "Type the exact number" + unit + ".";
  }

  function setup(box, index) {
    var data = JSON.parse(box.getAttribute("data-selfcheck"));
    var rules = data.rules;
    var q = { box: box, data: data, state: load(data.id) };
    var title = box.querySelector(".selfcheck-title");
    title.textContent = "Check yourself (" + (index + 1) + ")";
    var form = el("form", "selfcheck-form");
    form.setAttribute("autocomplete", "off");
    var input = null;
    if (rules.kind === "choice") {
      var group = el("div", "selfcheck-options");
      data.options.forEach(function (option, i) {
        var label = el("label", "selfcheck-option");
        var radio = document.createElement("input");
        radio.type = "radio";
        radio.name = data.id;
        radio.value = option;
        label.appendChild(radio);
        label.appendChild(document.createTextNode(" " + option));
        group.appendChild(label);
      });
      form.appendChild(group);
    } else {
      input = el("input", "selfcheck-input");
      input.type = "text";
      input.spellcheck = false;
      input.setAttribute("aria-label", "your answer");
      input.placeholder = rules.kind === "shape" ? "(…, …)" : "your answer";
      form.appendChild(input);
      if (rules.unit) form.appendChild(el("span", "selfcheck-unit", rules.unit));
    }
    var check = el("button", "selfcheck-check", "Check");
    check.type = "submit";
    var show = el("button", "selfcheck-show", "Show me");
    show.type = "button";
    form.appendChild(check);
    form.appendChild(show);
    var how = el("p", "selfcheck-how", howToAnswer(rules));
    var feedback = el("p", "selfcheck-feedback");
    feedback.setAttribute("role", "status");
    feedback.setAttribute("aria-live", "polite");
    var question = box.querySelector(".selfcheck-question");
    question.insertAdjacentElement("afterend", form);
    form.insertAdjacentElement("afterend", how);
    how.insertAdjacentElement("afterend", feedback);

    function answerText() {
      if (input) return input.value;
      var chosen = form.querySelector("input[type=radio]:checked");
      return chosen ? chosen.value : "";
    }

    function say(kind, text) {
      feedback.className = "selfcheck-feedback selfcheck-" + kind;
      feedback.textContent = text;
      box.setAttribute("data-result", kind);
    }

    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var text = answerText();
      if (!String(text).trim()) { say("empty", rules.kind === "choice" ? "Choose an option first." : "Type an answer first."); return; }
      var normalised;
      try {
        normalised = normalise(rules, text);
      } catch (err) {
        if (!(err instanceof NotAnswer)) throw err;
        say("format", err.message === "shape" ? "Write a shape such as (2, 3, 4)." :
            "Write a number" + (rules.unit ? " in " + rules.unit : "") + ", such as 1234 or 0.05.");
        return;
      }
      var h = digest(data.salt, normalised);
      if (h === data.right) {
        say("right", "Right.");
        setState("right");
        openSolution();
        return;
      }
      for (var i = 0; i < data.wrong.length; i++) {
        if (data.wrong[i][0] === h) { say("hint", "Not quite: " + data.wrong[i][1]); return; }
      }
      say("notyet", "Not yet. Try again, or choose \u201cShow me\u201d.");
    });

    show.addEventListener("click", function () {
      if (q.state !== "right") setState("shown");
      openSolution();
    });

    function setState(state) {
      if (q.state === "right" && state === "shown") return;
      q.state = state;
      save(data.id, state);
      box.setAttribute("data-state", state || "");
      updateSummary();
    }

    function openSolution() {
      var holder = box.querySelector(".selfcheck-solution");
      if (holder) {
        if (holder.hasAttribute("data-encoded")) {
          holder.innerHTML = decodeSolution(data.salt, holder.getAttribute("data-encoded"));
          holder.removeAttribute("data-encoded");
          if (window.MathJax && window.MathJax.typesetPromise) window.MathJax.typesetPromise([holder]);
        }
        holder.hidden = false;
        return;
      }
      // no solution inside: open the dropdown that follows the question
      var next = box.nextElementSibling;
      if (!next) return;
      if (next.tagName === "DETAILS") { next.open = true; return; }
      var toggle = next.querySelector(".toggle-button, button.toggle-button");
      if (toggle && next.querySelector(".toggle-hidden, .toggle-details__container[hidden]")) toggle.click();
    }

    q.reset = function () { q.state = null; save(data.id, null); box.removeAttribute("data-state"); };
    if (q.state) {
      box.setAttribute("data-state", q.state);
      say("earlier", q.state === "right" ? "You answered this one right on an earlier visit." : "You looked at this solution on an earlier visit.");
    }
    questions.push(q);
  }

  function init() {
    var boxes = document.querySelectorAll(".selfcheck[data-selfcheck]");
    if (!boxes.length) return;
    Array.prototype.forEach.call(boxes, setup);
    summary = { box: el("div", "selfcheck-summary"), count: el("span", "selfcheck-count"), reset: el("button", "selfcheck-reset", "Start again") };
    summary.reset.type = "button";
    summary.box.appendChild(summary.count);
    summary.box.appendChild(summary.reset);
    summary.reset.addEventListener("click", function () {
      questions.forEach(function (q) {
        q.reset();
        var fb = q.box.querySelector(".selfcheck-feedback");
        fb.textContent = "";
        fb.className = "selfcheck-feedback";
      });
      updateSummary();
    });
    var heading = document.querySelector("article h1") || document.querySelector("h1");
    if (heading) heading.insertAdjacentElement("afterend", summary.box);
    else boxes[0].insertAdjacentElement("beforebegin", summary.box);
    updateSummary();
  }

  // exposed for the tests of the normalisation (tests/test_selfcheck.py runs them in Chromium)
  window.selfcheck = { normalise: normalise, digest: digest, decodeSolution: decodeSolution, NotAnswer: NotAnswer };

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
