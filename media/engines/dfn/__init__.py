"""DeepFilterNet3 batched across streams: the ``denoise`` model run by onnxruntime, one model
call per hop for every stream, each stream's memory in its own rows (see ``batch.py``)."""

from media.engines.dfn.batch import BatchedDeepFilter, SlotsExhausted

__all__ = ["BatchedDeepFilter", "SlotsExhausted"]
