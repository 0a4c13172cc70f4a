"""``querylab datasets list|new|build`` and ``querylab import-dab``: the dataset catalogue on the
command line (wired into :mod:`querylab.cli` through :func:`register`)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


# -- scaffold templates ------------------------------------------------------------------------
# A working example over a real data set that ships in a PyPI package (Palmer penguins, in
# bokeh-sampledata): two databases, a reformatted key, a value moved into text, two questions.
# The data engineer replaces sources, tables, placements and queries; the test keeps working.

SPEC_TEMPLATE = '''\
# {name}: <one line: what the data is, where it comes from, its licence>.
# Scaffolded by `querylab datasets new {name}` as a working example over the Palmer penguins
# (Gorman, Williams & Fraser 2014, CC0; `penguins.csv` in the PyPI package bokeh-sampledata).
# Replace sources, tables, placements and queries with your own; docs/adding-a-dataset.md
# walks through each part. Say here how big each placed table is (MongoDB: keep collections
# to a few thousand documents; the in-process fallback scans ~2-3k documents per 0.1 s).
name: {name}
version: "1"
description: >-
  Palmer penguins: 344 penguins measured on three islands of the Palmer Archipelago, with
  field notes in SQLite and lab measurements in DuckDB.
hints: |
  - A penguin is `specimen_id` in SQLite `field.specimens` and `PEN-` + the id zero-padded to
    4 digits in DuckDB `lab.measurements.specimen` (`PEN-0042`).
  - The species is not a column: it is written in the field note.
seed: 1

sources:
  penguins_raw: {{package: bokeh_sampledata, path: _data/penguins.csv, format: csv}}

tables:
  penguins:
    sql: |
      SELECT row_number() OVER () AS specimen_id, species, island,
             TRY_CAST(bill_length_mm AS DOUBLE) AS bill_length_mm,
             TRY_CAST(bill_depth_mm AS DOUBLE) AS bill_depth_mm,
             TRY_CAST(flipper_length_mm AS BIGINT) AS flipper_length_mm,
             TRY_CAST(body_mass_g AS BIGINT) AS body_mass_g, nullif(sex, 'NA') AS sex
      FROM penguins_raw
    columns:
      specimen_id: int64
      species: string
      island: string
      bill_length_mm: float64
      bill_depth_mm: float64
      flipper_length_mm: int64
      body_mass_g: int64
      sex: string

databases:
  field:
    engine: sqlite
    description: Field records of the tagged penguins (`specimens`).
  lab:
    engine: duckdb
    description: Lab measurements (`measurements`).

placements:
  - database: field
    name: specimens
    source: penguins
    columns: [specimen_id, species, island, sex]
    transforms:
      - op: text
        column: field_note
        templates:
          - "Tagged on {{island}}; identified as a {{species}} penguin."
          - "{{species}} penguin, sex {{sex}}, caught on {{island}}."
        drop: [species]
    description: One row per tagged penguin.
    column_notes:
      field_note: free-text note written at tagging
  - database: lab
    name: measurements
    source: penguins
    columns: [specimen_id, bill_length_mm, bill_depth_mm, flipper_length_mm, body_mass_g]
    transforms:
      - {{op: format, column: specimen, template: "PEN-{{specimen_id:04d}}", drop: [specimen_id]}}
    description: One row per measured penguin.
    column_notes:
      body_mass_g: grams

queries:
  - id: gentoo_mean_mass
    question: What is the mean body mass, in grams, of the Gentoo penguins? Round to 1 decimal.
    requires:
      sources: [field.specimens, lab.measurements]
      operations: [join_reformatted_key, extract_from_text]
    ground_truth:
      sql: SELECT avg(body_mass_g) FROM penguins WHERE species = 'Gentoo'
    validator: {{kind: number, decimals: 1}}
    reference:
      - tool: query_db
        args: {{db: field, query: "SELECT specimen_id FROM specimens WHERE field_note LIKE '%Gentoo%'"}}
      - tool: query_db
        args: {{db: lab, query: "SELECT specimen, body_mass_g FROM measurements WHERE body_mass_g IS NOT NULL"}}
      - tool: execute_python
        args:
          code: |
            gentoo = {{r["specimen_id"] for r in var_call_1}}
            mass = [r["body_mass_g"] for r in var_call_2 if int(r["specimen"][4:]) in gentoo]
            print(round(sum(mass) / len(mass), 2))

  - id: dream_long_flippers
    question: >-
      How many Chinstrap penguins tagged on Dream island have flippers longer than 200 mm?
    requires:
      sources: [field.specimens, lab.measurements]
      operations: [join_reformatted_key, extract_from_text]
    ground_truth:
      sql: |
        SELECT count(*) FROM penguins
        WHERE species = 'Chinstrap' AND island = 'Dream' AND flipper_length_mm > 200
    validator: {{kind: number, decimals: 0}}
    reference:
      - tool: query_db
        args: {{db: field, query: "SELECT specimen_id FROM specimens WHERE island = 'Dream' AND field_note LIKE '%Chinstrap%'"}}
      - tool: query_db
        args: {{db: lab, query: "SELECT specimen FROM measurements WHERE flipper_length_mm > 200"}}
      - tool: execute_python
        args:
          code: |
            chinstrap = {{r["specimen_id"] for r in var_call_1}}
            print(sum(1 for r in var_call_2 if int(r["specimen"][4:]) in chinstrap))
'''

FLOW_TEMPLATE = '''\
"""Build the ``{name}`` dataset (spec: ``data/{name}.yaml``)."""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from flows.datasets import build_from_spec

SPEC = Path(__file__).resolve().parents[2] / "data" / "{name}.yaml"


@flow(name="build-{name}")
def build_{name}(artifacts_root: str | None = None, source_dir: str | None = None) -> str:
    """Extract, perturb and place ``{name}``; returns its manifest URI."""
    return build_from_spec(SPEC, artifacts_root, source_dir)
'''

TEST_TEMPLATE = '''\
"""The ``{name}`` dataset: it builds deterministically, its perturbations bite, and the oracle
(each query's reference solution, run through the real tools) scores 1.0 on every query."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from schemas.settings import Settings
from tasks.core import storage
from tasks.agents.react import run_oracle
from tasks.datasets.build import build_dataset_artifacts
from tasks.db.engines import ensure_loaded, open_databases
from tasks.scoring.scoring_file import full_manifest
from tasks.agents.tools import ToolBox
from tasks.scoring.validate import is_correct

SPEC = Path(__file__).resolve().parents[1] / "data" / "{name}.yaml"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The built dataset as the scorer sees it (public manifest + private scoring file:
    questions with their ground truth, validator, reference solution and requirements)."""
    root = tmp_path_factory.mktemp("{name}")
    settings = Settings(artifacts=str(root / "artifacts"), home=root / "home")
    uri = build_dataset_artifacts.fn(str(SPEC), settings.artifacts)
    manifest = storage.read_json(uri)
    for db in manifest["databases"]:
        ensure_loaded(manifest, db, settings)
    return full_manifest(uri), settings


def test_oracle_answers_every_query(built, tmp_path):
    manifest, settings = built
    databases = open_databases(manifest, settings)
    for query in manifest["queries"]:
        outcome = run_oracle(ToolBox(databases, tmp_path / query["id"]), query["reference"],
                             query["question"])
        assert outcome.error is None, (query["id"], outcome.error)
        assert is_correct(outcome.answer, query["ground_truth"], query["validator"]), (
            query["id"], outcome.answer, query["ground_truth"])


def test_every_query_needs_two_databases(built):
    manifest, _ = built
    for query in manifest["queries"]:
        dbs = {{s.split(".")[0] for s in query["requires"]["sources"]}}
        assert len(dbs) >= 2, query["id"]


def test_dropped_columns_are_gone(built):
    manifest, _ = built
    spec = yaml.safe_load(SPEC.read_text())
    for placement in spec["placements"]:
        placed = manifest["databases"][placement["database"]]["tables"][placement["name"]]
        for op in placement.get("transforms", []):
            for column in op.get("drop", []):
                assert column not in placed["columns"], (placement["name"], column)


def test_build_is_deterministic(tmp_path):
    a = build_dataset_artifacts.fn(str(SPEC), str(tmp_path / "a"))
    b = build_dataset_artifacts.fn(str(SPEC), str(tmp_path / "b"))
    files_a = storage.list_uris(str(tmp_path / "a"), ".parquet")
    files_b = storage.list_uris(str(tmp_path / "b"), ".parquet")
    assert len(files_a) == len(files_b) > 0
    for fa, fb in zip(files_a, files_b):
        assert Path(fa).read_bytes() == Path(fb).read_bytes(), fa
'''


def scaffold_dataset(name: str, root: str | Path = REPO_ROOT, force: bool = False) -> list[Path]:
    """Write ``data/<name>.yaml``, ``flows/datasets/<name>.py`` and
    ``tests/test_dataset_<name>.py`` under ``root`` (default: the repository); returns them.

    The spec is a working example (Palmer penguins from bokeh-sampledata) that builds and whose
    test passes unchanged. Raises ValueError for a bad name and FileExistsError when any of the
    files exists (nothing is written then) unless ``force``."""
    if not NAME_RE.match(name):
        raise ValueError(
            f"bad dataset name {name!r}: use lower-case letters, digits and _, starting with a letter"
        )
    root = Path(root)
    files = {
        root / "data" / f"{name}.yaml": SPEC_TEMPLATE.format(name=name),
        root / "flows" / "datasets" / f"{name}.py": FLOW_TEMPLATE.format(name=name),
        root / "tests" / f"test_dataset_{name}.py": TEST_TEMPLATE.format(name=name),
    }
    existing = [p for p in files if p.exists()]
    if existing and not force:
        raise FileExistsError(f"not overwriting {[str(p) for p in existing]} (use --force)")
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return list(files)


# -- commands ----------------------------------------------------------------------------------


def _dataset_rows() -> list[dict]:
    from tasks.datasets.catalogue import SHARED_DATASETS, dataset_names, shared_data_dir
    from tasks.datasets.spec import SpecError, check_sources, load_spec, spec_path

    rows = []
    for name in dataset_names():
        row = {"name": name, "source": "", "engines": "", "queries": "", "status": "ready"}
        try:
            path = spec_path(name)
            spec = load_spec(path)
            shared = name in SHARED_DATASETS
            row["source"] = "shared data" if shared else (
                "PyPI" if all(s.package for s in spec.sources.values()) else "PyPI + data/"
            )
            row["engines"] = ", ".join(sorted({d.engine for d in spec.databases.values()}))
            row["queries"] = str(len(spec.queries))
            check_sources(path, spec, shared_data_dir() if shared else None)
        except SpecError as exc:
            row["status"] = f"not buildable: {exc.field}: {exc.problem}"
        rows.append(row)
    return rows


def cmd_list(args: argparse.Namespace) -> int:
    """Print every dataset: where its data comes from, its engines, its query count and
    whether it can be built here."""
    rows = _dataset_rows()
    cols = ["name", "source", "engines", "queries", "status"]
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols[:-1]}
    print("  ".join(c.ljust(width.get(c, 0)) for c in cols).rstrip())
    for r in rows:
        print("  ".join(r[c].ljust(width.get(c, 0)) for c in cols).rstrip())
    return 0


def cmd_new(args: argparse.Namespace) -> int:
    """Scaffold a dataset (spec + flow + test)."""
    try:
        files = scaffold_dataset(args.name, args.root or REPO_ROOT, args.force)
    except (ValueError, FileExistsError) as exc:
        print(f"querylab datasets new: {exc}", file=sys.stderr)
        return 2
    for f in files:
        print(f"wrote {f}")
    print(f"next: edit data/{args.name}.yaml (docs/adding-a-dataset.md), then "
          f"`querylab datasets build {args.name}` and "
          f"`.venv/bin/python -m pytest tests/test_dataset_{args.name}.py`")
    return 0


def load_shipped_spec(name: str) -> None:
    """Load ``data/<name>.yaml`` when it exists (an imported dataset has none): SpecError
    ``<file>: <field>: <problem>`` when it is broken — before any flow or Prefect import."""
    from tasks.datasets.spec import DATA_DIR, load_spec

    path = DATA_DIR / f"{name}.yaml"
    if path.exists():
        load_spec(path)


def cmd_build(args: argparse.Namespace) -> int:
    """Build and load the named datasets; prints each manifest URI. An unknown name is one
    line (``querylab datasets build: ...``, with a did-you-mean) before Prefect is imported."""
    from querylab import UsageError
    from querylab.cli import check_datasets

    try:
        check_datasets(args.names)
    except UsageError as exc:
        print(f"querylab datasets build: {exc}", file=sys.stderr)
        return 2
    from tasks.datasets.spec import SpecError

    for name in args.names:  # a broken spec: one line, before Prefect starts
        try:
            load_shipped_spec(name)
        except SpecError as exc:
            print(f"querylab datasets build {name}: {exc}", file=sys.stderr)
            return 2
    from flows.datasets import dataset_flows

    flows = dataset_flows()
    for name in args.names:
        try:
            print(flows[name](artifacts_root=args.artifacts, source_dir=args.source_dir))
        except SpecError as exc:
            print(f"querylab datasets build {name}: {exc}", file=sys.stderr)
            return 2
    return 0


def cmd_import_dab(args: argparse.Namespace) -> int:
    """Import DAB-format datasets under DAB's names, each on its own (``--scoring-only``:
    queries, validators and ground truth, no database); unless ``--no-run``, run them through
    the benchmark (``--agent``, default oracle; ``--limit`` / ``--query``: a subset), score
    the answers with each query's ``validate.py`` and print pass@k — and, on DAB datasets, DAB's
    leaderboard pass@1 (the last line, ``DAB pass@1: 0.xxxx``). Failed datasets are listed at
    the end, one line each. Exit 1 when a dataset failed to import, trials errored (more than
    ``--max-error-share``), no trial was scored or the oracle failed; 2 for bad input."""
    from querylab import UsageError, run_id_or_new
    from querylab.cli import (
        check_agents_now,
        check_scored,
        print_dab_figures,
        quiet_tracebacks,
        run_preflight,
    )
    from querylab.cmd_agents import agent_options_from_args
    from querylab.cmd_report import print_report, with_run_details
    from schemas.settings import Settings
    from tasks.datasets.dab_import import DabImportError, find_dab_datasets

    run_id = None if args.no_run else run_id_or_new(args.run_id)
    agents = args.agent or ["oracle"]
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.trials < 1 or args.batch_size < 1:
        raise UsageError("--trials and --batch-size must be at least 1")
    try:
        find_dab_datasets(args.path)
    except DabImportError as exc:
        print(f"querylab import-dab: {exc}", file=sys.stderr)
        return 2
    options = agent_options_from_args(args)
    root = args.artifacts or Settings.from_env().artifacts
    if run_id is not None:
        check_agents_now(agents, options, "import-dab")
        run_preflight(agents, options, "import-dab", (root, run_id))  # recorded: paid requests
        _check_replay_files(agents, args)
    from flows.datasets.dab_import import import_dab

    if not getattr(args, "debug", False):
        quiet_tracebacks()
    try:
        out = import_dab(
            path=args.path, run_id=run_id, agents=agents, n_trials=args.trials,
            batch_size=args.batch_size, artifacts_root=root,
            query_ids=args.query or None, limit=args.limit, scoring_only=args.scoring_only,
            hints=list(dict.fromkeys(args.hints or ["off"])),
            score_no_tool_call=args.score_no_tool_call, agent_options=options,
            max_error_share=args.max_error_share,
        )
    except DabImportError as exc:
        print(f"querylab import-dab: {exc}", file=sys.stderr)
        return 2
    for uri, name in zip(out["manifests"], out["names"]):
        print(f"dataset:   {name}  {uri}")
    status = 1 if out["failures"] else 0
    if run_id is not None and out["names"]:
        print(f"run:       {run_id}")
        status = max(status, print_report(with_run_details(out["report"], root, run_id)))
        if out.get("errored"):
            print(f"querylab import-dab: {out['errored']}", file=sys.stderr)
            status = 1
        status = max(status, check_scored(out["score"], "import-dab"))
    _print_failures(out["failures"])
    if run_id is not None and out["names"]:
        print_dab_figures(root, run_id, out["manifests"])
    return status


def _check_replay_files(agents: list[str], args: argparse.Namespace) -> None:
    """Before anything is imported: every entry of each replay agent's answer file must be for
    a dataset of this checkout (by DAB's name, ignoring case) and one of its query folders —
    UsageError / ReplayError naming those that are not (a typo would score nothing)."""
    from querylab import UsageError
    from tasks.datasets.dab_import import DabImportError, dataset_name, find_dab_datasets
    from tasks.agents.replay import load_answers
    from tasks.trials.stage import parse_agent

    from tasks.agents.replay import answers_for, unmatched_datasets

    found = []
    for folder in find_dab_datasets(args.path):
        try:
            queries = sorted(p.name for p in folder.iterdir()
                             if p.is_dir() and re.fullmatch(r"query\d+", p.name))
            found.append({"name": dataset_name(folder), "format": "dab",
                          "queries": [{"id": q} for q in queries]})
        except DabImportError:
            continue  # listed among the failures by the import
    for agent in agents:
        kind, arg = parse_agent(agent)
        if kind != "replay":
            continue
        answers = load_answers(arg)
        missing = unmatched_datasets(answers, found)
        if missing:
            shown = ", ".join(f"{d!r} ({n} entries)" for d, n in missing.items())
            raise UsageError(f"{arg}: entries for datasets that {args.path} does not have: "
                             f"{shown}; it has {sorted(m['name'] for m in found)}")
        for m in found:  # every query an entry names is a query folder
            answers_for(answers, m)


def _print_failures(failures: list[dict]) -> None:
    """The datasets that failed to import, one line each (last but the DAB figure)."""
    if not failures:
        return
    print(f"\n{len(failures)} dataset(s) failed to import (the others are usable):",
          file=sys.stderr)
    for f in failures:
        print(f"  {f['error'].splitlines()[0]}", file=sys.stderr)


def register(subparsers) -> None:
    """Add ``datasets`` (``list``, ``new``, ``build``) and ``import-dab`` to the ``querylab``
    argument parser's subparsers."""
    d = subparsers.add_parser("datasets", help="list, scaffold and build datasets")
    dsub = d.add_subparsers(dest="datasets_command", required=True)

    ls = dsub.add_parser("list", help="every dataset with its source, engines and status")
    ls.set_defaults(func=cmd_list)

    new = dsub.add_parser("new", help="scaffold data/NAME.yaml + flow + test")
    new.add_argument("name")
    new.add_argument("--root", help="repository root to write into (default: this checkout)")
    new.add_argument("--force", action="store_true", help="overwrite existing files")
    new.set_defaults(func=cmd_new)

    b = dsub.add_parser("build", help="build and load datasets")
    b.add_argument("names", nargs="+", metavar="NAME")
    b.add_argument("--source-dir", help="directory holding the source files (shared-data "
                   "datasets default to $QUERYLAB_SHARED_DATA or ../shared/data)")
    b.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    b.set_defaults(func=cmd_build)

    imp = subparsers.add_parser(
        "import-dab", help="import DAB-format datasets (query_<name>/) and run trials on them"
    )
    imp.add_argument("path", help="a DAB checkout or one query_<name>/ directory")
    imp.add_argument("--agent", action="append",
                     help="oracle (default), openai:<model>, local:<model> or "
                     "replay:<answers.json>; repeat")
    imp.add_argument("--trials", type=int, default=1, help="trials per query (default 1)")
    imp.add_argument("--batch-size", type=int, default=25, help="trials per mapped task")
    imp.add_argument("--query", action="append", metavar="ID",
                     help="run only this query (query<N> or <dataset>/query<N>); repeat")
    imp.add_argument("--limit", type=int, help="run only the first N queries of each dataset")
    imp.add_argument("--max-error-share", type=float, default=0.0, metavar="X",
                     help="share of each agent's trials that may error for exit 0 "
                     "(default 0)")
    imp.add_argument("--run-id", help="run id (default: a new one; an existing one resumes)")
    imp.add_argument("--no-run", action="store_true", help="import and load only")
    imp.add_argument("--scoring-only", action="store_true",
                     help="import queries, validators and ground truth only (no database, "
                     "no data files needed): for rescoring answer files with --agent replay:FILE")
    imp.add_argument("--hints", action="append", choices=["on", "off"],
                     help="off (default, as DAB): question + db_description.txt; on: "
                     "db_description_withhint.txt appended (DAB's --use_hints); repeat for both")
    imp.add_argument("--score-no-tool-call", action="store_true",
                     help="score the text of a no_tool_call ending (DAB: invalid, the default)")
    imp.add_argument("--artifacts", help="artifact root (default: $QUERYLAB_ARTIFACTS)")
    from querylab import cmd_agents

    cmd_agents.add_agent_options(imp)
    imp.set_defaults(func=cmd_import_dab)
