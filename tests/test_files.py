"""The one atomic writer (`hacrl_lightning/files.py`): a file is its old whole self or its new whole self,
a failed write leaves no `.tmp`, and every file a run writes atomically goes through it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hacrl_lightning.files import write_atomically

PACKAGE = Path(__file__).resolve().parents[1] / "hacrl_lightning"


def test_a_write_replaces_the_file_whole_and_leaves_no_tmp(tmp_path):
    target = tmp_path / "summary.json"
    assert write_atomically(target, "first\n") == target
    write_atomically(target, "second, é\n")
    assert target.read_text(encoding="utf-8") == "second, é\n"
    write_atomically(tmp_path / "weights.bin", b"\x00\x01")
    assert (tmp_path / "weights.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json", "weights.bin"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_tmp(tmp_path):
    target = tmp_path / "run_config.json"
    write_atomically(target, '{"seed": 7}\n')
    with pytest.raises(UnicodeEncodeError):
        write_atomically(target, "half \ud800")  # fails after the .tmp was opened
    assert target.read_text() == '{"seed": 7}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["run_config.json"]


def test_no_module_but_files_py_writes_a_file_and_renames_it_into_place():
    """`os.replace(...)` or `Path.replace(...)` of a file written beside it belongs in files.py; the
    directory installs (`agents/agent.py`, `agents/cache.py`) and the vLLM engine's per-step weight file
    (`rollout/vllm.py`, rewritten every step and never read after a crash) are the exceptions."""
    allowed = {"files.py", "agents/agent.py", "agents/cache.py", "rollout/vllm.py"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "replace"
                    and len(node.args) >= 1 and not isinstance(node.args[0], ast.Constant)
                    and name not in allowed
                    and (isinstance(node.func.value, ast.Name) and node.func.value.id == "os"
                         or ".tmp" in ast.unparse(node) or "tmp" in ast.unparse(node.func.value))):
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "atomic writes outside files.py:\n" + "\n".join(found)
