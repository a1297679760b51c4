"""A flat keyword or flag sets ONE field of its group, never the whole group (issue 36 item 5):
``--broker redis://...`` beside ``SENSEVOICE_SHARED_DIR`` replaced the broker group and dropped the
shared directory, the visibility time-out and the live-lane timing without a word (the README's
own distributed example put every upload inside Redis). The start-up log line that lists the
settings in effect (secrets as '***'), and an api process started with ``--demo`` that reports it
(item 9: it said ``demo: false``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import typing
from pathlib import Path

import annotated_types
import httpx
import pytest
from pydantic import SecretStr

from pipeline.config import GROUP_OF, Settings, shown
from tests.conftest import ROOT, free_port
from tests.redis_server import redis_server, redis_url  # noqa: F401 (fixtures)

# every flat name that is also the name of a group ("broker", "ui", and any added later)
FLAT_GROUP_NAMES = [flat for flat in GROUP_OF if flat in Settings.model_fields]
VALID = {  # fields whose validators want a particular shape of value
    ("server", "trusted_proxies"): "10.0.0.0/24",
    ("broker", "url"): "redis://127.0.0.1:1/0",
}


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    """Only the variables a test sets (conftest sets a few for the whole suite)."""
    for name in list(os.environ):
        if name.startswith("SENSEVOICE_"):
            monkeypatch.delenv(name)


def _field(group: str, name: str):
    return Settings.model_fields[group].annotation.model_fields[name]


def _fits(info, value) -> bool:
    for c in info.metadata:
        if (isinstance(c, annotated_types.Ge) and not value >= c.ge
                or isinstance(c, annotated_types.Gt) and not value > c.gt
                or isinstance(c, annotated_types.Le) and not value <= c.le
                or isinstance(c, annotated_types.Lt) and not value < c.lt):
            return False
    return True


def other_value(group: str, name: str):
    """A valid value of the field that is not its default (typed as the field holds it)."""
    if (group, name) in VALID:
        return VALID[(group, name)]
    info = _field(group, name)
    default, kind = info.get_default(call_default_factory=True), info.annotation
    if typing.get_origin(kind) is typing.Literal:
        return next(choice for choice in typing.get_args(kind) if choice != default)
    if kind in (bool, bool | None):
        return not default
    if kind is SecretStr:
        return SecretStr(f"secret-{group}-{name}")
    if kind is Path:
        return Path(f"/tmp/sv-{group}-{name}")
    if kind is str:
        return f"x-{group}-{name}"
    for candidate in (default + 1, default / 2, default * 2, default - 1, 1):
        candidate = kind(candidate)
        if candidate != default and _fits(info, candidate):
            return candidate
    raise AssertionError(f"no other value for {group}.{name}")


def as_env(value) -> str:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def held(settings: Settings, group: str, name: str):
    value = getattr(getattr(settings, group), name)
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def plain(value):
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def set_group_from_env(monkeypatch, group: str, but: str) -> dict[str, object]:
    """SENSEVOICE_* for every field of ``group`` except ``but``: {field: value}."""
    values = {}
    for flat, (g, name) in GROUP_OF.items():
        if g == group and name != but:
            values[name] = other_value(g, name)
            monkeypatch.setenv("SENSEVOICE_" + flat.upper(), as_env(values[name]))
    return values


def test_the_flat_names_that_are_group_names_are_found():
    """(The list the tests below go over is computed; this guards that it is not empty.)"""
    assert {"broker", "ui"} <= set(FLAT_GROUP_NAMES)
    for flat in FLAT_GROUP_NAMES:  # each such group has other fields the environment can set
        group, name = GROUP_OF[flat]
        assert any(g == group and n != name for g, n in GROUP_OF.values()), flat


@pytest.mark.parametrize("flat", FLAT_GROUP_NAMES)
def test_a_flat_keyword_named_like_its_group_sets_one_field(flat, monkeypatch):
    group, name = GROUP_OF[flat]
    from_env = set_group_from_env(monkeypatch, group, but=name)
    assert from_env
    value = other_value(group, name)
    settings = Settings(**{flat: value})
    assert held(settings, group, name) == plain(value)
    for other, expected in from_env.items():
        assert held(settings, group, other) == plain(expected), f"{flat}= dropped {group}.{other}"
    # the same through updated(): a copy with the one field changed
    again = Settings().updated(**{flat: value})
    assert held(again, group, name) == plain(value)
    for other, expected in from_env.items():
        assert held(again, group, other) == plain(expected), f"updated({flat}=) dropped {group}.{other}"


@pytest.mark.parametrize("flat", FLAT_GROUP_NAMES)
def test_a_flat_keyword_beside_other_keywords_of_its_group(flat):
    """Keywords only (no environment): the flat one and its group's other flat ones together."""
    group, name = GROUP_OF[flat]
    given = {f: other_value(g, n) for f, (g, n) in GROUP_OF.items() if g == group}
    settings = Settings(**given)
    for f, value in given.items():
        assert held(settings, *GROUP_OF[f]) == plain(value), f


