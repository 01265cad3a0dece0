"""Split a full lock into install layers ordered for cache reuse (pure).

Heavy, rarely changing parts first and verl last, so bumping verl rebuilds only the last layer:

1. ``torch``: torch and everything it pulls in (CUDA libraries, triton, sympy ...);
2. ``engine``: the rollout engine (vLLM or SGLang) and what it adds on top of torch;
3. ``deps``: every other locked package (transformers, ray, tensordict, hydra-core ...);
4. ``verl``: verl alone.

The dependency graph comes from the lock's ``# via`` annotations (uv writes who required each
package). Every layer is installed with ``--no-deps --require-hashes``, so the union of the layers
is exactly the lock. Packages built from source are left out: they are installed from the wheel
the source-build stage produced.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from builder.resolve.lock import LockedPackage

LAYER_ORDER = ("torch", "engine", "deps", "verl")


@dataclass(frozen=True)
class Layer:
    name: str
    packages: tuple[LockedPackage, ...]

    @property
    def filename(self) -> str:
        return f"{LAYER_ORDER.index(self.name) + 1}0-{self.name}.txt"

    def render(self) -> str:
        head = f"# verl-env install layer {self.filename}: {len(self.packages)} packages\n"
        return head + "".join(p.render() for p in self.packages)


def dependents(locked: dict[str, LockedPackage]) -> dict[str, set[str]]:
    """name -> the locked packages it depends on (inverting uv's "via" annotations)."""
    deps: dict[str, set[str]] = {name: set() for name in locked}
    for pkg in locked.values():
        for parent in pkg.via:
            parent = parent.split(" ")[0]
            if parent in deps:
                deps[parent].add(pkg.name)
    return deps


def closure(roots: Iterable[str], graph: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    stack = [r for r in roots if r in graph]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph[node] - seen)
    return seen


def split_layers(locked: dict[str, LockedPackage], *, engine: str | None,
                 exclude: Iterable[str] = ()) -> list[Layer]:
    """Assign every locked package to exactly one layer; empty layers are dropped."""
    graph = dependents(locked)
    excluded = set(exclude)
    torch = closure(["torch"], graph) - {"verl"}
    eng = (closure([engine], graph) - torch - {"verl"}) if engine else set()
    verl = {"verl"} & set(locked)
    deps = set(locked) - torch - eng - verl
    groups = {"torch": torch, "engine": eng, "deps": deps, "verl": verl}
    layers = []
    for name in LAYER_ORDER:
        members = sorted(groups[name] - excluded)
        if members:
            layers.append(Layer(name, tuple(locked[m] for m in members)))
    return layers
