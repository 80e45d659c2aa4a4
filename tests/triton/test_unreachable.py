"""``cosyvoice-triton`` with no Triton server to reach: the node starts and says why."""

from __future__ import annotations

import numpy as np
import pytest

from media.audio.frames import RTC_RATE
from peer.call import PeerCall
from signaling.client import SignalingError
from tests.conftest import running_server
from tests.triton.conftest import free_port, triton_engine, triton_registry


async def test_with_the_server_down_at_start_new_sessions_get_503_saying_why():
    """A node whose Triton server is not up yet starts all the same (the engine loads and
    keeps reconnecting); offers for the engine are refused with 503 ``engine_unavailable``
    and a message naming the server, instead of sessions that would only fail later."""
    url = f"127.0.0.1:{free_port()}"
    registry = triton_registry(url)
    try:
        assert registry.names == ["echo", "cosyvoice-triton"]
        reason = triton_engine(registry).unavailable_reason
        assert reason is not None and url in reason and "does not answer" in reason
        async with running_server(registry, engine="cosyvoice-triton") as server:
            with pytest.raises(SignalingError) as refused:
                async with PeerCall(
                    server.url, np.zeros(RTC_RATE, np.float32), engine="cosyvoice-triton"
                ):
                    pass
        assert (refused.value.status, refused.value.code) == (503, "engine_unavailable")
        assert url in refused.value.message
    finally:
        registry.close()
