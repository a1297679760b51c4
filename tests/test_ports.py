"""The ports stay narrow (issue 37): no port of pipeline/serving/ports.py declares more than twelve
members, and every consumer uses at least 60 % of each port it takes. A consumer is a class or a
function of pipeline/ that names a port in the annotation of a parameter or an attribute; what it
uses is read from the source (attribute reads on that parameter or attribute, ``len()`` for
``__len__``), together with what the parts it hands the port on to use of it. Only the composition
root holds ``Broker``, every port at once."""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.serving import ports

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
MAX_MEMBERS = 12
MIN_SHARE = 0.6
ADAPTER_UNION = "Broker"  # every port at once: what an adapter implements, not what a part takes
COMPOSITION_ROOT = {"pipeline/serving/runtime.py", "pipeline/serving/broker.py"}


def port_types() -> dict[str, type]:
    """The Protocols ports.py declares (the small ports, the ones composed per consumer, and the
    handles they hand out)."""
    return {name: obj for name, obj in vars(ports).items()
            if isinstance(obj, type) and getattr(obj, "_is_protocol", False) and obj.__module__ == ports.__name__}


def _names_in(annotation: ast.expr | None) -> set[str]:
    """The names an annotation mentions (``X | None``, ``list[X]``, ``"X"``)."""
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return set()
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} | \
        {n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)}


@dataclass
class Slot:
    """One port a consumer holds: as a parameter (``name``) and/or an attribute of ``self``."""

    where: str  # "module.py: Consumer.param"
    port: str
    param: str | None = None
    attr: str | None = None
    used: set[str] = field(default_factory=set)
    handed: list[tuple[str, int | str]] = field(default_factory=list)  # (callee, position or keyword)


def _is_slot(node: ast.AST, slot: Slot, in_init_or_fn: bool) -> bool:
    if slot.param and in_init_or_fn and isinstance(node, ast.Name) and node.id == slot.param:
        return True
    return bool(slot.attr) and isinstance(node, ast.Attribute) and node.attr == slot.attr and \
        isinstance(node.value, ast.Name) and node.value.id == "self"


def _read(body: list[ast.AST], slot: Slot, own_scope: bool) -> None:
    """Collect the members read on ``slot`` in ``body`` and the calls it is handed to."""
    for tree in body:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_slot(node.value, slot, own_scope):
                slot.used.add(node.attr)
            elif isinstance(node, ast.Call):
                callee, args = ast.unparse(node.func), node.args
                if callee in ("functools.partial", "partial") and args:  # partial(f, port, ...): f's
                    callee, args = ast.unparse(args[0]), args[1:]
                for i, arg in enumerate(args):
                    if _is_slot(arg, slot, own_scope):
                        if callee == "len":
                            slot.used.add("__len__")
                        else:
                            slot.handed.append((callee, i))
                for kw in node.keywords:
                    if kw.arg and _is_slot(kw.value, slot, own_scope):
                        slot.handed.append((callee, kw.arg))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs]


def consumers(names: set[str]) -> tuple[list[Slot], dict[str, list[str]], dict[tuple[str, str], Slot]]:
    return _consumers(frozenset(names))


@functools.cache  # (the tests read the same source: parsed once)
def _consumers(names: frozenset[str]) -> tuple[list[Slot], dict[str, list[str]], dict[tuple[str, str], Slot]]:
    """Every slot that names a port; the parameter names of each class's constructor and each
    function (to follow a port handed on); slots by (callee name, parameter)."""
    slots: list[Slot] = []
    signatures: dict[str, list[str]] = {}
    by_param: dict[tuple[str, str], Slot] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel == "pipeline/serving/ports.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                _class_slots(rel, node, names, slots, signatures, by_param)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not _is_method(tree, node):
                signatures[node.name] = [a.arg for a in _params(node)]
                for a in _params(node):
                    for port in _names_in(a.annotation) & names:
                        slot = Slot(f"{rel}: {node.name}({a.arg})", port, param=a.arg)
                        _read(node.body, slot, True)
                        slots.append(slot)
                        by_param[(node.name, a.arg)] = slot
    return slots, signatures, by_param


def _is_method(tree: ast.AST, fn: ast.AST) -> bool:
    return any(isinstance(c, ast.ClassDef) and fn in c.body for c in ast.walk(tree))


def _class_slots(rel, cls: ast.ClassDef, names, slots, signatures, by_param) -> None:
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    init = next((m for m in methods if m.name == "__init__"), None)
    found: dict[str, Slot] = {}  # attribute or parameter -> slot
    for stmt in cls.body:  # dataclass fields
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            for port in _names_in(stmt.annotation) & names:
                found[stmt.target.id] = Slot(f"{rel}: {cls.name}.{stmt.target.id}", port, param=None,
                                             attr=stmt.target.id)
    fields = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    signatures[cls.name] = [a.arg for a in _params(init)][1:] if init else fields
    for m in methods:  # self.x: Port = ...
        for node in ast.walk(m):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute):
                for port in _names_in(node.annotation) & names:
                    found[node.target.attr] = Slot(f"{rel}: {cls.name}.{node.target.attr}", port,
                                                   attr=node.target.attr)
    if init is not None:
        for a in _params(init):
            for port in _names_in(a.annotation) & names:
                attr = next((t.attr for n in ast.walk(init) if isinstance(n, ast.Assign)
                             and isinstance(n.value, ast.Name) and n.value.id == a.arg
                             for t in n.targets if isinstance(t, ast.Attribute)), None)
                slot = Slot(f"{rel}: {cls.name}({a.arg})", port, param=a.arg, attr=attr)
                if attr:  # the attribute it is kept in is this slot, not one of its own
                    found.pop(attr, None)
                found[f"param:{a.arg}"] = slot
                by_param[(cls.name, a.arg)] = slot
    for key, slot in found.items():
        if slot.param and not key.startswith("param:"):
            continue
        for m in methods:
            _read(m.body, slot, m is init)
        slots.append(slot)
        if slot.attr and not slot.param:
            by_param[(cls.name, slot.attr)] = slot
    for m in methods:  # a method taking a port as a parameter of its own
        if m is init:
            continue
        for a in _params(m):
            for port in _names_in(a.annotation) & names:
                slot = Slot(f"{rel}: {cls.name}.{m.name}({a.arg})", port, param=a.arg)
                _read(m.body, slot, True)
                slots.append(slot)
                by_param[(m.name, a.arg)] = slot


