"""DeepFilterNet3 for many streams at once: one call of each graph per 10 ms hop, for all of them.

The C engine (``media/engines/deepfilter.py``) runs libDF's ``df_process_frame`` once per
stream and hop, each stream with its own copy of the model. Here every piece of a stream's
memory is a row of a batch array (the model's GRU states and convolution histories, which
``graphs.py`` made explicit, and the DSP's overlap, spectra and running norms, see ``dsp.py``),
and one ``process`` call runs the encoder, the ERB decoder and the DF decoder once for every
stream in it.

Slots and bit-identical streams. A stream owns one slot, a fixed row of every array, from
``open_slot`` to ``close_slot``; a new stream takes the lowest free row. A call gathers the
rows it names, in its order, runs the DSP and the three graphs on exactly those, and scatters
the new state back: a stream left out of a call (late) does not move, and nothing is computed
for it or for free rows. No row's inputs change another row's result, so a stream's output
could depend on the others only through a kernel whose rounding depends on the batch size or
on the row's position in it. Measured on this project's machine (onnxruntime 1.32, AVX-512),
every row of the three edited graphs, state outputs included, is bit-identical at any batch
size from 2 to 64 and any position (60 random subsets and orders of 64 streams), at every
optimisation level; a batch of one row takes other (matrix-vector) kernels and differs in
the last bits. So a call never runs fewer than ``MIN_BATCH`` = 2 rows: a lone stream is
computed twice and one copy dropped. Running every allocated row on every call (a fixed
bucket) would not need the measurement, but would cost the whole capacity on every call,
including a late stream's catch-up call; the tests check the invariance this relies on
(reset, close, join, skipped calls, growth), since another CPU or onnxruntime release could
break it. The DSP is numpy without BLAS and without reductions across rows, so it has no such
kernels at all.

A call is all or nothing: every new state is computed first and committed at the end, so a
call that raises leaves every stream as it was.

Threads: every method takes one lock, so ``open_slot``, ``reset_slot`` and ``close_slot`` may
be called from another thread than ``process``; they wait for a ``process`` in flight (one
hop's compute). The model itself runs on ``threads`` onnxruntime threads per graph.

Memory: the weights are shared (three ORT sessions, ~8 MB of graphs); a stream costs its rows,
``bytes_per_stream``: 46 kB (the five noisy spectra libDF keeps, 19 kB; the DF decoder's
pending partial sums, 15 kB; the five GRU states, 5 kB; overlaps, norms and features).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Sequence

import numpy as np

from media.engines.deepfilter import ATTEN_LIM_FLOOR_DB, ATTEN_LIM_MAX_DB, POST_FILTER_BETA_MAX
from media.engines.dfn.dsp import Dsp, DspConfig, attenuation_limit
from media.engines.dfn.graphs import DeepFilterModel, GraphSession, load_model

MIN_BATCH = 2  # a one-row batch runs other kernels (see the module docstring)
DEFAULT_CAPACITY = 16
DEFAULT_MAX_CAPACITY = 256


class SlotsExhausted(RuntimeError):
    """Every slot up to ``max_capacity`` is in use."""


class BatchedDeepFilter:
    """DeepFilterNet3 noise suppression for up to ``max_capacity`` streams, batched per hop."""

    def __init__(
        self,
        capacity: int = DEFAULT_CAPACITY,
        max_capacity: int = DEFAULT_MAX_CAPACITY,
        threads: int = 1,
        optimization: str = "all",
        model: DeepFilterModel | None = None,
    ) -> None:
        if not MIN_BATCH <= capacity <= max_capacity:
            raise ValueError(f"need {MIN_BATCH} <= capacity ({capacity}) <= max_capacity")
        model = model if model is not None else load_model()
        self._dsp = Dsp(DspConfig.from_ini(model.config))
        self._encoder, self._erb_decoder, self._df_decoder = (
            GraphSession(graph, threads, optimization) for graph in model.graphs
        )
        self.hop_size = self._dsp.config.hop_size
        self.sample_rate = self._dsp.config.sample_rate
        self.max_capacity = max_capacity
        self._lock = threading.Lock()
        self._rows = self._allocate(capacity)
        self._free = list(range(capacity))  # a heap: the lowest free row first
        self._open: set[int] = set()

    @property
    def capacity(self) -> int:
        """Rows allocated now; grows (doubling, up to ``max_capacity``) when all are taken."""
        return len(self._rows["analysis"])

    @property
    def open_slots(self) -> int:
        return len(self._open)

    @property
    def bytes_per_stream(self) -> int:
        """What one more stream's rows cost (the weights are shared)."""
        return sum(array[0].nbytes for array in self._rows.values())

    def open_slot(
        self, atten_lim_db: float = ATTEN_LIM_MAX_DB, post_filter_beta: float = 0.0
    ) -> int:
        """A slot for a fresh stream, with the C engine's options and their ranges.

        ``atten_lim_db``: 100 (the default) and above is no limit; like the C engine, values
        under ``ATTEN_LIM_FLOOR_DB`` are raised to it, since libDF would pass such a stream
        through undelayed. ``post_filter_beta``: 0 is off. Raises ``ValueError`` out of range
        and ``SlotsExhausted`` when ``max_capacity`` streams are open.
        """
        if not 0.0 <= atten_lim_db <= ATTEN_LIM_MAX_DB:
            raise ValueError(f"atten_lim_db must be within 0..{ATTEN_LIM_MAX_DB}")
        if not 0.0 <= post_filter_beta <= POST_FILTER_BETA_MAX:
            raise ValueError(f"post_filter_beta must be within 0..{POST_FILTER_BETA_MAX}")
        with self._lock:
            if not self._free:
                self._grow()
            slot = heapq.heappop(self._free)
            self._clear(slot)
            self._rows["limit"][slot] = attenuation_limit(max(atten_lim_db, ATTEN_LIM_FLOOR_DB))
            self._rows["beta"][slot] = post_filter_beta
            self._open.add(slot)
            return slot

    def reset_slot(self, slot: int) -> None:
        """Put ``slot``'s stream back to a fresh state with its options; others are untouched."""
        with self._lock:
            self._check_open([slot])
            options = self._rows["limit"][slot], self._rows["beta"][slot]
            self._clear(slot)
            self._rows["limit"][slot], self._rows["beta"][slot] = options

    def close_slot(self, slot: int) -> None:
        """Free ``slot``; its rows are zeroed, so nothing of the stream outlives it."""
        with self._lock:
            self._check_open([slot])
            self._open.remove(slot)
            self._clear(slot)
            heapq.heappush(self._free, slot)

    def process(self, slots: Sequence[int], hops: np.ndarray) -> np.ndarray:
        """One hop per named stream: ``hops`` float32 [len(slots), hop_size] in, the same out.

        Any subset of the open slots, in any order, each at most once. The output of hop ``t``
        is the input of hop ``t - 3`` denoised (libDF's 30 ms).
        """
        hops = np.ascontiguousarray(hops, dtype=np.float32)
        if hops.shape != (len(slots), self.hop_size):
            raise ValueError(f"hops must be [{len(slots)}, {self.hop_size}], not {hops.shape}")
        with self._lock:
            self._check_open(slots)
            if len(set(slots)) != len(slots):
                raise ValueError("a slot appears twice in one call")
            if not len(slots):
                return np.zeros((0, self.hop_size), np.float32)
            return self._process(np.asarray(slots, dtype=np.intp), hops)

    def _process(self, rows: np.ndarray, hops: np.ndarray) -> np.ndarray:
        count = len(rows)
        if count < MIN_BATCH:  # the copies compute the same values and commit them again
            rows = np.concatenate([rows, np.repeat(rows[:1], MIN_BATCH - count)])
            hops = np.concatenate([hops, np.repeat(hops[:1], MIN_BATCH - count, axis=0)])
        dsp, r = self._dsp, self._rows
        spectra = dsp.analysis(r["analysis"][rows], hops)
        history = np.concatenate([r["history"][rows, 1:], spectra[:, None]], axis=1)
        erb, erb_mean = dsp.erb_features(spectra, r["erb_mean"][rows])
        cplx, unit = dsp.complex_features(spectra, r["unit"][rows])

        # [rows, channels, time (one frame), bins], as the encoder takes them.
        feat_erb, feat_spec = erb[:, None, None, :], cplx[:, :, None, :]
        encoded, enc_states = self._run(self._encoder, rows, feat_erb=feat_erb, feat_spec=feat_spec)
        e0, e1, e2, e3, emb, c0 = encoded
        (mask,), erb_states = self._run(
            self._erb_decoder, rows, emb=emb, e3=e3, e2=e2, e1=e1, e0=e0
        )
        (coefs,), df_states = self._run(self._df_decoder, rows, emb=emb, c0=c0)

        # [rows, 1, nb_df, df_order * 2] as libDF reads it: (re, im) pairs per tap.
        taps = coefs[:, 0].view(np.complex64)
        enhanced = dsp.enhance(history, mask[:, 0, 0], taps, r["beta"][rows], r["limit"][rows])
        out, overlap = dsp.synthesis(enhanced, r["overlap"][rows])

        # Commit: nothing above changed a stream's state.
        r["analysis"][rows] = hops
        r["history"][rows] = history
        r["erb_mean"][rows] = erb_mean
        r["unit"][rows] = unit
        r["overlap"][rows] = overlap
        for session, states in (
            (self._encoder, enc_states),
            (self._erb_decoder, erb_states),
            (self._df_decoder, df_states),
        ):
            for spec, value in zip(session.graph.states, states, strict=True):
                r[spec.input][rows] = value
        return out[:count]

    def _run(
        self, session: GraphSession, rows: np.ndarray, **inputs: np.ndarray
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``session`` on ``inputs`` and the states gathered from ``rows``."""
        feeds = {name: np.ascontiguousarray(value) for name, value in inputs.items()}
        feeds.update({spec.input: self._rows[spec.input][rows] for spec in session.graph.states})
        return session.run(feeds)

    def _allocate(self, capacity: int) -> dict[str, np.ndarray]:
        cfg = self._dsp.config
        rows: dict[str, np.ndarray] = {
            "analysis": np.zeros((capacity, cfg.hop_size), np.float32),
            "overlap": np.zeros((capacity, cfg.hop_size), np.float32),
            "history": np.zeros((capacity, cfg.history, cfg.n_freqs), np.complex64),
            "erb_mean": np.tile(self._dsp.mean_norm_init, (capacity, 1)),
            "unit": np.tile(self._dsp.unit_norm_init, (capacity, 1)),
            "beta": np.zeros(capacity, np.float32),
            "limit": np.zeros(capacity, np.float32),
        }
        for session in (self._encoder, self._erb_decoder, self._df_decoder):
            for spec in session.graph.states:
                rows[spec.input] = np.zeros((capacity, *spec.shape), np.float32)
        return rows

    def _grow(self) -> None:
        old = self.capacity
        if old >= self.max_capacity:
            raise SlotsExhausted(f"all {self.max_capacity} slots are in use")
        new = min(2 * old, self.max_capacity)
        rows = self._allocate(new)
        for name, array in self._rows.items():
            rows[name][:old] = array
        self._rows = rows
        for slot in range(old, new):
            heapq.heappush(self._free, slot)

    def _clear(self, slot: int) -> None:
        for array in self._rows.values():
            array[slot] = 0
        self._rows["erb_mean"][slot] = self._dsp.mean_norm_init
        self._rows["unit"][slot] = self._dsp.unit_norm_init

    def _check_open(self, slots: Sequence[int]) -> None:
        closed = [slot for slot in slots if slot not in self._open]
        if closed:
            raise KeyError(f"slot {closed[0]} is not open")
