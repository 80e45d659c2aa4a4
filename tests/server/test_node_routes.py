"""A node's own routes without a cluster: its load in ``GET /cluster``, and a drain."""

from __future__ import annotations

import aiohttp

from tests.conftest import RunningServer


async def test_a_lone_node_lists_itself_and_drains_on_request(server: RunningServer):
    async with aiohttp.ClientSession() as http:
        async with http.get(server.url + "cluster") as response:
            body = await response.json()
        assert body["cluster"] is False and len(body["nodes"]) == 1
        node = body["nodes"][0]
        assert node["live"] == 0 and node["draining"] is False and "echo" in node["engines"]
        async with http.post(server.url + "admin/drain") as drained:
            assert drained.status == 202
        async with http.get(server.url + "readyz") as ready:
            assert ready.status == 503 and "draining" in (await ready.json())["reasons"]
        async with http.post(server.url + "offer", json={"sdp": "v=0", "type": "offer"}) as r:
            assert r.status in (400, 503)  # the SDP check may come first; nothing is admitted
        async with http.get(server.url + "cluster") as response:
            assert (await response.json())["nodes"][0]["draining"] is True
