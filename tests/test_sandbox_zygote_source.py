"""The zygote program is kept in parts (tasks/sandbox/zygote/*.py) and joined into the one source
the launcher passes to ``python -I -c``: the joined program imports only the standard library,
names nothing that is not defined in it, and runs exactly the parts' statements in one namespace
where no part shadows another's name."""

from __future__ import annotations

import ast
import builtins
import dis
import sys
import types

import pytest

from tasks.sandbox import zygote


def _code_objects(code: types.CodeType):
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_objects(const)


def _top_level_names(tree: ast.Module) -> list[str]:
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, (ast.Name, ast.Tuple)):
                    names += [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]
    return names


def _joined_namespace() -> dict:
    ns = {"__name__": "zygote_joined", "__builtins__": builtins}  # not __main__: main() not run
    exec(compile(zygote.source(), "<zygote>", "exec"), ns)
    return ns


def test_the_joined_program_imports_only_the_standard_library():
    tree = ast.parse(zygote.source())
    assert isinstance(tree.body[0], ast.ImportFrom) and tree.body[0].module == "__future__"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import left at line {node.lineno}"
            assert node.module.partition(".")[0] in sys.stdlib_module_names
            assert node.module != "__future__" or node is tree.body[0]
        elif isinstance(node, ast.Import):
            assert all(a.name.partition(".")[0] in sys.stdlib_module_names for a in node.names)
    assert "tasks." not in "".join(
        ast.unparse(n) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def test_no_part_defines_a_name_another_part_defines():
    owners: dict[str, set[str]] = {}
    for part in zygote.PARTS:
        text = (zygote._HERE / f"{part}.py").read_text(encoding="utf-8")
        for name in _top_level_names(ast.parse(text)):
            owners.setdefault(name, set()).add(part)
    assert {n: p for n, p in owners.items() if len(p) > 1} == {}
    assert {"main", "send_msg", "recv_msg", "_Session", "_cell_main", "_install_seccomp",
            "_install_audit_hook", "CONFIG", "_STATE"} <= set(owners)


def test_every_global_the_joined_program_reads_is_defined_in_it():
    ns = _joined_namespace()
    unresolved = {
        (co.co_name, ins.argval)
        for co in _code_objects(compile(zygote.source(), "<zygote>", "exec"))
        for ins in dis.get_instructions(co)
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")
        and ins.argval not in ns and not hasattr(builtins, ins.argval)
    }
    assert unresolved == set()


def test_the_joined_program_runs_the_parts_code_unchanged():
    """Every statement of every part is in the joined program as written (the same syntax
    tree), but the imports between parts, which became ``pass``."""
    joined = ast.parse(zygote.source()).body
    at = 1  # after the hoisted `from __future__ import annotations`
    for part in zygote.PARTS:
        for node in ast.parse((zygote._HERE / f"{part}.py").read_text(encoding="utf-8")).body:
            here = joined[at]
            at += 1
            if isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__"):
                assert isinstance(here, ast.Pass), (part, node.lineno)
            elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                assert [type(n) for n in here.body] == [ast.Pass] * len(node.body), part
            else:
                assert ast.dump(here) == ast.dump(node), (part, node.lineno)
    assert at == len(joined)
    assert ast.unparse(joined[-1]) == "if __name__ == '__main__':\n    main()"


def test_the_framing_is_the_parts_and_the_harness_imports_it():
    from tasks.sandbox import session_client
    from tasks.sandbox.zygote import framing

    assert zygote.send_msg is framing.send_msg and zygote.recv_msg is framing.recv_msg
    assert session_client.send_msg is framing.send_msg


@pytest.mark.parametrize("line, why", [
    ("import tasks.core.settings\n", "may import only the standard library"),
    ("from querylab import cli\n", "may import only the standard library"),
    ("from .framing import send_msg as send\n", "no `as`"),
    ("from . import framing\n", "no `as`"),
    ("import os; from .framing import send_msg\n", "shares its line"),
])
def test_a_part_that_would_break_the_one_program_is_refused(tmp_path, monkeypatch, line, why):
    for part in zygote.PARTS:
        (tmp_path / f"{part}.py").write_text((zygote._HERE / f"{part}.py").read_text())
    (tmp_path / "cell.py").write_text((tmp_path / "cell.py").read_text() + line)
    monkeypatch.setattr(zygote, "_HERE", tmp_path)
    with pytest.raises(RuntimeError, match=why):
        zygote._joined_part("cell")
