"""The verdicts joined onto trials (tasks.scoring.stage.scored_trials): the positional path for
artifacts aligned row for row gives the rows of the join; anything else takes the join; stale
scores are refused on both paths."""

import polars as pl
import pytest

from tasks.scoring.stage import ScoringError, scored_trials


def _trials(n=6):
    return pl.DataFrame({
        "trial_key": [f"a|ds|q|{i:03d}" for i in range(n)],
        "answer": [str(i) if i % 3 else None for i in range(n)],
        "terminate_reason": ["return_answer"] * (n - 1) + ["api_error"],
        "cost_usd": [0.5 * i for i in range(n)],
    })


def _scores(trials):
    return trials.select(
        "trial_key", "answer", "terminate_reason",
        pl.when(pl.col("terminate_reason") == "api_error").then(pl.lit("errored"))
        .when(pl.int_range(pl.len()) % 2 == 0).then(pl.lit("correct"))
        .otherwise(pl.lit("incorrect")).alias("verdict"),
        (pl.int_range(pl.len()) % 2 == 0).alias("is_correct"),
        pl.lit("r").alias("reason"),
        pl.lit(0, pl.Int32).alias("audit_flags"),
    )


def _by_join(trials, scores):
    return trials.join(scores.drop("answer", "terminate_reason"), on="trial_key", how="left",
                       maintain_order="left")


@pytest.mark.parametrize("lazy", [False, True])
def test_aligned_scores_give_the_joins_rows(lazy):
    trials = _trials()
    scores = _scores(trials)
    got = scored_trials(trials.lazy() if lazy else trials, scores.lazy() if lazy else scores)
    assert got.equals(_by_join(trials, scores))
    cat = scored_trials(trials, scores, verdicts=("verdict", "is_correct"),
                        categorical=("terminate_reason", "verdict"))
    assert cat.schema["verdict"] == pl.Categorical
    assert cat.with_columns(pl.col("terminate_reason", "verdict").cast(pl.String)).equals(
        _by_join(trials, scores).drop("reason", "audit_flags"))


@pytest.mark.parametrize("shape", ["shuffled", "unsorted_trials", "extra_scores", "duplicated"])
def test_unaligned_scores_are_joined(shape):
    trials, scores = _trials(), None
    if shape == "shuffled":
        scores = _scores(trials).reverse()
    elif shape == "unsorted_trials":  # same order on both sides, but not ascending
        trials = trials.reverse()
        scores = _scores(trials)
    elif shape == "extra_scores":
        scores = pl.concat([_scores(trials), _scores(_trials(8)).tail(2)])
    else:  # a key twice on both sides, row for row: the join's rows, not the positions'
        trials = pl.concat([trials, trials.tail(1)])
        scores = _scores(trials)
    got = scored_trials(trials, scores)
    assert got.equals(_by_join(trials, scores))
    if shape == "duplicated":
        assert got.height == trials.height + 2  # 2 x 2 rows for the repeated key


@pytest.mark.parametrize("aligned", [True, False])
def test_stale_scores_are_refused(aligned):
    trials = _trials()
    scores = _scores(trials)
    if not aligned:
        scores = scores.reverse()
    changed = trials.with_columns(
        pl.when(pl.col("trial_key") == "a|ds|q|002").then(pl.lit("other"))
        .otherwise(pl.col("answer")).alias("answer"))
    with pytest.raises(ScoringError, match=r"stale for 1 trial\(s\) \(e\.g\. a\|ds\|q\|002\)"):
        scored_trials(changed, scores, "r1")
    with pytest.raises(ScoringError, match=r"stale for 1 trial\(s\) \(e\.g\. a\|ds\|q\|005\)"):
        scored_trials(trials, scores.filter(pl.col("trial_key") != "a|ds|q|005"), "r1")
    rerun = trials.with_columns(pl.lit("max_iterations").alias("terminate_reason"))
    with pytest.raises(ScoringError, match=r"stale for 6 trial\(s\) \(e\.g\. a\|ds\|q\|000\)"):
        scored_trials(rerun, scores, "r1")


def test_empty_run():
    trials = _trials().head(0)
    assert scored_trials(trials, _scores(trials)).equals(_by_join(trials, _scores(trials)))
