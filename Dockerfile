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

# Listen on every interface inside the container; publish 8080/tcp for HTTP. Media uses
# UDP on ephemeral ports: run with --network host, or set --ice-host to the host address.
ENV COSYRTC_HOST=0.0.0.0
EXPOSE 8080

HEALTHCHECK --interval=15s --timeout=3s --start-period=20s \
  CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2)"

CMD ["make", "run"]
