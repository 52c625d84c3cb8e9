"""Which layers of a collapsed stack a captured-graph element stands for, and its module path in each (the
plan reader, :mod:`autoshard.problem.extract`, names every layer a shared decision covers)."""

from __future__ import annotations

import re

from autoshard.problem.build import BuiltProblem, EdgeUse

__all__ = ["LayerNamer"]


class LayerNamer:
    """Which layers a captured-graph element stands for, and its module path in each."""

    def __init__(self, built: BuiltProblem, prefix: str | None, first: int = 0) -> None:
        self.n = built.num_blocks
        self.prefix = prefix
        self.first = first  # container index of layer 0 (leading layers that differ come before it)
        self.infos = built.infos

    def layers_of_edge(self, use: EdgeUse) -> list[int | None]:
        u, v = self.infos[use.producer], self.infos[use.consumer]
        if self.n == 1:
            block = v.block or u.block
            return [block[0] if block else None]
        if v.block is not None:
            return self._span(v.block[0], use.weight, inward=True)
        if u.block is not None:
            return self._span(u.block[0], use.weight, inward=False)
        return [None]

    def layers_of_node(self, name: str) -> list[int | None]:
        info = self.infos[name]
        if info.block is None:
            return [None]
        return list(range(self.n)) if self.n > 1 else [info.block[0]]

    def _span(self, block: int, weight: int, *, inward: bool) -> list[int | None]:
        n = self.n
        if weight == n:
            return list(range(n))
        if weight == n - 1 and n > 2:  # with two layers each copy is its own layer: the block says which
            return list(range(1, n)) if inward else list(range(0, n - 1))
        return [0 if block == 0 else n - 1]

    def module(self, path: str, layer: int | None) -> str:
        if layer is None or not self.prefix:
            return path
        return re.sub(rf"^{re.escape(self.prefix)}\.\d+", f"{self.prefix}.{self.first + layer}", path)
