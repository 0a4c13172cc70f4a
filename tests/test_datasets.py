"""Datasets: ground truth checked independently, perturbation that bites, determinism, bad specs."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import duckdb
import polars as pl
import pytest
import yaml

from tasks.core import storage
from tasks.datasets.build import build_dataset_artifacts
from tasks.db.engines import open_databases
from tasks.datasets.spec import SpecError, load_spec, spec_path


def canonical(manifest: dict, table: str) -> pl.DataFrame:
    return pl.read_parquet(manifest["canonical"][table])


def truth(manifest: dict) -> dict:
    return {q["id"]: q["ground_truth"] for q in manifest["queries"]}


# -- ground truth, recomputed with Polars (the build uses DuckDB SQL from the spec) ----------


def test_movies_ground_truth_independent(movies_manifest):
    films = canonical(movies_manifest, "films")
    tom = canonical(movies_manifest, "tomatoes")
    j = films.join(tom, on="film_id", how="inner")
    gt = truth(movies_manifest)
    assert gt["spielberg_box_office"] == pytest.approx(
        j.filter(pl.col("director") == "Steven Spielberg")["box_office_usd"].sum()
    )
    top = j.filter(pl.col("oscars") >= 5).sort("box_office_usd", descending=True)["title"][0]
    assert gt["top_grossing_oscar_sweep"] == [top]
    horror = j.filter(
        pl.col("genre").str.contains("Horror"),
        pl.col("year").is_between(2000, 2009),
        pl.col("tomatometer").is_not_null(),
    )
    assert gt["horror_2000s_tomatometer"] == pytest.approx(horror["tomatometer"].mean())
    assert gt["oscar_winners_over_100m"] == j.filter(
        pl.col("oscars") >= 1, pl.col("box_office_usd") > 100_000_000
    ).height
    anim = (
        j.filter(pl.col("genre").str.contains("Animation"))
        .group_by("director")
        .agg(pl.col("box_office_usd").sum())
        .sort("box_office_usd", descending=True)
    )
    assert gt["animation_top_directors"] == anim["director"].head(3).to_list()
    assert anim["box_office_usd"][2] > anim["box_office_usd"][3]  # no tie at the cut
    assert gt["fresh_90s_comedies"] == j.filter(
        pl.col("genre").str.contains("Comedy"),
        pl.col("year").is_between(1990, 1999),
        pl.col("tomatometer") >= 60,
    ).height


def _total_return(px: pl.DataFrame, ticker: str, start, end) -> float:
    s = px.filter(pl.col("ticker") == ticker, pl.col("date").is_between(start, end)).sort("date")
    return s["adj_close"][-1] / s["adj_close"][0]


def test_stocks_ground_truth_independent(stocks_manifest):
    import datetime as dt

    px = canonical(stocks_manifest, "prices")
    co = canonical(stocks_manifest, "companies")
    gt = truth(stocks_manifest)
    aapl = px.filter(pl.col("ticker") == "AAPL", pl.col("date").dt.year() == 2005).sort("date")
    lr = (aapl["adj_close"] / aapl["adj_close"].shift(1)).log().drop_nulls()
    assert gt["apple_2005_volatility"] == pytest.approx(lr.std() * math.sqrt(252) * 100)
    # the raw close (2:1 split in Feb 2005) gives a very different, wrong figure
    raw = (aapl["close"] / aapl["close"].shift(1)).log().drop_nulls()
    assert raw.std() * math.sqrt(252) * 100 > gt["apple_2005_volatility"] + 10

    it = co.filter(pl.col("sector") == "Information Technology")
    y0, y1 = dt.date(2010, 1, 1), dt.date(2010, 12, 31)
    best = max(it.iter_rows(named=True), key=lambda r: _total_return(px, r["ticker"], y0, y1))
    assert gt["best_it_return_2010"] == [best["company"]]

    vol = (
        px.filter(pl.col("date").dt.year() == 2012)
        .join(co.filter(pl.col("exchange") == "NASDAQ"), on="ticker")
        .group_by("company")
        .agg(pl.col("volume").mean())
        .sort("volume", descending=True)
    )
    assert gt["nasdaq_top_volume_2012"] == [vol["company"][0]]

    comm = co.filter(pl.col("sector") == "Communication Services")["ticker"]
    h0, h1 = dt.date(2012, 6, 1), dt.date(2012, 12, 31)
    rets = [(_total_return(px, t, h0, h1) - 1) * 100 for t in comm]
    assert gt["comm_services_return_2012h2"] == pytest.approx(sum(rets) / len(rets))

    nyse = co.filter(pl.col("exchange") == "NYSE")["ticker"][0]
    s = px.filter(pl.col("ticker") == nyse, pl.col("date").dt.year() == 2008).sort("date")
    dd = (1 - s["adj_close"] / s["adj_close"].cum_max()).max() * 100
    assert gt["nyse_drawdown_2008"] == pytest.approx(dd)


# -- the perturbation bites ------------------------------------------------------------------


def test_movies_key_join_fails_naively_and_genre_only_in_text(movies_manifest, settings):
    dbs = open_databases(movies_manifest, settings)
    films = dbs["catalog"].query(
        '{"collection": "films", "find": {}, "projection": {"_id": 0}}', max_rows=100_000
    ).rows
    revenue = dbs["boxoffice"].query("SELECT * FROM revenue", max_rows=100_000).rows
    reviews = dbs["boxoffice"].query("SELECT * FROM reviews", max_rows=100_000).rows
    assert len(films) == len(revenue) == 2760
    con = duckdb.connect()
    con.register("films", pl.DataFrame(films, infer_schema_length=None).to_arrow())
    con.register("revenue", pl.DataFrame(revenue).to_arrow())
    assert con.sql("SELECT count(*) FROM films f JOIN revenue r ON f.film_ref = r.omdb_key").fetchone()[0] == 0
    # ... but the same join on the numeric id matches every film
    fixed = """SELECT count(*) FROM films f JOIN revenue r
               ON CAST(substr(f.film_ref, 3) AS BIGINT) = CAST(split_part(r.omdb_key, ':', 2) AS BIGINT)"""
    assert con.sql(fixed).fetchone()[0] == 2760

    genres = {
        f"MV{r['film_id']:08d}": r["genre"]
        for r in canonical(movies_manifest, "films").iter_rows(named=True)
    }
    for doc in films:
        genre = genres[doc["film_ref"]]
        assert genre in doc["synopsis"]
        assert not any(genre == v for k, v in doc.items() if k != "synopsis")
        assert "genre" not in doc and "oscars" not in doc
    pg_values = {str(v) for row in revenue + reviews for v in row.values()}
    assert not pg_values & set(genres.values())


def test_stocks_listing_key_and_sector_only_in_text(stocks_manifest, settings):
    dbs = open_databases(stocks_manifest, settings)
    listings = dbs["listings"].query("SELECT * FROM listings").rows
    tables = {t.name for t in dbs["market"].list_tables()}
    assert tables == {"aapl", "fb", "goog", "ibm", "msft"}
    # naive equality join of the listing key to the price tables' names finds nothing
    assert not {r["listing"] for r in listings} & tables
    assert not {r["listing"].lower() for r in listings} & tables
    sectors = dict(
        canonical(stocks_manifest, "companies").select("company", "sector").iter_rows()
    )
    for row in listings:
        assert sectors[row["company"]] in row["profile"]
        assert "sector" not in row
        assert all(sectors[row["company"]] not in str(v) for k, v in row.items() if k != "profile")
    for t in tables:
        cols = {c.name for c in next(x for x in dbs["market"].list_tables() if x.name == t).columns}
        assert "ticker" not in cols


# -- determinism -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["movies", "stocks"])
def test_build_twice_gives_identical_parquet_bytes(name, tmp_path):
    a = build_dataset_artifacts.fn(str(spec_path(name)), str(tmp_path / "a"))
    b = build_dataset_artifacts.fn(str(spec_path(name)), str(tmp_path / "b"))
    files_a = storage.list_uris(str(tmp_path / "a"), ".parquet")
    files_b = storage.list_uris(str(tmp_path / "b"), ".parquet")
    assert len(files_a) == len(files_b) > 3
    for fa, fb in zip(files_a, files_b):
        assert Path(fa).relative_to(tmp_path / "a") == Path(fb).relative_to(tmp_path / "b")
        assert Path(fa).read_bytes() == Path(fb).read_bytes(), fa
    assert Path(a).read_bytes() == Path(b).read_bytes().replace(b"/b/", b"/a/")


# -- bad input -------------------------------------------------------------------------------


def _edited_spec(tmp_path: Path, name: str, edit) -> Path:
    raw = yaml.safe_load(spec_path(name).read_text())
    edit(raw)
    out = tmp_path / f"{name}.yaml"
    out.write_text(yaml.safe_dump(raw, sort_keys=False))
    return out


def test_unknown_column_names_file_and_field(tmp_path):
    bad = _edited_spec(tmp_path, "movies", lambda r: r["placements"][0]["columns"].append("budget"))
    with pytest.raises(SpecError) as err:
        load_spec(bad)
    assert err.value.file == str(bad)
    assert err.value.field == "placements[0].columns[13]"
    assert "budget" in str(err.value) and str(bad) in str(err.value)


def test_unknown_template_column_names_field(tmp_path):
    def edit(r):
        r["placements"][0]["transforms"][2]["templates"][1] = "A {genres} film"

    with pytest.raises(SpecError) as err:
        load_spec(_edited_spec(tmp_path, "movies", edit))
    assert err.value.field == "placements[0].transforms[2].templates[1]"


def test_declared_columns_must_match_sql(tmp_path):
    def edit(r):
        r["tables"]["companies"]["columns"]["ceo"] = "string"

    spec = _edited_spec(tmp_path, "stocks", edit)
    shutil.copy(spec_path("stocks").parent / "stocks_companies.csv", tmp_path)
    with pytest.raises(SpecError) as err:
        build_dataset_artifacts.fn(str(spec), str(tmp_path / "art"))
    assert err.value.field == "tables.companies.columns" and "ceo" in str(err.value)


def test_missing_source_file_names_file_and_field(tmp_path):
    # the stocks spec's companies file is relative to the spec: absent next to the copy
    spec = _edited_spec(tmp_path, "stocks", lambda r: None)
    with pytest.raises(SpecError) as err:
        build_dataset_artifacts.fn(str(spec), str(tmp_path / "art"))
    assert err.value.file == str(spec)
    assert err.value.field == "sources.companies_raw.path"
    assert "stocks_companies.csv" in str(err.value)
    assert not (tmp_path / "art").exists()  # nothing half-written


# -- fuzzy keys and schema descriptions --------------------------------------------------------


def _fuzz(**kw):
    from schemas.spec import FuzzOp

    return FuzzOp(op="fuzz", column="k", **kw)


def test_fuzz_value_kinds_are_deterministic_and_bite():
    import random

    from tasks.datasets.placement import fuzz_value

    op = _fuzz(kinds=["abbreviate", "case", "whitespace"],
               abbreviations={"Fort": "Ft.", "Saint": "St."})
    values = ["Fort Lauderdale", "Saint Paul", "Fortuna", None] * 25
    rng1, rng2 = random.Random("seed"), random.Random("seed")
    first = [fuzz_value(v, op, rng1) for v in values]
    assert first == [fuzz_value(v, op, rng2) for v in values]
    assert first[3] is None
    assert all(" ".join(x.split()).casefold() == "ft. lauderdale" for x in first[0::4])
    assert all(" ".join(x.split()).casefold() == "fortuna" for x in first[2::4])  # whole words only
    assert all(x != x.strip() or "  " in x for x in first if x)  # every key got stray blanks
    assert len({x for x in first[0::4]}) > 3  # case and blanks vary per row
    trunc = _fuzz(kinds=["truncate"], length=12)
    assert fuzz_value("TCGA-AB-2802-03B-01W", trunc, random.Random(0)) == "TCGA-AB-2802"
    never = _fuzz(kinds=["case"], rate=0.0)
    assert {fuzz_value("AbC", never, random.Random(i)) for i in range(20)} == {"AbC"}


def test_manifest_carries_a_schema_description(movies_manifest):
    text = movies_manifest["schema_description"]
    assert text.startswith("The dataset `movies` has 2 databases.")
    assert "1. catalog (mongodb)" in text and "films (2760 documents)" in text
    assert "reviews (2760 rows)" in text and "- omdb_key (string)" in text
