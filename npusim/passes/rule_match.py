"""The one matcher and rewriter every fusion rule runs through (npusim.passes.rule_data
reads the rules): find the rule's pattern anchored at each node of its first node's op
type, in graph order, and replace the nodes found by the rule's fused nodes."""

from __future__ import annotations

from collections.abc import Iterator

import attrs
from attrs import define

from npusim.errors import ConfigError
from npusim.graph.ir import Node, TensorSpec
from npusim.passes.fused_ops import BUILDERS
from npusim.passes.graph_edit import Editor
from npusim.passes.rule_data import PatternNode, Rule


@define
class Match:
    """A rule's pattern found in the graph: pattern node -> graph node (a list for a
    repeated node, None for a missing optional one), $tensor -> graph tensor (a list for a
    repeated node's outputs), and the editor holding the graph."""

    editor: Editor
    nodes: dict[str, Node | list[Node] | None]
    tensors: dict[str, str | list[str]]

    def matched(self) -> list[Node]:
        return [n for v in self.nodes.values() if v is not None for n in (v if isinstance(v, list) else [v])]

    def first(self, key: str) -> Node:
        v = self.nodes[key]
        return v[0] if isinstance(v, list) else v


def apply_rule(rule: Rule, ed: Editor, rules: dict[str, Rule]) -> None:
    """Replace every match of `rule` (anchors in graph order, each node fused once)."""
    first = rule.match[0]
    taken: set[int] = set()
    for anchor in [n for n in ed.nodes if n.op_type == first.op]:
        if id(anchor) in taken:
            continue
        m = find(rule, ed, anchor)
        if m is None or any(yields(rules[other], ed, m) for other in rule.yield_to):
            continue
        old = m.matched()
        new = build(rule, m)
        ed.replace(old, new)
        taken |= {id(n) for n in old}


def yields(other: Rule, ed: Editor, m: Match) -> bool:
    """Whether `other`'s pattern (without its constraints) takes one of the nodes of `m`."""
    return any(find(other, ed, n, constraints=False) is not None
               for n in m.matched() if n.op_type == other.match[0].op)


def find(rule: Rule, ed: Editor, anchor: Node, constraints: bool = True) -> Match | None:
    """The first match of `rule` whose first pattern node is `anchor` (None if none)."""
    return _search(rule, ed, 0, {}, {}, anchor, constraints)


def _search(rule: Rule, ed: Editor, i: int, nodes: dict, tensors: dict, anchor: Node,
            constraints: bool) -> Match | None:
    if i == len(rule.match):
        m = Match(ed, dict(nodes), dict(tensors))
        return m if _vanishing_ok(rule, ed, m) and (not constraints or _same_ok(rule, m)) else None
    p = rule.match[i]
    used = {id(n) for n in Match(ed, nodes, tensors).matched()}
    if p.repeat:
        found = _group(p, ed, anchor if i == 0 else None, tensors, used)
        if found is not None:
            group, bound = found
            return _search(rule, ed, i + 1, nodes | {p.key: group}, bound, anchor, constraints)
        return None
    for n in ([anchor] if i == 0 else _candidates(p, ed, tensors)):
        if id(n) in used:
            continue
        for bound in _bindings(p, n, tensors, ed):
            m = _search(rule, ed, i + 1, nodes | {p.key: n}, bound, anchor, constraints)
            if m is not None:
                return m
    if p.optional:  # missing: its outputs are the one tensor it reads of the nodes before it
        src = next(tensors[v] for v in p.ins.values() if v in tensors)
        return _search(rule, ed, i + 1, nodes | {p.key: None}, tensors | dict.fromkeys(p.outs.values(), src),
                       anchor, constraints)
    return None


def _source(ed: Editor, t: str, through: tuple[str, ...]) -> str:
    """The tensor `t` is a copy of, through producers of the op types `through`."""
    n = ed.producer(t)
    return next(iter(n.inputs.values())) if n is not None and n.op_type in through and n.inputs else t


def _candidates(p: PatternNode, ed: Editor, tensors: dict) -> list[Node]:
    """Nodes that may match `p`: the writer of a tensor it writes, else the readers of
    one it reads (copies by its look_through ops included), already bound."""
    for var in p.outs.values():
        if var in tensors:
            n = ed.producer(tensors[var])
            return [n] if n is not None and n.op_type == p.op else []
    var = next((v for v in p.ins.values() if v in tensors), None)
    if var is None:  # linked only through a tensor of a missing optional node
        return []
    found = list(ed.readers(tensors[var]))
    copies = [n for n in found if n.op_type in p.look_through]
    for c in copies:
        found += [n for t in c.outputs.values() for n in ed.readers(t)]
    if copies:  # in graph order, as the editor keeps its readers
        found = ed._ordered({n.name: n for n in found})
    return [n for n in found if n.op_type == p.op]


def _bindings(p: PatternNode, n: Node, tensors: dict, ed: Editor, outs: bool = True) -> Iterator[dict]:
    """The $tensor bindings (over `tensors`) under which `n` matches `p`: one per way round
    of its commutative inputs."""
    if n.op_type != p.op or any(getattr(n.args, k) != v for k, v in p.where.items()):
        return
    orders = [p.ins]
    if p.commutative:
        a, b = p.commutative
        orders.append(p.ins | {a: p.ins[b], b: p.ins[a]})
    for ins in orders:
        bound = dict(tensors)
        pairs = [(var, n.inputs.get(port), True) for port, var in ins.items()]
        pairs += [(var, n.outputs.get(port), False) for port, var in p.outs.items()] if outs else []
        ok = True
        for var, t, is_in in pairs:
            if t is not None and is_in and p.look_through:
                t = _source(ed, t, p.look_through)
            if t is None or bound.setdefault(var, t) != t:
                ok = False
                break
        if ok:
            yield bound


