"""Audio from the model host to one worker, through a ring of shared memory.

The host (the only writer) copies each chunk's float32 samples into the ring and sends a
control message with the chunk's absolute byte position and length; the worker (the only
reader) copies them out on receipt, in message order, and advances the ``consumed``
counter in the ring's first eight bytes. The writer reads that counter to know what it
may overwrite, so the audio of a hop crosses the processes as one memory copy on each
side, with no pickling and nothing on the socket but a few dozen bytes.

A chunk never wraps: one that would cross the end starts at the beginning, and the bytes
skipped count as written. The writer is told to wait (``write`` returns None) when the
reader is that far behind; the reader reports progress on the socket (``REPORT_FRACTION``
of the ring at a time), which is what wakes a waiting writer.
"""

from __future__ import annotations

from multiprocessing import resource_tracker, shared_memory

import numpy as np

HEADER_BYTES = 64  # the consumed counter, on its own cache line
SAMPLE = np.dtype(np.float32)
# The reader tells the writer how far it has read every time this share of the ring is read.
REPORT_FRACTION = 0.25


class RingFull(Exception):
    """A chunk larger than the writer may ever hold at once."""


class AudioRing:
    """One direction of shared audio: ``create`` on the writer's side, ``attach`` on the
    reader's; ``close`` on both, and the creator's ``close`` also removes the segment."""

    def __init__(self, memory: shared_memory.SharedMemory, owner: bool) -> None:
        self._memory = memory
        self._owner = owner
        self.capacity = memory.size - HEADER_BYTES
        self._consumed = np.ndarray((1,), np.uint64, memory.buf, 0)
        self._data = np.ndarray((self.capacity,), np.uint8, memory.buf, HEADER_BYTES)
        self.written = 0  # the writer's absolute position
        self._reported = 0  # the reader's position at its last report

    @classmethod
    def create(cls, capacity: int) -> AudioRing:
        memory = shared_memory.SharedMemory(create=True, size=capacity + HEADER_BYTES)
        ring = cls(memory, owner=True)
        ring._consumed[0] = 0
        return ring

    @classmethod
    def attach(cls, name: str) -> AudioRing:
        memory = shared_memory.SharedMemory(name=name)
        # The creator owns the segment: the reader's resource tracker, which registered it
        # on attach, must not unlink it when the reader exits (Python < 3.13 has no
        # ``track=False``).
        resource_tracker.unregister(memory._name, "shared_memory")  # type: ignore[attr-defined]
        return cls(memory, owner=False)

    @property
    def name(self) -> str:
        return self._memory.name

    # --- the writer ------------------------------------------------------------------------

    @property
    def consumed(self) -> int:
        return int(self._consumed[0])

    def write(self, samples: np.ndarray) -> tuple[int, int] | None:
        """Copy ``samples`` in; (position, bytes) to send, or None while the reader is too
        far behind for them to fit (retry after its next report)."""
        data = np.ascontiguousarray(samples, SAMPLE).view(np.uint8)
        size = len(data)
        if size > self.capacity // 2:
            raise RingFull(f"a chunk of {size} bytes in a ring of {self.capacity}")
        start = self.written
        offset = start % self.capacity
        if offset + size > self.capacity:
            start += self.capacity - offset  # skip the tail: chunks never wrap
            offset = 0
        if start + size - self.consumed > self.capacity:
            return None
        self._data[offset : offset + size] = data
        self.written = start + size
        return start, size

    # --- the reader ------------------------------------------------------------------------

    def read(self, position: int, size: int) -> np.ndarray:
        """The samples of the chunk at ``position`` (a copy), marking it consumed; raises
        ``ValueError`` for a position or size the writer cannot have sent."""
        offset = position % self.capacity
        if size < 0 or size % SAMPLE.itemsize or offset + size > self.capacity:
            raise ValueError(f"no chunk of {size} bytes at {position} in this ring")
        samples = self._data[offset : offset + size].view(SAMPLE).copy()
        self._consumed[0] = position + size
        return samples

    def report_due(self) -> bool:
        """Whether the reader should tell the writer its position now (and remember it)."""
        if self.consumed - self._reported < self.capacity * REPORT_FRACTION:
            return False
        self._reported = self.consumed
        return True

    def close(self) -> None:
        self._data = np.empty(0, np.uint8)
        self._consumed = np.empty(1, np.uint64)
        self._memory.close()
        if self._owner:
            self._memory.unlink()