def test_an_unknown_keyword_is_still_refused_without_echoing_secrets(monkeypatch):
    """(pydantic's message for it showed every value the environment gave, the UI login too.)"""
    monkeypatch.setenv("SENSEVOICE_UI_AUTH", "admin:pw-c4ca4238a0b9")
    monkeypatch.setenv("SENSEVOICE_API_TOKEN", "tok-c81e728d9d4c")
    for attempt in (lambda: Settings(brokr="redis://h/0"), lambda: Settings().updated(brokr="redis://h/0")):
        with pytest.raises(ValueError, match="unknown setting 'brokr'") as refused:
            attempt()
        assert "pw-c4ca4238a0b9" not in str(refused.value) and "tok-c81e728d9d4c" not in str(refused.value)


def _run_main(monkeypatch, argv: list[str], through_entry: bool) -> tuple[int, Settings]:
    """The real command line (app_sensevoice.main, or `sensevoice serve`), up to the runtime: the
    settings it built are caught there and the start stops (as a missing model stops it). One web
    process serves before it builds its runtime (pipeline/web/early.py): its settings are caught
    where that server would start, with the status a missing model gives."""
    import app_sensevoice
    import pipeline.entry
    import pipeline.serving.runtime
    from pipeline.domain.errors import ModelUnavailable

    caught: list[Settings] = []

    def build_runtime(settings, *args, **kwargs):
        caught.append(settings)
        raise ModelUnavailable("stopped by the test")

    def serve_at_once(settings, options):
        caught.append(settings)
        return 2

    monkeypatch.setattr(pipeline.serving.runtime, "build_runtime", build_runtime)
    monkeypatch.setattr(app_sensevoice, "serve_at_once", serve_at_once)
    code = pipeline.entry.main(["serve", *argv]) if through_entry else app_sensevoice.main(argv)
    assert len(caught) == 1
    return code, caught[0]


@pytest.mark.parametrize("through_entry", [False, True], ids=["app_sensevoice", "sensevoice serve"])
def test_command_line_flags_keep_every_other_setting_from_the_environment(through_entry, monkeypatch):
    """Every knob set by its SENSEVOICE_* variable, then --broker and --api-only (the two flags
    whose flat name is a group's name): each flag sets its own field, all others keep the
    environment's value."""
    env = {}
    for flat, (group, name) in GROUP_OF.items():
        env[(group, name)] = other_value(group, name)
        monkeypatch.setenv("SENSEVOICE_" + flat.upper(), as_env(env[(group, name)]))
    monkeypatch.setenv("SENSEVOICE_ROLE", "api")  # (a worker role would look for GPUs)
    env[("server", "role")] = "api"
    monkeypatch.setenv("SENSEVOICE_UI", "true")
    env[("ui", "enabled")] = True
    code, settings = _run_main(monkeypatch, ["--broker", "redis://127.0.0.1:2/3", "--api-only"],
                               through_entry)
    assert code == 2
    by_flags = {("broker", "url"): "redis://127.0.0.1:2/3", ("ui", "enabled"): False,
                ("server", "exit_on_fatal"): True}  # (main sets exit_on_fatal itself)
    for (group, name), value in env.items():
        expected = by_flags.get((group, name), plain(value))
        assert held(settings, group, name) == expected, f"{group}.{name}"


def test_the_readme_distributed_example_keeps_the_shared_directory(monkeypatch, tmp_path, caplog):
    """README: SENSEVOICE_SHARED_DIR on every process, the broker on the command line."""
    monkeypatch.setenv("SENSEVOICE_SHARED_DIR", "/dev/shm/sensevoice")
    monkeypatch.setenv("SENSEVOICE_VISIBILITY_TIMEOUT_S", "7")
    monkeypatch.setenv("SENSEVOICE_LIVE_LOST_AFTER_S", "2.5")
    caplog.set_level(logging.INFO, logger="sensevoice.app")
    code, settings = _run_main(monkeypatch, ["--role", "api", "--broker", "redis://127.0.0.1:6379/0",
                                             "--data-dir", str(tmp_path)], through_entry=False)
    assert code == 2
    assert settings.broker.model_dump() == {
        "url": "redis://127.0.0.1:6379/0", "shared_dir": "/dev/shm/sensevoice",
        "visibility_timeout_s": 7.0, "live_lost_after_s": 2.5}
    line = next(r.getMessage() for r in caplog.records if r.name == "sensevoice.app"
                and r.getMessage().startswith("settings"))
    assert "shared_dir=/dev/shm/sensevoice" in line and "visibility_timeout_s=7.0" in line


