"""Import DAB-format datasets (``query_<name>/`` directories) and run them through the same
trials, score and report stages as querylab's own datasets (see :mod:`tasks.dab_import`)."""

from __future__ import annotations

from prefect import flow, unmapped

from flows.report import report
from flows.trials import run_trials
from schemas.settings import Settings
from tasks import runs, storage
from tasks.dab_import import find_dab_datasets, import_dab_dataset
from tasks.engines import load_database
from tasks.scoring import score_run


@flow(name="import-dab", flow_run_name="import-dab-{run_id}")
def import_dab(
    path: str,
    run_id: str | None = None,
    agents: list[str] | None = None,
    n_trials: int = 1,
    batch_size: int = 25,
    artifacts_root: str | None = None,
    query_ids: list[str] | None = None,
    limit: int | None = None,
    retry_errors: bool = False,
) -> dict:
    """Import every DAB dataset under ``path`` and load its databases; then, when ``run_id`` is
    given, run ``agents`` (default: oracle) ``n_trials`` times per query (``query_ids`` /
    ``limit``: a subset of each dataset's queries; ``retry_errors``: re-run the errored trials
    of an existing run id), score the answers with each query's ``validate.py`` and report
    pass@k. Returns ``{"manifests": [...]}`` plus ``"trials"``,
    ``"score"`` and ``"report"`` when run."""
    root = artifacts_root or Settings.from_env().artifacts
    manifests = [import_dab_dataset(str(d), root) for d in find_dab_datasets(path)]
    for uri in manifests:
        dbs = list(storage.read_json(uri)["databases"])
        for future in load_database.map(unmapped(uri), dbs):
            future.result()
    out: dict = {"manifests": manifests}
    if run_id:
        with runs.run_lease(root, run_id):  # one process per run id (no duplicate model calls)
            out["trials"] = run_trials(run_id, manifests, agents or ["oracle"], n_trials,
                                       batch_size, root, query_ids=query_ids, limit=limit,
                                       retry_errors=retry_errors)
            out["score"] = score_run(run_id, root, manifests)
            out["report"] = report(run_id, root)
    return out
