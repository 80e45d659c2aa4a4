"""``SentenceSplitter``: where streamed text is cut into pieces for a speak engine."""

from __future__ import annotations

import random

import pytest

from media.audio.text import FIRST_CLAUSE_MIN_WORDS, SentenceSplitter


def _split(text: str) -> list[str]:
    splitter = SentenceSplitter()
    return [*splitter.feed(text), *splitter.flush()]


def _split_streamed(pieces: list[str]) -> list[str]:
    splitter = SentenceSplitter()
    out: list[str] = []
    for piece in pieces:
        out.extend(splitter.feed(piece))
    return [*out, *splitter.flush()]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello there. How are you?", ["Hello there.", "How are you?"]),
        ("Stop! Wait; listen: now.", ["Stop!", "Wait;", "listen:", "now."]),
        ("Really?! Yes...  Fine.", ["Really?!", "Yes...", "Fine."]),
        ("First line\nsecond line", ["First line", "second line"]),
        ("One.\n\nTwo.", ["One.", "Two."]),
        ('He said "No." Then he left.', ['He said "No."', "Then he left."]),
        ("(It was late.) We slept.", ["(It was late.)", "We slept."]),
        ("No terminator at all", ["No terminator at all"]),
    ],
)
def test_splits_at_sentence_and_clause_ends(text: str, expected: list[str]) -> None:
    assert _split(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Mr. Smith met Dr. Jones at St. Mary's.",
        "Bring fruit, e.g. apples or pears.",
        "That is, i.e. the other one.",
        "We met at 5 p.m. on Friday.",
        "The U.S. Army arrived.",
        "J. R. R. Tolkien wrote it.",
        "Pay 3.5 dollars, or 1,000 yen.",
        "See version 2.0.1 for details.",
        "Open http://example.com/a:b now.",
        "The train leaves at 10:30 sharp.",
    ],
)
def test_keeps_abbreviations_initials_and_numbers_whole(text: str) -> None:
    assert _split(text) == [text]


def test_single_i_still_ends_a_sentence() -> None:
    assert _split("So do I. Then we go.") == ["So do I.", "Then we go."]


def test_long_first_clause_ends_at_a_comma() -> None:
    text = (
        "When the evening train finally pulled in, the passengers left, "
        "and the station, at last, was quiet. After that, everyone slept, deeply."
    )
    assert _split(text) == [
        "When the evening train finally pulled in,",
        "the passengers left, and the station, at last, was quiet.",
        "After that, everyone slept, deeply.",
    ]


def test_short_first_clause_keeps_its_comma() -> None:
    assert _split("Well, I think that is right.") == ["Well, I think that is right."]
    words = " ".join(["word"] * (FIRST_CLAUSE_MIN_WORDS - 1))
    assert _split(f"{words}, and more.") == [f"{words}, and more."]
    words = " ".join(["word"] * FIRST_CLAUSE_MIN_WORDS)
    assert _split(f"{words}, and more.") == [f"{words},", "and more."]


def test_first_clause_rule_applies_again_after_flush() -> None:
    splitter = SentenceSplitter()
    clause = "one two three four five six,"
    assert splitter.feed(f"{clause} seven. ") == [clause, "seven."]
    assert splitter.flush() == []
    assert splitter.feed(f"{clause} eight.") == [clause]
    assert splitter.flush() == ["eight."]


def test_terminator_waits_for_the_next_character() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("It costs 3.") == []
    assert splitter.feed("5 dollars.") == []
    assert splitter.feed(" Cheap") == ["It costs 3.5 dollars."]
    assert splitter.feed("!") == []
    assert splitter.feed('"') == []  # a closing quote may still follow
    assert splitter.feed(" ") == ['Cheap!"']
    assert splitter.flush() == []


def test_abbreviation_split_across_pieces() -> None:
    assert _split_streamed(["We saw M", "r", ".", " Smith", ". ", "Bye"]) == [
        "We saw Mr. Smith.",
        "Bye",
    ]


def test_streamed_tokens_match_whole_text() -> None:
    text = (
        "Hello there! Mr. Brown paid 3.5 dollars, e.g. a fair price; then, at 5 p.m., "
        'he said "Fine." and left.\nNext line: done... Really?! Yes'
    )
    expected = _split(text)
    rng = random.Random(3)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 40)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        assert _split_streamed(pieces) == expected
    assert _split_streamed(list(text)) == expected


def test_sentences_come_out_as_soon_as_they_are_complete() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("First one.") == []
    assert splitter.feed(" Sec") == ["First one."]
    assert splitter.feed("ond one? Th") == ["Second one?"]
    assert splitter.flush() == ["Th"]


def test_pieces_without_words_are_dropped() -> None:
    assert _split("... !!! \n - \n Hi.  ") == ["Hi."]
    assert _split("   ") == []
    assert _split("") == []


def test_flush_resets_for_the_next_utterance() -> None:
    splitter = SentenceSplitter()
    assert splitter.feed("Unfinished") == []
    assert splitter.flush() == ["Unfinished"]
    assert splitter.flush() == []
    assert splitter.feed("New one. ") == ["New one."]
