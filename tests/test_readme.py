"""Every Python snippet of the README runs as written, in order: no name a reader has not been given.

A new-user trial found ``F``, ``labels`` and ``ids_1k`` used but never defined.  Every block is checked
statically, in order (each name a statement reads is bound by an earlier statement, by itself, or is a
builtin); the blocks that run in one process in seconds are also executed, after the imports of the blocks
before them.  The others were run by hand: the LLaMA-3-8B plan (39 CPU s here: its memory budget binds) and
the GPT-3 175B plan (their comments say what they print: the 8B plan's placement ``('R', 'S(0)')`` and
``FSDP 8 (...) × DP 2``), the
``train.py`` pieces under ``torchrun --nproc_per_node 4`` after its ``init`` and ``plan`` commands; the
pipeline-run block needs the 1,024-rank job its plan is for.
"""

from __future__ import annotations

import ast
import builtins
import re
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
EXECUTED = ('zoo.build("mlp")', "plan_shapes(")  # the blocks run here: pins on the MLP, two input shapes


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _bound(tree: ast.AST) -> set[str]:
    """Every name a piece of code binds: assignments, imports, definitions, arguments, loop targets."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            out.add(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            out |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            out.add(node.name)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _undefined(blocks: list[str]) -> list[str]:
    known = set(dir(builtins))
    missing = []
    for k, block in enumerate(blocks):
        for statement in ast.parse(block).body:
            here = _bound(statement)
            for node in ast.walk(statement):
                read = isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
                if read and node.id not in known and node.id not in here:
                    missing.append(f"block {k} line {node.lineno}: {node.id}")
            known |= here
    return missing


def test_every_snippet_names_only_what_it_was_given() -> None:
    blocks = _blocks()
    assert len(blocks) >= 6
    assert _undefined(blocks) == []
    missing = sorted(_undefined(["y = F.relu(x)"]))
    assert missing == ["block 0 line 1: F", "block 0 line 1: x"]  # the check checks


@pytest.mark.slow  # plans the Megatron MLP four times and GPT-2 at two shapes: ~5 CPU s
def test_single_process_snippets_run(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # snippets may write files
    blocks = _blocks()
    chosen = [k for k, b in enumerate(blocks) if any(m in b for m in EXECUTED)]
    assert len(chosen) == len(EXECUTED)
    for k in chosen:
        imports = [
            s for b in blocks[:k] for s in ast.parse(b).body if isinstance(s, ast.Import | ast.ImportFrom)
        ]
        namespace: dict[str, object] = {}
        exec(compile(ast.Module(imports, []), "README imports", "exec"), namespace)
        exec(compile(blocks[k], f"README block {k}", "exec"), namespace)
    assert "weighted step" in namespace["multi"].summary()  # type: ignore[attr-defined]


def test_the_model_list_names_every_zoo_model() -> None:
    """A new-user trial found ``llama3-405b`` missing from the README's list: it names exactly ``zoo.names()``."""
    from autoshard import zoo

    text = " ".join(README.read_text().split())
    listed = text.split("Built-in models (`--model`): ", 1)[1].split(" are built on the `meta` device", 1)[0]
    names = set(re.findall(r"`([a-z0-9-]+)`", listed)) - {"verify"}
    assert names == set(zoo.names()), names ^ set(zoo.names())


def test_train_init_writes_the_files_its_comment_names(tmp_path) -> None:
    """The trial found ``init`` documented to write ``model.safetensors``; it writes shards and an index."""
    line = next(x for x in README.read_text().splitlines() if x.startswith("python examples/train.py init"))
    named = {w.strip(",") for w in line.split("#", 1)[1].split()}
    sys.path.insert(0, str(README.parent / "examples"))
    import train  # examples/train.py

    train.main(["init", "--model", str(tmp_path / "ckpt"), "--preset", "llama-tiny"])
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == named
