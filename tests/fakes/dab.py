"""A small hand-made DAB checkout for tests and benches: one dataset, ``query_tinyshop``, over
SQLite, DuckDB, a PostgreSQL dump and a MongoDB dump (see :func:`make_dab_checkout`)."""

from __future__ import annotations

import json
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
