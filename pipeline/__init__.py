"""SenseVoiceSmall serving pipeline: decode -> queue -> batched GPU engine -> job store."""

import logging

logger = logging.getLogger("sensevoice")
