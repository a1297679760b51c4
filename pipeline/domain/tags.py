"""The one vocabulary of SenseVoiceSmall: the sample rate, the languages, emotions, audio events
and text-normalisation tags, with their rows in the model's query embedding and their token ids.

Everything else imports these names: the engine and the demo-model builder (rows and ids), the
rich-text parser (tag names), request validation (languages), the live stream (sample rate), and
the browser, which receives :func:`browser_table` (made from the rows below) instead of keeping a
copy (``pipeline/web/vocab.py`` puts it on the page; ``static/richtext.js`` reads it).
``tests/test_vocabulary.py`` fails if a second copy appears anywhere in the package or static/.

Facts from funasr 1.4.x ``funasr/models/sense_voice/model.py`` (/work/shared/SENSEVOICE_NOTES.md):
four query embeddings are prepended to the encoder input (language, event, emotion, itn); the
token ids of the language, the four evaluated emotions, EMO_UNKNOWN and the itn tags are fixed in
its code. Tag names are case-sensitive, exactly as the model writes them (``<|Speech_Noise|>``).
No torch, no web: plain data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SAMPLE_RATE_HZ = 16_000  # samples per second the model (and silero-vad) consumes

AUTO_LANGUAGE = "auto"  # a request's language: let the model detect it (query row 0)
NO_SPEECH = "nospeech"  # the language tag of a segment without speech


@dataclass(frozen=True)
class Language:
    """A language tag ``<|code|>`` the model writes, and how a page shows it."""

    code: str  # the tag name, e.g. "yue"
    query_row: int  # row of the model's query embedding that asks for this language
    token_id: int  # id of ``<|code|>`` in the model's vocabulary
    native: str  # the name its speakers use (shown)
    english: str  # the English name (titles, the OpenAI route's verbose_json)
    badge: str  # short label
    html_lang: str  # BCP 47 tag of text in this language ("" = none)
    color: str  # "R G B", the chip's --sv-c


@dataclass(frozen=True)
class Tag:
    """An emotion or an audio-event tag ``<|NAME|>``, and how a page shows it."""

    name: str  # exactly as the model writes it
    emoji: str
    word: str  # what it means, in English (the chip's title)
    word_zh: str  # what it means, in Chinese (the chip's label and title on a Chinese page)
    color: str  # "R G B"
    token_id: int | None = None  # id in the model's vocabulary, where funasr's code fixes it


@dataclass(frozen=True)
class ItnTag:
    """A text-normalisation tag: the model wrote punctuation and digits (withitn) or not."""

    name: str
    use_itn: bool  # the request option that asks for it
    query_row: int
    token_id: int
    label: str
    title: str
    label_zh: str  # (a Chinese page)
    title_zh: str


LANGUAGE_TABLE = (
    Language("zh", 3, 24884, "中文", "Chinese", "ZH", "zh", "220 38 38"),
    Language("en", 4, 24885, "English", "English", "EN", "en", "37 99 235"),
    Language("yue", 7, 24888, "粵語", "Cantonese", "YUE", "zh-HK", "234 88 12"),
    Language("ja", 11, 24892, "日本語", "Japanese", "JA", "ja", "219 39 119"),
    Language("ko", 12, 24896, "한국어", "Korean", "KO", "ko", "124 58 237"),
    Language(NO_SPEECH, 13, 24992, "No speech", "No speech", "∅", "", "107 114 128"),
)
EMOTION_TABLE = (
    Tag("HAPPY", "😊", "happy", "开心", "234 179 8", 25001),
    Tag("SAD", "😔", "sad", "伤心", "59 130 246", 25002),
    Tag("ANGRY", "😡", "angry", "生气", "239 68 68", 25003),
    Tag("NEUTRAL", "😐", "neutral", "平静", "107 114 128", 25004),
    Tag("FEARFUL", "😰", "fearful", "害怕", "139 92 246"),
    Tag("DISGUSTED", "🤢", "disgusted", "厌恶", "101 163 13"),
    Tag("SURPRISED", "😮", "surprised", "惊讶", "236 72 153"),
    Tag("EMO_UNKNOWN", "❓", "unknown", "未知", "148 163 184", 25009),
    Tag("EMO_OTHER", "🤔", "other", "其他", "148 163 184"),  # not in the published vocabulary; tolerated
)
EVENT_TABLE = (
    Tag("BGM", "🎼", "background music", "背景音乐", "168 85 247"),
    Tag("Speech", "🗣️", "speech", "说话", "14 165 233"),
    Tag("Applause", "👏", "applause", "掌声", "245 158 11"),
    Tag("Laughter", "😀", "laughter", "笑声", "234 179 8"),
    Tag("Cry", "😭", "crying", "哭声", "96 165 250"),
    Tag("Sneeze", "🤧", "sneeze", "喷嚏", "20 184 166"),
    Tag("Breath", "😮‍💨", "breath", "呼吸声", "45 212 191"),
    Tag("Cough", "😷", "cough", "咳嗽", "132 204 22"),
    Tag("Sing", "🎤", "singing", "唱歌", "217 70 239"),
    Tag("Speech_Noise", "🔉", "speech noise", "语音噪声", "251 146 60"),
    Tag("GBG", "🗑️", "garbage / noise", "杂音", "120 113 108"),
    Tag("Event_UNK", "❔", "unknown event", "未知事件", "148 163 184"),
)
ITN_TABLE = (
    ItnTag("withitn", True, 14, 25016, "punctuated",
           "Punctuation and numbers as digits (inverse text normalisation, ITN, on)",
           "带标点", "加标点，数字写成阿拉伯数字（逆文本正则化，开）"),
    ItnTag("woitn", False, 15, 25017, "spoken form",
           "As spoken, without punctuation (inverse text normalisation, ITN, off)",
           "口语形式", "按说出的样子，不加标点（逆文本正则化，关）"),
)

# ---- the names, for parsing and validation
LANGUAGES = tuple(lang.code for lang in LANGUAGE_TABLE)  # language tags the model writes
REQUEST_LANGUAGES = (AUTO_LANGUAGE, *LANGUAGES)  # what a request's language option may be
EMOTIONS = tuple(t.name for t in EMOTION_TABLE)
EVENTS = tuple(t.name for t in EVENT_TABLE)
ITN_TAGS = tuple(t.name for t in ITN_TABLE)

# ---- the model's query embedding (``model.embed``: 16 rows; 4 prompt frames per item)
QUERY_EMBED_ROWS = 16
AUTO_LANGUAGE_ROW = 0
EVENT_QUERY_ROW = 1  # the second prompt frame
EMOTION_QUERY_ROW = 2  # the third
LANGUAGE_QUERY_ROWS = {AUTO_LANGUAGE: AUTO_LANGUAGE_ROW,
                       **{lang.code: lang.query_row for lang in LANGUAGE_TABLE}}
ITN_QUERY_ROWS = {t.use_itn: t.query_row for t in ITN_TABLE}  # use_itn -> row

# ---- token ids fixed in funasr's code (tag name -> id)
TOKEN_IDS = {
    **{lang.code: lang.token_id for lang in LANGUAGE_TABLE},
    **{t.name: t.token_id for t in EMOTION_TABLE + EVENT_TABLE if t.token_id is not None},
    **{t.name: t.token_id for t in ITN_TABLE},
}
EMO_UNKNOWN_ID = TOKEN_IDS["EMO_UNKNOWN"]  # its logit is -inf when ban_emo_unk is asked


def browser_table() -> dict:
    """What the page's scripts know of the vocabulary (JSON-ready; read by static/richtext.js as
    ``window.SenseVoiceVocab``): the sample rate, the auto and no-speech names, and the rows."""
    return {
        "sampleRateHz": SAMPLE_RATE_HZ,
        "auto": AUTO_LANGUAGE,
        "noSpeech": NO_SPEECH,
        "language": [asdict(lang) for lang in LANGUAGE_TABLE],
        "emotion": [asdict(t) for t in EMOTION_TABLE],
        "event": [asdict(t) for t in EVENT_TABLE],
        "itn": [asdict(t) for t in ITN_TABLE],
    }
