"""A job submitted with ``spark-submit`` (client mode) to a standalone cluster with Spark's
authentication and network encryption on: the session ``itf.session()`` finds, resident
rounds on executors of two workers over the TLS data plane, and a combine whose model and
accumulators pass along the tasks' tree over TLS too. Prints one JSON line."""

from __future__ import annotations

import json

from cluster_exchange_job import run as exchange
from cluster_resident_job import run

import iterflow as itf


def main() -> None:
    spark = itf.session()
    spark.sparkContext.setLogLevel("ERROR")
    points = spark.range(0, 200_000, 1, 4).selectExpr("CAST(id AS DOUBLE) AS x")
    conf = spark.sparkContext.getConf()
    out = {
        "master": spark.sparkContext.master,
        "app": spark.sparkContext.appName,
        "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
        "authenticate": conf.get("spark.authenticate", None),
        "crypto": conf.get("spark.network.crypto.enabled", None),
        **run(spark, points, rounds=3),
        "exchange": {way: exchange(spark, points, way == "tree") for way in ("tree", "driver")},
    }
    print(json.dumps(out))
    spark.stop()


if __name__ == "__main__":
    main()
