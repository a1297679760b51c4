"""Audio: decoding (PyAV in bounded child processes), resampling, voice activity detection."""
