"""Text cut into speakable pieces, for speak sessions.

A speak engine encodes each piece it gets as a whole, so the first audio waits for the first
piece to be complete. Pieces end at sentence and clause punctuation; the first piece of an
utterance may also end at a comma once it is long enough, so a long opening clause does not
hold back the first audio. Later pieces are synthesised while the first one plays.
"""

from __future__ import annotations

import re

TERMINATORS = frozenset(".!?;:")
# Closing quotes and brackets after a terminator still belong to its sentence: 'He said "No."'
CLOSERS = frozenset("\"')]}\u00bb\u201d\u2019")
OPENERS = "\"'([{\u00ab\u201c\u2018"
# Enough words for a comma to end the first piece: shorter openings ("Well,", "Yes, sir,") are
# quick to synthesise as they are, and cutting them would break the sentence's prosody for nothing.
FIRST_CLAUSE_MIN_WORDS = 5
# Words whose period does not end a sentence. Initials ("J. R. R.") and dotted letter groups
# ("e.g.", "U.S.", "p.m.") are matched by pattern below; "etc." and "No." end sentences as often
# as not, and a wrong cut costs less than a missed one (a short pause against late audio).
ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "cf", "approx", "dept", "fig"}
)
# "I." ends sentences ("So do I.") far more often than it is an initial.
_INITIAL = re.compile(r"[A-HJ-Z]")
_DOTTED_LETTERS = re.compile(r"(?:[a-z]\.)+[a-z]", re.IGNORECASE)


def _is_abbreviation(piece: str) -> bool:
    """True when the period closing ``piece`` belongs to its last word, not to a sentence."""
    words = piece.split()
    if not words:
        return False
    word = words[-1].lstrip(OPENERS)[:-1]  # without its closing period
    return (
        word.lower() in ABBREVIATIONS
        or _INITIAL.fullmatch(word) is not None
        or _DOTTED_LETTERS.fullmatch(word) is not None
    )


def _speakable(piece: str) -> bool:
    return any(char.isalnum() for char in piece)


class SentenceSplitter:
    """Cuts streamed text (whole utterances or tokens as a language model emits them) into pieces.

    ``feed`` returns the pieces completed so far; a terminator counts only once the character
    after it has arrived, so "3." followed later by "5" stays one number. ``flush`` returns what
    is left and starts a new utterance. Pieces are stripped, and those with nothing to say
    (punctuation only) are dropped.
    """

    def __init__(self, first_clause_min_words: int = FIRST_CLAUSE_MIN_WORDS) -> None:
        self._first_clause_min_words = first_clause_min_words
        self._buffer = ""
        self._scanned = 0  # characters of the buffer already looked at as possible ends
        self._first = True  # nothing emitted yet in this utterance

    def feed(self, piece: str) -> list[str]:
        self._buffer += piece
        pieces: list[str] = []
        buffer, start, index = self._buffer, 0, self._scanned
        while index < len(buffer):
            char = buffer[index]
            end: int | None = None
            if char == "\n":
                end = index
            elif char in TERMINATORS or char == ",":
                after = index + 1
                while after < len(buffer) and buffer[after] in CLOSERS:
                    after += 1
                if after == len(buffer):
                    break  # what follows decides; wait for it
                if buffer[after].isspace() and self._ends_piece(buffer[start : index + 1]):
                    end = after
            if end is not None:
                text = buffer[start:end].strip()
                if _speakable(text):
                    pieces.append(text)
                    self._first = False
                start = end
                index = end
            index += 1
        self._buffer = buffer[start:]
        self._scanned = index - start
        return pieces

    def flush(self) -> list[str]:
        text = self._buffer.strip()
        self._buffer, self._scanned, self._first = "", 0, True
        return [text] if _speakable(text) else []

    def _ends_piece(self, piece: str) -> bool:
        """Whether the punctuation mark closing ``piece`` (and followed by a space) ends it."""
        mark = piece[-1]
        if mark == ",":
            return self._first and len(piece.split()) >= self._first_clause_min_words
        if mark == ".":
            return not _is_abbreviation(piece)
        return True
