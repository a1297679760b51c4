# SenseVoice web app for a CUDA host:  docker build -t sensevoice . &&
#   docker run --gpus all -p 7860:7860 -v sv-data:/data -v sv-models:/root/.cache --restart unless-stopped sensevoice
# The torch wheel from PyPI bundles its CUDA runtime; the host needs only the NVIDIA driver and
# the NVIDIA container toolkit. PyAV bundles FFmpeg: no ffmpeg binary is needed.
# Reached by another name than localhost (a LAN address, a DNS name)? Add
#   -e SENSEVOICE_ALLOWED_HOSTS=your.host.name  (and -e SENSEVOICE_API_TOKEN=... when exposed)
# or requests get 400 host_not_allowed (DNS-rebinding defence). Distributed topology: deploy/.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    SENSEVOICE_HOST=0.0.0.0 SENSEVOICE_PORT=7860 SENSEVOICE_DATA_DIR=/data

WORKDIR /app
COPY requirements.txt .
RUN pip install -r requirements.txt

COPY app_sensevoice.py .
COPY pipeline/ pipeline/
COPY static/ static/

VOLUME ["/data", "/root/.cache"]
EXPOSE 7860
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s \
  CMD python -c "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:7860/readyz').status == 200 else 1)"
# Real model by default (downloaded into /root/.cache on first start); pass --demo to try offline.
ENTRYPOINT ["python", "app_sensevoice.py"]
CMD ["--model", "iic/SenseVoiceSmall"]
