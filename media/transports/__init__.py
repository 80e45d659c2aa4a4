"""Transports other than WebRTC that attach to the same pipelines (WebSocket, telephony)."""
