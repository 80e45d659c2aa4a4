"""Speak sessions: text in, speech out (see :mod:`media.pipeline.speak.pipeline`)."""

from media.pipeline.speak.pipeline import SpeakPipeline, UnsupportedLanguage
from media.pipeline.speak.utterances import SpeechQueueFull

__all__ = ["SpeakPipeline", "SpeechQueueFull", "UnsupportedLanguage"]
