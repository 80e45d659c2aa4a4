"""Speak sessions: first audio, synthesis real-time factor and interrupt-to-silence.

    .venv/bin/python -m bench.tts [--sentences 24] [--interrupts 10]

The server runs as its own process pinned to core 0; this client is pinned to core 1.
Latencies are the server's own measurements, read from ``GET /sessions/{id}``: from the
``speak`` message arriving to the first frame of its speech leaving on the track, and from
``interrupt`` to the track being silent (the faded frame has left and its fade has ended).
Results go to bench/results/tts.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform

import aiohttp
import numpy as np

from bench.common import ROOT, percentile, print_table, server_process, write_results
from peer.call import PeerCall

SENTENCES = (
    "Good morning, how can I help you today?",
    "The train to the city leaves at half past nine.",
    "Please remember to bring your ticket with you.",
    "It looks like it is going to rain this afternoon.",
    "I have booked a table for two at seven o'clock.",
    "Your package was delivered to the front door.",
    "Let me check that for you, it will only take a moment.",
    "The meeting has been moved to Thursday.",
    "Thank you for waiting, I found the answer.",
    "Turn left at the next corner and walk straight ahead.",
    "The library closes early on Sundays.",
    "Would you like to hear the weather forecast?",
    "Your appointment is confirmed for tomorrow morning.",
    "I am sorry, I did not catch that.",
    "The total comes to twenty four dollars.",
    "Press the green button to start the machine.",
    "We will send you a reminder an hour before.",
    "The museum is free on the first Sunday of the month.",
    "Dinner is ready, come to the table.",
    "That is a great question, let me explain.",
    "The printer on the second floor is out of paper.",
    "Please hold while I transfer your call.",
    "The concert starts at eight, doors open at seven.",
    "Have a wonderful day and see you soon.",
)
PARAGRAPH = " ".join(SENTENCES)


async def measure(url: str, sentences: int, interrupts: int) -> dict:
    silence = np.zeros(48_000 * 600, np.float32)
    async with PeerCall(url, silence, engine="piper") as call, aiohttp.ClientSession() as http:
        for index in range(sentences):
            since = len(call.events)
            await call.send({"type": "speak", "text": SENTENCES[index % len(SENTENCES)]})
            queued = await call.wait_for("speech_queued", since=since)
            await call.wait_for("speech_finished", 30, since=since, id=queued["id"])
        for index in range(interrupts):
            since = len(call.events)
            await call.send({"type": "speak", "text": PARAGRAPH, "id": f"long{index}"})
            await call.wait_for("speech_started", 30, since=since, id=f"long{index}")
            await asyncio.sleep(0.5 + 0.137 * index)  # vary the phase against the 20 ms slots
            await call.send({"type": "interrupt"})
            await call.wait_for("speech_finished", 10, since=since, id=f"long{index}")
            await asyncio.sleep(0.3)
        async with http.get(f"{call.url}sessions/{call.session_id}") as response:
            described = await response.json()
    return described["speak"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=24)
    parser.add_argument("--interrupts", type=int, default=10)
    args = parser.parse_args()
    if (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {1})
    with server_process(["--engine", "piper", "--workers", "1"]) as url:
        speak = asyncio.run(measure(url, args.sentences, args.interrupts))
    first = speak["first_audio_ms"][: args.sentences]
    rows = [
        {
            "measure": "first audio (ms)",
            "n": len(first),
            "p50": percentile(first, 50),
            "p95": percentile(first, 95),
            "target": "<= 120 p50",
        },
        {
            "measure": "interrupt to silence (ms)",
            "n": len(speak["interrupt_ms"]),
            "p50": percentile(speak["interrupt_ms"], 50),
            "p95": percentile(speak["interrupt_ms"], 95),
            "target": "<= 40",
        },
        {
            "measure": "synthesis real-time factor",
            "n": speak["sentences"],
            "p50": round(speak["real_time_factor"], 3),
            "p95": None,
            "target": "< 1",
        },
    ]
    print_table(rows, ["measure", "n", "p50", "p95", "target"])
    path = write_results(
        "tts", {"benchmark": "tts", "machine": platform.platform(), "rows": rows, "raw": speak}
    )
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
