"""Hand-made DAB checkouts for tests and benches, in DAB's layout (``db_config.yaml``,
``db_description*.txt``, ``query<N>/{query.json, validate.py, ground_truth.csv}``, generated
SQLite / DuckDB files, a PostgreSQL dump and MongoDB dumps):

- :func:`make_dab_checkout`: ``query_tinyshop`` over all four engines;
- :func:`make_dab_suite`: that plus ``query_PATENTS`` (DAB's upper-case name, a gap in the
  query numbers, validators that read ``ground_truth.csv`` and one that crashes) and
  ``query_agnews`` (a ``mongodump`` BSON file and an extended-JSON array, a hint file), and
  optionally a broken dataset;
- :func:`scoring_only_copy` (what the public forks hold: no data), :func:`write_answer_file`
  (the leaderboard format) and :func:`make_big_sqlite` (for the memory bench)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import textwrap
from pathlib import Path

import bson
import duckdb

PG_DUMP = """\
--
-- PostgreSQL database dump (hand-written in pg_dump's plain format)
--
SET statement_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);

CREATE TABLE public.customers (
    customer_id integer NOT NULL,
    name text,
    city text
);

COPY public.customers (customer_id, name, city) FROM stdin;
1\tAda Lovelace\tBerkeley
2\tAlan Turing\tOakland
3\tGrace Hopper\tBerkeley
4\tEdsger Dijkstra\t\\N
\\.

ALTER TABLE ONLY public.customers ADD CONSTRAINT customers_pkey PRIMARY KEY (customer_id);
"""

VALIDATE_NUMBER = """\
import re

def validate(llm_output: str):
    numbers = [float(x) for x in re.findall(r"-?\\d+(?:\\.\\d+)?", llm_output.replace(",", ""))]
    if any(abs(x - 151.25) <= 0.01 for x in numbers):
        return True, "OK"
    return False, f"151.25 not found in {numbers}"
"""

VALIDATE_NAMES = """\
from common_scaffold.validate.levenshtein import levenshtein

def validate(llm_output: str):
    words = llm_output.replace(",", " ").split()
    for name in ["Hopper", "Lovelace"]:
        if min(levenshtein(name.lower(), w.lower()) for w in words) > 1:
            return False, f"{name} missing"
    return True, "both names found"
"""

LEVENSHTEIN = """\
def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]
"""

VALIDATE_RATING = """\
def validate(llm_output: str):
    return ("4.5" in llm_output), "expects 4.5"
