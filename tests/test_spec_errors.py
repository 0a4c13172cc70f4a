"""Spec validation: each kind of broken spec gets a SpecError naming the file, the field and the
fix, before any data is touched (one test per error of issue 5, plus a few neighbours)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.datasets.build import build_dataset_artifacts
from tasks.datasets.spec import SpecError, check_sources, load_spec
from tests.helpers import scaffold_spec


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "penguins.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def error_for(tmp_path: Path, edit) -> tuple[Path, SpecError]:
    raw = scaffold_spec()
    edit(raw)
    path = write(tmp_path, raw)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert err.value.file == str(path) and str(path) in str(err.value)
    assert err.value.field in str(err.value)
    return path, err.value


def test_the_base_spec_is_valid(tmp_path):
    spec = load_spec(write(tmp_path, scaffold_spec()))
    assert spec.name == "penguins" and len(spec.queries) == 2


def test_unknown_table(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["placements"][1].update(source="penguin"))
    assert err.field == "placements[1].source"
    assert "unknown table 'penguin'" in err.problem and "fix: use one of ['penguins']" in err.problem


def test_unknown_column(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["placements"][0]["columns"].append("beak_colour"))
    assert err.field == "placements[0].columns[4]"
    assert "beak_colour" in err.problem and "tables.penguins.columns" in err.problem


def test_perturbation_of_a_missing_column(tmp_path):
    def fuzz_missing(r):
        r["placements"][1]["transforms"].append(
            {"op": "fuzz", "column": "tag_code", "kinds": ["case", "whitespace"]})

    _, err = error_for(tmp_path, fuzz_missing)
    assert err.field == "placements[1].transforms[1].column"
    assert "perturbs column 'tag_code'" in err.problem and "fix:" in err.problem


def test_perturbation_template_and_drop_of_missing_columns(tmp_path):
    def bad_template(r):
        r["placements"][0]["transforms"][0]["templates"][1] = "{genus} penguin"

    _, err = error_for(tmp_path, bad_template)
    assert err.field == "placements[0].transforms[0].templates[1]" and "'genus'" in err.problem

    def bad_drop(r):
        r["placements"][0]["transforms"][0]["drop"] = ["species", "weight"]

    _, err = error_for(tmp_path, bad_drop)
    assert err.field == "placements[0].transforms[0].drop[1]" and "'weight'" in err.problem


def test_table_placed_twice(tmp_path):
    def twice(r):
        r["placements"].append(dict(r["placements"][0]))

    _, err = error_for(tmp_path, twice)
    assert err.field == "placements[2].name"
    assert "placed twice in database 'field'" in err.problem and "placements[0]" in err.problem


def test_query_without_ground_truth(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["queries"][1].pop("ground_truth"))
    assert err.field == "queries[1].ground_truth"
    assert "required field missing" in err.problem and "DuckDB SQL" in err.problem


def test_query_without_validator(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["queries"][0].pop("validator"))
    assert err.field == "queries[0].validator"
    assert "kind: number" in err.problem and "kind: items" in err.problem


def test_engine_that_does_not_exist(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["databases"]["lab"].update(engine="mysql"))
    assert err.field == "databases.lab.engine"
    assert "unknown engine 'mysql'" in err.problem
    assert "postgres, mongodb, sqlite, duckdb" in err.problem


def test_source_file_that_is_missing(tmp_path):
    def local_source(r):
        r["sources"]["penguins_raw"] = {"path": "penguins_2024.csv", "format": "csv"}

    raw = scaffold_spec()
    local_source(raw)
    path = write(tmp_path, raw)
    spec = load_spec(path)  # the spec itself is fine ...
    with pytest.raises(SpecError) as err:  # ... its source file is not there
        check_sources(path, spec)
    assert err.value.file == str(path) and err.value.field == "sources.penguins_raw.path"
    assert "penguins_2024.csv" in err.value.problem and "--source-dir" in err.value.problem
    with pytest.raises(SpecError) as err:
        build_dataset_artifacts.fn(str(path), str(tmp_path / "art"))
    assert err.value.field == "sources.penguins_raw.path"
    assert not (tmp_path / "art").exists()  # nothing half-written


def test_package_that_is_not_installed(tmp_path):
    raw = scaffold_spec()
    raw["sources"]["penguins_raw"]["package"] = "no_such_data_package"
    path = write(tmp_path, raw)
    with pytest.raises(SpecError) as err:
        check_sources(path, load_spec(path))
    assert err.value.field == "sources.penguins_raw.package" and "pip install" in err.value.problem


def test_unknown_field_and_unknown_transform(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["databases"]["lab"].update(engin="duckdb"))
    assert err.field == "databases.lab.engin" and "unknown field" in err.problem

    def bad_op(r):
        r["placements"][1]["transforms"][0]["op"] = "mask"

    _, err = error_for(tmp_path, bad_op)
    assert err.field == "placements[1].transforms[0]" and "format, text, compose, split, fuzz" in err.problem


def test_fuzz_options_checked(tmp_path):
    def truncate_without_length(r):
        r["placements"][1]["transforms"].append(
            {"op": "fuzz", "column": "specimen", "kinds": ["truncate"]})

    _, err = error_for(tmp_path, truncate_without_length)
    assert err.field == "placements[1].transforms[1].length"

    def abbreviate_without_words(r):
        r["placements"][0]["transforms"].insert(
            0, {"op": "fuzz", "column": "island", "kinds": ["abbreviate"]})

    _, err = error_for(tmp_path, abbreviate_without_words)
    assert err.field == "placements[0].transforms[0].abbreviations"


def test_reference_on_unknown_database(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["queries"][0]["reference"][0]["args"].update(db="fields"))
    assert err.field == "queries[0].reference[0].args.db"
    assert "fix: use one of ['field', 'lab']" in err.problem


# -- derive, compose and shard (issue 15.7) -------------------------------------------------------


def test_derive_compose_and_shard_are_checked(tmp_path):
    _, err = error_for(tmp_path, lambda r: r["placements"][0].update(derive={"sex": "upper(sex)"}))
    assert err.field == "placements[0].derive.sex" and "also in" in err.problem

    def compose_unknown(r):
        r["placements"][0]["transforms"].append(
            {"op": "compose", "column": "note2", "clauses": [["{island}"], ["{beak}"]]})

    _, err = error_for(tmp_path, compose_unknown)
    assert err.field == "placements[0].transforms[1].clauses[1][0]" and "'beak'" in err.problem

    _, err = error_for(tmp_path, lambda r: r["placements"][0].update(shard={"by": "colour"}))
    assert err.field == "placements[0].shard.by" and "unknown column 'colour'" in err.problem
    _, err = error_for(tmp_path, lambda r: r["placements"][0].update(
        shard={"by": "island", "table": "{island}_{sex}"}))
    assert err.field == "placements[0].shard.table" and "['sex']" in err.problem


def test_derive_and_shard_build_errors_name_the_field(tmp_path, settings):
    raw = scaffold_spec()
    raw["placements"][0]["derive"] = {"beak": "no_such_function(island)"}
    with pytest.raises(SpecError) as err:
        build_dataset_artifacts.fn(str(write(tmp_path, raw)), str(tmp_path / "a"), str(
            Path(__file__).resolve().parents[1] / "data"))
    assert err.value.field == "placements[0].derive.beak"
    raw = scaffold_spec()
    raw["placements"][0]["shard"] = {"by": "sex"}  # values 'female'/'male', and NULL left out
    raw["queries"][0]["requires"]["sources"] = ["field.males", "lab.measurements"]
    with pytest.raises(SpecError) as err:
        build_dataset_artifacts.fn(str(write(tmp_path, raw)), str(tmp_path / "b"), str(
            Path(__file__).resolve().parents[1] / "data"))
    assert err.value.field == "queries[0].requires.sources[0]" and "'males'" in err.value.problem
