"""The vocabulary for the page's scripts: one ``<script>`` that sets ``window.SenseVoiceVocab`` to
:func:`pipeline.domain.tags.browser_table`, put in the page head before ``static/*.js``
(:func:`pipeline.web.ui.head_html`), with the desk's quick filters and tag columns
(:func:`pipeline.domain.calls.desk_table`). static/richtext.js builds its tag table from it and live.js
takes the sample rate from it, so the browser holds no copy; the JS tests load this same script."""

from __future__ import annotations

import json

from pipeline.domain.calls import desk_table
from pipeline.domain.tags import browser_table

VOCAB_GLOBAL = "SenseVoiceVocab"  # window.<this>


def vocab_json() -> str:
    """The table as ASCII JSON, safe inside a ``<script>`` element (no ``<``, ``>`` or ``&``)."""
    text = json.dumps({**browser_table(), "desk": desk_table()}, ensure_ascii=True, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def vocab_script() -> str:
    return f"<script>window.{VOCAB_GLOBAL}={vocab_json()};</script>"
