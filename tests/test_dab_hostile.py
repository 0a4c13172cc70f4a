"""A hostile DAB checkout: dumps with psql meta-commands or server-side attacks, paths that
leave the dataset folder, validators that look around. Each is refused with a one-line
DabImportError naming the file (and line), nothing runs outside the import role's scratch
database, and no marker file appears."""

from __future__ import annotations

import json
import os
import shutil
import textwrap
import uuid
from pathlib import Path

import psycopg
import pytest

from tasks.datasets.dab_import import (
    DabImportError,
    import_dab_dataset,
    read_postgres_dump,
    run_validate_script,
    split_sql_dump,
)
from tests.fakes import hostile
from tests.fakes.dab import PG_DUMP, make_dab_checkout

MARK = Path("/tmp") / f"querylab-dab-pwned-{uuid.uuid4().hex[:8]}"

META = hostile.dab_meta_commands(MARK)


@pytest.mark.parametrize("dump", META, ids=[m.split()[0] + str(i) for i, m in enumerate(META)])
def test_psql_meta_commands_are_refused_before_anything_runs(dump):
    with pytest.raises(DabImportError, match="psql meta-command refused"):
        list(split_sql_dump(dump, "x.sql"))
    assert not MARK.exists()


def test_restrict_lines_of_new_pg_dump_are_ignored_and_quotes_honoured():
    text = ("\\restrict k3y\n--\nSET a = 1;\nSELECT 'x;\\! no', $f$ ; \\! $f$, E'\\';', \"a;b\";\n"
            "/* one /* two */ ; */ SELECT 2;\n\\unrestrict k3y\n")
    stmts = [(line, s) for line, s, _ in split_sql_dump(text)]
    assert [line for line, _ in stmts] == [3, 4, 5]
    assert stmts[1][1].startswith("SELECT 'x;\\! no'") and stmts[2][1].endswith("SELECT 2")


def test_copy_data_is_data(tmp_path):
    (line, stmt, data), = [s for s in split_sql_dump(PG_DUMP) if s[2] is not None]
    assert stmt.startswith("COPY public.customers") and data.count("\n") == 4
    assert "\\! " not in stmt


SERVER_ATTACKS = [(dump, message) for _, dump, message in hostile.dab_server_attacks(MARK)]


@pytest.mark.parametrize(("dump", "message"), SERVER_ATTACKS, ids=[d[:30] for d, _ in SERVER_ATTACKS])
def test_dump_statements_run_as_an_unprivileged_role(tmp_path, settings, dump, message, pg_server_url):
    f = tmp_path / "d.sql"
    f.write_text(dump + "\nCREATE TABLE ok (a int);\n")
    if message is None:
        assert "ok" in read_postgres_dump(f, settings)
    else:
        with pytest.raises(DabImportError) as err:
            read_postgres_dump(f, settings)
        text = str(err.value)
        assert message in text and ("line 1:" in text or "line 2:" in text), text
    assert not MARK.exists()
    with psycopg.connect(pg_server_url) as conn:  # nothing left behind, nothing escalated
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'evil' OR "
                            "rolname LIKE 'ql_dabimport_%'").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE "
                            "'ql_dabimport_%'").fetchone()[0] == 0


@pytest.fixture
def shop(tmp_path) -> Path:
    return make_dab_checkout(tmp_path / "dab") / "query_tinyshop"


def _config(shop: Path, **paths) -> None:
    lines = ["db_clients:"]
    kinds = {"db_path": "sqlite", "sql_file": "postgres", "dump_folder": "mongo"}
    for key, value in paths.items():
        lines += [f"  x_{key}:", f"    db_type: {kinds[key]}", f"    {key}: '{value}'"]
    (shop / "db_config.yaml").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "mongo-symlink"])
