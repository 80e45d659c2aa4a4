"""Which writing systems a text is in, and whether an engine's languages can read them.

A speak engine declares the languages it speaks (``Capabilities.languages``); a text mostly
written in a script none of them uses is refused instead of spoken: the embedded English
Piper voice reads Chinese as seconds of spelled-out letter names. Letters are classified by
their Unicode names; digits, punctuation and symbols belong to every language.
"""

from __future__ import annotations

import unicodedata
from collections import Counter

LATIN_LANGUAGES = (
    "en", "de", "fr", "es", "it", "pt", "nl", "pl", "sv", "da", "no", "fi",
    "cs", "ro", "hu", "tr", "vi", "id", "ms", "ca", "sk", "sl", "hr", "sw",
)  # fmt: skip
# ISO 639 code -> the scripts its text is written in.
LANGUAGE_SCRIPTS: dict[str, frozenset[str]] = {
    **{code: frozenset({"LATIN"}) for code in LATIN_LANGUAGES},
    "zh": frozenset({"CJK"}),
    "yue": frozenset({"CJK"}),
    "ja": frozenset({"CJK", "HIRAGANA", "KATAKANA"}),
    "ko": frozenset({"HANGUL", "CJK"}),
    **{code: frozenset({"CYRILLIC"}) for code in ("ru", "uk", "bg", "sr", "kk")},
    "el": frozenset({"GREEK"}),
    "ar": frozenset({"ARABIC"}),
    "fa": frozenset({"ARABIC"}),
    "he": frozenset({"HEBREW"}),
    "hi": frozenset({"DEVANAGARI"}),
    "th": frozenset({"THAI"}),
}
KNOWN_SCRIPTS = ("LATIN", "CJK", "HIRAGANA", "KATAKANA", "HANGUL", "CYRILLIC", "GREEK",
                 "ARABIC", "HEBREW", "DEVANAGARI", "THAI")  # fmt: skip
# A text is refused when more than this share of its letters is in scripts the engine
# cannot read: a foreign name in an English sentence is spoken, a Chinese sentence is not.
FOREIGN_SHARE = 0.3


def _script(char: str) -> str | None:
    name = unicodedata.name(char, "")
    if name.startswith("CJK") or "IDEOGRAPH" in name:
        return "CJK"
    for script in KNOWN_SCRIPTS:
        if name.startswith(script):
            return script
    return "OTHER" if char.isalpha() else None


def letter_scripts(text: str) -> Counter[str]:
    """How many letters of ``text`` each script holds."""
    return Counter(s for s in map(_script, text) if s is not None)


def readable_scripts(languages: tuple[str, ...]) -> frozenset[str]:
    """The scripts some of ``languages`` are written in."""
    return frozenset().union(*(LANGUAGE_SCRIPTS.get(code, frozenset()) for code in languages))


def foreign_scripts(text: str, languages: tuple[str, ...]) -> list[str]:
    """The scripts of ``text`` that ``languages`` cannot read, when they dominate; else [].

    An engine that declares no languages reads everything.
    """
    if not languages:
        return []
    counts = letter_scripts(text)
    readable = readable_scripts(languages)
    foreign = {script: n for script, n in counts.items() if script not in readable}
    letters = sum(counts.values())
    if not letters or sum(foreign.values()) <= FOREIGN_SHARE * letters:
        return []
    return sorted(foreign, key=lambda script: -foreign[script])
