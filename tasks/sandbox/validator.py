"""A folder's script in a sealed sandbox session of its own (DAB's ``validate.py``):
:func:`run_in_folder` shows the script a read-only copy of its folder at ``/task`` (its cwd),
libraries under ``/opt/querylab-lib`` and a scratch work directory; :func:`run_validator` judges
an answer with the folder's ``validate.py`` that way. See :mod:`tasks.sandbox.session`.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from tasks.sandbox.isolation import TASK_DIR, SandboxError, _MiB
from tasks.sandbox.pool import Sandbox, shared_sandbox
from tasks.sandbox.session_client import CellResult


def _folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(relative path, file) for every regular file under ``folder`` (symlinks skipped: they
    could point anywhere on the host)."""
    out = []
    for root, dirs, files in os.walk(folder, followlinks=False):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for f in files:
            p = Path(root, f)
            if stat.S_ISREG(p.lstat().st_mode):
                out.append((p.relative_to(folder).as_posix(), p))
    return sorted(out)


def run_in_folder(
    folder: str | Path,
    code: str,
    files: dict[str, bytes] | None = None,
    libraries: list[str | Path] | tuple = (),
    timeout_s: float = 30.0,
    memory_mb: int = 1024,
    cpu_s: int | None = None,
    disk_mb: int = 64,
    max_folder_mb: int = 64,
    name: str = "script",
    sandbox: Sandbox | None = None,
    require_isolation: bool = False,
) -> tuple[CellResult, dict[str, bytes]]:
    """Run ``code`` in a sealed session of its own that sees a read-only copy of ``folder``
    at ``/task`` (its working directory, so ``Path(__file__).parent`` of a script loaded from
    there is ``/task``), of each of ``libraries`` (host directories of Python packages, e.g. a
    DAB checkout's ``common_scaffold``) under ``/opt/querylab-lib/<name>``, and a ``disk_mb``
    MiB scratch work directory ``/home/sandbox`` (``HOME``, ``/tmp``) holding ``files``
    (relative path → bytes). Nothing else of the host is visible. Only regular files are
    copied (symlinks are skipped), at most ``max_folder_mb`` MiB in all. Limits:
    ``timeout_s`` wall seconds, ``memory_mb`` MiB, ``cpu_s`` CPU seconds (default the timeout
    + 1).

    Returns ``(result, outputs)``: the :class:`CellResult` and the work-directory files named
    in ``files`` with a ``.out`` suffix added (read back when they exist; e.g. a verdict file
    the code wrote). Raises SandboxError when the sandbox cannot start or the folder is over
    ``max_folder_mb``, SandboxUnavailable with ``require_isolation`` on a machine that cannot
    isolate, NotADirectoryError for a ``folder`` or library that is not a directory.
    """
    folder = Path(folder).resolve()
    trees = [("task", "", folder)] + [("lib", Path(lib).resolve().name, Path(lib).resolve())
                                       for lib in libraries]
    todo = []
    for root, prefix, path in trees:
        if not path.is_dir():
            raise NotADirectoryError(f"{path}: not a directory")
        todo += [(root, f"{prefix}/{rel}" if prefix else rel, p) for rel, p in _folder_files(path)]
    total = sum(p.stat().st_size for _, _, p in todo)
    if total > max_folder_mb * _MiB:
        raise SandboxError(f"{folder}: {total / _MiB:.0f} MiB of files, more than the "
                           f"{max_folder_mb} MiB a sandboxed script may see")
    sb = sandbox or shared_sandbox()
    with sb.open_session(disk_mb=disk_mb, cwd=TASK_DIR, readonly_mb=max_folder_mb + 1,
                         require_isolation=require_isolation) as session:
        for root, rel, p in todo:
            session.put_readonly(root, rel, p.read_bytes())
        for rel, data in (files or {}).items():
            session.put_file(rel, data)
        res = session.run(code, name=name, timeout_s=timeout_s, memory_mb=memory_mb,
                          cpu_s=cpu_s or int(timeout_s) + 1)
        outputs = {}
        for rel in files or {}:
            try:
                outputs[rel + ".out"] = session.get_file(rel + ".out", 1 << 20)
            except SandboxError:
                pass
        return res, outputs


#: The cell that loads ``/task/validate.py`` and judges the answer in ``answer.txt``; its
#: verdict goes to ``answer.txt.out`` (read back by :func:`run_validator`).
_VALIDATOR = r"""
import importlib.util, json, sys
sys.path[:0] = ["/task", "/opt/querylab-lib"]
spec = importlib.util.spec_from_file_location("validate", "/task/validate.py")
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
result = module.validate(open("/home/sandbox/answer.txt", encoding="utf-8").read())
ok, reason = (tuple(result) + ("",))[:2] if isinstance(result, (tuple, list)) else (result, "")
with open("/home/sandbox/answer.txt.out", "w") as fh:
    json.dump({"ok": bool(ok), "reason": str(reason)}, fh)
"""


def run_validator(
    folder: str | Path,
    answer: str | None,
    libraries: list[str | Path] | tuple = (),
    timeout_s: float = 30.0,
    memory_mb: int = 1024,
    sandbox: Sandbox | None = None,
    require_isolation: bool = False,
) -> tuple[bool, str]:
    """Judge ``answer`` with the ``validate.py`` in ``folder`` (DAB's ``validate(llm_output)
    -> (bool, reason)``), run by :func:`run_in_folder`: the script sees only ``folder``
    (read-only, its cwd, so ``Path(__file__).parent / "ground_truth.csv"`` works), the
    ``libraries`` (importable, e.g. ``common_scaffold``) and a scratch directory, within
    ``timeout_s`` seconds and ``memory_mb`` MiB. Returns ``(ok, reason)``; a script that
    fails, hangs or gives no verdict yields ``(False, <why>)``; a None answer is wrong."""
    if answer is None:
        return False, "no answer"
    if not (Path(folder) / "validate.py").is_file():
        return False, f"{folder}: no validate.py"
    res, out = run_in_folder(folder, _VALIDATOR, {"answer.txt": answer.encode("utf-8")},
                             libraries=libraries, timeout_s=timeout_s, memory_mb=memory_mb,
                             name="validate", sandbox=sandbox, require_isolation=require_isolation)
    if res.timed_out:
        return False, f"validate.py timed out after {timeout_s:g} s"
    verdict = out.get("answer.txt.out")
    if not res.ok or not verdict:
        tail = "\n".join(res.stderr.strip().splitlines()[-5:])
        return False, f"validate.py failed ({res.error or 'no verdict'}): {tail}"
    result = json.loads(verdict)
    return bool(result["ok"]), str(result["reason"])
