"""Fusion rules as data: the records a rules file is read into, and the checks that
turn a malformed rule into one line naming the file, the rule and the key.

The form is described at the top of fusion_rules.yaml (the built-in rules, written in
it) and in docs/extending.md. A rules file maps a rule name to `on` / `off` (switch a
rule) or to a definition (a new rule, on unless it says `default: off`; under a
built-in's name it replaces that rule in its place).
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import frozen

from npusim.errors import ConfigError
from npusim.hw.parse import did_you_mean, read_yaml, short

RULES_FILE = Path(__file__).with_name("fusion_rules.yaml")

_RULE_KEYS = ("default", "match", "same", "yield_to", "tensors", "into")
_MATCH_KEYS = ("node", "op", "where", "in", "out", "commutative", "optional", "repeat", "look_through")
_INTO_KEYS = ("node", "op", "params", "in", "out", "build", "parts")
_TEMPLATE_SPECS = ("", "tail")  # and "-suffix"


@frozen
class PatternNode:
    """One node of a rule's pattern: its op type, parameter values it must have, and the
    $tensors it reads and writes by port."""

    key: str
    op: str
    where: dict[str, Any]
    ins: dict[str, str]  # port -> $tensor
    outs: dict[str, str]
    commutative: tuple[str, ...] = ()
    optional: bool = False
    repeat: int = 0  # 0: one node; N: every node like it reading the same tensors, at least N
    look_through: tuple[str, ...] = ()


@frozen
class FusedNode:
    """One node a match becomes: a name template, its op type(s), and where its
    parameters and tensors come from."""

    name: str
    ops: tuple[str, ...]
    params: Any  # "$node", a mapping of values / "$node.param" / "$tensor.attr", or None
    ins: dict[str, str]
    outs: dict[str, str]
    build: str | None = None
    parts: tuple[str, ...] = ()


@frozen
class NewTensor:
    name: str  # template
    concat: tuple[str, ...]  # $tensors joined along their last dim


@frozen
class Rule:
    """A fusion rule: a pattern, its constraints and the nodes it becomes."""

    name: str
    on: bool
    match: tuple[PatternNode, ...]
    into: tuple[FusedNode, ...]
    same: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()  # (pattern nodes, params they agree on)
    yield_to: tuple[str, ...] = ()
    tensors: dict[str, NewTensor] = attrs.field(factory=dict)
    where: str = ""  # the file (or "fusion_rules") it was read from


class _Reader:
    """Reads one rule definition; every error names the file, the rule and the key."""

    def __init__(self, where: str, name: str):
        self.where, self.name = where, name
        from npusim.ops.registry import OPS  # every op module imported: which op types exist

        self.ops = OPS

    def fail(self, key: str, message: str):
        raise ConfigError(f"{self.where}: rule '{self.name}': {key}: {message}")

    def mapping(self, value, key: str, allowed: tuple[str, ...] | None = None) -> dict:
        if not isinstance(value, Mapping):
            self.fail(key, f"expected a mapping, got {short(value)}")
        for k in value:
            if allowed is not None and k not in allowed:
                self.fail(f"{key}.{k}" if key else str(k), f"unknown key{did_you_mean(k, allowed)} (keys: {', '.join(allowed)})")
        return dict(value)

    def names(self, value, key: str) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, f"expected a name or a list of names, got {short(value)}")
        return tuple(value)

    def op(self, value, key: str) -> str:
        if not isinstance(value, str):
            self.fail(key, f"expected an op type, got {short(value)}")
        if value not in self.ops:
            self.fail(key, f"unknown op type '{value}'{did_you_mean(value, self.ops)}")
        return value

    def tensor_var(self, value, key: str) -> str:
        if not isinstance(value, str) or not value.startswith("$") or len(value) < 2 or "." in value:
            self.fail(key, f"expected a $tensor name, got {short(value)}")
        return value

    def ports(self, value, key: str, op: str, side: str) -> dict[str, str]:
        from npusim.kvcache import CACHE_TENSORS

        spec = self.ops[op]
        allowed = (spec.operands.ins if side == "in" else spec.operands.outs)
        if spec.operands.kv == "read" and side == "in" or spec.operands.kv == "write":
            allowed = allowed + CACHE_TENSORS
        ports = self.mapping(value, key)
        for port in ports:
            if not spec.operands.allows(port.rstrip("*") + ("0" if port.endswith("*") else ""), allowed):
                self.fail(f"{key}.{port}", f"not an {side}put of {op} ({', '.join(allowed)})")
        return ports

    # ---- the pattern

    def pattern(self, items) -> tuple[PatternNode, ...]:
        if not isinstance(items, list) or not items:
            self.fail("match", f"expected a list of pattern nodes, got {short(items)}")
        nodes: list[PatternNode] = []
        bound: set[str] = set()
        for i, item in enumerate(items):
            data = self.mapping(item, f"match[{i}]", _MATCH_KEYS)
            key = data.get("node")
            if not isinstance(key, str) or not key.isidentifier():
                self.fail(f"match[{i}].node", f"expected a name for the node, got {short(key)}")
            at = f"match.{key}"
            if any(n.key == key for n in nodes):
                self.fail(f"{at}.node", "name used twice")
            op = self.op(data.get("op"), f"{at}.op")
            fields = {f.name for f in attrs.fields(self.ops[op].params)}
            where = self.mapping(data.get("where", {}), f"{at}.where")
            for param, v in where.items():
                if param not in fields:
                    self.fail(f"{at}.where.{param}", f"not a parameter of {op}{did_you_mean(param, fields)}")
                where[param] = tuple(v) if isinstance(v, list) else v
            ins = {p: self.tensor_var(v, f"{at}.in.{p}") for p, v in self.ports(data.get("in", {}), f"{at}.in", op,
                                                                                 "in").items()}
            outs = {p: self.tensor_var(v, f"{at}.out.{p}") for p, v in self.ports(data.get("out", {}), f"{at}.out",
                                                                                  op, "out").items()}
            commutative = self.names(data.get("commutative", []), f"{at}.commutative")
            if commutative and (len(commutative) != 2 or not set(commutative) <= set(ins)):
                self.fail(f"{at}.commutative", f"expected two of its inputs ({', '.join(ins)}), got {short(commutative)}")
            optional, repeat = data.get("optional", False), data.get("repeat", 0)
            if not isinstance(optional, bool):
                self.fail(f"{at}.optional", f"expected true or false, got {short(optional)}")
            if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 0:
                self.fail(f"{at}.repeat", f"expected a count (at least that many nodes), got {short(repeat)}")
            look = self.names(data.get("look_through", []), f"{at}.look_through")
            for j, o in enumerate(look):
                self.op(o, f"{at}.look_through[{j}]")
            linked = set(ins.values()) | set(outs.values())
            if nodes and not linked & bound:
                self.fail(at, "shares no $tensor with a node before it (the pattern must connect)")
            if optional and (not nodes or repeat or len(set(ins.values()) & bound) != 1):
                self.fail(f"{at}.optional", "an optional node reads exactly one $tensor of the nodes before it "
                          "(its output is that tensor when it is missing)")
            if repeat and nodes and not set(ins.values()) <= bound:
                self.fail(f"{at}.repeat", "a repeated node after the first reads only $tensors of the nodes before it")
            bound |= linked
            nodes.append(PatternNode(key, op, where, ins, outs, commutative, optional, repeat, look))
        return tuple(nodes)

    # ---- references: $tensor, $node.port, $node.param, $tensor.shape

    def ref(self, value, key: str, tensors: set[str], nodes: dict[str, PatternNode], what: str) -> str:
        if not isinstance(value, str) or not value.startswith("$"):
            self.fail(key, f"expected a $tensor or $node.{what}, got {short(value)}")
        head, _, attr = value[1:].partition(".")
        if not attr:
            if "$" + head not in tensors:
                self.fail(key, f"'{value}' names no tensor of the pattern{did_you_mean('$' + head, tensors)}")
            return value
        if head in nodes:
            op = nodes[head].op
            names = ({f.name for f in attrs.fields(self.ops[op].params)} if what == "param"
                     else set(nodes[head].ins) | set(nodes[head].outs))
            if attr not in names:
                self.fail(key, f"'{value}': {attr} is not a{'' if what == 'param' else ' bound'} {what} of "
                          f"{head} ({op}){did_you_mean(attr, names)}")
            return value
        if "$" + head in tensors and what == "param" and attr in ("shape", "dtype"):
            return value
        self.fail(key, f"'{value}' names no node of the pattern{did_you_mean(head, nodes)}")

    def template(self, value, key: str, nodes: dict[str, PatternNode]) -> str:
        if not isinstance(value, str):
            self.fail(key, f"expected a name template, got {short(value)}")
        try:
            fields = [(f, spec) for _, f, spec, _ in string.Formatter().parse(value) if f is not None]
        except ValueError as e:
            self.fail(key, f"bad template '{value}': {e}")
        for f, spec in fields:
            if f != "layer" and f not in nodes:
                self.fail(key, f"'{{{f}}}' names no node of the pattern (nor {{layer}}){did_you_mean(f, nodes)}")
            if spec not in _TEMPLATE_SPECS and not spec.startswith("-"):
                self.fail(key, f"'{{{f}:{spec}}}': expected {{{f}}}, {{{f}:tail}} or {{{f}:-suffix}}")
        return value

    # ---- the rule

    def rule(self, data, default: bool | None) -> Rule:
        data = self.mapping(data, "", _RULE_KEYS)
        on = data.get("default", default)
        if on is None:
            self.fail("default", "the shipped rules state their default: on or off")
        if not isinstance(on, bool):
            self.fail("default", f"expected on or off, got {short(on)}")
        match = self.pattern(data.get("match"))
        nodes = {p.key: p for p in match}
        tensors = {v for p in match for v in (*p.ins.values(), *p.outs.values())}
        if tensors & {"$" + k for k in nodes}:
            self.fail("match", f"'{sorted(tensors & {'$' + k for k in nodes})[0]}' names both a node and a tensor")
        same = []
        for i, entry in enumerate(data.get("same", []) if isinstance(data.get("same", []), list) else [None]):
            entry = self.mapping(entry, f"same[{i}]", ("nodes", "params"))
            keys = self.names(entry.get("nodes"), f"same[{i}].nodes")
            for k in keys:
                if k not in nodes:
                    self.fail(f"same[{i}].nodes", f"'{k}' is no node of the pattern{did_you_mean(k, nodes)}")
            params = self.names(entry.get("params"), f"same[{i}].params")
            for k in keys:
                fields = {f.name for f in attrs.fields(self.ops[nodes[k].op].params)}
                for p in params:
                    if p not in fields:
                        self.fail(f"same[{i}].params", f"'{p}' is not a parameter of {k} ({nodes[k].op})")
            same.append((keys, params))
        yield_to = self.names(data.get("yield_to", []), "yield_to")  # checked once every rule is read
        new = {}
        for var, spec in self.mapping(data.get("tensors", {}), "tensors").items():
            at = f"tensors.{var}"
            self.tensor_var(var, at)
            if var in tensors:
                self.fail(at, f"'{var}' is already a tensor of the pattern")
            spec = self.mapping(spec, at, ("name", "concat"))
            parts = tuple(self.ref(v, f"{at}.concat", tensors, nodes, "port")
                          for v in self.names(spec.get("concat"), f"{at}.concat"))
            new[var] = NewTensor(self.template(spec.get("name"), f"{at}.name", nodes), parts)
        tensors |= set(new)
        into = data.get("into")
        if not isinstance(into, list) or not into:
            self.fail("into", f"expected a list of fused nodes, got {short(into)}")
        return Rule(self.name, on, match, tuple(self.fused(item, f"into[{i}]", tensors, nodes)
                                                for i, item in enumerate(into)),
                    tuple(same), yield_to, new, self.where)

    def fused(self, item, at: str, tensors: set[str], nodes: dict[str, PatternNode]) -> FusedNode:
        from npusim.passes.fused_ops import BUILDERS

        data = self.mapping(item, at, _INTO_KEYS)
        ops = tuple(self.op(o, f"{at}.op") for o in self.names(data.get("op"), f"{at}.op"))
        build = data.get("build")
        if build is not None:
            if build not in BUILDERS:
                self.fail(f"{at}.build", f"no builder '{build}'{did_you_mean(build, BUILDERS)} "
                          f"(builders: {', '.join(BUILDERS)})")
            makes = BUILDERS[build].makes
            if not set(ops) <= set(makes):
                self.fail(f"{at}.op", f"builder '{build}' makes {', '.join(makes)}, not {', '.join(ops)}")
        elif len(ops) > 1:
            self.fail(f"{at}.op", "several op types need a builder to pick one (build: NAME)")
        parts = self.names(data.get("parts", []), f"{at}.parts")
        for k in parts:
            if k not in nodes:
                self.fail(f"{at}.parts", f"'{k}' is no node of the pattern{did_you_mean(k, nodes)}")
        params = data.get("params")
        if isinstance(params, str):
            if params[1:] not in nodes or not params.startswith("$"):
                self.fail(f"{at}.params", f"expected $node (copy its parameters) or a mapping, got {short(params)}")
        elif params is not None:
            params = self.mapping(params, f"{at}.params")
            fields = {f.name for f in attrs.fields(self.ops[ops[0]].params)}
            for p, v in params.items():
                if p not in fields:
                    self.fail(f"{at}.params.{p}", f"not a parameter of {ops[0]}{did_you_mean(p, fields)}")
                if isinstance(v, str) and v.startswith("$"):
                    self.ref(v, f"{at}.params.{p}", tensors, nodes, "param")
        sides = {}
        for side in ("in", "out"):
            ports = {}
            for op in ops:
                ports = self.ports(data.get(side, {}), f"{at}.{side}", op, side)
            sides[side] = {p: self.ref(v, f"{at}.{side}.{p}", tensors, nodes, "port") for p, v in ports.items()}
        return FusedNode(self.template(data.get("node"), f"{at}.node", nodes), ops, params, sides["in"],
                         sides["out"], build, parts)


def read_rules(data: Mapping, where: str, base: dict[str, Rule] | None = None) -> dict[str, Rule]:
    """The rules of a rules file's content `data` (a mapping) over `base` (the built-in
    rules; None: `data` is the shipped file, every rule stating its default)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of rule names, got {short(data)}")
    rules = dict(base or {})
    for name, value in data.items():
        if isinstance(value, Mapping):
            rules[name] = _Reader(where, name).rule(value, None if base is None else True)
        elif name not in rules:
            raise ConfigError(f"{where}: unknown fusion rule '{name}'{did_you_mean(name, rules)} "
                              f"(rules: {', '.join(rules)}; or define it: a mapping, see docs/extending.md)")
        elif not isinstance(value, bool):
            raise ConfigError(f"{where}: rule '{name}' must be on or off (or a definition), got {short(value)}")
        else:
            rules[name] = attrs.evolve(rules[name], on=value)
    for rule in rules.values():
        for other in rule.yield_to:
            if other not in rules:
                raise ConfigError(f"{rule.where}: rule '{rule.name}': yield_to: unknown fusion rule "
                                  f"'{other}'{did_you_mean(other, rules)}")
    # a cycle of yield_to: where the patterns meet, each yields to the next and none fuses
    # (named at a rule of `data` first: the file that closed the cycle)
    for rule in sorted(rules.values(), key=lambda r: r.name not in data):
        cycle = _yield_cycle(rules, rule.name, [rule.name])
        if cycle:
            what = ("it never fuses where it matches" if len(cycle) == 2 else
                    "where their patterns meet, each yields to the next and none of them fuses")
            raise ConfigError(f"{rule.where}: rule '{rule.name}': yield_to: a cycle ({' -> '.join(cycle)}): {what}")
    return rules


def _yield_cycle(rules: dict[str, Rule], start: str, path: list[str]) -> list[str] | None:
    """A chain of yield_to from path[-1] back to `start` (`path` with `start` again), or None."""
    for other in rules[path[-1]].yield_to:
        if other == start:
            return [*path, other]
        if other not in path:
            found = _yield_cycle(rules, start, [*path, other])
            if found:
                return found
    return None


def builtin_names() -> tuple[str, ...]:
    """The built-in rules' names in the order they apply (the shipped file, not checked)."""
    return tuple(read_yaml(RULES_FILE))
