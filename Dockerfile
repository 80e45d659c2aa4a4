# cosyrtc: WebRTC server for streaming speech inference.
# Installs through the same make target as the README, so the two cannot drift.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 cosyrtc
WORKDIR /app
COPY --chown=cosyrtc:cosyrtc . /app
USER cosyrtc

RUN make install

# HTTP on every interface of the container. Media: each call's ICE host candidate binds a
# UDP port of COSYRTC_RTP_PORT_RANGE, so publishing that range (-p 40000-40199:40000-40199/udp)
# forwards every call's media; Docker's port publishing is a 1:1 NAT, so also set
# COSYRTC_ANNOUNCE_IP to the address clients reach the host at. A range of N ports holds
# N concurrent calls; beyond that a new offer gets 503 no_media_ports.
ENV COSYRTC_HOST=0.0.0.0 \
    COSYRTC_PORT=8080 \
    COSYRTC_RTP_PORT_RANGE=40000-40199
EXPOSE 8080/tcp 40000-40199/udp

# /healthz needs no token; the scheme follows COSYRTC_TLS_CERT (a local probe of our own
# certificate, so it is not verified).
HEALTHCHECK --interval=15s --timeout=3s --start-period=30s \
  CMD python -c "import ssl, sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2, context=ssl._create_unverified_context())" \
      "http${COSYRTC_TLS_CERT:+s}://127.0.0.1:${COSYRTC_PORT}/healthz"

CMD ["make", "run"]
