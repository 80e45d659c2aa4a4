"""A cluster of nodes coordinated through Redis: membership, load and placement.

Each node keeps a record in Redis, refreshed every ``HEARTBEAT_S`` and whenever its load
changes, that expires ``RECORD_TTL_MS`` after the last refresh: its URL, capacity, live
sessions, CPU, engines and whether it drains, and its sessions by client address. A node
that stops refreshing (killed, cut off) drops out of placement within the TTL.

Placement is one Lua script (atomic in Redis): among live nodes that have the engine, are
not draining and have room (live sessions plus reservations below capacity), the least
loaded takes a *reservation*, a slot held for ``RESERVATION_TTL_MS``; the cluster-wide
per-client limit is checked in the same step. No two concurrent offers can both take the
last slot, and a burst spreads because every reservation counts as load at once. The node
that then opens the session *commits*: it publishes its record (now counting the session)
and drops the reservation in one step, so the slot is never counted zero times.

Redis unavailable: the node keeps serving its live sessions, admits new ones locally only
(logged once), keeps the last node URLs it knew to route other nodes' sessions, and rejoins
by itself when Redis answers again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import secrets
import socket
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from server.config import Settings, SettingsError
from server.http.node import LocalNode

log = logging.getLogger(__name__)

HEARTBEAT_S = 0.5
RECORD_TTL_MS = 1500  # three missed heartbeats: a dead node is gone well within 2 s
RESERVATION_TTL_MS = 5000  # an offer is answered well within this, or it failed
PREFIX = "cosyrtc"
NODES = f"{PREFIX}:nodes"
REDIS_TIMEOUT_S = 0.5


def node_key(node_id: str) -> str:
    return f"{PREFIX}:node:{node_id}"


@dataclass(frozen=True)
class Placement:
    outcome: str  # "ok", "full" or "client_limit"
    node_id: str | None = None
    url: str | None = None
    reservation: str | None = None


# KEYS: none (the node set and every node's keys are named from ARGV, one Redis instance).
# ARGV: now_ms, reservation_ttl_ms, engine, client, client_limit, reservation_id, and the
# comma-separated ids of nodes not to choose (they refused this offer already).
RESERVE = """
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local engine, client, limit, reservation = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local excluded = ',' .. ARGV[7] .. ','
local prefix = 'cosyrtc:node:'
local best, best_load, best_url = nil, nil, nil
local client_total = 0
for _, id in ipairs(redis.call('SMEMBERS', 'cosyrtc:nodes')) do
  local key = prefix .. id
  if redis.call('EXISTS', key) == 0 then
    redis.call('SREM', 'cosyrtc:nodes', id)
  else
    local f = redis.call('HMGET', key, 'capacity', 'live', 'draining', 'engines', 'url', 'cpu')
    redis.call('ZREMRANGEBYSCORE', key .. ':reserved', '-inf', now)
    local reserved = redis.call('ZCARD', key .. ':reserved')
    if client ~= '' then
      client_total = client_total + tonumber(redis.call('HGET', key .. ':clients', client) or '0')
    end
    local capacity, live = tonumber(f[1]), tonumber(f[2])
    local has_engine = string.find(',' .. f[4] .. ',', ',' .. engine .. ',', 1, true)
    local refused = string.find(excluded, ',' .. id .. ',', 1, true)
    if f[3] ~= '1' and has_engine and not refused and live + reserved < capacity then
      local load = (live + reserved) / capacity + tonumber(f[6]) / 1000
      if best == nil or load < best_load then
        best, best_load, best_url = id, load, f[5]
      end
    end
  end
end
local client_key = 'cosyrtc:client:' .. client .. ':reserved'
if client ~= '' then
  redis.call('ZREMRANGEBYSCORE', client_key, '-inf', now)
  client_total = client_total + redis.call('ZCARD', client_key)
  if limit > 0 and client_total >= limit then return {'client_limit'} end