"""


def make_dab_checkout(root: Path) -> Path:
    """A DAB checkout with one dataset, ``query_tinyshop``, over SQLite, DuckDB, a PostgreSQL
    dump and a MongoDB dump (one .bson and one extended-JSON collection), three queries and a
    ``common_scaffold`` helper module that one validate.py imports (as DAB's do)."""
    shop = root / "query_tinyshop"
    data = shop / "query_dataset"
    (data / "reviews_dump" / "reviews_db").mkdir(parents=True)
    with sqlite3.connect(data / "orders.db") as con:
        con.execute("CREATE TABLE orders (order_id INTEGER, customer_ref TEXT, amount REAL)")
        con.executemany(
            "INSERT INTO orders VALUES (?, ?, ?)",
            [(1, "C-001", 100.0), (2, "C-002", 20.0), (3, "C-003", 51.25), (4, "C-001", None)],
        )
    con = duckdb.connect(str(data / "products.duckdb"))
    con.execute("CREATE TABLE products AS SELECT * FROM (VALUES ('P1', 'Lamp', 20.5), "
                "('P2', 'Desk', 180.0)) t(sku, name, price)")
    con.close()
    (data / "customers.sql").write_text(PG_DUMP)
    with (data / "reviews_dump" / "reviews_db" / "reviews.bson").open("wb") as fh:
        for doc in [{"_id": bson.ObjectId(), "sku": "P1", "stars": 4, "text": "bright"},
                    {"_id": bson.ObjectId(), "sku": "P1", "stars": 5, "text": "good",
                     "tags": ["home", "light"]},
                    {"_id": bson.ObjectId(), "sku": "P2", "stars": 2}]:
            fh.write(bson.encode(doc))
    (data / "reviews_dump" / "reviews_db" / "notes.json").write_text(
        '{"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}, "note": "restock", "qty": {"$numberInt": "3"}}\n'
        '{"_id": {"$oid": "65a1b2c3d4e5f60718293a4c"}, "note": "recall", "qty": 1}\n'
    )
    (data / "reviews_dump" / "reviews_db" / "reviews.metadata.json").write_text("{}")
    (shop / "db_config.yaml").write_text(textwrap.dedent("""\
        db_clients:
          orders_database:
            db_type: sqlite
            db_path: query_dataset/orders.db
          catalog_database:
            db_type: duckdb
            db_path: query_dataset/products.duckdb
          customer_database:
            db_type: postgres
            db_name: shop_db
            sql_file: query_dataset/customers.sql
          review_database:
            db_type: mongo
            db_name: reviews_db
            dump_folder: query_dataset/reviews_dump
        """))
    (shop / "db_description.txt").write_text(
        "A tiny shop: orders in SQLite, products in DuckDB, customers in PostgreSQL, reviews in MongoDB.\n"
    )
    (shop / "db_description_withhint.txt").write_text(
        "A tiny shop: orders in SQLite, products in DuckDB, customers in PostgreSQL, reviews in MongoDB.\n"
        "Hint: customer_ref is 'C-' + the customer_id zero-padded to 3 digits.\n"
    )
    queries = [
        ("What is the total amount ordered by customers living in Berkeley?", VALIDATE_NUMBER, "151.25"),
        ("Which customers in Berkeley placed orders? Give their last names.", VALIDATE_NAMES,
         "Lovelace, Hopper"),
        ({"query": "What is the average review rating of the Lamp?"}, VALIDATE_RATING, "4.5"),
    ]
    for i, (question, validate, truth) in enumerate(queries, start=1):
        q = shop / f"query{i}"
        q.mkdir()
        (q / "query.json").write_text(json.dumps(question))
        (q / "validate.py").write_text(validate)
        (q / "ground_truth.csv").write_text(truth + "\n")
    helper = root / "common_scaffold" / "validate"
    helper.mkdir(parents=True)
    (root / "common_scaffold" / "__init__.py").write_text("")
    (helper / "__init__.py").write_text("")
    (helper / "levenshtein.py").write_text(LEVENSHTEIN)
    return root


# -- a DAB checkout of several datasets (names, gaps, validators that read or crash) ----------

#: query1 of PATENTS: reads ground_truth.csv beside itself, as DAB's newer validators do.
VALIDATE_GT_BESIDE = """\
import re
from pathlib import Path

def validate(llm_output: str):
    truth = (Path(__file__).parent / "ground_truth.csv").read_text().strip()
    numbers = re.findall(r"-?\\d+(?:\\.\\d+)?", llm_output)
    if truth in numbers:
        return True, f"{truth} found"
    return False, f"{truth} not in {numbers}"
"""

#: query2 of PATENTS: reads ground_truth.csv relative to its working directory.
VALIDATE_GT_CWD = """\
import csv

def validate(llm_output: str):
    with open("ground_truth.csv", newline="") as fh:
        truth = next(csv.reader(fh))[0]
    ok = truth.lower() in llm_output.lower()
    return ok, ("found " if ok else "missing ") + truth
"""

#: query4 of PATENTS: crashes (IndexError) on an answer without a four-digit year.
VALIDATE_CRASHES = """\
import re

def validate(llm_output: str):
    year = int(re.findall(r"\\b\\d{4}\\b", llm_output)[0])
    return year == 2019, f"year {year}"
"""

#: query1 of agnews, as DAB writes it (ground truth in the code).
VALIDATE_RUNDOWN = """\
import re

def validate(llm_output: str):
    gt = "The Rundown"
    if re.search(r'\\b' + re.escape(gt) + r'\\b', llm_output, re.IGNORECASE):
        return True, "Ground truth found in LLM output."
    return False, f"Ground truth '{gt}' not found in LLM output: {llm_output}"
"""

VALIDATE_TWO = """\
def validate(llm_output: str):
    return ("2" in llm_output.split()), "expects 2"
"""

AGNEWS_DESCRIPTION = """\
You are working with two databases to solve this query.

1. articles_database
   - MongoDB; collection articles (article_id, title, description) and authors (author_id,
     name).
2. metadata_database
   - SQLite; table article_metadata (article_id, author_id, region, publication_date
     YYYY-MM-DD).
"""

AGNEWS_HINTS = """\
HINTS:
- The category of each article can be determined based on its title and description.
- All articles belong to one of four categories: World, Sports, Business, or Science/Technology.
"""


def _write_queries(ds: Path, queries: list[tuple[str, object, str, str]]) -> None:
    for folder, question, validate, truth in queries:
        q = ds / folder
        q.mkdir(parents=True)
        (q / "query.json").write_text(json.dumps(question))
        (q / "validate.py").write_text(validate)
        (q / "ground_truth.csv").write_text(truth + "\n")


def make_patents(root: Path) -> Path:
    """``query_PATENTS`` (upper-case name, as in DAB): SQLite + DuckDB, queries ``query1``,
    ``query2`` and ``query4`` (no ``query3``: DAB numbers queries by folder). query1's
    validator reads ``ground_truth.csv`` beside itself (``Path(__file__).parent``), query2's
    from its working directory, query4's crashes on an answer without a four-digit year."""
    ds = root / "query_PATENTS"
    data = ds / "query_dataset"
    data.mkdir(parents=True)
    with sqlite3.connect(data / "publications.db") as con:
        con.execute("CREATE TABLE publicationinfo (pub_id TEXT, cpc TEXT, year INTEGER)")
        con.executemany("INSERT INTO publicationinfo VALUES (?, ?, ?)", [
            ("US-1", "A01B", 2019), ("US-2", "A01B", 2019), ("DE-3", "A01B", 2020),
            ("US-4", "A23J", 2019), ("EP-5", "H04L", 2018)])
    con = duckdb.connect(str(data / "cpc.duckdb"))
    con.execute("CREATE TABLE cpc_definition AS SELECT * FROM (VALUES ('A01B', 'Soil working', "
                "4), ('A23J', 'Protein compositions', 4), ('H04L', 'Digital transmission', 4)) "
                "t(symbol, title, level)")
    con.close()
    (ds / "db_config.yaml").write_text(textwrap.dedent("""\
        db_clients:
          publication_database:
            db_type: sqlite
            db_path: query_dataset/publications.db
          CPCDefinition_database:
            db_type: duckdb
            db_path: query_dataset/cpc.duckdb
        """))
    (ds / "db_description.txt").write_text(
        "publication_database (SQLite): publicationinfo(pub_id, cpc, year).\n"
        "CPCDefinition_database (DuckDB): cpc_definition(symbol, title, level).\n")
    (ds / "db_description_withhint.txt").write_text(
        "HINTS:\n- cpc holds the CPC group symbol; its title is in cpc_definition.\n")
    _write_queries(ds, [
        ("query1", "How many publications have CPC group A01B?", VALIDATE_GT_BESIDE, "3"),
        ("query2", {"query": "What is the title of CPC group A01B?"}, VALIDATE_GT_CWD,
         "Soil working"),
        ("query4", "In which year were the most patents published?", VALIDATE_CRASHES, "2019"),
    ])
    return ds


def make_agnews(root: Path) -> Path:
    """``query_agnews``: a MongoDB dump (``articles.bson`` from ``mongodump``, ``authors.json`` a
    JSON array in extended JSON) and a SQLite file; two queries; a hint file."""
    ds = root / "query_agnews"
    dump = ds / "query_dataset" / "agnews_articles" / "articles_db"
    dump.mkdir(parents=True)
    articles = [
        {"_id": bson.ObjectId(), "article_id": 1, "title": "The Rundown",
         "description": "No. 4 Miami at N.C. State, 7:45 p.m., ESPN: the Wolfpack pass defense "
                        "faces tailback T.A. McLendon." * 3},
        {"_id": bson.ObjectId(), "article_id": 2, "title": "Cavaliers, Hokies Play Host",
         "description": "Akron at No. 12 Virginia."},
        {"_id": bson.ObjectId(), "article_id": 3, "title": "Oil prices rise",
         "description": "Crude futures climbed on supply worries.", "tags": ["energy"]},
    ]
    with (dump / "articles.bson").open("wb") as fh:
        for doc in articles:
            fh.write(bson.encode(doc))
    (dump / "articles.metadata.json").write_text("{}")
    (dump / "authors.json").write_text(
        '[{"_id": {"$oid": "65a1b2c3d4e5f60718293a4b"}, "author_id": 7, "name": "Matthew Smith"},'
        '\n {"_id": {"$oid": "65a1b2c3d4e5f60718293a4c"}, "author_id": 8, "name": "Ada Byron",'
        ' "joined": {"$date": "2004-01-01T00:00:00Z"}}]\n')
    with sqlite3.connect(ds / "query_dataset" / "metadata.db") as con:
        con.execute("CREATE TABLE article_metadata (article_id INTEGER, author_id INTEGER, "
                    "region TEXT, publication_date TEXT)")
        con.executemany("INSERT INTO article_metadata VALUES (?, ?, ?, ?)", [
            (1, 7, "Europe", "2010-11-22"), (2, 8, "Europe", "2004-05-02"),
            (3, 7, "Asia", "2009-01-03")])
    (ds / "db_config.yaml").write_text(textwrap.dedent("""\
        db_clients:
          articles_database:
            db_type: mongo                # Database type: MongoDB
            db_name: articles_db
            dump_folder: query_dataset/agnews_articles
          metadata_database:
            db_type: sqlite
            db_path: query_dataset/metadata.db
        """))
    (ds / "db_description.txt").write_text(AGNEWS_DESCRIPTION)
    (ds / "db_description_withhint.txt").write_text(AGNEWS_HINTS)
    _write_queries(ds, [
        ("query1", "What is the title of the sports article with the longest description?",
         VALIDATE_RUNDOWN, "The Rundown"),
        ("query2", "How many articles were published in Europe?", VALIDATE_TWO, "2"),
    ])
    return ds


def make_dab_suite(root: Path, broken: bool = False) -> Path:
    """A DAB checkout with ``query_tinyshop`` (:func:`make_dab_checkout`), ``query_PATENTS``
    (:func:`make_patents`) and ``query_agnews`` (:func:`make_agnews`); with ``broken`` also
    ``query_broken``, whose ``db_config.yaml`` names a file that does not exist."""
    make_dab_checkout(root)
    make_patents(root)
    make_agnews(root)
    if broken:
        bad = root / "query_broken"
        (bad / "query1").mkdir(parents=True)
        (bad / "db_config.yaml").write_text(
            "db_clients:\n  x:\n    db_type: sqlite\n    db_path: query_dataset/missing.db\n")
        (bad / "db_description.txt").write_text("x\n")
        (bad / "query1" / "query.json").write_text('"q?"')
        (bad / "query1" / "validate.py").write_text(VALIDATE_TWO)
    return root


def scoring_only_copy(root: Path, target: Path) -> Path:
    """``root`` as the public forks ship it: query folders, descriptions and validators, but
    neither data files nor ``db_config.yaml``."""
    shutil.copytree(root, target, ignore=shutil.ignore_patterns("query_dataset", "*.yaml"))
    return target


def write_answer_file(path: Path, answers: dict[tuple[str, int], list[str | None]]) -> Path:
    """A DAB leaderboard answer file: ``answers[(dataset, query number)] = [answer of run 0,
    run 1, ...]`` (None: no entry for that run), written as DAB submissions are: a JSON list of
    ``{"dataset", "query", "run", "answer"}`` with query and run as strings."""
    entries = [
        {"dataset": dataset, "query": str(query), "run": str(run), "answer": answer}
        for (dataset, query), runs in answers.items()
        for run, answer in enumerate(runs) if answer is not None
    ]
    path.write_text(json.dumps(entries, indent=2))
    return path


def make_big_sqlite(path: Path, megabytes: int, seed: int = 7) -> int:
    """A SQLite file of about ``megabytes`` MB: one table ``events`` (id, kind, amount, note)
    with ~250-byte rows of varied text; returns the row count."""
    import random

    rng = random.Random(seed)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    rows = megabytes * 1_000_000 // 270
    with sqlite3.connect(path) as con:
        con.execute("PRAGMA journal_mode = OFF")
        con.execute("CREATE TABLE events (id INTEGER, kind TEXT, amount REAL, note TEXT)")
        batch = []
        for i in range(rows):
            note = " ".join(rng.choice(words) for _ in range(30))
            batch.append((i, words[i % 8], rng.random() * 1000, note))
            if len(batch) == 50_000:
                con.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", batch)
                batch = []
        if batch:
            con.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", batch)
    return rows
