"""Running an imported DAB query's own ``validate.py`` — scorer-side, in a sandbox of its own.

The ``dab_script`` validator (:class:`DabScriptValidator`, registered in :mod:`tasks.scoring.registry`) calls :func:`run_validate_script`;
the DAB importer (:mod:`tasks.datasets.dab_import`) only records where the script, its query
folder and the checkout's ``common_scaffold`` helpers are, and re-exports these names. The
scorer therefore never imports the importer.
"""

from __future__ import annotations

import json
import secrets
import tempfile
from pathlib import Path

from tasks.core import storage
from tasks.scoring.registry import Validator, validator
from tasks.scoring.validate import Verdict

#: Seconds a ``validate.py`` may run before its verdict is errored (timed out).
VALIDATE_TIMEOUT_S = 30.0
#: Address-space limit of a ``validate.py`` process (MiB).
VALIDATE_MEMORY_MB = 2048
#: Largest file of a query folder or of the checkout's helpers copied for ``validate.py``.
MAX_VALIDATOR_FILE_BYTES = 16 << 20


class ValidatorFileError(ValueError):
    """A file a ``validate.py`` would see cannot be used (outside its root, too large).
    ``str(err)`` is ``"<path>: <problem>"`` (the importer re-raises it as DabImportError)."""

    def __init__(self, path: str | Path, problem: str):
        self.path, self.problem = str(path), problem
        super().__init__(f"{path}: {problem}")


