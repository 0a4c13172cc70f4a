"""Security bench: the hostile-model payload corpus through the real tools.

    .venv/bin/python bench/security.py [--only CATEGORY ...] [--timeout-ms 3000] [--list]

What runs: a scripted OpenAI-compatible server (tests/fakes/openai_server.py, in this
process, real HTTP on 127.0.0.1) plays a hostile model. Each payload of the corpus
(tests/fakes/hostile.py) opens one trial of a batch that goes through the production path
(tasks.trials.stage.run_batch: the real ReAct loop, the real ToolBox, databases opened by
tasks.db.engines as agents get them) on the built ``stocks`` (SQLite + DuckDB) and ``movies``
(PostgreSQL + MongoDB) datasets:

- query_db on all four engines: writes in disguise (CTE-wrapped, comment-hidden, chained,
  dollar-quoted), file access (COPY, lo_import/lo_export, read_csv, replacement scans,
  ATTACH, VACUUM INTO, EXPORT), extensions (INSTALL/LOAD, load_extension, dblink),
  Unicode-escaped PostgreSQL functions, set_config, pragmas, other sessions and databases,
  the marker collection, Mongo $where/$function/$accumulator/$out/$merge, $lookup and
  $graphLookup bombs, huge results (zeroblob, repeat, randomblob), time bombs;
- execute_python: a walk of / for answers, reading the repository / QUERYLAB_HOME / the
  artifact root / /etc/shadow, a .pth in site-packages, writing outside the work dir,
  umount /proc, host processes, environment secrets, network, a bounded fork bomb, memory
  over a process tree, a daemon outliving its cell (these test the sandbox, tasks/sandbox/session.py);
- tool-call shapes: ids of 300 characters to 1 MB or of other types, arguments 100,000 deep,
  of 2 MB, of other types, lone surrogates, undecodable bodies, unknown tools, too many calls;
- DAB inputs (run directly, not as trials): psql meta-commands in dumps, server-side attacks
  in dumps, paths and symlinks out of the dataset folder, validators linked out of their folder;
- integrity after everything: every database's content unchanged, querylab's RSS bounded.

Each payload has a precise "blocked" check and a time bound; one that took longer got
through. Lines for the payloads that got through come first; the last line is the figure:
``security: N payloads, N blocked, 0 got through``. The statement time limit is
``--timeout-ms`` (default 3000, so time bombs end quickly). Everything lives in a fresh
temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
_TMP = Path(tempfile.mkdtemp(prefix="querylab-security-"))
os.environ.update({
    "QUERYLAB_HOME": str(_TMP / "home"),
    "QUERYLAB_ARTIFACTS": str(_TMP / "artifacts"),
    "PREFECT_HOME": str(_TMP / "prefect"),
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "ERROR",
})
for _var in ("QUERYLAB_POSTGRES_URL", "QUERYLAB_MONGO_URI", "OPENAI_API_KEY",
             "QUERYLAB_OPENAI_API_KEY"):
    os.environ.pop(_var, None)


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS(threading.Thread):
    """This process's peak resident memory while running (sampled every 5 ms)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.start_rss = self.peak = _rss()
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(0.005):
            self.peak = max(self.peak, _rss())


def _checksum(db) -> str:
    h = hashlib.sha256()
    for t in sorted(db.list_tables(), key=lambda t: t.name):
        query = ({"collection": t.name, "sort": [["_id", 1]]} if db.engine == "mongodb"
                 else f'SELECT * FROM "{t.name}" ORDER BY 1, 2')
        res = db.query(query if isinstance(query, str) else json.dumps(query),
                       max_rows=10_000_000, max_result_bytes=1 << 30, max_value_bytes=1 << 30)
        h.update(f"{t.name}:{t.row_count}:{json.dumps(res.rows, sort_keys=True, default=str)}".encode())
    return h.hexdigest()


