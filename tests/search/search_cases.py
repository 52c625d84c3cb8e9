"""Random search problems for the solver tests (fixed seeds, small enough for brute force)."""

from __future__ import annotations

import numpy as np

from autoshard.search import Edge, SearchProblem


def random_problem(
    seed: int,
    *,
    max_nodes: int = 8,
    inf_fraction: float = 0.0,
    memory: bool = False,
    masks: bool = False,
    cyclic: bool = True,
) -> SearchProblem:
    """<= ``max_nodes`` nodes, 1-4 strategies, random edges (parallel and reversed ones included).

    ``cyclic=False`` gives a random forest; ``memory=True`` integer byte counts and a limit drawn between the
    least and the largest possible total.
    """
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, max_nodes + 1))
    sizes = rng.integers(1, 5, size=n)
    pairs = [(int(rng.integers(0, v)), v) for v in range(1, n)] if not cyclic else []
    if cyclic:
        for _ in range(int(rng.integers(n - 1, 2 * n + 1))):
            u, v = rng.choice(n, 2, replace=False)
            pairs.append((int(u), int(v)))
    edges = []
    for u, v in pairs:
        u, v = (u, v) if rng.random() < 0.5 else (v, u)
        cost = rng.random((sizes[u], sizes[v]))
        if inf_fraction:
            cost[rng.random(cost.shape) < inf_fraction] = np.inf
        edges.append(Edge(u, v, cost))
    mem = tuple(rng.integers(0, 100, s).astype(float) for s in sizes) if memory else None
    limit = None
    if mem is not None:
        lo, hi = sum(float(m.min()) for m in mem), sum(float(m.max()) for m in mem)
        limit = float(np.floor(lo + (hi - lo) * rng.random()))
    allowed = None
    if masks:
        allowed = tuple(
            (rng.random(s) < 0.6) | (np.arange(s) == rng.integers(s)) if rng.random() < 0.4 else None
            for s in sizes
        )
    return SearchProblem(
        node_costs=tuple(rng.random(s) * 2 for s in sizes),
        edges=tuple(edges),
        names=tuple(f"n{i}" for i in range(n)),
        memory=mem,
        memory_limit=limit,
        allowed=allowed,
    )


def random_chain(seed: int, length: int, strategies: int) -> SearchProblem:
    rng = np.random.default_rng(seed)
    return SearchProblem(
        node_costs=tuple(rng.random(strategies) for _ in range(length)),
        edges=tuple(Edge(i, i + 1, rng.random((strategies, strategies))) for i in range(length - 1)),
        names=tuple(f"c{i}" for i in range(length)),
    )


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return a == b or abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def transformer_problem(seed: int, strategies: int, *, memory: bool = False) -> SearchProblem:
    """One decoder layer solved once, shaped like the planner's LLaMA problem (random costs).

    The layer output ``res2`` feeds the layer's own input consumers (the "wraparound" of identical layers
    sharing variables), and the global RoPE tables ``cos``/``sin`` feed both ``q`` and ``k``: treewidth 4.
    Aligned strategies (same index) redistribute for free.
    """
    names = ["embed", "cos", "sin", "norm1", "q", "k", "v", "attn", "o", "res1"]
    names += ["norm2", "gate", "up", "act", "down", "res2", "final", "head"]
    at = {name: i for i, name in enumerate(names)}
    flows = [
        ("embed", "norm1"), ("embed", "res1"), ("res2", "norm1"), ("res2", "res1"),  # the wraparound
        ("norm1", "q"), ("norm1", "k"), ("norm1", "v"),
        ("cos", "q"), ("cos", "k"), ("sin", "q"), ("sin", "k"),  # the global RoPE tables
        ("q", "attn"), ("k", "attn"), ("v", "attn"), ("attn", "o"), ("o", "res1"),
        ("res1", "norm2"), ("res1", "res2"), ("norm2", "gate"), ("norm2", "up"), ("gate", "act"),
        ("act", "down"), ("up", "down"), ("down", "res2"), ("res2", "final"), ("final", "head"),
    ]  # fmt: skip
    rng = np.random.default_rng(seed)
    s = strategies
    edges = []
    for u, v in flows:
        cost = rng.random((s, s)) * (1.0 - np.eye(s))
        edges.append(Edge(at[u], at[v], cost))
    mem = tuple(rng.integers(1, 100, s).astype(float) for _ in names) if memory else None
    return SearchProblem(
        node_costs=tuple(rng.random(s) for _ in names),
        edges=tuple(edges),
        names=tuple(names),
        memory=mem,
    )
