"""The kinds of personal data a request may ask to mask (``redact``) and how the audio of such a job
is served back (``redact_audio``): names and their parsing only, so that the options' type can check
them without the detectors (pipeline/domain/redaction.py)."""

from __future__ import annotations

from pipeline.domain.errors import InvalidOption

KINDS = ("card", "phone", "email", "id", "digits")
ALL = "pii"  # every kind
MASKS = {kind: f"[{kind.upper()}]" for kind in KINDS}
AUDIO_MODES = ("silence", "beep")


def parse_redact(value) -> tuple[str, ...]:
    """The kinds to mask from ``pii``, a comma list (``card, phone``) or a list; ``""``/``none``:
    none. An unknown kind is :class:`InvalidOption` naming it."""
    if value is None:
        return ()
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = [v if isinstance(v, str) else repr(v) for v in value]
    else:
        raise InvalidOption(f"redact must be 'pii' or a comma list of {', '.join(KINDS)}")
    kinds: list[str] = []
    for item in (v.strip().lower() for v in items):
        if not item or item == "none":
            continue
        chosen = KINDS if item == ALL else (item,)
        for kind in chosen:
            if kind not in KINDS:
                raise InvalidOption(f"unknown redact kind {item[:40]!r}; choose 'pii' or among "
                                    f"{', '.join(KINDS)}")
            if kind not in kinds:
                kinds.append(kind)
    return tuple(k for k in KINDS if k in kinds)  # one order: equal requests are equal options


def parse_redact_audio(value) -> str:
    """``silence``, ``beep`` or ``""`` (the audio served back as it was uploaded)."""
    text = "" if value is None else str(value).strip().lower()
    if text in ("", "none", "off"):
        return ""
    if text not in AUDIO_MODES:
        raise InvalidOption(f"unknown redact_audio {text[:40]!r}; choose one of {', '.join(AUDIO_MODES)}")
    return text