def test_the_start_up_line_names_what_differs_and_hides_every_secret(monkeypatch, caplog):
    token, login, password = "tok-5d41402abc4b2a76", "admin:pw-7d793037a076", "redispw-9e107d9d"
    monkeypatch.setenv("SENSEVOICE_API_TOKEN", token)
    monkeypatch.setenv("SENSEVOICE_UI_AUTH", login)
    monkeypatch.setenv("SENSEVOICE_MAX_BATCH", "8")
    caplog.set_level(logging.DEBUG)  # every logger's records, to find a secret anywhere
    # the app's own level too: the batch CLI's main, run in-process by an earlier test of the suite,
    # set the "sensevoice" loggers to WARNING (its process's choice), which "sensevoice.app" inherits
    caplog.set_level(logging.DEBUG, logger="sensevoice.app")
    code, settings = _run_main(monkeypatch, ["--role", "api", "--demo",
                                             "--broker", f"redis://user:{password}@10.0.0.9:6379/0"],
                               through_entry=False)
    assert code == 2 and settings.server.token == token and settings.ui.login == login
    lines = [r.getMessage() for r in caplog.records
             if r.name == "sensevoice.app" and r.getMessage().startswith("settings")]
    assert len(lines) == 1
    line = lines[0]
    for part in ("api_token=***", "ui_auth=***", "broker=redis://user:***@10.0.0.9:6379/0",
                 "max_batch=8", "role=api", "demo=True", "exit_on_fatal=True"):
        assert part in line, (part, line)
    assert "port=" not in line and "queue_size=" not in line  # defaults are not listed
    for secret in (token, login, "pw-7d793037a076", password):
        assert secret not in caplog.text


def test_nothing_changed_says_so(caplog):
    import app_sensevoice

    caplog.set_level(logging.INFO, logger="sensevoice.app")
    app_sensevoice.log_settings(Settings())
    assert "settings (not the defaults): none" in caplog.text


@pytest.mark.parametrize("url, safe", [
    ("redis://h:6379/0", "redis://h:6379/0"),
    ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
    ("rediss://user:p@ss@h/0", "rediss://user:***@h/0"),
    ("redis://pw@h", "redis://***@h"),
    ("redis://h/0?password=pw&db=1", "redis://h/0?password=***&db=1"),
    ("unix:///run/redis.sock?password=pw", "unix:///run/redis.sock?password=***"),
])
def test_urls_are_shown_without_their_credentials(url, safe):
    assert shown(url) == safe
    assert shown(SecretStr("x")) == "***"


def test_an_api_process_reports_the_demo_setting_unit(redis_url, tmp_path):  # noqa: F811
    """Item 9, in process: an api runtime (no model) reports the demo setting it was given."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from pipeline.serving.runtime import build_runtime
    from pipeline.web.routes.health import build_health_router

    for demo in (True, False):
        settings = Settings(role="api", broker=redis_url, demo=demo, data_dir=tmp_path, decode_processes=0)
        runtime = build_runtime(settings)
        try:
            assert runtime.pool is None and runtime.is_demo is demo
            app = FastAPI()
            app.include_router(build_health_router(runtime))
            body = TestClient(app).get("/readyz").json()
            assert body["demo"] is demo
            assert ("demo" in body["model"]) is demo
        finally:
            runtime.broker.close()


def test_an_api_process_started_with_demo_says_demo(redis_url, tmp_path):  # noqa: F811
    """Item 9 end to end: `app_sensevoice.py --role api --broker redis://... --demo` answers
    /readyz with "demo": true (it said false), and its start-up line keeps the environment's
    shared directory beside --broker and hides the token."""
    port, token = free_port(), "tok-e2e-0cc175b9c0f1b6a8"
    log = tmp_path / "api.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SENSEVOICE_")}
    env.update(SENSEVOICE_SHARED_DIR=str(tmp_path / "shared"), SENSEVOICE_API_TOKEN=token,
               SENSEVOICE_DECODE_PROCESSES="0")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app_sensevoice.py"), "--role", "api",
                                 "--broker", redis_url, "--demo", "--api-only", "--port", str(port),
                                 "--data-dir", str(tmp_path / "data")],
                                cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        deadline, body = time.monotonic() + 120, None
        while body is None:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).json()
            except httpx.HTTPError:
                time.sleep(0.3)
        assert body["demo"] is True and "demo" in body["model"], body
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert f"shared_dir={tmp_path / 'shared'}" in text and "api_token=***" in text, text
    assert token not in text
