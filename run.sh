#!/usr/bin/env bash
# One entry point for a fresh machine (Python >= 3.10 and Java 17 installed):
#   bash run.sh demo pagerank [options]   run the PageRank demo on an embedded local Spark
#   bash run.sh demo online-kmeans        online k-means over files arriving in a watched folder
#   bash run.sh test [pytest args]        lint, type-check and run the test suite
#   bash run.sh test --slow [pytest args] the slow fault and soak tests (marked slow_spark) only
#   bash run.sh test --cluster [args]     the cluster tier (marked cluster): local-cluster,
#                                         a secured standalone cluster, spark-submit; slow ones too
#   bash run.sh test-oldest [pytest args] the core tests on the oldest supported PySpark
#   bash run.sh docs [mkdocs build args]  build the docs and API reference strictly (a broken
#                                         link or reference fails) into a temporary folder;
#                                         --site-dir DIR keeps the site
# The first call creates .venv and installs iterflow with its test tools into it.
set -euo pipefail
cd "$(dirname "$0")"

venv=${ITERFLOW_VENV:-.venv}
python=${PYTHON:-python3}
# The oldest PySpark that pyproject.toml admits (pyspark>=4.0), and the tests run on it.
oldest_pyspark=4.0.0
oldest_tests=(tests/test_bounded_semantics.py tests/test_termination.py tests/test_lineage.py
  tests/test_errors.py tests/test_pagerank.py tests/test_checkpoints.py tests/test_columnar.py
  tests/test_connect.py tests/test_ml_kmeans.py tests/test_resident.py
  # assert_frame_close stands on pyspark.testing.assertDataFrameEqual(rtol=, atol=)
  tests/test_testing.py::test_frame_close_takes_each_kind_of_expected_and_names_key_differences
  tests/test_testing.py::test_frame_close_compares_maps_and_structs_within_the_tolerances
  # the whole semantics suite again on Spark Connect runs on the newest PySpark only
  --deselect tests/test_connect.py::test_the_core_semantics_tests_pass_on_a_connect_session
  # one random graph of the three is enough to see PageRank's kernels on the oldest PySpark
  --deselect "tests/test_pagerank.py::test_pagerank_matches_networkx_on_random_graphs_with_dangling_vertices[2]"
  --deselect "tests/test_pagerank.py::test_pagerank_matches_networkx_on_random_graphs_with_dangling_vertices[3]")

if ! command -v java >/dev/null 2>&1; then
  echo "run.sh: Java (17 or newer) is needed by Spark and was not found on PATH" >&2
  exit 1
fi
# Create virtualenv $1 and pip-install the rest of the arguments into it, unless it
# exists already and pyproject.toml has not changed since.
ensure_venv() {
  local env=$1
  shift
  if [ ! -x "$env/bin/python" ] || [ pyproject.toml -nt "$env/.installed" ]; then
    echo "run.sh: installing $* into $env" >&2
    "$python" -m venv "$env"
    "$env/bin/python" -m pip install --quiet --upgrade pip
    "$env/bin/python" -m pip install --quiet "$@"
    touch "$env/.installed"
  fi
}
ensure_venv "$venv" -e ".[dev]"

export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
command=${1:-}
[ $# -gt 0 ] && shift

# pytest in virtualenv $1 with the rest as arguments; exit code 5 ("no tests collected")
# is fine for a filter given by hand and a failure otherwise.
run_pytest() {
  local env=$1
  shift
  local status=0
  "$env/bin/python" -m pytest "$@" || status=$?
  if [ "$status" -eq 5 ]; then
    if [ -n "${filtered:-}" ]; then
      echo "run.sh: no test matched $filtered" >&2
      return 0
    fi
    echo "run.sh: pytest collected no tests" >&2
    return 1
  fi
  return "$status"
}

case "$command" in
  demo)
    exec "$venv/bin/iterflow" demo "$@"
    ;;
  test)
    if [ "${1:-}" = "--slow" ]; then
      shift
      set -- -m slow_spark "$@"
    elif [ "${1:-}" = "--cluster" ]; then
      shift
      set -- -m cluster "$@"
    fi
    "$venv/bin/ruff" check .
    "$venv/bin/ruff" format --check .
    "$venv/bin/mypy"
    filtered="$*" run_pytest "$venv" "$@"
    ;;
  test-oldest)
    oldest=${ITERFLOW_OLDEST_VENV:-.venv-pyspark-$oldest_pyspark}
    ensure_venv "$oldest" -e ".[test]" "pyspark[connect]==$oldest_pyspark"
    "$oldest/bin/python" -c "import pyspark; assert pyspark.__version__ == '$oldest_pyspark'"
    if [ $# -gt 0 ]; then
      filtered="$*" run_pytest "$oldest" "$@"
    else
      run_pytest "$oldest" "${oldest_tests[@]}"
    fi
    ;;
  docs)
    site=$(mktemp -d)
    trap 'rm -rf "$site"' EXIT
    "$venv/bin/mkdocs" build --strict --site-dir "$site" "$@"
    ;;
  *)
    echo "usage: bash run.sh demo pagerank|online-kmeans [options] | bash run.sh test|test-oldest [pytest args] | bash run.sh docs" >&2
    exit 2
    ;;
esac