def folder_files(folder: Path, root: Path) -> dict[str, Path]:
    """Regular files under ``folder`` by relative path (``__pycache__`` skipped); each must
    resolve inside ``root`` (symlinks followed) and be at most
    :data:`MAX_VALIDATOR_FILE_BYTES`; ValidatorFileError otherwise."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if "__pycache__" in p.parts or p.is_dir():
            continue
        real = p.resolve()
        if not real.is_relative_to(root.resolve()):
            raise ValidatorFileError(p, f"file: {p} resolves to {real}, outside {root}")
        if not real.is_file():
            continue
        if real.stat().st_size > MAX_VALIDATOR_FILE_BYTES:
            raise ValidatorFileError(p, f"larger than {MAX_VALIDATOR_FILE_BYTES >> 20} MiB")
        out[p.relative_to(folder).as_posix()] = real
    return out


def scaffold_files(root: Path) -> dict[str, Path]:
    """The Python helpers of a DAB checkout at ``root`` (``common_scaffold/**.py``) by path
    relative to ``root``; empty when it has none. ValidatorFileError as :func:`folder_files`."""
    pkg = root / "common_scaffold"
    if not pkg.is_dir():
        return {}
    return {f"common_scaffold/{rel}": p for rel, p in folder_files(pkg, root).items()
            if rel.endswith(".py")}


# -- validate.py in its own sandbox ------------------------------------------------------------

#: The sandbox cell that imports a DAB ``validate.py`` (by its absolute path, as DAB's
#: ``common_scaffold/validate/validate.py`` does, so ``Path(__file__).parent`` is the query
#: folder) and calls ``validate(answer)``; the search path and the answer come from files next
#: to it (the cell sees no querylab state). It prints one marker line: the verdict, or the
#: traceback of whatever went wrong.
_CELL = r"""
import importlib.util, json, os, sys, traceback
def _out(obj):
    sys.stdout.write("\n@@querylab-validate@@" + json.dumps(obj))
try:
    sys.path[:0] = [os.getcwd()] + json.load(open("search_path.json"))
    with open("answer.txt", encoding="utf-8", newline="") as fh:
        answer = fh.read()
    path = os.path.abspath("validate.py")
    spec = importlib.util.spec_from_file_location("validate", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.validate(answer)
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TypeError("validate() returned %r; DAB unpacks (is_valid, reason)" % (result,))
    _out({"ok": bool(result[0]), "reason": str(result[1])})
except BaseException:
    kind, exc, tb = sys.exc_info()
    _out({"error": "".join(traceback.format_exception(kind, exc, tb.tb_next or tb))[-4000:]})
"""


def _run_in_validate_sandbox(cell: str, workdir: Path, timeout_s: float, memory_mb: int):
    """THE call site of the sandbox that runs DAB ``validate.py`` files: a sealed session of
    its own (:func:`tasks.sandbox.session.run_in_folder`), separate from every agent's, that sees a
    read-only copy of ``workdir`` (only the query's own folder, the checkout's helpers and the
    answer) as its working directory and nothing else of the host."""
    from tasks.sandbox.session import run_in_folder

    res, _ = run_in_folder(workdir, cell, timeout_s=timeout_s, memory_mb=memory_mb,
                           name="validate")
    return res


def _artifact_files(source: str | Path) -> dict[str, bytes]:
    """Files under a local folder or an artifact URI prefix, by relative path."""
    local = Path(str(source))
    if "://" not in str(source) and local.is_dir():
        return {rel: p.read_bytes() for rel, p in folder_files(local, local).items()}
    prefix = str(source).rstrip("/") + "/"
    return {uri[len(prefix):]: storage.read_bytes(uri) for uri in storage.list_uris(prefix)}


#: Names the validator's working directory holds besides the query folder's own files.
_RESERVED = ("answer.txt", "search_path.json")


def run_validate_script(
    script: str | Path,
    answer: str | None,
    search_path: list[str] | tuple[str, ...] = (),
    timeout_s: float = VALIDATE_TIMEOUT_S,
    memory_mb: int = VALIDATE_MEMORY_MB,
    folder: str | Path | None = None,
    support: str | Path | None = None,
) -> tuple[bool | None, str]:
    """Judge ``answer`` with a DAB ``validate.py`` (a path or an artifact URI).

    The script runs in a sealed sandbox session of its own (:func:`_run_in_validate_sandbox`),
    never in querylab's process: an unprivileged process whose environment holds no API keys
    or database URLs, with no network and no view of the host's files, within ``memory_mb``
    MiB and ``timeout_s`` seconds of wall-clock and CPU time. Its working directory is a copy
    of the query's own folder (``folder``: a local directory or an artifact prefix; without
    it, ``validate.py`` alone) — so ``open("ground_truth.csv")`` and
    ``Path(__file__).parent / "ground_truth.csv"`` both work — plus the checkout's
    ``common_scaffold`` helpers (``support``, importable) and the answer. ``search_path``
    entries (older manifests point at the DAB checkout this way) have their helpers copied in
    too. The answer reaches ``validate()`` byte for byte (no newline translation).

    Returns ``(ok, reason)``: ``(True|False, <the validator's reason>)`` for a verdict; a None
    answer is ``(False, "no answer")``; ``(None, <why, with the traceback>)`` when the script
    gave no verdict — it raised, returned something else than DAB's ``(is_valid, reason)``
    pair, hung past ``timeout_s`` or ran out of memory: an *errored* verdict (the validator's
    fault, not the answer's).
    """
    if answer is None:
        return False, "no answer"
    local = Path(str(script))
    source = local.read_bytes() if local.is_file() else storage.read_bytes(str(script))
    with tempfile.TemporaryDirectory(prefix="querylab-validate-") as tmp:
        work = Path(tmp)
        # older manifests name the checkout in search_path: its helpers are copied in, since
        # the sandbox sees no host path
        legacy = {rel: p.read_bytes() for entry in search_path if Path(entry).is_dir()
                  for rel, p in scaffold_files(Path(entry).resolve()).items()}
        for files in (legacy, _artifact_files(support) if support else {},
                      _artifact_files(folder) if folder else {}):
            for rel, data in files.items():
                target = work / rel
                if rel in _RESERVED or not target.resolve().is_relative_to(work.resolve()):
                    continue  # an artifact name with '..' never leaves the directory
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        (work / "validate.py").write_bytes(source)
        (work / "answer.txt").write_bytes(answer.encode("utf-8", errors="surrogatepass"))
        (work / "search_path.json").write_text(json.dumps([str(x) for x in search_path]))
        # a fresh marker per call: an answer the validator echoes cannot fake the verdict
        marker = f"@@querylab-validate-{secrets.token_hex(8)}@@"
        cell = _CELL.replace("@@querylab-validate@@", marker)
        res = _run_in_validate_sandbox(cell, work, timeout_s, memory_mb)
    if res.timed_out:
        return None, f"validate.py timed out after {timeout_s:g} s (no verdict)"
    if marker not in res.stdout:
        tail = "\n".join(res.stderr.strip().splitlines()[-20:])
        return None, f"validate.py gave no verdict ({res.error or 'it printed none'}): {tail}"
    result = json.loads(res.stdout.rsplit(marker, 1)[1])
    if "error" in result:
        return None, f"validate.py raised:\n{result['error'].rstrip()}"
    return bool(result["ok"]), result["reason"]


@validator("dab_script")
class DabScriptValidator(Validator):
    """``{"kind": "dab_script", "script": <uri>, "folder": <uri>, "support": <uri>}`` (older
    imports: ``"search_path": [...]``; optional ``"timeout_s"``, default
    :data:`VALIDATE_TIMEOUT_S`): an imported DAB query's own ``validate.py``, run by
    :func:`run_validate_script`; its reason is kept. A script that raises, hangs or returns no
    ``(is_valid, reason)`` pair gives an errored Verdict."""

    def check(self, answer, truth, spec, question=None) -> Verdict:
        ok, reason = run_validate_script(spec["script"], answer, spec.get("search_path", []),
                                         timeout_s=float(spec.get("timeout_s", VALIDATE_TIMEOUT_S)),
                                         folder=spec.get("folder"), support=spec.get("support"))
        if ok is None:  # the script gave no verdict: errored, with its traceback
            return Verdict(False, f"validate.py errored: {reason}", errored=True)
        return Verdict(bool(ok), f"validate.py: {reason}" if reason else "validate.py")
