"""Reading config text (hardware configs, workloads, fusion rules, `--set` values)
without trusting it: YAML and JSON with duplicate keys rejected, and limits on size,
nesting and YAML alias expansion checked before anything walks the data. Error
messages quote values through `short()`, so a huge or self-referencing value can
never make building the message itself slow.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import reprlib
import stat
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import cattrs
import yaml
from cattrs.cols import is_sequence, list_structure_factory

from npusim.errors import ConfigError

# Limits on config text. A shipped config is a few KB, a few levels deep and a few
# hundred values; these bounds are far above that and far below what would make
# loading or an error message slow.
MAX_TEXT_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_VALUES = 100_000  # after YAML aliases are expanded (what a walk of the data visits)

_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxdict, _repr.maxlist, _repr.maxtuple, _repr.maxset = 2, 4, 4, 4, 4
_repr.maxstring, _repr.maxlong, _repr.maxother = 40, 24, 40


def short(value: Any) -> str:
    """repr() of a value from a config, bounded in length and depth (for messages)."""
    return _repr.repr(value)


def clipped(text: str, limit: int = 60) -> str:
    """Text read from a file as a message shows it: at most about `limit` characters,
    its middle elided (a cell of thousands of characters made a message as long)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...{text[-(limit // 2):]} ({len(text)} characters)"


def counted(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 request', '2 requests': a count and its noun, plural unless the count is one
    (`nouns`: the plural, default the noun + 's')."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def first_repeated(items: Iterable[Any]) -> Any:
    """The first item equal to one before it (a name given twice in a list), or None."""
    seen = []
    for item in items:
        if item in seen:
            return item
        seen.append(item)
    return None


def plain_number(text: str) -> bool:
    """Whether `text` may be read as a number: ASCII, without '_' (Python's int() and
    float() also read '1_000' and other scripts' digits, '１６'; a flag or a file's cell
    spelt so is a slip, not a number to take silently)."""
    return text.isascii() and "_" not in text


def plain(kind: type, text: str):
    """kind(text) (int or float) of a plain number (plain_number); ValueError otherwise,
    as kind() raises for text that is no number at all."""
    if not plain_number(text):
        raise ValueError(text)
    return kind(text)


BRACKETS = {"(": ")", "[": "]"}  # the pairs a list on the command line may be enclosed in


def unbracketed(text: str) -> str:
    """A list as the command line spells it, without its one enclosing pair of brackets:
    [8,4096], (8, 4096) and (64,) (Python's one-tuple) read as 8,4096 and 64 do. A
    bracket not closed, or closed without being opened, is a ValueError: splitting on
    the commas would read '[8' and '4096]' as items."""
    inner = text.strip()
    opened, closed = inner[:1] in BRACKETS, inner[-1:] in BRACKETS.values()
    if not opened and not closed:
        return inner
    if not opened or inner[-1] != BRACKETS[inner[0]]:
        raise ValueError(text)
    inner = inner[1:-1].strip()
    if inner.endswith(",") and "," not in inner[:-1]:  # (64,): Python's one-tuple
        inner = inner[:-1]
    return inner


def odd_number(text: str) -> bool:
    """Whether text (or an item of its list: 32,32 or 2x16) is a number spelt with '_' or
    other scripts' digits ('1_6', '１６'), which int() and float() would read."""
    import re

    for part in re.split(r"[,x()\[\]]", text):
        if not plain_number(part):
            try:
                float(part)
                return True
            except ValueError:
                pass
    return False


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' naming the closest candidate (by difflib's ratio, else
    those containing the word: 'bw' -> 'peak_bw_bytes_per_s'), or '' when none is close."""
    word, names = str(word), sorted(str(c) for c in candidates)
    close = difflib.get_close_matches(word, names, n=1)
    if not close and len(word) >= 2:
        close = [c for c in names if word.lower() in c.lower()][:3]
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


class _Strict:
    """A loader that reads 1.6e12 as a float (YAML 1.1 wants 1.6e+12) and rejects a
    key given twice in one mapping (PyYAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *base` keys may be overridden by design
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {short(key)}", key_node.start_mark)
                    seen.add(key)
                except TypeError:  # an unhashable key: PyYAML reports it below
                    pass
        return super().construct_mapping(node, deep)


class _Loader(_Strict, yaml.SafeLoader):
    """The loader whose errors (line and problem) the messages quote."""


class _FastLoader(_Strict, getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """The same rules on libyaml's parser (when PyYAML has it): a few times faster."""


# Numbers are plain decimal, as JSON and YAML 1.2 write them. YAML 1.1 also reads 010
# as 8 (octal), 1:30 as 90 (base 60), 1_0 as 10, 0x18 and 0b11: a slip in a config or a
# --set value, taken silently. Any other spelling stays a string, which the field's type
# check refuses with the key's name. 1.6e12 is a float (YAML 1.1 wants 1.6e+12).
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
for _cls in (_Loader, _FastLoader):
    _cls.yaml_implicit_resolvers = {first: [r for r in rules if r[0] not in (_INT, _FLOAT)]
                                    for first, rules in _cls.yaml_implicit_resolvers.items()}
    _cls.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))
    _cls.add_implicit_resolver(
        _FLOAT,
        re.compile(r"^[-+]?(?:(?:[0-9]+\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+"
                   r"|\.(?:inf|Inf|INF))$|^\.(?:nan|NaN|NAN)$"),
        list("-+0123456789."),
    )


def _load_yaml(text: str) -> Any:
    """The data of YAML text; on bad YAML, the error _Loader gives (libyaml counts
    lines at the end of input differently)."""
    try:
        return yaml.load(text, Loader=_FastLoader)
    except yaml.YAMLError:
        return yaml.load(text, Loader=_Loader)


def _check_text(text: str, where: str) -> None:
    if len(text) > MAX_TEXT_BYTES:
        raise ConfigError(f"{where}: {len(text):,} characters, more than the {MAX_TEXT_BYTES:,} a config may have")


def check_shape(data: Any, where: str) -> None:
    """Nesting at most MAX_DEPTH levels, at most MAX_VALUES values counting every
    use of a YAML alias, and no value containing itself. Shared (aliased) values
    are counted without being walked twice, so a YAML alias bomb is caught fast."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(v: Any, depth: int) -> int:
        if not isinstance(v, (dict, list)):
            return 1
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels")
        if id(v) in open_:
            raise ConfigError(f"{where}: a value contains itself (a recursive YAML alias)")
        if id(v) not in sizes:
            open_.add(id(v))
            items = v.values() if isinstance(v, dict) else v
            n = 1 + len(v)  # the keys count too
            for item in items:
                n += size(item, depth + 1)
                if n > MAX_VALUES:
                    raise ConfigError(f"{where}: more than {MAX_VALUES:,} values once YAML aliases are expanded")
            open_.discard(id(v))
            sizes[id(v)] = n
        return sizes[id(v)]

    size(data, 0)


def _check_brackets(text: str, where: str) -> None:
    """Flow collections ([...], {...}) nested far deeper than MAX_DEPTH, refused before
    the YAML parser spends time quadratic in the depth on them. Brackets inside
    strings count too; the bound leaves them room."""
    depth = 0
    for m in re.finditer(r"[\[\]{}]", text):
        depth += 1 if m[0] in "[{" else -1
        if depth > 2 * MAX_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels")


def parse_yaml(text: str, where: str) -> Any:
    """YAML text -> data, within the limits above; errors name `where` and the line."""
    _check_text(text, where)
    _check_brackets(text, where)
    return _checked(lambda: _load_yaml(text), where, "YAML")


def parse_json(text: str, where: str) -> Any:
    """JSON text -> data, with duplicate keys rejected and the same limits as YAML."""
    _check_text(text, where)

    def no_duplicates(pairs):
        out = {}
        for k, v in pairs:
            if k in out:
                raise ConfigError(f"{where}: duplicate key {short(k)}")
            out[k] = v
        return out

    return _checked(lambda: json.loads(text, object_pairs_hook=no_duplicates), where, "JSON")


def _checked(load: Callable[[], Any], where: str, kind: str) -> Any:
    """load() with its errors as one ConfigError line, and its data's shape checked."""
    try:
        data = load()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{where}:{line} not valid YAML: {problem}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: line {e.lineno} not valid JSON: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # an integer of more digits than Python converts
        raise ConfigError(f"{where}: not valid {kind}: a number with too many digits") from None
    check_shape(data, where)
    return data


# What an input path can be other than a regular file, as an error names it. Each is
# refused before anything opens it: opening a named pipe waits for a writer that may never
# come, a device's read may never end (/dev/zero) or wait on a terminal (/dev/tty), a
# socket does not open, and a folder is no file's text.
_NOT_A_FILE = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def input_file(path: str | os.PathLike, what: str | None = None, folder: bool = False,
               error: type[Exception] = ConfigError) -> Path:
    """`path` checked before anything opens it: a regular file (folder=True: or a folder),
    through any links. A path that does not exist is left to the open that follows, which
    says so in its reader's words. `what` names the input in the error (default: the path);
    `error`: the error type raised (the reader's own)."""
    if os.fspath(path) == "":  # Path('') is the working folder
        raise error(f"{what or 'path'}: expected a file's path, got an empty string")
    p = Path(path)
    try:
        mode = p.stat().st_mode
    except OSError:  # missing, a dangling link, ...: the open reports it
        return p
    if stat.S_ISREG(mode) or (folder and stat.S_ISDIR(mode)):
        return p
    got = next((name for is_kind, name in _NOT_A_FILE if is_kind(mode)), "a special file")
    raise error(f"{what or p}: expected {'a file or a folder' if folder else 'a regular file'}, got {got}")


def read_text(path: Path) -> str:
    """A config file's text, refusing one larger than MAX_TEXT_BYTES before reading it all."""
    input_file(path)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read(MAX_TEXT_BYTES + 1)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    _check_text(text, str(path))
    return text


def read_yaml(path: Path) -> dict:
    """A YAML file whose top level is a mapping."""
    data = parse_yaml(read_text(path), str(path))
    if not isinstance(data, dict):
        got = "an empty file" if data is None else f"a {type(data).__name__}: {short(data)}"
        raise ConfigError(f"{path}: expected a mapping at the top level, got {got}")
    return data


def strict_converter() -> cattrs.Converter:
    """The cattrs converter every config loader (hardware, workload, service) uses:
    unknown keys are errors and nothing is converted silently (a string is not a
    number, 1 is not True, 2.5 is not an integer); each refusal says what was expected."""
    conv = cattrs.Converter(forbid_extra_keys=True)

    def to_int(v, _):
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                return int(v)
            raise TypeError(f"expected an integer, got {short(v)}")
        return v

    def to_float(v, _):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"expected a number, got {short(v)}")
        try:
            return float(v) + 0.0  # -0.0 is 0.0 (else printed as '-0 ms')
        except OverflowError:  # an integer too large for a float: the range checks word it
            return math.inf

    def to_bool(v, _):
        if not isinstance(v, bool):
            raise TypeError(f"expected true or false, got {short(v)}")
        return v

    def to_str(v, _):
        if not isinstance(v, str):
            raise TypeError(f"expected a string, got {short(v)}")
        return v

    def sequence_hook(t, converter):
        # cattrs would iterate whatever it is given: a number said "'int' object is not
        # iterable", a string or a mapping was read item by item
        args = typing.get_args(t)
        homogeneous = typing.get_origin(t) is tuple and len(args) == 2 and args[1] is Ellipsis
        items = list_structure_factory(list[args[0]] if args else list, converter)

        def structure(v, _):
            if not isinstance(v, (list, tuple)):
                raise TypeError(f"expected a list, got {short(v)}")
            out = items(v, t)
            return tuple(out) if homogeneous else out

        return structure

    for kind, hook in ((int, to_int), (float, to_float), (bool, to_bool), (str, to_str)):
        conv.register_structure_hook(kind, hook)
    conv.register_structure_hook_factory(is_sequence, sequence_hook)
    return conv