def test_paths_must_stay_inside_the_dataset_folder(shop, tmp_path, how):
    outside = tmp_path / "outside.db"
    shutil.copy(shop / "query_dataset" / "orders.db", outside)
    if how == "dotdot":
        _config(shop, db_path="../../outside.db")
    elif how == "absolute":
        _config(shop, db_path=str(outside))
    elif how == "symlink":
        (shop / "query_dataset" / "link.db").symlink_to(outside)
        _config(shop, db_path="query_dataset/link.db")
    else:
        (tmp_path / "secret.json").write_text('{"a": 1}\n')
        (shop / "query_dataset" / "reviews_dump" / "leak.json").symlink_to(tmp_path / "secret.json")
        _config(shop, dump_folder="query_dataset/reviews_dump")
    with pytest.raises(DabImportError, match="outside") as err:
        import_dab_dataset.fn(str(shop), str(tmp_path / "art"))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "art").exists()


def test_a_validator_linked_out_of_its_folder_is_refused(shop, tmp_path):
    (tmp_path / "elsewhere.py").write_text("def validate(x):\n    return True, 'ok'\n")
    target = shop / "query1" / "validate.py"
    target.unlink()
    target.symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(DabImportError, match="outside"):
        import_dab_dataset.fn(str(shop), str(tmp_path / "art"))


LOOK_AROUND = textwrap.dedent("""
    import json, os
    def validate(answer):
        return True, json.dumps({"cwd": sorted(os.listdir(".")), "pid": os.getpid(),
                                 "ppid": os.getppid()})
""")


@pytest.mark.slow
def test_validate_runs_in_its_own_sandbox_with_only_its_folder(shop, tmp_path, settings):
    (shop / "query2" / "validate.py").write_text(LOOK_AROUND)
    from tasks.scoring.scoring_file import load_scoring

    scoring = load_scoring(import_dab_dataset.fn(str(shop), str(tmp_path / "art")))
    v = scoring["queries"]["query2"]["validator"]
    ok, reason = run_validate_script(v["script"], "x", folder=v["folder"], support=v["support"])
    seen = json.loads(reason)
    assert ok and set(seen["cwd"]) <= {"validate.py", "query.json", "ground_truth.csv", "answer.txt",
                                       "search_path.json", "common_scaffold", ".cells",
                                       "__pycache__", "tmp"}  # the last three: the sandbox's
    assert "query1" not in seen["cwd"] and "db_config.yaml" not in seen["cwd"]
    assert seen["ppid"] != os.getpid()  # a sandbox session's cell, not querylab's child


def test_validate_cannot_see_outside_its_folder(shop, tmp_path, settings):
    probe = textwrap.dedent(f"""
        import os
        def validate(answer):
            seen = [p for p in ({str(shop)!r}, {settings.artifacts!r}, {str(Path(settings.home))!r})
                    if os.path.exists(p)]
            return not seen, repr(seen)
    """)
    f = tmp_path / "probe.py"
    f.write_text(probe)
    ok, reason = run_validate_script(f, "x")
    assert ok, reason


# -- scoring-only checkouts and misbehaving validators (issue 15, points 2 and 4) ----------------


