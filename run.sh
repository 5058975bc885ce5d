#!/usr/bin/env bash
# One entry point for a fresh machine (Python >= 3.10 and Java 17 installed):
#   bash run.sh demo pagerank [options]   run the PageRank demo on an embedded local Spark
#   bash run.sh demo online-kmeans        online k-means over files arriving in a watched folder
#   bash run.sh test [pytest args]        lint, type-check and run the test suite
# The first call creates .venv and installs iterflow with its test tools into it.
set -euo pipefail
cd "$(dirname "$0")"

venv=${ITERFLOW_VENV:-.venv}
python=${PYTHON:-python3}

if ! command -v java >/dev/null 2>&1; then
  echo "run.sh: Java (17 or newer) is needed by Spark and was not found on PATH" >&2
  exit 1
fi
if [ ! -x "$venv/bin/python" ] || [ pyproject.toml -nt "$venv/.installed" ]; then
  echo "run.sh: installing iterflow and its test tools into $venv" >&2
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -e ".[dev]"
  touch "$venv/.installed"
fi

export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1}
command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  demo)
    exec "$venv/bin/iterflow" demo "$@"
    ;;
  test)
    "$venv/bin/ruff" check .
    "$venv/bin/ruff" format --check .
    "$venv/bin/mypy"
    status=0
    "$venv/bin/python" -m pytest "$@" || status=$?
    if [ "$status" -eq 5 ]; then
      # pytest's "no tests collected": fine for a filter given by hand, a failure otherwise.
      if [ $# -gt 0 ]; then
        echo "run.sh: no test matched $*" >&2
        exit 0
      fi
      echo "run.sh: pytest collected no tests" >&2
      exit 1
    fi
    exit "$status"
    ;;
  *)
    echo "usage: bash run.sh demo pagerank|online-kmeans [options] | bash run.sh test [pytest args]" >&2
    exit 2
    ;;
esac
