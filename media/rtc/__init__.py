"""The WebRTC stack: the only package that touches aiortc and aioice directly."""
