"""ALS against MLlib's (held-out RMSE, explicit and implicit), against the normal equations
solved in numpy from the same start, saved and loaded both ways, recommendations, cold
starts and its errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.ml import recommendation as mllib
from pyspark.ml.evaluation import RegressionEvaluator

from iterflow.ml import ALS, ALSModel, MLError, als

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def ratings(spark):
    """Ratings of 300 users x 120 items from a rank-4 structure plus noise."""
    rng = np.random.default_rng(0)
    users, items, n = 300, 120, 9000
    u_f, i_f = rng.normal(size=(users, 4)), rng.normal(size=(items, 4))
    u, i = rng.integers(0, users, n), rng.integers(0, items, n)
    value = np.einsum("ij,ij->i", u_f[u], i_f[i]) + rng.normal(0, 0.5, n)
    table = pa.table({"user": u.astype(np.int32), "item": i.astype(np.int32), "rating": value})
    df = spark.createDataFrame(table).dropDuplicates(["user", "item"]).repartition(3)
    train, test = df.randomSplit([0.8, 0.2], seed=1)
    return train.cache(), test.cache()


def rmse(df) -> float:
    """The held-out RMSE, by MLlib's evaluator (made once a session is up)."""
    evaluator = RegressionEvaluator(metricName="rmse", labelCol="rating")
    return evaluator.evaluate(df)


@pytest.mark.parametrize("implicit", [False, True])
def test_held_out_rmse_within_one_percent_of_mllib(ratings, implicit):
    train, test = ratings
    options = {"rank": 4, "maxIter": 10, "regParam": 0.1, "implicitPrefs": implicit}
    theirs = mllib.ALS(**options, coldStartStrategy="drop", seed=3).fit(train)
    ours = ALS(**options, coldStartStrategy="drop").setIterationOptions(progress=False)
    model = ours.fit(train)
    assert model.rounds == 20 and model.rank == 4  # two rounds an iteration
    mine, reference = rmse(model.transform(test)), rmse(theirs.transform(test))
    assert abs(mine - reference) <= 0.01 * reference


def normal_equations(fixed, rows, cols, values, count, reg):
    """Each row's ridge solution with MLlib's penalty (reg times its ratings), in numpy."""
    solved = np.zeros((count, fixed.shape[1]))
    for k in range(count):
        mine = rows == k
        y, r = fixed[cols[mine]], values[mine]
        system = y.T @ y + reg * mine.sum() * np.eye(fixed.shape[1])
        solved[k] = np.linalg.solve(system, y.T @ r)
    return solved


def test_one_iteration_solves_the_normal_equations_from_the_start(ratings):
    train, _ = ratings
    start = mllib.ALS(rank=3, maxIter=1, regParam=0.05, seed=2).fit(train)
    model = (
        ALS(rank=3, maxIter=1, regParam=0.05, initialModel=start)
        .setIterationOptions(progress=False)
        .fit(train)
    )
    rows = train.collect()
    user_ids, item_ids = model.learned["userIds"], model.learned["itemIds"]
    u = np.searchsorted(user_ids, [r["user"] for r in rows])
    i = np.searchsorted(item_ids, [r["item"] for r in rows])
    values = np.array([r["rating"] for r in rows])
    factors = {r["id"]: r["features"] for r in start.userFactors.collect()}
    first = np.array([factors[k] for k in user_ids], dtype=np.float64)
    items = normal_equations(first, i, u, values, len(item_ids), 0.05)  # items first
    users = normal_equations(items, u, i, values, len(user_ids), 0.05)
    np.testing.assert_allclose(model.learned["items"], items, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(model.learned["users"], users, rtol=1e-8, atol=1e-10)


def test_saved_models_load_across_the_libraries_and_recommend(ratings, tmp_path):
    train, test = ratings
    model = als(train, rank=4, max_rounds=3, progress=False)
    model.save(str(tmp_path / "ours"))
    theirs = mllib.ALSModel.load(str(tmp_path / "ours"))
    assert theirs.rank == 4
    a = model.transform(test).orderBy("user", "item").select("prediction").collect()
    b = theirs.transform(test).orderBy("user", "item").select("prediction").collect()
    np.testing.assert_allclose(
        [r[0] for r in a], [r[0] for r in b], rtol=1e-5, atol=1e-6, equal_nan=True
    )

    fitted = mllib.ALS(rank=3, maxIter=2, seed=1).fit(train)
    fitted.save(str(tmp_path / "theirs"))
    loaded = ALSModel.load(str(tmp_path / "theirs"))
    assert loaded.rank == 3 and not loaded.hasSummary
    a = loaded.transform(test).orderBy("user", "item").select("prediction").collect()
    b = fitted.transform(test).orderBy("user", "item").select("prediction").collect()
    np.testing.assert_allclose(
        [r[0] for r in a], [r[0] for r in b], rtol=1e-5, atol=1e-6, equal_nan=True
    )

    top = {r["user"]: r["recommendations"] for r in model.recommendForAllUsers(3).collect()}
    scores = model.learned["users"] @ model.learned["items"].T
    for k, user in enumerate(model.learned["userIds"][:20]):
        best = model.learned["itemIds"][np.argsort(-scores[k], kind="stable")[:3]]
        assert [x["item"] for x in top[int(user)]] == best.tolist()
    subset = model.recommendForUserSubset(test.select("user").limit(5), 2).collect()
    assert all(len(r["recommendations"]) == 2 for r in subset)


def test_cold_starts_and_errors(spark, ratings):
    train, _ = ratings
    model = ALS(rank=2, maxIter=1).setIterationOptions(progress=False).fit(train)
    unseen = spark.createDataFrame([(10_000, 0), (0, 0)], "user INT, item INT")
    assert np.isnan(model.transform(unseen).orderBy("user").collect()[1]["prediction"])
    assert model.setColdStartStrategy("drop").transform(unseen).count() == 1
    with pytest.raises(MLError, match="no column 'rating'"):
        ALS().setIterationOptions(progress=False).fit(train.drop("rating"))
    strings = spark.createDataFrame([("a", 1, 1.0)], "user STRING, item INT, rating DOUBLE")
    with pytest.raises(MLError, match="column 'user' must hold integer ids"):
        ALS().setIterationOptions(progress=False).fit(strings)
    with pytest.raises(MLError, match=r"has no Param\(s\) \['ranks'\]"):
        ALS(ranks=3)