def used_members(slot: Slot, signatures, by_param, seen=None) -> set[str]:
    """What ``slot`` uses itself and what the parts it hands the port to use of it."""
    seen = seen or set()
    if id(slot) in seen:
        return set()
    seen.add(id(slot))
    out = set(slot.used)
    for callee, where in slot.handed:
        name = callee.rsplit(".", 1)[-1]
        params = signatures.get(name)
        param = where if isinstance(where, str) else (params[where] if params and where < len(params) else None)
        target = by_param.get((name, param)) if param else None
        if target is None:
            raise AssertionError(f"{slot.where} hands its {slot.port} to {callee}, which names no port there")
        out |= used_members(target, signatures, by_param, seen)
    return out


@functools.cache
def shares() -> dict[str, tuple[str, int, int, set[str]]]:
    """slot -> (port, members used, members of the port, members read that the port lacks)."""
    types = port_types()
    slots, signatures, by_param = consumers(set(types))
    out = {}
    for slot in slots:
        if slot.port == ADAPTER_UNION:
            continue
        declared = ports.members(types[slot.port])
        used = used_members(slot, signatures, by_param)
        out[slot.where] = (slot.port, len(used & declared), len(declared), used - declared)
    return out


def test_no_port_declares_more_than_twelve_members():
    wide = {name: len(ports.members(t)) for name, t in port_types().items()
            if name != ADAPTER_UNION and len(ports.members(t)) > MAX_MEMBERS}
    assert wide == {}


def test_every_consumer_uses_most_of_each_port_it_takes():
    found = shares()
    assert len(found) >= 10  # Worker, WorkerPool, Intake, LongAudio, JobView, Health, the routes ...
    narrow = {where: f"{port}: {n}/{total}" for where, (port, n, total, _) in found.items()
              if n / total < MIN_SHARE}
    assert narrow == {}


def test_no_consumer_reads_a_member_its_port_lacks():
    lacking = {where: sorted(extra) for where, (_, _, _, extra) in shares().items() if extra}
    assert lacking == {}


def test_the_composition_root_hands_each_part_a_port_of_its_own():
    """Every part the root hands the whole Broker takes it as a port (an annotated parameter that
    this test measures), not as a Broker or an untyped parameter."""
    types = port_types()
    slots, signatures, by_param = consumers(set(types))
    unmeasured = []
    for slot in slots:
        if slot.port != ADAPTER_UNION:
            continue
        for callee, where in slot.handed:
            if callee == "type":  # type(broker).__name__, in the start-up line
                continue
            name = callee.rsplit(".", 1)[-1]
            params = signatures.get(name, [])
            param = where if isinstance(where, str) else (params[where] if where < len(params) else None)
            target = by_param.get((name, param))
            if target is None:
                unmeasured.append(f"{slot.where} -> {callee}[{where}]")
    assert unmeasured == []


def test_only_the_composition_root_holds_every_port():
    slots, _, _ = consumers(set(port_types()))
    holders = {s.where for s in slots if s.port == ADAPTER_UNION and s.where.split(":")[0] not in COMPOSITION_ROOT}
    assert holders == set()


def test_the_reader_follows_a_port_handed_on_and_sees_a_narrow_use():
    """The test itself: a consumer that hands its port to a part counts the part's reads, and one
    that reads one member of four is seen."""
    src = ("class Part:\n    def __init__(self, q: Q):\n        self.q = q\n"
           "    def go(self):\n        return self.q.a(), len(self.q)\n"
           "class Holder:\n    def __init__(self, q: Q):\n        self.part = Part(q)\n        q.b\n")
    tree = ast.parse(src)
    slots, signatures, by_param = [], {}, {}
    for node in tree.body:
        _class_slots("x.py", node, {"Q"}, slots, signatures, by_param)
    holder = next(s for s in slots if s.where.startswith("x.py: Holder"))
    assert used_members(holder, signatures, by_param) == {"a", "b", "__len__"}
    part = next(s for s in slots if s.where.startswith("x.py: Part"))
    assert len(used_members(part, signatures, by_param)) / 4 < MIN_SHARE


def figures() -> dict[str, object]:
    """The figures docs/ARCHITECTURE.md quotes: the widest port, the smallest share."""
    types = port_types()
    widest = max((len(ports.members(t)), n) for n, t in types.items() if n != ADAPTER_UNION)
    smallest = min((n / total, where, port) for where, (port, n, total, _) in shares().items())
    return {"widest": widest, "smallest_share": smallest, "consumers": len(shares())}


if __name__ == "__main__":
    for where, (port, n, total, extra) in sorted(shares().items(), key=lambda kv: kv[1][1] / kv[1][2]):
        print(f"{n / total:5.0%} {n:2d}/{total:<2d} {port:14s} {where} {sorted(extra) if extra else ''}")
    print(figures())
