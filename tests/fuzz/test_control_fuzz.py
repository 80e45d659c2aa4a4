"""The data-channel protocol (server/sessions/control.py) fed thousands of messages directly.

Each message is checked against the protocol's rules as tests/fuzz/expect.py states them:
a message that breaks a rule is refused with the code of a rule it breaks and reaches no
speaker method; one that breaks none is carried out, with the speaker called exactly once
with the message's own text and id.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from server.sessions.control import ControlError, apply, decode, parse
from tests.fuzz.conftest import BATCH, Budget
from tests.fuzz.expect import message_violations
from tests.fuzz.harness import INPUTS
from tests.fuzz.strategies import control_messages

CONTROL_EXAMPLES = 1000


@dataclass
class RecordingSpeaker:
    """A speaker that remembers every call (``server.sessions.control``'s ``Speaker``)."""

    calls: list[tuple[Any, ...]] = field(default_factory=list)

    def speak(self, text: str, utterance_id: str | None = None) -> str:
        self.calls.append(("speak", text, utterance_id))
        return utterance_id or "u1"

    def speak_delta(self, piece: str, utterance_id: str | None = None) -> str:
        self.calls.append(("speak_delta", piece, utterance_id))
        return utterance_id or "u1"

    def flush(self, utterance_id: str | None = None) -> str | None:
        self.calls.append(("flush", None, utterance_id))
        return utterance_id

    def interrupt(self) -> int:
        self.calls.append(("interrupt", None, None))
        return 0


def check_message(raw: str | bytes) -> None:
    """Refused with the code of a rule it breaks and nothing done, or carried out exactly."""
    INPUTS["data channel: control.py"] += 1
    broken = message_violations(raw)
    speaker = RecordingSpeaker()
    try:
        ack = apply(parse(decode(raw)), speaker)
    except ControlError as exc:
        assert broken, f"a valid message was refused with {exc.code!r}: {raw!r:.200}"
        assert exc.code in broken, f"{exc.code!r}, but the message breaks {broken}"
        assert speaker.calls == []
        event = json.loads(json.dumps(exc.event()))
        assert set(event) == {"type", "error", "message"} and event["type"] == "error"
        assert isinstance(event["message"], str) and event["message"]
        return
    assert not broken, f"a message breaking {broken} was accepted: {raw!r:.200}"
    payload = json.loads(raw)
    kind = payload["type"]
    text = payload.get("text") if kind in ("speak", "speak_delta") else None
    utterance_id = payload.get("id") if kind != "interrupt" else None
    assert speaker.calls == [(kind, text, utterance_id)]
    if kind == "speak":
        assert ack == {"type": "speech_queued", "id": payload.get("id") or "u1"}
    else:
        assert ack is None


def test_every_message_is_carried_out_or_refused_by_a_rule_it_breaks(budget: Budget):
    @budget(CONTROL_EXAMPLES)
    @given(st.lists(control_messages(), min_size=1, max_size=BATCH))
    def run(batch: list[str | bytes]) -> None:
        for raw in batch:
            check_message(raw)

    run()
