"""Import DAB-format datasets (``query_<name>/`` directories) under DAB's own names and run them
through the same datasets → trials → score → report stages as querylab's own datasets (see
:mod:`tasks.datasets.dab_import`)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow, get_run_logger, unmapped

from schemas.settings import Settings
from tasks.core import storage
from tasks.datasets.dab_import import (
    DabImportError,
    find_dab_datasets,
    import_dab_dataset,
    resolve_imported,
)
from tasks.db.engines import load_database


def load_dab_dataset(dab_dir: str, root: str, scoring_only: bool = False) -> str:
    """Import one DAB dataset folder (a no-op when this version is imported) and load its
    databases into their engines (mapped); returns its manifest URI. Call inside a flow."""
    uri = import_dab_dataset(dab_dir, root, scoring_only=scoring_only)
    dbs = list(storage.read_json(uri)["databases"])
    for future in load_database.map(unmapped(uri), dbs):
        future.result()
    return uri


def load_imported(name: str, root: str) -> str:
    """The manifest of the registered DAB import ``name`` (see
    :func:`tasks.datasets.dab_import.resolve_imported`), loaded into its engines: re-imported from its
    source folder when that still exists (an edited folder is a new version), else the
    recorded manifest. ValueError when nothing of that name was imported."""
    entry = resolve_imported(root, name)
    if entry is None:
        raise ValueError(f"no DAB dataset {name!r} has been imported into {root} "
                         "(`querylab import-dab PATH`)")
    source = Path(entry["source"])
    if source.is_dir():
        return load_dab_dataset(str(source), root, bool(entry.get("scoring_only")))
    uri = entry["manifest"]
    for future in load_database.map(unmapped(uri), list(storage.read_json(uri)["databases"])):
        future.result()
    return uri


@flow(name="import-dab", flow_run_name="import-dab")
def import_dab(
    path: str,
    run_id: str | None = None,
    agents: list[str] | None = None,
    n_trials: int = 1,
    batch_size: int = 25,
    artifacts_root: str | None = None,
    query_ids: list[str] | None = None,
    limit: int | None = None,
    scoring_only: bool = False,
    hints: list[str] | None = None,
    score_no_tool_call: bool = False,
    agent_options: dict | None = None,
    max_error_share: float = 0.0,
) -> dict:
    """Import every DAB dataset under ``path``, each on its own (``scoring_only``: queries,
    validators and ground truth only), and load its databases; then, when ``run_id`` is
    given, run the imported datasets through the benchmark (:func:`flows.benchmark.benchmark`:
    ``agents``, default oracle, ``n_trials`` per query, ``hints``, ``score_no_tool_call``,
    ``query_ids`` / ``limit``).

    A dataset that fails to import does not stop the others: it is listed in ``failures``
    (``[{"path", "error"}]``, one line each) and left out of the run. Returns
    ``{"manifests", "names", "failures"}`` plus the benchmark's ``trials``, ``score`` and
    ``report`` when run (also when some trials errored: the exception's result)."""
    from flows.benchmark import benchmark
    from tasks.core.runs import TrialsErrored

    log = get_run_logger()
    root = artifacts_root or Settings.from_env().artifacts
    manifests, names, failures = [], [], []
    for folder in find_dab_datasets(path):
        try:
            uri = load_dab_dataset(str(folder), root, scoring_only)
        except DabImportError as exc:
            failures.append({"path": str(folder), "error": str(exc)})
            log.warning("DAB import failed: %s", exc)
            continue
        except Exception as exc:  # noqa: BLE001 - one dataset's failure, named, the rest go on
            failures.append({"path": str(folder),
                             "error": f"{folder}: {type(exc).__name__}: {exc}"})
            log.warning("DAB import of %s failed: %s: %s", folder, type(exc).__name__, exc)
            continue
        manifests.append(uri)
        names.append(storage.read_json(uri)["name"])
    out: dict = {"manifests": manifests, "names": names, "failures": failures}
    if run_id and names:
        try:
            result = benchmark(
                run_id=run_id, datasets=names, agents=agents or ["oracle"], n_trials=n_trials,
                batch_size=batch_size, artifacts_root=root, agent_options=agent_options,
                hints=hints, query_ids=query_ids, limit=limit, preflight=False,
                score_no_tool_call=score_no_tool_call, max_error_share=max_error_share,
            )
        except TrialsErrored as exc:
            if exc.result is None:
                raise
            out["errored"] = str(exc)
            result = exc.result
        out.update({k: result[k] for k in ("trials", "score", "report")})
    return out
