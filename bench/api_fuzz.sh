#!/usr/bin/env bash
# The full API fuzzing run (tests/test_security.py runs a bounded one in CI): schemathesis with every check over
# every operation of a running rackbench. Start the server first (scripts/demo, or the docker stack), then:
#   RACKBENCH_URL=http://127.0.0.1:8000 RACKBENCH_TOKEN=rbk_... bench/api_fuzz.sh [more schemathesis options]
# The token is a launch-scoped token of a throwaway team (the run creates, changes and deletes its objects);
# raise RACKBENCH_API_RATE on the server first, or the run measures the throttle. Exit status 0: nothing found.
set -euo pipefail
cd "$(dirname "$0")/.."
url="${RACKBENCH_URL:?set RACKBENCH_URL, e.g. http://127.0.0.1:8000}"
token="${RACKBENCH_TOKEN:?set RACKBENCH_TOKEN to an API token (rbk_...)}"
schema="$(mktemp --suffix=.json)"
trap 'rm -f "$schema"' EXIT
curl -fsS -H "Authorization: Bearer $token" -H "Accept: application/json" "$url/api/v1/schema/?format=json" > "$schema"
exec .venv/bin/schemathesis run "$schema" --url "$url" --checks all -H "Authorization: Bearer $token" \
  --max-examples "${RACKBENCH_FUZZ_EXAMPLES:-100}" --workers "${RACKBENCH_FUZZ_WORKERS:-4}" "$@"
