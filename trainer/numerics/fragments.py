"""Splitting the parameter pytree into P fragments, and when each fragment syncs.

A fragment is a set of whole leaves, named by path (`"layer_0/qkv"`). Two layouts:

- `balanced` (default): greedy bin-packing by leaf size. Leaves in order of
  (size descending, path ascending) each go into the currently lightest bin, ties
  to the lowest bin index. Deterministic; sizes end within one leaf of each other.
- `strided`: `layer_i` → fragment i % P; every other top-level entry (`embed`,
  `final`, ...) → fragment n_layers % P. So with P = n_layers + 1 each layer is a
  fragment and embed + final share the last one.

Within a fragment, leaves are in tree order (sorted path), the order of the list
`get` returns and `set` takes. A layout that leaves a fragment empty is an error.

Schedule (`due_fragment`): fragment p syncs at inner steps s ≥ 1 with
(s − offset_p) % H == 0, offset_p = (p·H) // P. For H = 6, P = 3 the offsets are
0, 2, 4:

    step s     1  2  3  4  5  6  7  8  9 10 11 12 ...
    fragment   -  1  -  2  -  0  -  1  -  2  -  0 ...

so each fragment syncs every H steps, one every H/P steps, and (for H ≥ P) never
two at once.
"""
from __future__ import annotations

from typing import Any, Iterable

import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("balanced", "strided")


def flatten_with_paths(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(path, leaf) pairs of a nested dict, in sorted-key (tree) order."""
    out: list[tuple[str, Any]] = []
    for key in sorted(tree):
        value, path = tree[key], f"{prefix}{key}"
        if isinstance(value, dict):
            out.extend(flatten_with_paths(value, path + "/"))
        else:
            out.append((path, value))
    return out


def _replace(tree: dict, path: str, value: Any) -> dict:
    head, _, rest = path.partition("/")
    new = dict(tree)
    new[head] = _replace(tree[head], rest, value) if rest else value
    return new


class Fragmenter:
    """The fixed assignment of leaves to fragments for one parameter structure."""

    def __init__(self, params: dict, P: int, kind: str = "balanced"):
        if kind not in KINDS:
            raise ValueError(f"fragmentation kind {kind!r} is not valid; valid: "
                             + ", ".join(KINDS))
        leaves = flatten_with_paths(params)
        if not isinstance(P, int) or P < 1:
            raise ValueError(f"fragments P = {P!r} must be an int >= 1")
        self.P, self.kind = P, kind
        self._shapes = {path: tuple(np.shape(leaf)) for path, leaf in leaves}
        sizes = {path: int(np.prod(shape)) for path, shape in self._shapes.items()}
        assign = (_balanced(sizes, P) if kind == "balanced"
                  else _strided(list(sizes), P))
        order = [path for path, _ in leaves]
        self._paths = [[path for path in order if assign[path] == p] for p in range(P)]
        self._fragment_of = assign
        self._sizes = [sum(sizes[path] for path in paths) for paths in self._paths]
        empty = [p for p, paths in enumerate(self._paths) if not paths]
        if empty:
            raise ValueError(
                f"fragments P = {P} with {kind!r} fragmentation leaves fragment(s) "
                f"{empty} empty ({len(order)} leaves"
                + (f", {_n_layers(order)} layers" if kind == "strided" else "")
                + "); lower DilocoConfig.fragments")

    def leaf_paths(self, p: int) -> list[str]:
        return list(self._paths[p])

    def fragment_of(self, path: str) -> int:
        return self._fragment_of[path]

    def sizes(self) -> list[int]:
        """Elements (float32 numbers) per fragment."""
        return list(self._sizes)

    def is_embedding(self, p: int) -> bool:
        """Whether fragment p holds a leaf under `embed/` (DESIGN.md merges that
        fragment with the plain weighted mean instead of RDA)."""
        return any(path.startswith("embed/") for path in self._paths[p])

    def get(self, params: dict, p: int) -> list[np.ndarray]:
        """Fragment p as float32 numpy arrays (copies), in `leaf_paths(p)` order."""
        return [np.array(_lookup(params, path), dtype=np.float32) for path in self._paths[p]]

    def leaves(self, params: dict, p: int) -> list[Any]:
        """Fragment p's leaves as `params` holds them (no copy: JAX arrays stay on their
        devices), in `leaf_paths(p)` order."""
        return [_lookup(params, path) for path in self._paths[p]]

    def rebase(self, params: dict, p: int, new: Iterable[Any], ref: Iterable[Any]) -> dict:
        """Fragment p moved onto `new` keeping its drift from `ref`: leaf ← new + (leaf − ref),
        computed where the leaves live, so the host does not wait for a step in flight
        (keeping local progress, docs/PROTOCOL.md)."""
        leaves = self.leaves(params, p)
        # one jitted call per fragment: eager ops, one per leaf and operation, cost more
        # host time than the inner step they sit between
        moved = _rebase_leaves([np.asarray(n, np.float32) for n in new], leaves,
                               [np.asarray(r, np.float32) for r in ref])
        for path, arr in zip(self._paths[p], moved):
            params = _replace(params, path, arr)
        return params

    def set(self, params: dict, p: int, arrays: Iterable[Any]) -> dict:
        """A new params tree with fragment p replaced (float32 jax arrays); the other
        leaves are shared, not copied. Shapes must match exactly."""
        arrays = list(arrays)
        if len(arrays) != len(self._paths[p]):
            raise ValueError(f"fragment {p} has {len(self._paths[p])} leaves, "
                             f"got {len(arrays)} arrays")
        for path, arr in zip(self._paths[p], arrays):
            if tuple(np.shape(arr)) != self._shapes[path]:
                raise ValueError(f"leaf {path} has shape {self._shapes[path]}, "
                                 f"got {tuple(np.shape(arr))}")
            params = _replace(params, path, jnp.asarray(arr, jnp.float32))
        return params


@jax.jit
def _rebase_leaves(new: list, leaves: list, ref: list) -> list:
    return [n + (x.astype(jnp.float32) - r) for n, x, r in zip(new, leaves, ref)]


def _lookup(tree: dict, path: str) -> Any:
    for key in path.split("/"):
        tree = tree[key]
    return tree


def _n_layers(paths: list[str]) -> int:
    return len({path.split("/")[0] for path in paths if path.startswith("layer_")})


def _balanced(sizes: dict[str, int], P: int) -> dict[str, int]:
    loads, assign = [0] * P, {}
    for path in sorted(sizes, key=lambda path: (-sizes[path], path)):
        p = min(range(P), key=lambda q: (loads[q], q))
        assign[path] = p
        loads[p] += sizes[path]
    return assign


def _strided(paths: list[str], P: int) -> dict[str, int]:
    rest = _n_layers(paths) % P
    assign = {}
    for path in paths:
        top = path.split("/")[0]
        assign[path] = int(top[len("layer_"):]) % P if top.startswith("layer_") else rest
    return assign


def due_fragments(step: int, H: int, P: int) -> list[int]:
    """Every fragment due at inner step `step` (more than one only when H < P)."""
    if step < 1:
        return []
    return [p for p in range(P) if (step - (p * H) // P) % H == 0]


def due_fragment(step: int, H: int, P: int) -> int | None:
    """The fragment due at inner step `step` (counting from 1), or None. Needs
    H >= P so that at most one is due; see the module docstring for the table."""
    if H < P:
        raise ValueError(f"sync_every H = {H} < fragments P = {P}: several fragments "
                         f"would be due at once; use H >= P or due_fragments()")
    due = due_fragments(step, H, P)
    return due[0] if due else None
