"""Every engine in the project, the tests and the benchmarks is a full ``Engine``: the worker calls
its members with no defaults, so a double that lacks one (or takes other arguments) fails here,
not as an AttributeError in a worker thread."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
import torch

from pipeline.model.protocol import Engine, EngineOutput, Finished, PendingOutputs

ROOT = Path(__file__).resolve().parents[1]
ATTRIBUTES = ("device",)
SKIP = {"pipeline.model.protocol", "tests.test_engine_protocol"}  # the declaration, and this suite's refused doubles


def _members() -> dict[str, object]:
    """The protocol's members as it declares them (methods and properties)."""
    return {name: value for name, value in vars(Engine).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def _is_engine_def(node: ast.ClassDef) -> bool:
    """A class that computes batches of waves: it defines transcribe_async, or transcribe(self,
    waves, ...), or subclasses an engine double."""
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "transcribe_async":
            return True
        if isinstance(item, ast.FunctionDef) and item.name == "transcribe":
            args = [a.arg for a in item.args.args]
            if args[1:2] == ["waves"]:
                return True
    return any(isinstance(b, ast.Name) and (b.id.endswith("Engine") or b.id == "EngineDouble")
               for b in node.bases)


def engine_classes() -> tuple[list[tuple[str, str]], list[str]]:
    """(module, class) of every engine class defined at module level under pipeline/, tests/ and
    bench/; and those defined inside a function (which no test can reach: they are reported)."""
    found, nested = [], []
    for folder in ("pipeline", "tests", "bench"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text())
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if module in SKIP:
                continue
            top = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and _is_engine_def(node):
                    if id(node) in top:
                        found.append((module, node.name))
                    else:
                        nested.append(f"{module}:{node.name}")
    return found, nested


FOUND, NESTED = engine_classes()


def test_the_engines_are_found():
    names = {f"{m}:{c}" for m, c in FOUND}
    assert {"pipeline.model.engine:SenseVoiceEngine", "tests.engines:EngineDouble",
            "tests.test_reliability:FakeEngine", "tests.test_broker_redis:FakeEngine",
            "tests.test_engine:HotEngine", "bench.broker_worker:NoOpEngine"} <= names


def test_no_engine_double_hides_inside_a_function():
    assert NESTED == [], "define engine doubles at module level, where this suite checks them"


def _signature(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def check_members(cls: type) -> None:
    """Each member of Engine given by ``cls`` itself, as a property where the protocol has one and
    with the protocol's parameters where it is a method; ``device`` set on the class or in its code."""
    name = cls.__name__
    members = _members()
    assert set(members) == {"transcribe", "transcribe_async", "has_idle_work", "idle_step",
                            "has_hot_work", "capture_hot", "warm", "close"}
    for member, declared in members.items():
        given = inspect.getattr_static(cls, member, None)
        assert given is not None, f"{name} lacks {member}"
        if isinstance(declared, property):
            assert isinstance(given, property), f"{name}.{member} is not a property"
        else:
            assert callable(given), f"{name}.{member} is not a method"
            assert _signature(given) == _signature(declared), f"{name}.{member}'s parameters differ"
    for member in ATTRIBUTES:
        assert member in Engine.__annotations__
        assert hasattr(cls, member) or any(f"self.{member}" in inspect.getsource(k) for k in cls.__mro__
                                           if k.__module__ != "builtins"), f"{name} sets no {member}"


@pytest.mark.parametrize("module,name", FOUND, ids=[f"{m}:{c}" for m, c in FOUND])
def test_every_engine_implements_the_protocol(module, name, tiny_dir):
    cls = getattr(importlib.import_module(module), name)
    check_members(cls)
    if cls.__name__ == "SenseVoiceEngine":  # the fast loader: no funasr import
        engine = cls.from_model_dir_fast(tiny_dir, "cpu", "float32", compile=False)
    else:
        engine = cls()
    assert isinstance(engine, Engine), f"{name} lacks a member of Engine"
    assert isinstance(engine.device, torch.device)
    assert isinstance(engine.has_idle_work, bool) and isinstance(engine.has_hot_work, bool)
    assert isinstance(engine.warm, bool)


class _Lacking:
    """A double without capture_hot: what the suite must refuse."""

    device = None

    def transcribe(self, waves, options):
        return []

    def transcribe_async(self, waves, options):
        return Finished([])

    has_idle_work = property(lambda self: False)
    has_hot_work = property(lambda self: False)
    warm = property(lambda self: True)

    def idle_step(self):
        return False

    def close(self):
        return None


class _OtherArguments(_Lacking):
    def capture_hot(self, shape):
        return None


class _Method(_OtherArguments):
    def capture_hot(self):
        return None

    def warm(self):  # a method where the protocol has a property
        return True


def test_the_check_refuses_a_double_that_lacks_a_member_or_takes_other_arguments():
    assert not isinstance(_Lacking(), Engine)
    with pytest.raises(AssertionError, match="lacks capture_hot"):
        check_members(_Lacking)
    assert isinstance(_OtherArguments(), Engine)  # runtime_checkable reads names only:
    with pytest.raises(AssertionError, match="parameters differ"):  # the signatures are compared
        check_members(_OtherArguments)
    with pytest.raises(AssertionError, match="warm is not a property"):
        check_members(_Method)


def test_the_doubles_answer_as_an_idle_warm_cpu_engine():
    from tests.test_reliability import FakeEngine

    engine = FakeEngine()
    assert isinstance(engine, Engine)
    pending = engine.transcribe_async([torch.zeros(1600)], [None])
    assert isinstance(pending, PendingOutputs)
    out = pending.result()
    assert len(out) == 1 and isinstance(out[0], EngineOutput) and "n=1600" in out[0].raw_text
    assert (engine.has_idle_work, engine.idle_step(), engine.has_hot_work, engine.warm) == (False, False, False, True)
    assert engine.capture_hot() is None and engine.device.type == "cpu"
    assert engine.close() is None
