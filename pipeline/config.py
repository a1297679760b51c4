"""All knobs of the service, in one place, grouped (server, limits, engine, broker, live, ui).

Each knob is read from the environment by its flat name with the prefix ``SENSEVOICE_``
(``SENSEVOICE_MAX_BATCH``, ``SENSEVOICE_API_TOKEN``, as the README and the deploy manifests name
them) or given to ``Settings(max_batch=...)`` by that flat name; the code reads it in its group
(``settings.engine.max_batch``). Secrets are ``SecretStr``. No other module reads the project's
environment."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_MODEL = "iic/SenseVoiceSmall"
ENV_PREFIX = "SENSEVOICE_"
# submits decoded and stored at once: fewer left 2 cores idle under load, more made polls wait for
# the GIL (8 is what the measurements in limits.submit_threads's description chose)
DEFAULT_SUBMIT_THREADS = 8


def env_cache_dir() -> Path | None:
    """``SENSEVOICE_CACHE_DIR`` as set (the demo builder's cache root when given), or None."""
    value = os.environ.get(ENV_PREFIX + "CACHE_DIR")
    return Path(value).expanduser() if value else None


def env_api_token() -> str | None:
    """``SENSEVOICE_API_TOKEN`` as set (the CLI's default token for ``--server``), or None."""
    return os.environ.get(ENV_PREFIX + "API_TOKEN") or None


GPU_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd", "/dev/dxg")


def gpu_driver_present() -> bool:
    """Whether this host may have a GPU torch can use (NVIDIA's driver, ROCm's, WSL's): without
    one the answer is ``cpu`` with no torch import (2-5 s that the HTTP server need not wait for)."""
    return any(os.path.exists(p) for p in GPU_DRIVER_PATHS)


def default_device() -> str:
    """``cuda`` when a GPU is visible, else ``cpu``. Imports torch lazily, and only on a host with
    a GPU driver."""
    if not gpu_driver_present():
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class ServerSettings(BaseModel):
    """Where and how the process serves: address, role, storage, supervision, the API token."""

    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(7860, description="Port to bind.")
    data_dir: Path = Field(Path("data"), description="Job store (SQLite) and audio spool; created "
                           "0700 (files 0600), an existing one of this user's tightened to 0700.")
    cache_dir: Path = Field(
        Path.home() / ".cache" / "sensevoice-app",
        description="Where the demo model is built and cached.",
    )
    role: Literal["all", "api", "worker"] = Field(
        "all", description="What this process runs: 'api' (HTTP, UI, decoding; no model), 'worker' "
        "(one GPU's model and batching; probes and metrics on --port), 'all' (both, the default).")
    access_log: bool = Field(
        False, description="Log every HTTP request (polls included: 200 pollers are 400 lines/s); "
        "each job is logged once either way.")
    gil_switch_ms: float = Field(
        0.5, ge=0, description="Python's thread switch interval, ms (0 = Python's own 5 ms). Smaller "
        "hands the GIL to the event loop sooner when threads compete (poll latency under load).")
    web_processes: int = Field(
        0, ge=0, le=64, description="HTTP processes of the embedded server: this one (the store's "
        "writer, the GPU loop, the UI, live captions) and N-1 sibling web processes on the same "
        "port that take uploads and polls (the REST API's hot routes) so that HTTP, decoding and "
        "polling use more than one core; the rest they relay to this one. 0 = auto: 3 on a CUDA "
        "host with 2 cores or more, else 1 (a CPU model needs the cores).")
    web_owner_accepts: bool | None = Field(
        None, description="With sibling web processes: this process accepts public connections "
        "too (False: only the siblings do, and this one serves the GPU loop, the store and what "
        "they relay to it). None = auto: only when it has a single sibling.")
    exit_on_fatal: bool = Field(
        False, description="Exit the process (code 3) on a fatal device error or a hung worker, so a "
        "supervisor restarts it; set by main().")
    hung_timeout_s: float = Field(120.0, description="A worker without a heartbeat this long is hung.")
    loop_stall_timeout_s: float = Field(
        30.0, gt=0, description="An event loop that has not answered for this long makes the "
        "service unhealthy (readyz 503, and with exit_on_fatal an exit for a restart).")
    trusted_proxies: str = Field(
        "", description="Comma-separated addresses or networks (CIDR) of the reverse proxies in "
        "front of this server. Only a connection from one of them may set the client's address "
        "(X-Forwarded-For) and scheme (X-Forwarded-Proto), which the per-client limits and the "
        "sign-in throttle count by; empty (the default) trusts no one, loopback included. Name "
        "the proxy itself, never '*'.")
    allowed_hosts: str = Field(
        "", description="Comma-separated Host names the server answers (DNS-rebinding defence). "
        "Empty = loopback names (localhost, 127.0.0.1, ::1) plus the bound host when it is not a "
        "wildcard; '*' = any.")
    api_token: SecretStr = Field(SecretStr(""), description="If set, REST calls need 'Authorization: Bearer <token>'.")

    @property
    def token(self) -> str:
        """The API token in clear ('' without one): compared and signed with, never logged."""
        return self.api_token.get_secret_value()

    @field_validator("trusted_proxies")
    @classmethod
    def _proxy_networks(cls, value: str) -> str:
        for item in (i.strip() for i in value.split(",")):
            if not item:
                continue
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(
                    f"SENSEVOICE_TRUSTED_PROXIES: {item!r} is not an address or network; name the "
                    "reverse proxy's address (10.0.0.5) or its network (10.0.0.0/24), never '*': "
                    "any client could then choose the address its limits are counted by") from None
        return value


class LimitsSettings(BaseModel):
    """What one request, one client and all of them together may cost; retention."""

    max_upload_bytes: int = Field(200 * 1024 * 1024, description="Max upload size, bytes.")
    max_audio_seconds: float = Field(4 * 3600.0, description="Max decoded duration, seconds.")
    queue_size: int = Field(1024, ge=1, description="Max jobs waiting; beyond it submit gets 503.")
    request_wait_s: float = Field(
        600.0, gt=0, description="The longest one HTTP request waits for its job: POST "
        "/api/jobs?wait= is capped at it, and /v1/audio/transcriptions answers 504 after it (naming "
        "the job, whose result stays at /api/jobs/{id}). The wait holds no thread.")
    retry_after_s: int = Field(2, description="Retry-After seconds sent with 503 queue_full.")
    decode_concurrency: int = Field(
        0, description="Uploads decoded at once (0 = one per CPU core); more wait, so that polls and "
        "the event loop are not starved by CPU-bound decoding threads.")
    decode_processes: int = Field(
        -1, description="Processes that decode uploads (-1 = one per CPU core, at most 8; 0 = in "
        "the server process). Out of the server's GIL, and a decoder crash costs one process.")
    decode_timeout_s: float = Field(
        600.0, gt=0, description="An upload still decoding after this long is refused (415) and its "
        "decoder process killed (a 4 h mp3 decodes in well under a minute per core).")
    decoder_memory_mb: int = Field(
        0, ge=0, description="Address-space limit of each decoder process, MiB (0 = derived from "
        "max_audio_seconds: room for the longest allowed audio at 16 kHz plus the decoder's own "
        "needs). A crafted file that asks for more fails alone (413 decoder_out_of_memory).")
    max_concurrent_uploads: int = Field(
        0, ge=0, description="Large request bodies received or handled at once by each web process "
        "(0 = twice the CPU cores, at least 8); beyond it an upload gets 503 + Retry-After at once. "
        "Bounds memory too: each upload is read whole before it is decoded.")
    submit_threads: int = Field(
        0, ge=0, description="Uploads decoded and stored at once by the thread pool (0 = "
        f"{DEFAULT_SUBMIT_THREADS}, whatever the cores: one process has one GIL); more wait for a "
        "thread. Each of those threads takes the GIL several times per upload: with 32 at once "
        "under load, polls waited behind them for the event loop's turn (poll p99 0.6-1.8 s on 2 "
        "cores, 9 ms with 8 threads; 838 ms on the H200's 16 cores, where 2 a core made it 32).")
    header_timeout_s: float = Field(
        10.0, gt=0, description="A connection must send a request's complete headers within this "
        "long, or it is closed (slow-header attacks hold file descriptors).")
    body_timeout_s: float = Field(
        900.0, gt=0, description="The longest a request body may take to arrive (408 beyond it).")
    body_min_rate_bytes_s: int = Field(
        8192, ge=0, description="After body_grace_s, a request body arriving slower than this (bytes/s, "
        "on average) is cut off with 408: slow bodies cannot hold upload slots.")
    body_grace_s: float = Field(10.0, ge=0, description="Seconds before the minimum body rate applies.")
    max_uploads_per_client: int = Field(
        4, ge=0, description="Large uploads one client address may have in flight (0 = no limit); more "
        "get 429 + Retry-After. Behind a reverse proxy every client has the proxy's address unless "
        "trusted_proxies names it.")
    max_batches_per_client: int = Field(
        2, ge=0, description="Batches (POST /api/batches) one client address may have in progress, "
        "read, unpacked and submitted (0 = no limit); more get 429 too_many_batches_from_client + "
        "Retry-After. A batch's body takes an upload slot whatever its size.")
    batch_recordings_per_slot: int = Field(
        20, ge=1, description="A batch holds one upload slot per this many recordings (or per "
        "quarter of max_upload_bytes unpacked, whichever is more; at most half the slots and the "
        "client's max_uploads_per_client) until every recording is submitted: a few kilobytes of "
        "zip are many decodes and jobs.")
    max_event_streams_per_job: int = Field(
        2048, ge=0, description="Event streams (GET /api/jobs/{id}/events) one job may have at "
        "once (0 = no limit); more get 503 event_streams_full. Each job's events are built once "
        "and shared by its streams.")
    max_event_streams_per_client: int = Field(
        64, ge=0, description="Event streams one client address may hold at once, all jobs "
        "together (0 = no limit); more get 429 too_many_event_streams_from_client.")
    max_exports: int = Field(
        4, ge=0, description="CSV exports of the calls table (POST /api/calls, format csv) each web "
        "process builds at once, in worker threads (0 = no limit); more get 503 too_many_exports + "
        "Retry-After. One of 30,000 calls is about a second of CPU.")
    max_exports_per_client: int = Field(
        2, ge=0, description="CSV exports one client address may have in progress (0 = no limit); "
        "more get 429 too_many_exports_from_client + Retry-After.")
    auth_failures_per_client: int = Field(
        20, ge=0, description="Failed sign-ins (401s, failed UI logins, live streams refused for "
        "their token) one client address may make per auth_failure_window_s (0 = no limit); then "
        "it gets 429 too_many_auth_failures until the window ends, the right token included.")
    auth_failure_window_s: float = Field(
        300.0, gt=0, description="The window of auth_failures_per_client, seconds.")
    max_connections_per_client: int = Field(
        256, ge=0, description="Open connections one client address may hold (0 = no limit); more are "
        "closed at once.")
    max_connections: int = Field(
        0, ge=0, description="Open connections in all (0 = half the file-descriptor limit); beyond "
        "it new connections are closed at once, so the server never runs out of descriptors.")
    segment_backlog_jobs: int = Field(
        64, ge=1, description="Long recordings accepted but not yet split into pieces and queued; "
        "beyond it a long upload gets 503 backlog_full + Retry-After.")
    segment_backlog_hours: float = Field(
        16.0, gt=0, description="Audio hours of long recordings waiting to be split or run; beyond "
        "it a long upload gets 503 backlog_full. Their audio waits on disk, not in memory.")
    min_free_memory_ratio: float = Field(
        0.15, description="GPU admission: refuse new jobs (503) while free device memory is under this share.")
    retention_hours: float = Field(24.0, description="Results and their audio are purged after this.")
    keep_max_days: float = Field(30.0, gt=0, description="POST /api/jobs/{id}/keep (the desk's Keep) keeps "
                                 "a finished call this many days from then, at most.")
    delete_audio_when_done: bool = Field(False, description="Delete a job's audio as soon as it is done.")
    queue_timeout_s: float = Field(600.0, description="A job waiting longer than this fails ('timed out in queue').")

    @model_validator(mode="after")
    def _derive(self) -> "LimitsSettings":
        """The defaults that depend on the machine, resolved once here (0 / -1 mean "derive")."""
        cores = os.cpu_count() or 2
        if self.decode_processes < 0:
            self.decode_processes = min(cores, 8)
        if self.decode_concurrency <= 0:
            self.decode_concurrency = cores
        if self.max_concurrent_uploads <= 0:
            self.max_concurrent_uploads = max(8, 2 * cores)
        if self.submit_threads <= 0:
            self.submit_threads = DEFAULT_SUBMIT_THREADS
        return self


class EngineSettings(BaseModel):
    """The model, the device, batching, compiled kernels and graphs, long-audio splitting."""

    model: str = Field(
        DEFAULT_MODEL,
        description="Model: a local SenseVoiceSmall directory, or a hub name funasr downloads.",
    )
    demo: bool = Field(
        False, description="Build (once, cached) and serve a small hand-set demo model offline."
    )
    device: str = Field("", description="'cuda', 'cuda:1', 'cpu'; empty = cuda if available.")
    dtype: Literal["float16", "bfloat16", "float32"] = Field(
        "float16", description="Encoder compute dtype on GPU (CPU always uses float32)."
    )
    fp32_residual: bool = Field(
        True, description="Keep the encoder's residual stream in fp32 when dtype is fp16/bf16 "
        "(closer to fp32 tokens; about 15% slower on an H200).")
    fp8_gemm: Literal["off", "ffn", "all"] = Field(
        "off", description="FP8 (e4m3) matrix products in the fused encoder's linear layers on a GPU "
        "of compute capability 8.9+ (pipeline/model/fp8.py): weights per output channel, "
        "activations per token. 'ffn': the feed-forward's two linears; 'all': also the attention's "
        "qkv and output projections; 'off': the 16-bit path, unchanged.")
    cpu_threads: int = Field(
        1, description="torch threads for inference on a CPU device (more spin and starve the web "
        "server on small machines).")
    max_batch: int = Field(64, ge=1, description="Max clips per GPU batch.")
    max_wait_ms: float = Field(2.0, ge=0, description="Batch formation wait after the first job, ms.")
    max_batch_seconds: float = Field(
        1200.0, description="Max total padded audio seconds in one batch (bounds GPU memory)."
    )
    fused_encoder: bool = Field(
        True, description="Run the fused encoder (pipeline/model/fused.py), built from the model "
        "directory without importing funasr (pipeline/model/fast_load.py); on CUDA compiled, its "
        "kernels cached under cache_dir/inductor (eager until compiled), on a CPU uncompiled; false: "
        "the eager reference path over funasr's modules.")
    cuda_graphs: bool = Field(True, description="Capture CUDA graphs per (batch, length) bucket, "
                              "lazily, when the worker is idle.")
    background_compile: bool | None = Field(
        None, description="Compile the fused encoder and capture CUDA graphs in the background "
        "(while the worker is idle, and a shape run often between batches). Unset: on for the "
        "server, off for the batch CLI's local mode (a run ends before a compile pays, and a "
        "compile cannot be cancelled: the CLI would wait for it at exit); the eager path serves "
        "meanwhile either way.")
    graph_batch_sizes: str = Field("1,2,4,8,16,32,64", description="Batch buckets to capture.")
    graph_max_seconds: float = Field(30.0, description="Longest clip served by captured graphs, s.")
    segment_threshold_s: float = Field(
        30.0, description="Audio longer than this is split with silero-vad into speech segments.")
    max_segment_s: float = Field(30.0, description="Longest VAD segment, seconds (split at the quietest point).")
    hub_timeout_s: float = Field(3.0, description="Seconds to wait for the model hub to answer.")
    speaker_model: str = Field(
        "iic/speech_campplus_sv_zh-cn_16k-common", description="The CAM++ speaker model that labels "
        "a mono recording's speakers when a job asks (speakers=N / diarize): a local directory or "
        "the hub name; with --demo (or a demo model directory) offline demo weights instead.")

    def resolved_device(self) -> str:
        return self.device or default_device()


class BrokerSettings(BaseModel):
    """The topology: the embedded broker (no url) or Redis."""

    url: str = Field(
        "", description="Empty: the embedded topology (SQLite job store + in-process queue, one "
        "process). 'redis://HOST:PORT/DB': the distributed topology (Redis Streams queue and job "
        "records; api and worker processes on any hosts).")
    shared_dir: str = Field(
        "", description="Distributed topology: a directory every api and worker process sees (on "
        "one host: /dev/shm/sensevoice). Decoded audio and uploads travel as files there and Redis "
        "holds only their names; empty: they travel inside Redis (any hosts). Not fsynced: a host "
        "crash fails the queued jobs whose audio was there (audio_lost), never silently. Created "
        "0700; refused when it or a directory above it is another user's or others can write it "
        "(a sticky one, as /dev/shm, is fine).")
    visibility_timeout_s: float = Field(
        60.0, gt=0, description="Distributed topology: a job claimed by a worker and not finished in "
        "this long (the worker died) is claimed again by another; after 3 claims it fails.")
    live_lost_after_s: float = Field(
        1.0, gt=0, le=30.0, description="Distributed topology: a worker whose live-lane beat (4 a "
        "period) is this late is taken as gone by the live streams it decodes for: their re-decode "
        "moves to another worker, or (none left) the stream ends with live_worker_lost.")

class LiveSettings(BaseModel):
    """Live captions (WebSocket /api/stream and /api/stream/funasr; pipeline/serving/live.py)."""

    max_streams: int = Field(
        64, ge=0, description="Live caption streams served at once (both WebSocket endpoints); "
        "beyond it a new stream gets the error too_many_streams and close code 1013. 0 = live "
        "captions off. Raise it on a GPU (one H200 is meant to hold 500).")
    max_streams_per_client: int = Field(
        8, ge=0, description="Live caption streams one client address may hold at once (0 = no "
        "limit); more get too_many_streams, so one client cannot take every slot. Behind a reverse "
        "proxy the address is the proxy's unless trusted_proxies names it.")
    partial_interval_s: float = Field(
        0.4, gt=0, description="A live stream's utterance in progress is re-decoded at most this "
        "often (wall clock); a partial is sent only when its text changed.")
    pause_s: float = Field(
        0.7, ge=0.05, description="Silence after speech that closes a live utterance (its final "
        "follows). 0.7 s cuts where the offline splitter cuts (its 500 ms merge gap plus 100 ms of "
        "padding on each side); less gives earlier, shorter finals.")
    max_utterance_s: float = Field(
        30.0, ge=2.0, le=60.0, description="A live utterance reaching this is cut at its quietest "
        "point and finalised, as long recordings are cut.")
    idle_timeout_s: float = Field(
        30.0, gt=0, description="A live stream that sends nothing for this long is finalised and "
        "closed (idle_timeout).")
    max_stream_s: float = Field(
        4 * 3600.0, gt=0, description="Audio one live stream may send, seconds; then its "
        "utterances are finalised and it ends with stream_too_long.")
    max_frame_bytes: int = Field(
        256 * 1024, ge=4096, description="Largest frame a live stream may send, bytes (256 KiB: "
        "2.7 s of 48 kHz PCM); larger gets frame_too_large. The WebSocket layer itself refuses "
        "messages over twice this (close 1009).")
    burst_s: float = Field(
        10.0, ge=0, description="Audio a live stream may send ahead of real time, seconds: beyond "
        "real time plus this burst the server stops reading the stream until its audio is due "
        "(back-pressure), so a sender faster than real time costs no more than a real-time one.")
    max_buffered_s: float = Field(
        60.0, gt=0, description="Audio one live stream may hold while it waits for the model "
        "(the utterance in progress plus finals not yet decoded; at least the longest utterance "
        "plus 5 s). Beyond it the server stops reading that stream until it catches up, and ends "
        "it with live_overloaded after live_idle_timeout_s.")
    latency_budget_s: float = Field(
        0.15, gt=0, description="Live captions keep their re-decodes under this latency: while "
        "recent ones take longer, a new stream is refused at once (live_at_capacity, close 1013, "
        "retry in 5 s); from half of it open streams stretch their partial cadence (to 4x "
        "live_partial_interval_s at it); finals are never delayed. A final also waits for the "
        "speech detector, a partial still running and the network (docs/BENCHMARKS.md: 0.15 s "
        "measured best of 0.12 / 0.15 / 0.3 on two cores).")
    target_busy: float = Field(
        0.6, gt=0, le=1.0, description="Partials thin out from half this busy share of the live "
        "lane's model. Until the lane's capacity is measured (live_capacity_share), also a new "
        "stream is refused (live_at_capacity) once the open streams, with the load the young ones "
        "have still to bring (a per-stream cost learned from the lane), would take it past this.")
    capacity_share: float = Field(
        0.8, gt=0, le=1.0, description="Live admission fills the lane's measured capacity up to "
        "this share: the re-decodes per second its workers can batch within live_latency_budget_s "
        "(measured from their batches' sizes and times), against the open streams' demand (their "
        "speech times a cost per voiced second learned from the lane; in the distributed "
        "topology every api process's streams together). A burst is admitted up to it at once.")
    gather_ms: float = Field(
        4.0, ge=0, le=50.0, description="On a GPU, a batch waits up to this long after its oldest "
        "live re-decode for more of them while they arrive densely, so re-decodes of many streams "
        "run in one batch; not on a CPU (a batch there costs the sum of its items).")
    max_stream_wall_s: float = Field(
        4 * 3600.0, gt=0, description="Time one live stream (one FunASR recording) may stay open, "
        "wall clock, whatever it sends: then its utterances are finalised and it ends with "
        "stream_time_limit (1008). A stream that trickles a little audio now and then never meets "
        "live_max_stream_s (audio); this bounds it too. 4 h: a long meeting or lecture.")
    quiet_window_s: float = Field(
        60.0, gt=0, description="The recent time over which a live stream counts as quiet (see "
        "live_quiet_share); a stream younger than this is never quiet.")
    quiet_share: float = Field(
        0.05, ge=0, le=1.0, description="While every live slot is held and a new stream asks for "
        "one, the quietest stream whose speech in its last live_quiet_window_s was under this "
        "share of it (3 s of 60 s) is finalised and closed (quiet_stream_yielded, 1013) and the "
        "new stream takes its slot. A quiet stream on a server with free slots is left alone. "
        "0 = never.")
    client_prefix_v4: int = Field(
        32, ge=8, le=32, description="Live streams per client (max_live_streams_per_client) count "
        "IPv4 clients by this prefix: 32 = each address, 24 = a /24 is one client.")
    client_prefix_v6: int = Field(
        64, ge=16, le=128, description="The same for IPv6 clients: 64 = a /64 (one site's "
        "network: a client holds as many addresses in it as it likes) is one client; 128 = each "
        "address.")

class UiSettings(BaseModel):
    """The Gradio page."""

    enabled: bool = Field(True, description="Serve the Gradio UI at /ui; false = REST API only (gradio "
                     "is then not imported).")
    auth: SecretStr = Field(SecretStr(""), description="If set ('user:password'), the UI asks for this login.")
    kiosk: bool = Field(False, description="Kiosk mode for demo stations (also ?kiosk=1 on the page): no "
                        "history, no calls table, each visitor's result cleared on 'Next visitor' or when idle.")
    kiosk_clear_s: float = Field(120.0, ge=5, le=3600, description="Kiosk mode: a visitor's result is cleared "
                                 "after this many seconds without a touch.")

    @property
    def login(self) -> str:
        """The UI login ('user:password', '' without one), in clear."""
        return self.auth.get_secret_value()



# flat name (environment, keywords) -> (group, field)
GROUP_OF = {
    'host': ('server', 'host'),
    'port': ('server', 'port'),
    'data_dir': ('server', 'data_dir'),
    'cache_dir': ('server', 'cache_dir'),
    'role': ('server', 'role'),
    'access_log': ('server', 'access_log'),
    'gil_switch_ms': ('server', 'gil_switch_ms'),
    'exit_on_fatal': ('server', 'exit_on_fatal'),
    'web_processes': ('server', 'web_processes'),
    'web_owner_accepts': ('server', 'web_owner_accepts'),
    'hung_timeout_s': ('server', 'hung_timeout_s'),
    'loop_stall_timeout_s': ('server', 'loop_stall_timeout_s'),
    'trusted_proxies': ('server', 'trusted_proxies'),
    'allowed_hosts': ('server', 'allowed_hosts'),
    'api_token': ('server', 'api_token'),
    'max_upload_bytes': ('limits', 'max_upload_bytes'),
    'max_audio_seconds': ('limits', 'max_audio_seconds'),
    'queue_size': ('limits', 'queue_size'),
    'request_wait_s': ('limits', 'request_wait_s'),
    'retry_after_s': ('limits', 'retry_after_s'),
    'decode_concurrency': ('limits', 'decode_concurrency'),
    'decode_processes': ('limits', 'decode_processes'),
    'decode_timeout_s': ('limits', 'decode_timeout_s'),
    'decoder_memory_mb': ('limits', 'decoder_memory_mb'),
    'max_concurrent_uploads': ('limits', 'max_concurrent_uploads'),
    'submit_threads': ('limits', 'submit_threads'),
    'header_timeout_s': ('limits', 'header_timeout_s'),
    'body_timeout_s': ('limits', 'body_timeout_s'),
    'body_min_rate_bytes_s': ('limits', 'body_min_rate_bytes_s'),
    'body_grace_s': ('limits', 'body_grace_s'),
    'max_uploads_per_client': ('limits', 'max_uploads_per_client'),
    'max_batches_per_client': ('limits', 'max_batches_per_client'),
    'batch_recordings_per_slot': ('limits', 'batch_recordings_per_slot'),
    'max_event_streams_per_job': ('limits', 'max_event_streams_per_job'),
    'max_event_streams_per_client': ('limits', 'max_event_streams_per_client'),
    'max_exports': ('limits', 'max_exports'),
    'max_exports_per_client': ('limits', 'max_exports_per_client'),
    'auth_failures_per_client': ('limits', 'auth_failures_per_client'),
    'auth_failure_window_s': ('limits', 'auth_failure_window_s'),
    'max_connections_per_client': ('limits', 'max_connections_per_client'),
    'max_connections': ('limits', 'max_connections'),
    'segment_backlog_jobs': ('limits', 'segment_backlog_jobs'),
    'segment_backlog_hours': ('limits', 'segment_backlog_hours'),
    'min_free_memory_ratio': ('limits', 'min_free_memory_ratio'),
    'retention_hours': ('limits', 'retention_hours'),
    'keep_max_days': ('limits', 'keep_max_days'),
    'delete_audio_when_done': ('limits', 'delete_audio_when_done'),
    'queue_timeout_s': ('limits', 'queue_timeout_s'),
    'model': ('engine', 'model'),
    'demo': ('engine', 'demo'),
    'device': ('engine', 'device'),
    'dtype': ('engine', 'dtype'),
    'fp32_residual': ('engine', 'fp32_residual'),
    'fp8_gemm': ('engine', 'fp8_gemm'),
    'cpu_threads': ('engine', 'cpu_threads'),
    'max_batch': ('engine', 'max_batch'),
    'max_wait_ms': ('engine', 'max_wait_ms'),
    'max_batch_seconds': ('engine', 'max_batch_seconds'),
    'fused_encoder': ('engine', 'fused_encoder'),
    'cuda_graphs': ('engine', 'cuda_graphs'),
    'background_compile': ('engine', 'background_compile'),
    'graph_batch_sizes': ('engine', 'graph_batch_sizes'),
    'graph_max_seconds': ('engine', 'graph_max_seconds'),
    'segment_threshold_s': ('engine', 'segment_threshold_s'),
    'max_segment_s': ('engine', 'max_segment_s'),
    'hub_timeout_s': ('engine', 'hub_timeout_s'),
    'speaker_model': ('engine', 'speaker_model'),
    'broker': ('broker', 'url'),
    'shared_dir': ('broker', 'shared_dir'),
    'visibility_timeout_s': ('broker', 'visibility_timeout_s'),
    'live_lost_after_s': ('broker', 'live_lost_after_s'),
    'max_live_streams': ('live', 'max_streams'),
    'max_live_streams_per_client': ('live', 'max_streams_per_client'),
    'live_partial_interval_s': ('live', 'partial_interval_s'),
    'live_pause_s': ('live', 'pause_s'),
    'live_max_utterance_s': ('live', 'max_utterance_s'),
    'live_idle_timeout_s': ('live', 'idle_timeout_s'),
    'live_max_stream_s': ('live', 'max_stream_s'),
    'live_max_frame_bytes': ('live', 'max_frame_bytes'),
    'live_burst_s': ('live', 'burst_s'),
    'live_max_buffered_s': ('live', 'max_buffered_s'),
    'live_latency_budget_s': ('live', 'latency_budget_s'),
    'live_target_busy': ('live', 'target_busy'),
    'live_capacity_share': ('live', 'capacity_share'),
    'live_gather_ms': ('live', 'gather_ms'),
    'live_max_stream_wall_s': ('live', 'max_stream_wall_s'),
    'live_quiet_window_s': ('live', 'quiet_window_s'),
    'live_quiet_share': ('live', 'quiet_share'),
    'live_client_prefix_v4': ('live', 'client_prefix_v4'),
    'live_client_prefix_v6': ('live', 'client_prefix_v6'),
    'ui': ('ui', 'enabled'),
    'ui_auth': ('ui', 'auth'),
    'kiosk': ('ui', 'kiosk'),
    'kiosk_clear_s': ('ui', 'kiosk_clear_s'),
}


def _is_group(key: str, value: Any) -> bool:
    """A whole group (``broker={...}``), not the flat knob of the same name (``broker="redis://..."``:
    "broker" and "ui" are both a group and a flat knob)."""
    return key in Settings.model_fields and isinstance(value, (dict, BaseModel))


def _grouped(data: dict[str, Any]) -> dict[str, Any]:
    """Flat names into their groups, each setting ONE field of its group: ``broker="redis://..."``
    sets ``broker.url`` and keeps the group's other fields. A flat name wins over the same field in
    a whole group given beside it. An unknown name is refused (a typo is not ignored)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if _is_group(key, value):
            out[key] = value.model_dump() if isinstance(value, BaseModel) else dict(value)
    for key, value in data.items():
        if _is_group(key, value):
            continue
        if key not in GROUP_OF:
            raise ValueError(f"unknown setting {key!r}")
        group, name = GROUP_OF[key]
        out.setdefault(group, {})[name] = value
    return out


SECRET_QUERY_KEYS = ("pass", "token", "secret", "auth", "key")  # URL query values never shown


def shown(value: Any) -> str:
    """A setting's value as it may be logged: a secret as '***'; in a URL the credentials
    (``redis://user:***@host``, ``redis://***@host``) and query values that look secret."""
    if isinstance(value, SecretStr):
        return "***" if value.get_secret_value() else ""
    text = str(value)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, host = netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else f"***@{host}"
    path, question, query = tail.partition("?")
    if question:
        pairs = []
        for pair in query.split("&"):
            key, eq, _ = pair.partition("=")
            secret = eq and any(word in key.lower() for word in SECRET_QUERY_KEYS)
            pairs.append(f"{key}=***" if secret else pair)
        tail = f"{path}?{'&'.join(pairs)}"
    return f"{scheme}://{netloc}{tail}"


class _GroupedKeywords(PydanticBaseSettingsSource):
    """The keywords of ``Settings(...)``, placed in their groups before they are merged with the
    environment: ``Settings(broker="redis://...")`` beside ``SENSEVOICE_SHARED_DIR`` sets the url
    and keeps the shared directory (merged as a plain value, the keyword replaced the whole group
    the environment had filled)."""

    def __init__(self, settings_cls, keywords: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self.keywords = keywords

    def get_field_value(self, field, field_name):  # (the whole work is in __call__)
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:  # (a typo is refused here, its message without the
        return _grouped(self.keywords())  # values: pydantic's would show them all)


class _FlatEnvironment(PydanticBaseSettingsSource):
    """``SENSEVOICE_<FLAT_NAME>`` variables, placed in their groups."""

    def get_field_value(self, field, field_name):  # (the whole work is in __call__)
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        out: dict[str, dict[str, str]] = {}
        for flat, (group, name) in GROUP_OF.items():
            value = os.environ.get(ENV_PREFIX + flat.upper())
            if value is not None:
                out.setdefault(group, {})[name] = value
        return out


class Settings(BaseSettings):
    """The service's settings, grouped. ``Settings(max_batch=4)`` and ``SENSEVOICE_MAX_BATCH=4``
    both set ``settings.engine.max_batch``; keywords win over the environment."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    server: ServerSettings = Field(default_factory=ServerSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    broker: BrokerSettings = Field(default_factory=BrokerSettings)
    live: LiveSettings = Field(default_factory=LiveSettings)
    ui: UiSettings = Field(default_factory=UiSettings)

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        return (_GroupedKeywords(settings_cls, init_settings), _FlatEnvironment(settings_cls))

    def updated(self, **flat: Any) -> "Settings":
        """A copy with some knobs changed, named by their flat names (``updated(port=0)``); each
        changes one field (``updated(broker="redis://...")`` keeps the broker's other fields)."""
        data = self.model_dump()
        for key, value in _grouped(flat).items():
            data[key] = {**data[key], **value} if _is_group(key, value) else value
        return type(self).model_validate(data)

    def changed(self) -> dict[str, str]:
        """The settings in effect that differ from the defaults, by flat name, as the start-up log
        shows them: secrets as '***', a password in a URL (``redis://:PASSWORD@host``) too."""
        flat_of = {place: flat for flat, place in GROUP_OF.items()}
        out: dict[str, str] = {}
        for group in type(self).model_fields:
            current = getattr(self, group)
            default = type(current)()
            for name in type(current).model_fields:
                value = getattr(current, name)
                if value != getattr(default, name):
                    out[flat_of.get((group, name), f"{group}.{name}")] = shown(value)
        return out

    @model_validator(mode="before")
    @classmethod
    def _group_flat_names(cls, data: Any) -> Any:
        """Flat names (keywords, the environment) into their groups; a flat keyword wins over the
        same knob from the environment. An unknown name is refused (a typo is not ignored)."""
        if not isinstance(data, dict):
            return data
        return _grouped(data)
