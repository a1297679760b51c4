"""Serving: the brokers (SQLite, Redis), the scheduler, the GPU worker, admission, the runtime."""