@pytest.mark.parametrize("how", ["validator", "ground-truth", "query-folder"])
def test_a_scoring_only_checkout_cannot_reach_outside(shop, tmp_path, how):
    """Links out of the dataset folder are refused by the scoring-only import too."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "validate.py").write_text("def validate(x):\n    return True, 'ok'\n")
    (outside / "ground_truth.csv").write_text("answer\nsecret\n")
    if how == "validator":
        (shop / "query1" / "validate.py").unlink()
        (shop / "query1" / "validate.py").symlink_to(outside / "validate.py")
    elif how == "ground-truth":
        (shop / "query1" / "ground_truth.csv").unlink(missing_ok=True)
        (shop / "query1" / "ground_truth.csv").symlink_to(outside / "ground_truth.csv")
    else:
        (shop / "query7").symlink_to(outside, target_is_directory=True)
    with pytest.raises(DabImportError, match="outside") as err:
        import_dab_dataset.fn(str(shop), str(tmp_path / "art"), scoring_only=True)
    assert "\n" not in str(err.value)


MISBEHAVING = {
    "syntax-error": "def validate(out)\n    return True, 'ok'\n",
    "no-validate": "def check(out):\n    return True, 'ok'\n",
    "exits-0": "import sys\ndef validate(out):\n    sys.exit(0)\n",
    "exits-at-import": "import os\nos._exit(0)\n",
    "kills-itself": "import os, signal\ndef validate(out):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "non-pair": "def validate(out):\n    return 'yes'\n",
    "floods-stdout": "import sys\ndef validate(out):\n    sys.stdout.write('x' * 20_000_000)\n"
                     "    return True, 'ok'\n",
    "hangs": "def validate(out):\n    while True:\n        pass\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MISBEHAVING))
def test_a_misbehaving_validator_is_errored_not_incorrect(shop, tmp_path, name):
    """Whatever validate.py does short of returning a pair, the trial is errored (no verdict,
    the reason says why) — never a wrong answer — and the other queries still score."""
    from tasks.scoring.scoring_file import load_scoring
    from tasks.scoring.stage import score_rows

    (shop / "query2" / "validate.py").write_text(MISBEHAVING[name])
    uri = import_dab_dataset.fn(str(shop), str(tmp_path / "art"), scoring_only=True)
    scoring = load_scoring(uri)
    if name == "hangs":
        scoring["queries"]["query2"]["validator"]["timeout_s"] = 2
    base = {"run_id": "r", "agent": "a", "dataset": "tinyshop", "error": None,
            "dataset_version": scoring["version"], "terminate_reason": "return_answer"}
    trials = [{**base, "trial_key": "k1", "trial": 0, "query_id": "query2",
               "answer": "Lovelace, Hopper"},
              {**base, "trial_key": "k2", "trial": 0, "query_id": "query1",
               "answer": "151.25"}]
    rows = score_rows(trials, {"tinyshop": scoring})
    assert rows[0]["verdict"] == "errored" and rows[0]["is_correct"] is None, rows[0]
    assert rows[0]["reason"].startswith("validate.py errored"), rows[0]["reason"]
    assert len(rows[0]["reason"]) < 20_000
    assert rows[1]["verdict"] == "correct"


def test_a_validator_cannot_change_its_ground_truth_for_the_next_trial(shop, tmp_path):
    """Each call sees the imported folder as it was: a validator that rewrites
    ground_truth.csv (or deletes it) does not change the next verdict."""
    from tasks.scoring.scoring_file import load_scoring

    (shop / "query2" / "ground_truth.csv").write_text("answer\nHopper\n")
    (shop / "query2" / "validate.py").write_text(textwrap.dedent("""
        from pathlib import Path
        def validate(out):
            gt = Path(__file__).parent / "ground_truth.csv"
            want = gt.read_text().splitlines()[1]
            try:
                gt.write_text("answer\\n" + out + "\\n")
            except OSError:
                pass
            return want in out, want
    """))
    scoring = load_scoring(import_dab_dataset.fn(str(shop), str(tmp_path / "art"),
                                                 scoring_only=True))
    v = scoring["queries"]["query2"]["validator"]
    for answer in ("nobody", "nobody"):
        ok, reason = run_validate_script(v["script"], answer, folder=v["folder"],
                                         support=v["support"])
        assert ok is False and reason == "Hopper"
    assert (shop / "query2" / "ground_truth.csv").read_text() == "answer\nHopper\n"


@pytest.mark.parametrize("lift", ["SET statement_timeout = 0;",
                                  "SELECT pg_catalog.set_config('statement_timeout', '0', false);"])
@pytest.mark.slow
def test_a_dump_cannot_lift_the_statement_time_limit(tmp_path, settings, monkeypatch, lift):
    """A dump's own ``SET statement_timeout = 0`` (QA12 minor 3) does not let a statement run
    past querylab's limit: the watchdog cancels it and the import fails naming the line."""
    import time

    from tasks.datasets import dab_pgdump

    monkeypatch.setattr(dab_pgdump, "DUMP_STATEMENT_TIMEOUT_S", 1)
    f = tmp_path / "slow.sql"
    f.write_text(f"{lift}\nSELECT pg_sleep(60);\nCREATE TABLE ok (a int);\n")
    start = time.monotonic()
    with pytest.raises(DabImportError, match=r"line 2: a statement ran longer than 1 s"):
        read_postgres_dump(f, settings)
    assert time.monotonic() - start < 30
