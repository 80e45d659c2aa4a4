"""deploy/docker-compose.yml starts a cluster the server accepts, wired the way it needs.

No Docker daemon runs here, so the file is read as Compose reads it (YAML with merge keys)
and each node's environment (the image's ``ENV`` under the service's) goes through the
server's own settings parser: a variable it does not know, a bad value, a port range the
node does not publish 1:1, or two nodes sharing ports fails here, not on someone's host.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.config import Settings, settings_from
from server.deploy.cli import build_parser
from server.deploy.cluster import with_cluster_defaults

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "docker-compose.yml"
ANNOUNCED = "203.0.113.10"


def image_environment() -> dict[str, str]:
    """The ``ENV`` the Dockerfile sets (one instruction, continued over lines)."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            pairs.update(re.findall(r"(\w+)=(\S+)", line))
    return pairs


def substituted(value: str) -> str:
    """Compose's ``${VAR:?message}``, with the variable set as the README says."""
    return re.sub(r"\$\{COSYRTC_ANNOUNCE_IP:\?[^}]*\}", ANNOUNCED, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


def nodes(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if "build" in svc}


def node_settings(service: dict[str, Any]) -> Settings:
    env = image_environment()
    env.update({key: substituted(str(value)) for key, value in service["environment"].items()})
    settings = settings_from(build_parser().parse_args(["serve"]), env)
    return with_cluster_defaults(settings, https=False)


def published(service: dict[str, Any], protocol: str) -> list[tuple[str, str]]:
    """(host side, container side) of each published port mapping of ``protocol``."""
    mappings = []
    for entry in service["ports"]:
        ports, _, proto = entry.partition("/")
        if (proto or "tcp") == protocol:
            host, _, container = ports.rpartition(":")
            mappings.append((host, container))
    return mappings


def test_the_cluster_has_redis_and_two_nodes_that_use_it(compose: dict[str, Any]):
    services = compose["services"]
    assert "redis" in services
    command = services["redis"]["command"]
    assert command[:1] == ["redis-server"] and "--save" in command
    assert len(nodes(compose)) == 2
    for name, service in nodes(compose).items():
        settings = node_settings(service)
        assert "redis" in service["depends_on"]
        assert urllib.parse.urlsplit(settings.redis).hostname == "redis"
        assert settings.node_id == name
        assert settings.announce_ip == ANNOUNCED


def test_each_node_is_reached_by_its_peers_and_its_callers(compose: dict[str, Any]):
    ranges: list[range] = []
    for name, service in nodes(compose).items():
        settings = node_settings(service)
        advertised = urllib.parse.urlsplit(settings.advertise_url)
        assert (advertised.hostname, advertised.port) == (name, settings.port)
        assert ("", "") not in published(service, "tcp")
        assert any(container == str(settings.port) for _, container in published(service, "tcp"))
        assert settings.rtp_port_range is not None
        low, high = settings.rtp_port_range
        # Host candidates carry the container's ports: they must be published unchanged.
        assert published(service, "udp") == [(f"{low}-{high}", f"{low}-{high}")]
        ranges.append(range(low, high + 1))
    first, second = ranges
    assert not set(first) & set(second), "two nodes announce the same host ports"
    host_ports = [host for svc in nodes(compose).values() for host, _ in published(svc, "tcp")]
    assert len(set(host_ports)) == len(host_ports)


def test_an_unset_announced_address_is_refused_by_compose(compose: dict[str, Any]):
    """Without it the nodes would announce the container's own address, unreachable."""
    for service in nodes(compose).values():
        assert re.search(
            r"\$\{COSYRTC_ANNOUNCE_IP:\?", service["environment"]["COSYRTC_ANNOUNCE_IP"]
        )