end
if best == nil then return {'full'} end
redis.call('ZADD', prefix .. best .. ':reserved', now + ttl, reservation)
redis.call('PEXPIRE', prefix .. best .. ':reserved', ttl)
if client ~= '' then
  redis.call('ZADD', client_key, now + ttl, reservation)
  redis.call('PEXPIRE', client_key, ttl)
end
return {'ok', best, best_url}
"""

# ARGV: node_id, ttl_ms, reservation ('' for none), client, then field/value pairs of the
# record, a '|' separator, and client/count pairs.
PUBLISH = """
local id, ttl, reservation, client = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local key = 'cosyrtc:node:' .. id
local i = 5
local record = {}
while ARGV[i] ~= '|' do
  table.insert(record, ARGV[i]); table.insert(record, ARGV[i + 1]); i = i + 2
end
redis.call('HSET', key, unpack(record))
redis.call('PEXPIRE', key, ttl)
redis.call('DEL', key .. ':clients')
i = i + 1
while ARGV[i] do
  redis.call('HSET', key .. ':clients', ARGV[i], ARGV[i + 1]); i = i + 2
end
redis.call('PEXPIRE', key .. ':clients', ttl)
redis.call('SADD', 'cosyrtc:nodes', id)
if reservation ~= '' then
  redis.call('ZREM', key .. ':reserved', reservation)
  if client ~= '' then
    redis.call('ZREM', 'cosyrtc:client:' .. client .. ':reserved', reservation)
  end