def dab_verdicts(settings, hostile) -> list:
    """The DAB inputs: each is run directly and must raise a DabImportError naming the file
    (and line), with no marker file appearing."""
    from tasks.datasets.dab_import import (
        DabImportError,
        import_dab_dataset,
        read_postgres_dump,
        split_sql_dump,
    )
    from tests.fakes.dab import make_dab_checkout

    mark = hostile._marker()
    out = []

    def refuses(fn, needle):
        """A DAB payload blocked when ``fn`` raises a one-line DabImportError with ``needle``."""
        def run():
            try:
                fn()
            except DabImportError as exc:
                text = str(exc)
                return True if needle in text and "\n" not in text else f"refused, not as expected: {text[:200]}"
            return "accepted"
        return run

    def case(name, run, bound_s=60.0):
        start = time.monotonic()
        try:
            why = run()
        except Exception as exc:  # noqa: BLE001 - any other failure is a finding
            why = f"{type(exc).__name__}: {exc}"[:200]
        if why is True and mark.exists():
            why = f"{mark} was created"
        seconds = time.monotonic() - start
        if why is True and seconds > bound_s:
            why = f"took {seconds:.1f} s"
        p = hostile.Payload(name, "dab", None, None, bound_s)
        out.append(hostile.Verdict(p, why is True, "" if why is True else str(why), seconds))

    for i, m in enumerate(hostile.dab_meta_commands(mark)):
        case(f"psql meta-command in a dump ({i}): {m.strip()[:40]!r}",
             refuses(lambda m=m: list(split_sql_dump(m, "dump.sql")), "psql meta-command refused"))
    for i, (name, text, needle) in enumerate(hostile.dab_server_attacks(mark)):
        f = _TMP / f"dump-{i}.sql"
        f.write_text(text + "\nCREATE TABLE ok (a int);\n")
        if needle is None:  # skipped by the import, which then finishes
            case(f"{name} in a dump (skipped)", lambda f=f: True if "ok" in read_postgres_dump(
                f, settings) else "the import did not finish")
        else:
            case(f"{name} in a dump", refuses(lambda f=f: read_postgres_dump(f, settings), needle))
    for how in ("dotdot", "absolute", "symlink", "mongo symlink", "validator symlink", "description symlink"):
        base = _TMP / f"dab-{how.replace(' ', '-')}"
        shop = make_dab_checkout(base) / "query_tinyshop"
        outside = _TMP / "outside.db"
        shutil.copy(shop / "query_dataset" / "orders.db", outside)
        config = None
        if how == "dotdot":
            config = "db_path: '../../../outside.db'"
        elif how == "absolute":
            config = f"db_path: '{outside}'"
        elif how == "symlink":
            (shop / "query_dataset" / "link.db").symlink_to(outside)
            config = "db_path: query_dataset/link.db"
        elif how == "mongo symlink":
            (_TMP / "secret.json").write_text('{"a": 1}\n')
            (shop / "query_dataset" / "reviews_dump" / "leak.json").symlink_to(_TMP / "secret.json")
        elif how == "validator symlink":
            target = shop / "query1" / "validate.py"
            target.unlink()
            target.symlink_to(_TMP / "secret.json")
        else:
            (shop / "db_description.txt").unlink()
            (shop / "db_description.txt").symlink_to("/etc/passwd")
        if config:
            (shop / "db_config.yaml").write_text(
                f"db_clients:\n  x:\n    db_type: sqlite\n    {config}\n")
        case(f"path out of the dataset folder: {how}",
             refuses(lambda shop=shop, base=base: import_dab_dataset.fn(str(shop), str(base / "art")),
                     "outside"))
    return out


