"""Text in a script an engine cannot read is recognised, and mixed text is not refused."""

from __future__ import annotations

from media.audio.languages import foreign_scripts, letter_scripts

ENGLISH = ("en",)
COSYVOICE = ("zh", "en", "ja", "ko", "yue")


def test_chinese_is_foreign_to_an_english_voice_and_not_to_cosyvoice():
    text = "你好\uff0c今天天气很好\u3002"  # with full-width punctuation
    assert foreign_scripts(text, ENGLISH) == ["CJK"]
    assert foreign_scripts(text, COSYVOICE) == []


def test_english_with_a_foreign_name_is_still_english():
    assert foreign_scripts("Please call Mr. 王 at 5 pm, thank you very much.", ENGLISH) == []


def test_digits_punctuation_and_accents_belong_to_every_language():
    assert foreign_scripts("123, 456! ?", ENGLISH) == []
    assert foreign_scripts("Café déjà vu, naïve señor.", ENGLISH) == []


def test_japanese_kana_and_korean_hangul_are_told_apart():
    assert letter_scripts("ひらがなカタカナ") == {"HIRAGANA": 4, "KATAKANA": 4}
    assert foreign_scripts("안녕하세요", ENGLISH) == ["HANGUL"]
    assert foreign_scripts("Привет, как дела?", COSYVOICE) == ["CYRILLIC"]


def test_an_engine_without_declared_languages_reads_anything():
    assert foreign_scripts("你好", ()) == []
