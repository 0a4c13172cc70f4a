"""Benchmark: peak memory of importing a large DAB database (issue 15, point 5).

    .venv/bin/python bench/dab_import_memory.py [--mb 300] [--engine sqlite|duckdb]
                                                [--no-baseline]

Generates a DAB dataset folder whose one database is a SQLite (or DuckDB) file of about
``--mb`` MB (one table of ~250-byte rows of varied text, :func:`tests.fakes.dab.make_big_sqlite`)
and, each in a fresh child process (so each peak is its own):

1. **streamed import**: :func:`tasks.datasets.dab_import.import_dab_dataset` (the table streamed in
   chunks into placed Parquet) followed by :func:`tasks.db.engines.ensure_loaded` (the Parquet
   streamed batch by batch into the SQLite engine file agents query): peak RSS and time;
2. **whole-table read** (unless ``--no-baseline``): what the importer did before — the table
   read with ``fetchall`` into one Arrow table — peak RSS only, for the ratio.

Peak RSS is the child's ``VmHWM`` (its own address space's high-water mark; includes the
interpreter and libraries, ~140 MiB).
Everything lives in a temporary directory, removed at exit. The machine is shared: give the
load average (printed) with the figures. Prints the figure LAST:

    dab import peak RSS: <streamed> MiB (<idle> MiB with nothing read) for a <size> MB
    <engine> file (<rows> rows); whole-table read: <baseline> MiB

(one line).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: The child's own peak RSS: ``VmHWM`` of its address space. (``ru_maxrss`` would not do: Linux
#: keeps it across fork + exec, so a child inherits its parent's high-water mark.)
HWM = """
def _hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
"""

CHILD_IMPORT = HWM + """
import json, sys, time
from pathlib import Path
from schemas.settings import Settings
from tasks.core import storage
from tasks.datasets.dab_import import import_dab_dataset
from tasks.db.engines import ensure_loaded
t0 = time.perf_counter()
uri = import_dab_dataset.fn(sys.argv[1], Settings.from_env().artifacts)
t1 = time.perf_counter()
import_kib = _hwm_kib()
m = storage.read_json(uri)
for db in m["databases"]:
    ensure_loaded(m, db, Settings.from_env())
t2 = time.perf_counter()
rows = sum(t["rows"] for d in m["databases"].values() for t in d["tables"].values())
print(json.dumps({"rss_kib": _hwm_kib(), "import_kib": import_kib,
                  "import_s": t1 - t0, "load_s": t2 - t1, "rows": rows}))
"""

CHILD_IDLE = HWM + """
import json
from schemas.settings import Settings
from tasks.core import storage
from tasks.datasets.dab_import import import_dab_dataset
from tasks.db.engines import ensure_loaded
print(json.dumps({"rss_kib": _hwm_kib()}))
"""

CHILD_WHOLE = HWM + """
import json, sqlite3, sys
import pyarrow as pa
path, engine = sys.argv[1], sys.argv[2]
if engine == "sqlite":
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    cur = con.execute("SELECT * FROM events")
    cols, rows = [d[0] for d in cur.description], cur.fetchall()
    table = pa.table({c: pa.array([r[i] for r in rows]) for i, c in enumerate(cols)})
else:
    import duckdb
    con = duckdb.connect(path, read_only=True)
    table = con.sql("SELECT * FROM events").to_arrow_table()
print(json.dumps({"rss_kib": _hwm_kib(),
                  "rows": table.num_rows}))
"""


def _child(code: str, *args: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"child failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _make_duckdb(path: Path, megabytes: int) -> int:
    import duckdb

    rows = megabytes * 1_000_000 // 200  # random hex text compresses to about 200 bytes a row
    con = duckdb.connect(str(path))
    words = "['alpha','bravo','charlie','delta','echo','foxtrot','golf','hotel']"
    con.execute(f"""
        CREATE TABLE events AS
        SELECT i AS id, {words}[1 + i % 8] AS kind, random() * 1000 AS amount,
               md5(i::VARCHAR) || ' ' || md5((i + 1)::VARCHAR) || ' ' || md5((i * 7)::VARCHAR)
                   || ' ' || md5((i * 13)::VARCHAR) || ' ' || md5((i * 17)::VARCHAR) AS note
        FROM range({rows}) t(i)""")
    con.close()
    return rows


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mb", type=int, default=300, help="size of the generated file (MB)")
    p.add_argument("--engine", choices=["sqlite", "duckdb"], default="sqlite")
    p.add_argument("--no-baseline", action="store_true", help="skip the whole-table read")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="querylab-bench-dabmem-"))
    try:
        from tests.fakes.dab import make_big_sqlite

        ds = tmp / "query_bigdata"
        (ds / "query_dataset").mkdir(parents=True)
        data = ds / "query_dataset" / f"events.{args.engine}"
        t0 = time.perf_counter()
        rows = (make_big_sqlite(data, args.mb) if args.engine == "sqlite"
                else _make_duckdb(data, args.mb))
        size_mb = data.stat().st_size / 1e6
        print(f"generated {data.name}: {size_mb:.0f} MB, {rows:,} rows in "
              f"{time.perf_counter() - t0:.1f} s")
        (ds / "db_config.yaml").write_text(textwrap.dedent(f"""\
            db_clients:
              events_database:
                db_type: {args.engine}
                db_path: query_dataset/{data.name}
            """))
        (ds / "db_description.txt").write_text("events_database: events(id, kind, amount, note)\n")
        (ds / "query1").mkdir()
        (ds / "query1" / "query.json").write_text('"How many events are there?"')
        (ds / "query1" / "validate.py").write_text(
            f"def validate(out):\n    return '{rows}' in out, 'expects {rows}'\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "QUERYLAB_HOME": str(tmp / "home"),
               "QUERYLAB_ARTIFACTS": str(tmp / "artifacts")}
        env.pop("QUERYLAB_POSTGRES_URL", None)
        idle = _child(CHILD_IDLE, env=env)["rss_kib"] / 1024
        print(f"interpreter + querylab's modules, nothing read: {idle:.0f} MiB")
        streamed = _child(CHILD_IMPORT, str(ds), env=env)
        assert streamed["rows"] == rows, streamed
        print(f"streamed import: {streamed['import_s']:.1f} s to Parquet (peak RSS "
              f"{streamed['import_kib'] / 1024:.0f} MiB), {streamed['load_s']:.1f} s into the "
              f"{args.engine} engine (peak RSS {streamed['rss_kib'] / 1024:.0f} MiB)")
        baseline = None
        if not args.no_baseline:
            whole = _child(CHILD_WHOLE, str(data), args.engine, env=env)
            baseline = whole["rss_kib"] / 1024
            print(f"whole-table read (the former importer's fetchall): peak RSS "
                  f"{baseline:.0f} MiB")
        load = os.getloadavg()
        print(f"load average: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (2 cores, shared)")
        tail = f"; whole-table read: {baseline:.0f} MiB" if baseline is not None else ""
        print(f"dab import peak RSS: {streamed['rss_kib'] / 1024:.0f} MiB ({idle:.0f} MiB with "
              f"nothing read) for a {size_mb:.0f} MB {args.engine} file ({rows:,} rows){tail}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