def integrity_verdicts(hostile, before: dict, after: dict, rss: PeakRSS, rss_cap: int) -> list:
    out = []
    for name in before:
        ok = before[name] == after.get(name)
        p = hostile.Payload(f"no write reached {name}", "integrity", None, None)
        out.append(hostile.Verdict(p, ok, "" if ok else "its content changed"))
    growth = rss.peak - rss.start_rss
    p = hostile.Payload("querylab's RSS bounded during huge results", "integrity", None, None)
    out.append(hostile.Verdict(p, growth < rss_cap,
                               "" if growth < rss_cap else f"grew by {growth >> 20} MiB"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", help="run only categories starting with this")
    ap.add_argument("--timeout-ms", type=int, default=3000, help="statement time limit (ms)")
    ap.add_argument("--list", action="store_true", help="list the payloads and exit")
    args = ap.parse_args()
    os.environ["QUERYLAB_STATEMENT_TIMEOUT_MS"] = str(args.timeout_ms)

    import logging

    from schemas.settings import Settings
    from tasks.core import storage
    from tasks.datasets.build import build_dataset_artifacts
    from tasks.db.engines import ensure_loaded, open_databases
    from tasks.datasets.spec import spec_path
    from tests.fakes import hostile
    from tests.fakes.openai_server import ScriptedOpenAIServer

    logging.getLogger("sqlglot").setLevel(logging.ERROR)  # refused statements warn otherwise
    settings = Settings.from_env()
    site = Path(sysconfig.get_paths()["purelib"])
    groups = {
        "stocks": hostile.tool_call_shapes() + hostile.sqlite_payloads() + hostile.duckdb_payloads(),
        "movies": hostile.postgres_payloads() + hostile.mongo_payloads(),
        "python": hostile.python_payloads(ROOT, Path(settings.home), settings.artifacts, site),
    }
    if args.only:
        for g in groups:
            groups[g] = [p for p in groups[g] if any(p.category.startswith(o) for o in args.only)]
    if args.list:
        for g, ps in groups.items():
            for p in ps:
                print(f"{p.category:<20} {p.name}")
        return
    start = time.monotonic()
    manifests = {}
    for name in ("stocks", "movies"):
        uri = build_dataset_artifacts.fn(str(spec_path(name)), settings.artifacts)
        manifests[name] = (uri, storage.read_json(uri))
        for db in manifests[name][1]["databases"]:
            ensure_loaded(manifests[name][1], db, settings)
    dbs = {f"{n}/{db}": d for n, (_, m) in manifests.items()
           for db, d in open_databases(m, settings).items()}
    before = {n: _checksum(d) for n, d in dbs.items()}
    queries = {"stocks": "nasdaq_top_volume_2012", "movies": "spielberg_box_office"}
    # cache off: groups share the dataset's first messages and trial indices; cells get 256 MiB
    # for their whole process tree (the memory payload forks 3 x 200 MiB)
    options = {g: {"cache": "off"} for g in groups}
    options["python"]["python_memory_mb"] = 256
    verdicts = []
    rss = PeakRSS()
    current = {"respond": hostile.responder([])}
    with ScriptedOpenAIServer(lambda body, i: current["respond"](body, i)) as srv:
        agent = hostile.register_model(srv, _TMP)
        rss.start()
        for group, payloads in groups.items():
            if not payloads:
                continue
            dataset = "stocks" if group == "python" else group
            current["respond"] = hostile.responder(payloads)
            # cache off: groups share the dataset's first messages and trial indices
            verdicts += hostile.run_payloads(payloads, srv, agent, manifests[dataset][0],
                                             queries[dataset], settings.artifacts, f"sec-{group}",
                                             options=options[group])
        rss.stop.set()
        rss.join()
    if not args.only or any("dab".startswith(o) or o.startswith("dab") for o in args.only):
        verdicts += dab_verdicts(settings, hostile)
    after = {n: _checksum(d) for n, d in dbs.items()}
    if not args.only or any("integrity".startswith(o) for o in args.only):
        verdicts += integrity_verdicts(hostile, before, after, rss, rss_cap=256 << 20)
    left = hostile.remove_leftovers()
    if left:
        print(f"removed what payloads created on the host: {', '.join(map(str, left))}")
    through = [v for v in verdicts if not v.blocked]
    by_cat: dict[str, list[int]] = {}
    for v in verdicts:
        by_cat.setdefault(v.payload.category, [0, 0])
        by_cat[v.payload.category][0] += 1
        by_cat[v.payload.category][1] += v.blocked
    for cat, (n, b) in sorted(by_cat.items()):
        print(f"  {cat:<20} {n:>3} payloads, {b:>3} blocked")
    for v in through:
        print(f"GOT THROUGH [{v.payload.category}] {v.payload.name}: {v.why}")
    print(f"({time.monotonic() - start:.0f} s; load average {os.getloadavg()[0]:.2f}; "
          f"statement time limit {args.timeout_ms} ms)")
    print(f"security: {len(verdicts)} payloads, {len(verdicts) - len(through)} blocked, "
          f"{len(through)} got through")


if __name__ == "__main__":
    try:
        main()
    finally:
        shutil.rmtree(_TMP, ignore_errors=True)
