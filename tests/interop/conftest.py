"""Fixtures for calls from WebRTC stacks that are not aiortc, inside a private network."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.netns import (
    Namespace,
    NamespacedServer,
    NamespaceUnavailable,
    namespaced_server,
    network_namespace,
)
from tests.interop.signals import stepped_tone, write_raw

HERE = Path(__file__).resolve().parent
SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, for which python3-gi and python3-gst-1.0 are built
GST_CHECK = (
    "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstWebRTC', '1.0'); "
    "from gi.repository import Gst; Gst.init(None); "
    "missing = [e for e in ('webrtcbin', 'nicesrc', 'opusenc', 'opusdec', 'rawaudioparse') "
    "if Gst.ElementFactory.find(e) is None]; "
    "print(' '.join(missing)); raise SystemExit(bool(missing))"
)
TONE_SECONDS = 20.0


@pytest.fixture(scope="module")
def namespace() -> Iterator[Namespace]:
    try:
        with network_namespace() as created:
            yield created
    except NamespaceUnavailable as exc:
        pytest.skip(f"interop tests run in a network namespace: {exc}")


@pytest.fixture(scope="module")
def echo_server(namespace: Namespace) -> Iterator[NamespacedServer]:
    with namespaced_server(namespace) as server:
        yield server


@pytest.fixture(scope="session")
def gst_python() -> str:
    """Debian's interpreter, once its GStreamer bindings and elements are known to be there."""
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"{SYSTEM_PYTHON} is missing")
    check = subprocess.run([SYSTEM_PYTHON, "-c", GST_CHECK], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(
            "GStreamer's Python bindings or elements are missing "
            f"({check.stdout.strip() or check.stderr.strip()[-200:]}): `make test` installs them"
        )
    return SYSTEM_PYTHON


@pytest.fixture(scope="session")
def igd_stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the UPnP stand-in library (see igd_stub.c for why)."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        pytest.skip("no C compiler to build the libgupnp-igd stand-in for simple-whip-client")
    folder = tmp_path_factory.mktemp("igd")
    library = folder / "libgupnp-igd-1.0.so.4"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-Wl,-soname,libgupnp-igd-1.0.so.4", "-o", str(library),
         str(HERE / "igd_stub.c")],
        check=True, capture_output=True,
    )  # fmt: skip
    return folder


@pytest.fixture(scope="session")
def tone_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_raw(tmp_path_factory.mktemp("tone") / "tone.raw", stepped_tone(TONE_SECONDS))
