# SenseVoice web app for a CUDA host:  docker build -t sensevoice . &&
#   docker run --gpus all -p 7860:7860 -v sv-data:/data -v sv-models:/root/.cache --restart unless-stopped sensevoice
# or, the same as one compose service:  docker compose -f deploy/compose.single.yaml up -d --build
# The torch wheel from PyPI bundles its CUDA runtime; the host needs only the NVIDIA driver and
# the NVIDIA container toolkit. PyAV bundles FFmpeg: no ffmpeg binary is needed.
# Reached by another name than localhost (a LAN address, a DNS name)? Add
#   -e SENSEVOICE_ALLOWED_HOSTS=your.host.name  (and -e SENSEVOICE_API_TOKEN=... when exposed)
# or requests get 400 host_not_allowed (DNS-rebinding defence). Distributed topology: deploy/.
#
# It runs as the unprivileged user "sensevoice" (uid/gid 10001), never root. Its two volumes are
# owned by that user, and a new named volume takes that ownership from the image:
#   /data          the job store (SQLite) and audio spool (SENSEVOICE_DATA_DIR)
#   /root/.cache   the model cache: funasr/modelscope, Hugging Face, torch hub and the demo model
#                  all use ~/.cache, and the user's ~/.cache (HOME=/home/sensevoice) points here.
#                  The path is the one the deploy/ files and earlier images mount.
# A bind mount (-v /srv/sv:/data) must be writable by uid 10001 (chown 10001:10001 /srv/sv).
# Volumes written by an earlier image (which ran as root) are root-owned: hand them over once:
#   docker run --rm --user 0 --entrypoint chown -v sv-data:/data -v sv-models:/root/.cache \
#     sensevoice -R 10001:10001 /data /root/.cache
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    SENSEVOICE_HOST=0.0.0.0 SENSEVOICE_PORT=7860 SENSEVOICE_DATA_DIR=/data

# espeak-ng: the UI's one-click sample recordings are spoken by it (pipeline/web/ui.py); without
# it the samples are hidden and the rest works
RUN apt-get update \
 && apt-get install -y --no-install-recommends espeak-ng \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt

# the user, its home, and the two volume directories it owns; /root is made traversable (0711,
# not listable) so that uid 10001 reaches /root/.cache
RUN groupadd --system --gid 10001 sensevoice \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/sensevoice --create-home \
      --shell /usr/sbin/nologin sensevoice \
 && mkdir -p /data /root/.cache \
 && chown 10001:10001 /data /root/.cache \
 && chmod 0711 /root \
 && ln -s /root/.cache /home/sensevoice/.cache
ENV HOME=/home/sensevoice

# the code stays root-owned: the process can read it, not change it
COPY app_sensevoice.py .
COPY pipeline/ pipeline/
COPY static/ static/

USER 10001:10001
VOLUME ["/data", "/root/.cache"]
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:7860/readyz', timeout=4).status == 200 else 1)"
# Real model by default (downloaded into /root/.cache on first start); pass --demo to try offline.
ENTRYPOINT ["python", "app_sensevoice.py"]
CMD ["--model", "iic/SenseVoiceSmall"]