end
return 1
"""

# ARGV: node_id, reservation, client
RELEASE = """
redis.call('ZREM', 'cosyrtc:node:' .. ARGV[1] .. ':reserved', ARGV[2])
if ARGV[3] ~= '' then redis.call('ZREM', 'cosyrtc:client:' .. ARGV[3] .. ':reserved', ARGV[2]) end
return 1
"""


def _now_ms() -> int:
    return int(time.time() * 1000)


class Cluster:
    """This node's membership, and placement across every node, through one Redis."""

    def __init__(self, url: str, node_id: str, node: LocalNode) -> None:
        self.node_id = node_id
        self._node = node
        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S
        )
        self._reserve = self._redis.register_script(RESERVE)
        self._publish = self._redis.register_script(PUBLISH)
        self._release = self._redis.register_script(RELEASE)
        self._urls: dict[str, str] = {}  # last known, for routing while Redis is away
        self.available = True
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # --- membership ----------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._heartbeat())

    async def close(self) -> None:
        """Leave: the record goes at once, not at its expiry (a clean exit after a drain)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        key = node_key(self.node_id)
        await self._call(self._redis.delete(key, f"{key}:clients"))
        await self._call(self._redis.srem(NODES, self.node_id))
        await self._redis.aclose()

    def changed(self) -> None:
        """The node's load changed: publish before the next heartbeat."""
        self._changed.set()

    async def _heartbeat(self) -> None:
        while True:
            await self.publish()
            self._changed.clear()
            try:
                async with asyncio.timeout(HEARTBEAT_S):
                    await self._changed.wait()
            except TimeoutError:
                pass

    async def publish(self, reservation: str | None = None, client: str = "") -> None:
        """Write this node's record (and drop a reservation it has now filled)."""
        load = self._node.load()
        record: dict[str, str | int | float] = {
            "url": load.url,
            "capacity": load.capacity,
            "live": load.live,
            "cpu": round(load.cpu, 3),
            "engines": ",".join(load.engines),
            "draining": int(load.draining),
            "updated_ms": _now_ms(),
        }
        args: list[str | int | float] = [self.node_id, RECORD_TTL_MS, reservation or "", client]
        for field, value in record.items():
            args += [field, value]
        args.append("|")
        for key, count in load.clients.items():
            args += [key, count]
        await self._call(self._publish(args=args))

    # --- placement -----------------------------------------------------------------------

    async def place(
        self, engine: str, client: str, client_limit: int, excluded: Collection[str] = ()
    ) -> Placement | None:
        """A reservation on the least-loaded node that can take the session, other than
        ``excluded``; None when Redis cannot be asked (then the receiving node admits locally)."""
        reservation = secrets.token_urlsafe(12)
        args: list[str | int] = [
            _now_ms(), RESERVATION_TTL_MS, engine, client, client_limit, reservation,
            ",".join(excluded),
        ]  # fmt: skip
        reply = await self._call(self._reserve(args=args))
        if reply is None:
            return None
        outcome = _text(reply[0])
        if outcome != "ok":
            return Placement(outcome)
        node_id, url = _text(reply[1]), _text(reply[2])
        self._urls[node_id] = url
        return Placement("ok", node_id, url, reservation)

    async def is_reserved(self, reservation: str) -> bool:
        """Whether ``reservation`` holds a slot on this node (a placed offer's proof)."""
        score = await self._call(
            self._redis.zscore(f"{node_key(self.node_id)}:reserved", reservation)
        )
        return score is not None

    async def release(self, node_id: str, reservation: str, client: str) -> None:
        await self._call(self._release(args=[node_id, reservation, client]))

    async def url_of(self, node_id: str) -> str | None:
        """Where node ``node_id`` serves; None once it left (or never was)."""
        url = await self._call(self._redis.hget(node_key(node_id), "url"))
        if url is not None:
            self._urls[node_id] = _text(url)
            return self._urls[node_id]
        if not self.available:
            return self._urls.get(node_id)
        self._urls.pop(node_id, None)
        return None

    async def nodes(self) -> list[dict[str, Any]] | None:
        """Every live node's record and reservations, for ``GET /cluster``."""
        ids = await self._call(self._redis.smembers(NODES))
        if ids is None:
            return None
        now = _now_ms()
        found = []
        for raw in sorted(ids):
            node_id = _text(raw)
            record = await self._call(self._redis.hgetall(node_key(node_id)))
            if not record:
                continue
            fields = {_text(k): _text(v) for k, v in record.items()}
            reserved = await self._call(
                self._redis.zcount(f"{node_key(node_id)}:reserved", now, "+inf")
            )
            found.append(
                {
                    "node_id": node_id,
                    "url": fields["url"],
                    "capacity": int(fields["capacity"]),
                    "live": int(fields["live"]),
                    "reserved": int(reserved or 0),
                    "cpu": float(fields["cpu"]),
                    "engines": [e for e in fields["engines"].split(",") if e],
                    "draining": fields["draining"] == "1",
                    "age_ms": now - int(fields["updated_ms"]),
                }
            )
        return found

    async def _call(self, awaitable: Any) -> Any:
        """One Redis round trip; None (and the node on its own) when Redis is away."""
        try:
            result = await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            if self.available:
                log.warning("cluster: Redis unavailable (%s): admitting locally only", exc)
            self.available = False
            return None
        if not self.available:
            log.info("cluster: Redis is back: node %s rejoins", self.node_id)
            self.available = True
        return result


def with_cluster_defaults(settings: Settings, https: bool) -> Settings:
    """``settings`` with a node id and an advertised URL when it joins a cluster.

    The node id defaults to the host name and port; the URL to the listening address,
    which must then be one other nodes can reach (not a wildcard).
    """
    if settings.redis is None:
        return settings
    node_id = settings.node_id
    if node_id is None:
        host = re.sub(r"[^a-z0-9-]+", "-", socket.gethostname().lower()).strip("-") or "node"
        node_id = f"{host[:24]}-{settings.port}"
    url = settings.advertise_url
    if url is None:
        if settings.host in ("0.0.0.0", "::", ""):
            raise SettingsError(
                "--advertise-url is needed with --redis when --host is a wildcard: other "
                "nodes must know where to reach this one"
            )
        url = f"{'https' if https else 'http'}://{settings.host}:{settings.port}/"
    return dataclasses.replace(settings, node_id=node_id, advertise_url=url)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
