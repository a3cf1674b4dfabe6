"""Placement (Monolith ``layout_filters``): which servables of an exported model one host serves.

A filter is ``"<pattern>; <expression>"``. The pattern names sub-graphs: ``entry``, or ``ps_{i}`` which matches every
``ps_<i>`` and binds ``i``; the expression is a Python-syntax boolean over ``i`` (integers, ``+ - * // %``,
comparisons, ``and or not``, ``True``/``False``) evaluated by a small interpreter, never ``eval``. A servable is placed
on the host when any filter selects it. :func:`model_config` renders the host's TF Serving model config text proto
(``tensorflow_model_server --model_config_file``) with served names ``<model>_entry`` / ``<model>_ps_<i>``.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.manifest import Manifest, entry_model_name, ps_dir_name, ps_model_name

__all__ = [
    "SERVED_VERSIONS",
    "Filter",
    "PlacementError",
    "Servable",
    "check_host_name",
    "helm_placement",
    "helm_values",
    "matching",
    "model_config",
    "parse_filter",
    "select",
]


SERVED_VERSIONS = 2
"""``model_version_policy { latest { num_versions: 2 } }`` on every generated servable: the previous version of the
entry and of each PS shard stays loaded while the next one loads. A full re-export publishes a new entry and new PS
versions that each backend loads on its own; with TF Serving's default (latest 1) the old entry is unloaded as soon
as the new one is AVAILABLE, while shards still load theirs, and no entry/PS pair is served everywhere (503s until
every shard has it). With two versions the gateway keeps serving the previous complete pair (docs/export.md
"Rollout of a full re-export")."""


class PlacementError(ValueError):
    """A malformed filter or an empty placement; the message quotes the filter and the problem."""


@dataclass(frozen=True)
class Servable:
    sub_graph: str  # "entry" or "ps_<i>"
    name: str  # served model name
    base_path: str  # directory holding the numeric versions


@dataclass(frozen=True)
class Filter:
    text: str
    regex: re.Pattern[str]
    binds_i: bool
    expr: ast.Expression

    def selects(self, sub_graph: str) -> bool:
        m = self.regex.fullmatch(sub_graph)
        if not m:
            return False
        env = {"i": int(m.group("i"))} if self.binds_i else {}
        value = _eval(self.expr.body, env, self.text)
        if not isinstance(value, bool):
            raise PlacementError(f"filter {self.text!r}: the expression gives {value!r}, not True/False")
        return value


_BIN: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMP: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


def parse_filter(text: str) -> Filter:
    """Parse ``"<pattern>; <expression>"``; every disallowed construct is rejected here, before evaluation."""
    pattern, sep, expression = text.partition(";")
    pattern, expression = pattern.strip(), expression.strip()
    if not sep or not pattern or not expression:
        raise PlacementError(
            f"filter {text!r}: expected '<pattern>; <expression>', e.g. 'ps_{{i}}; i % 2 == 0'"
        )
    if not re.fullmatch(r"[A-Za-z0-9_]*(\{i\})?[A-Za-z0-9_]*", pattern):
        raise PlacementError(
            f"filter {text!r}: pattern {pattern!r} may hold letters, digits, _ and one '{{i}}'"
        )
    binds_i = "{i}" in pattern
    regex = re.compile(
        re.escape(pattern).replace(re.escape("{i}"), r"(?P<i>\d+)") if binds_i else re.escape(pattern)
    )
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise PlacementError(
            f"filter {text!r}: expression {expression!r} is not valid syntax: {exc.msg}"
        ) from None
    for node in ast.walk(tree):
        _check_node(node, binds_i, text)
    return Filter(text, regex, binds_i, tree)


def _check_node(node: ast.AST, binds_i: bool, text: str) -> None:
    allowed = (
        ast.Expression,
        ast.BoolOp,
        ast.And,
        ast.Or,
        ast.UnaryOp,
        ast.Not,
        ast.USub,
        ast.UAdd,
        ast.BinOp,
        ast.Compare,
        ast.Name,
        ast.Load,
        ast.Constant,
        *_BIN,
        *_CMP,
    )
    if not isinstance(node, allowed):
        raise PlacementError(
            f"filter {text!r}: {type(node).__name__} is not allowed in an expression "
            "(only i, integers, + - * // %, comparisons, and/or/not, True/False)"
        )
    if isinstance(node, ast.Name):
        if node.id != "i":
            raise PlacementError(f"filter {text!r}: unknown name {node.id!r} (only 'i' may be used)")
        if not binds_i:
            raise PlacementError(f"filter {text!r}: the expression uses i but the pattern has no '{{i}}'")
    if isinstance(node, ast.Constant) and (type(node.value) not in (int, bool)):
        raise PlacementError(f"filter {text!r}: constant {node.value!r} is not an integer or True/False")


def _eval(node: ast.AST, env: dict[str, int], text: str) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return env[node.id]
    if isinstance(node, ast.BoolOp):
        values = [_eval(v, env, text) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, text)
        return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else +v)
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env, text), _eval(node.right, env, text)
        try:
            return _BIN[type(node.op)](left, right)
        except ZeroDivisionError:
            raise PlacementError(f"filter {text!r}: division by zero for i = {env.get('i')}") from None
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, text)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = _eval(comp, env, text)
            if not _CMP[type(op)](left, right):
                return False
            left = right
        return True
    raise PlacementError(
        f"filter {text!r}: cannot evaluate {type(node).__name__}"
    )  # unreachable after checks


def select(
    model_dir: str | Path,
    filters: Sequence[str | Filter],
    *,
    name_prefix: str | None = None,
    base_path_root: str | None = None,
) -> list[Servable]:
    """The servables of ``model_dir`` that any filter selects, entry first then shards in order.

    ``name_prefix`` replaces the model name in served names; ``base_path_root`` replaces the model directory's parent
    in base paths (e.g. where the host mounts the artifacts); default: the absolute local path. Raises
    :class:`PlacementError` when no servable matches (:func:`matching` answers an empty list instead).
    """
    md = Path(model_dir).resolve()
    parsed = _parsed(filters)
    chosen = matching(md, parsed, name_prefix=name_prefix, base_path_root=base_path_root)
    if not chosen:
        num_shards = Manifest.load(md).num_shards
        raise PlacementError(
            f"{md}: no servable matches the filters {[f.text for f in parsed]} "
            f"(sub-graphs: entry, ps_0..ps_{num_shards - 1})"
        )
    return chosen


def matching(
    model_dir: str | Path,
    filters: Sequence[str | Filter],
    *,
    name_prefix: str | None = None,
    base_path_root: str | None = None,
) -> list[Servable]:
    """Like :func:`select`, but a placement that selects nothing of this model is an empty list (a host of a
    multi-model deployment may serve none of one model's servables)."""
    md = Path(model_dir).resolve()
    manifest = Manifest.load(md)
    parsed = _parsed(filters)
    prefix = name_prefix or manifest.model_name
    root = base_path_root.rstrip("/") + "/" + md.name if base_path_root else str(md)
    candidates = [("entry", entry_model_name(prefix))] + [
        (ps_dir_name(i), ps_model_name(prefix, i)) for i in range(manifest.num_shards)
    ]
    return [
        Servable(sg, name, f"{root}/{sg}") for sg, name in candidates if any(f.selects(sg) for f in parsed)
    ]


def _parsed(filters: Sequence[str | Filter]) -> list[Filter]:
    parsed = [f if isinstance(f, Filter) else parse_filter(f) for f in filters]
    if not parsed:
        raise PlacementError("no filter given: pass at least one, e.g. 'entry; True'")
    return parsed


def model_config(servables: Sequence[Servable]) -> str:
    """TF Serving ``ModelServerConfig`` text proto with one ``config`` per servable, each keeping the latest
    :data:`SERVED_VERSIONS` versions loaded."""
    lines = ["model_config_list {"]
    for s in servables:
        lines += [
            "  config {",
            f"    name: {_quote(s.name)}",
            f"    base_path: {_quote(s.base_path)}",
            '    model_platform: "tensorflow"',
            f"    model_version_policy {{ latest {{ num_versions: {SERVED_VERSIONS} }} }}",
            "  }",
        ]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def helm_values(model_dir: str | Path, hosts: Sequence[tuple[str, str]]) -> str:
    """The Helm chart's ``model`` and ``psHosts`` values (YAML) for PS hosts named by ``(host, filter)`` pairs
    (:func:`helm_placement` as text)."""
    values = helm_placement(model_dir, hosts)
    model = values["model"]
    lines = [
        "model:",
        *(
            f"  {key}: {model[key]}"
            for key in ("name", "shards", "rowsPerShard", "dim", "psLayout", "rowBytes")
        ),
        "psHosts:",
    ]
    for host in values["psHosts"]:
        lines += [f"  - name: {host['name']}", f"    shards: [{', '.join(map(str, host['shards']))}]"]
    return "\n".join(lines) + "\n"


def helm_placement(model_dir: str | Path, hosts: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """The Helm chart's ``model`` and ``psHosts`` values for PS hosts named by ``(host, filter)`` pairs.

    A host named several times gets every shard any of its filters selects (the entry is placed by the chart itself).
    Refuses a host that selects no shard and a placement that leaves a shard on no host. For the chart's PS memory
    request (per million rows, per shard on a host: docs/deployment.md "Sizing"): ``model.rowsPerShard`` is the rows
    of every table spread over the shards, ``model.dim`` the tables' dims weighted by their rows (rounded up), so
    that the product covers every table of a shard; ``model.psLayout`` the manifest's PS layout and
    ``model.rowBytes`` the bytes a stored element takes (4 for float32, 2 for float16/bfloat16 rows), weighted by
    rows x dim and rounded up.
    """
    md = Path(model_dir).resolve()
    manifest = Manifest.load(md)
    by_host: dict[str, list[Filter]] = {}
    for host, text in hosts:
        check_host_name(host)
        by_host.setdefault(host, []).append(parse_filter(text))
    if not by_host:
        raise PlacementError("no host given: pass at least one, e.g. even='ps_{i}; i % 2 == 0'")
    placed: set[int] = set()
    total_rows = sum(t.rows for t in manifest.tables)
    model = {
        "name": manifest.model_name,
        "shards": manifest.num_shards,
        "rowsPerShard": max(-(-total_rows // manifest.num_shards), 1),
        "dim": max(-(-sum(t.rows * t.dim for t in manifest.tables) // max(total_rows, 1)), 1),
        "psLayout": manifest.ps_layout.value,
        "rowBytes": _row_bytes(manifest),
    }
    ps_hosts: list[dict[str, Any]] = []
    for host, filters in by_host.items():
        shards = [i for i in range(manifest.num_shards) if any(f.selects(ps_dir_name(i)) for f in filters)]
        if not shards:
            raise PlacementError(f"host {host!r}: its filters {[f.text for f in filters]} select no PS shard")
        placed.update(shards)
        ps_hosts.append({"name": host, "shards": shards})
    missing = sorted(set(range(manifest.num_shards)) - placed)
    if missing:
        raise PlacementError(f"{md}: shards {missing} are on no host; every shard needs at least one")
    return {"model": model, "psHosts": ps_hosts}


def _row_bytes(manifest: Manifest) -> int:
    """Bytes per stored row element over every table, weighted by rows x dim and rounded up (4 without rows)."""
    floats = sum(t.rows * t.dim for t in manifest.tables)
    if not floats:
        return 4
    stored = sum(t.rows * t.dim * (4 if t.row_dtype == "float32" else 2) for t in manifest.tables)
    return -(-stored // floats)


def check_host_name(host: str) -> None:
    """Refuse a host name that cannot name Kubernetes objects or compose services (PlacementError quoting it)."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", host) or len(host) > 20:
        raise PlacementError(
            f"host name {host!r}: use 1-20 lowercase letters, digits and '-' (it names Kubernetes objects)"
        )
