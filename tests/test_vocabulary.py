"""One vocabulary: pipeline/domain/tags.py defines the sample rate, the tag names (languages,
emotions, events, itn) and their token ids once, and pipeline/domain/errors.py the codes a job
fails with; this fails when a second definition appears in the package or in static/*.js, so the
copies cannot come back. Also: the page gets the table from the server."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

from pipeline.domain import tags
from pipeline.domain.errors import JobFailed
from pipeline.web.ui import head_html
from pipeline.domain.calls import desk_table
from pipeline.web.vocab import VOCAB_GLOBAL, vocab_json, vocab_script

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pipeline"
STATIC = ROOT / "static"
HOME = PACKAGE / "domain" / "tags.py"
KINDS = {"language": frozenset(tags.REQUEST_LANGUAGES), "emotion": frozenset(tags.EMOTIONS),
         "event": frozenset(tags.EVENTS), "itn": frozenset(tags.ITN_TAGS)}
NAMES = frozenset().union(*KINDS.values())
FIXED_IDS = frozenset(tags.TOKEN_IDS.values())
FAILURE_CODES = frozenset(c.code for c in (JobFailed, *JobFailed.__subclasses__()))
WRAPPED = re.compile(r"<\|([^<>|]+)\|>")
# The demo model builder places the tags funasr's code does not fix (guessed positions, demo only):
# its list of those may name many, never one whose id funasr fixes (those come from tags.TOKEN_IDS).
GUESSED_IDS_FILE = PACKAGE / "model" / "demo" / "build_model.py"
# Names a page script may write for another reason than the model's vocabulary: 'en'/'zh' are the
# interface's own languages (app.js's switch), 'auto' is also an HTML dir value.
JS_OTHER_MEANINGS = frozenset({"en", "zh", "auto"})


def _py_files():
    return sorted(p for p in PACKAGE.rglob("*.py") if p != HOME)


def _vocab_names(value) -> set[str]:
    if not isinstance(value, str):
        return set()
    return ({value} | set(WRAPPED.findall(value))) & NAMES


def _collections(tree):
    """Each tuple/list/set/dict display with the constants inside it (nested ones included)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            yield node, [n for n in ast.walk(node) if isinstance(n, ast.Constant)]


def python_copies(path: Path) -> list[str]:
    """Where ``path`` writes the sample rate or a fixed token id as a number, a job failure code as
    a string, or a collection naming 3 or more tags of one kind (both itn tags)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if node.value == tags.SAMPLE_RATE_HZ:
                found.append(f"{path.name}:{node.lineno}: the sample rate as a literal")
            elif node.value in FIXED_IDS:
                found.append(f"{path.name}:{node.lineno}: a token id of tags.TOKEN_IDS")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("fail", "_fail") and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            found.append(f"{path.name}:{node.lineno}: a job failure code as a loose string "
                         "(use a pipeline.domain.errors.JobFailed class's code)")
    for node, items in _collections(tree):
        named = set().union(*(_vocab_names(i.value) for i in items))
        if path == GUESSED_IDS_FILE and not named & set(tags.TOKEN_IDS):
            continue
        if any(len(named & kind) >= min(3, len(kind)) for kind in KINDS.values()):
            found.append(f"{path.name}:{node.lineno}: a copy of the tag names {sorted(named)}")
        codes = {i.value for i in items if isinstance(i.value, str)} & FAILURE_CODES
        if len(codes) >= 3:
            found.append(f"{path.name}:{node.lineno}: a copy of the job failure codes {sorted(codes)}")
    return found


def _js_code(text: str) -> str:
    """The script without its comments (strings kept; a '//' inside a string is left alone)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if c in "'\"`":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        elif text.startswith("/*", i):
            i = text.index("*/", i) + 2
        elif text.startswith("//", i):
            i = text.find("\n", i) if "\n" in text[i:] else n
        elif c == "/" and re.search(r"[(,=:!&|?{};]\s*$", "".join(out[-3:])):  # a regex literal
            j = i + 1
            while j < n and text[j] != "/":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _js_unescape(s: str) -> str:
    return re.sub(r"\\(u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}|.)",
                  lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) > 1 else m.group(1), s)


def js_copies(path: Path) -> list[str]:
    """Where a page script writes the sample rate, or names 2+ tags (in strings or as keys)."""
    code = _js_code(path.read_text(encoding="utf-8"))
    found = []
    if re.search(rf"(?<![\w.]){tags.SAMPLE_RATE_HZ}(?![\w.])", code):
        found.append(f"{path.name}: the sample rate as a literal")
    strings = [_js_unescape(m.group(1) if m.group(1) is not None else m.group(2))
               for m in re.finditer(r"'((?:[^'\\\n]|\\.)*)'|\"((?:[^\"\\\n]|\\.)*)\"", code)]
    keys = re.findall(r"[{,]\s*([A-Za-z_]\w*)\s*:", code)
    named = set().union(set(), *(_vocab_names(s) for s in strings + keys)) - JS_OTHER_MEANINGS
    if len(named) >= 2:
        found.append(f"{path.name}: names the tags {sorted(named)}")
    return found