def _group(p: PatternNode, ed: Editor, anchor: Node | None, tensors: dict, used: set) -> tuple | None:
    """A repeated node's match: every node like `p` reading the bound tensors (the anchor's
    when it is the first), in graph order, if there are at least p.repeat of them."""
    if anchor is not None:
        tensors = next(_bindings(p, anchor, tensors, ed, outs=False), None)
        if tensors is None:
            return None
    group = [n for n in _candidates(attrs.evolve(p, outs={}), ed, tensors) if id(n) not in used
             and next(_bindings(p, n, tensors, ed, outs=False), None) == tensors]
    if len(group) < max(p.repeat, 1):
        return None
    return group, tensors | {var: [n.outputs.get(port) for n in group] for port, var in p.outs.items()}


def _vanishing_ok(rule: Rule, ed: Editor, m: Match) -> bool:
    """Every tensor a matched node writes that no fused node writes is read only by matched
    nodes, and is neither a graph output nor a KV cache: it can disappear."""
    kept = set()
    for f in rule.into:
        for ref in f.outs.values():
            v = _tensor(m, ref, strict=False)
            kept |= set(v) if isinstance(v, list) else {v}
    matched = {id(n) for n in m.matched()}
    for n in m.matched():
        for t in n.outputs.values():
            if t in kept:
                continue
            if (t in ed.base.outputs or ed.tensors[t].kind == "kv"
                    or any(id(r) not in matched for r in ed.readers(t))):
                return False
    return True


def _same_ok(rule: Rule, m: Match) -> bool:
    for keys, params in rule.same:
        nodes = [n for k in keys for n in _as_list(m.nodes[k])]
        if any(getattr(n.args, p) != getattr(nodes[0].args, p) for n in nodes for p in params):
            return False
    return True


def _as_list(v) -> list:
    return [] if v is None else v if isinstance(v, list) else [v]


# ---------------------------------------------------------------- the fused nodes


class _Name(str):
    """A node name in a template: {x} itself, {x:tail} its last dotted part, {x:-sfx} without sfx."""

    def __format__(self, spec: str) -> str:
        if spec == "tail":
            return self.rsplit(".", 1)[-1]
        return str(self).removesuffix(spec[1:]) if spec.startswith("-") else str(self)


def build(rule: Rule, m: Match) -> list[Node]:
    """The rule's fused nodes for match `m` (adding the new tensors they write to the graph)."""
    ed = m.editor
    lead = m.first(rule.match[0].key)
    names = {k: _Name(m.first(k).name) for k, v in m.nodes.items() if v is not None}
    names["layer"] = f"L{lead.layer}." if lead.layer is not None else ""
    for var, spec in rule.tensors.items():
        specs = [ed.tensors[_tensor(m, ref)] for ref in spec.concat]
        shape = (*specs[0].shape[:-1], sum(s.shape[-1] for s in specs))
        m.tensors[var] = ed.add_tensor(TensorSpec(_format(rule, spec.name, names), shape, specs[0].dtype))
    out = []
    for i, f in enumerate(rule.into):
        if isinstance(f.params, str):
            params = dict(m.first(f.params[1:]).params)
        else:
            params = {k: _value(m, v) for k, v in (f.params or {}).items()}
        inputs = {port: _tensor(m, ref) for port, ref in f.ins.items()}
        outputs = {}
        for port, ref in f.outs.items():
            t = _tensor(m, ref)
            outputs |= ({f"{port[:-1]}{j}": x for j, x in enumerate(_as_list(t) if isinstance(t, list) else [t])}
                        if port.endswith("*") else {port: t})
        fields = dict(op=f.ops[0], params=params, inputs=inputs, outputs=outputs)
        if f.build is not None:
            fields = BUILDERS[f.build].fn(m, [n for k in f.parts for n in _as_list(m.nodes[k])], fields)
            if fields["op"] not in f.ops:
                raise ConfigError(f"{rule.where}: rule '{rule.name}': into[{i}].build: builder '{f.build}' made "
                                  f"a {fields['op']}, not one of {', '.join(f.ops)}")
        out.append(Node(_format(rule, f.name, names), fields["op"], fields["params"], fields["inputs"],
                        fields["outputs"], lead.layer))
    return out


def _format(rule: Rule, template: str, names: dict) -> str:
    try:
        return template.format(**names)
    except KeyError as e:  # a missing optional node
        raise ConfigError(f"{rule.where}: rule '{rule.name}': name '{template}': node {e} is missing "
                          "(optional) in this match") from None


def _tensor(m: Match, ref: str, strict: bool = True):
    """A $tensor or $node.port reference -> the graph tensor (a list for a repeated node's)."""
    head, _, port = ref[1:].partition(".")
    if port:
        n = m.nodes.get(head)
        n = n[0] if isinstance(n, list) else n
        t = None if n is None else n.inputs.get(port, n.outputs.get(port))
    else:
        t = m.tensors.get(ref)
    if t is None and strict:
        raise ConfigError(f"rule: {ref} is not in this match (its node is optional and missing)")
    return t


def _value(m: Match, v):
    """A fused node's parameter: a literal, $node.param (the node's value) or $tensor.shape / .dtype."""
    if isinstance(v, list):
        return tuple(v)
    if not isinstance(v, str) or not v.startswith("$"):
        return v
    head, _, attr = v[1:].partition(".")
    if head in m.nodes:
        return getattr(m.first(head).args, attr)
    spec = m.editor.tensors[m.tensors["$" + head]]
    return getattr(spec, attr)