def test_the_sample_rate_and_the_tag_names_are_defined_once_in_python():
    found = [f for p in _py_files() for f in python_copies(p)]
    assert found == [], "use pipeline.domain.tags instead:\n" + "\n".join(found)


def test_page_scripts_hold_no_copy_of_the_vocabulary():
    found = [f for p in sorted(STATIC.glob("*.js")) for f in js_copies(p)]
    assert found == [], "read window.SenseVoiceVocab instead:\n" + "\n".join(found)


def test_the_guards_catch_copies(tmp_path):
    """The checks above can fail: each kind of copy they look for is found."""
    py = tmp_path / "copy.py"
    py.write_text('RATE = 16_000\nLANGS = ("zh", "en", "yue")\nTOK = {1: "<|HAPPY|>", 2: "<|SAD|>",'
                  ' 3: "<|ANGRY|>"}\nITN = ["withitn", "woitn"]\nZH = 24884\n'
                  'OK = ("en", "zh")\nMIXED = {0: "<|en|>", 1: "<|NEUTRAL|>", 2: "<|Speech|>"}\n'
                  'PAIRS = (("Chinese", "zh"), ("Japanese", "ja"), ("Korean", "ko"))\n'
                  'store.fail(job_id, "queue_timeout", "timed out")\n'
                  'store.fail(job_id, QueueTimeout.code, "timed out")\n'
                  'CODES = ("audio_lost", "queue_timeout", "device_error")\n')
    assert sorted(f.split(": ", 1)[1] for f in python_copies(py)) == sorted([
        "the sample rate as a literal", "a token id of tags.TOKEN_IDS",
        "a copy of the tag names ['en', 'yue', 'zh']",
        "a copy of the tag names ['ANGRY', 'HAPPY', 'SAD']",
        "a copy of the tag names ['withitn', 'woitn']",
        "a job failure code as a loose string (use a pipeline.domain.errors.JobFailed class's code)",
        "a copy of the tag names ['ja', 'ko', 'zh']",
        "a copy of the job failure codes ['audio_lost', 'device_error', 'queue_timeout']"])
    js = tmp_path / "copy.js"
    js.write_text("var R = 16000; // 16000 in a comment is fine\nvar E = ['HAPPY', 'SAD'];\n")
    assert js_copies(js) == ["copy.js: the sample rate as a literal",
                             "copy.js: names the tags ['HAPPY', 'SAD']"]
    keys = tmp_path / "keys.js"
    keys.write_text("var L = { yue: 1, ja: 2 }; /* 'ko' 'nospeech' */ var ui = { en: 1, zh: 2 };\n")
    assert js_copies(keys) == ["keys.js: names the tags ['ja', 'yue']"]
    clean = tmp_path / "clean.js"
    clean.write_text("var url = 'http://x/y'; // 'ja' 'ko'\nvar re = /'yue'/; var s = 'a//b';\n")
    assert js_copies(clean) == []


def test_the_page_gets_the_table_from_the_server_before_its_scripts():
    head = head_html()
    assert head.index(vocab_script()) < head.index("SenseVoiceRich")
    assert vocab_script() == f"<script>window.{VOCAB_GLOBAL}={vocab_json()};</script>"
    text = vocab_json()
    assert text.isascii() and "<" not in text and ">" not in text and "&" not in text
    table = json.loads(text)
    desk = table.pop("desk")  # the reviewer's desk's quick filters and tag columns
    assert desk == json.loads(json.dumps(desk_table()))
    assert table == json.loads(json.dumps(tags.browser_table()))
    assert table["sampleRateHz"] == tags.SAMPLE_RATE_HZ
    assert [r["code"] for r in table["language"]] == list(tags.LANGUAGES)
    assert [r["name"] for r in table["emotion"]] == list(tags.EMOTIONS)
    assert [r["name"] for r in table["event"]] == list(tags.EVENTS)
    assert [r["name"] for r in table["itn"]] == list(tags.ITN_TAGS)


def test_the_table_agrees_with_itself():
    assert tags.REQUEST_LANGUAGES == (tags.AUTO_LANGUAGE, *tags.LANGUAGES)
    assert tags.NO_SPEECH in tags.LANGUAGES
    assert set(tags.LANGUAGE_QUERY_ROWS) == set(tags.REQUEST_LANGUAGES)
    rows = [*tags.LANGUAGE_QUERY_ROWS.values(), tags.EVENT_QUERY_ROW, tags.EMOTION_QUERY_ROW,
            *tags.ITN_QUERY_ROWS.values()]
    assert len(rows) == len(set(rows)) and max(rows) < tags.QUERY_EMBED_ROWS
    assert len(set(tags.TOKEN_IDS.values())) == len(tags.TOKEN_IDS)
    assert len(NAMES) == len(tags.REQUEST_LANGUAGES + tags.EMOTIONS + tags.EVENTS + tags.ITN_TAGS)
