#!/bin/sh
# The regression workflow's steps (.github/workflows/bench.yml): the same on a hosted runner, on a
# board that runs the CI job, and on this machine (scripts/ci-local.py runs them against a
# throwaway PostgreSQL).
#   scripts/bench-ci.sh main   run the ci suite; the run is pushed to $ZOBENCH_STORE as a run of main
#   scripts/bench-ci.sh pr     run it (pushed under its own branch), compare it with the last runs of
#                              main in the store, write the Markdown verdicts to $GITHUB_STEP_SUMMARY
#                              (stdout without it, its first line the gate's verdict); exits as
#                              `zobench compare` does: 0 every key judged and none regressed, 1 a
#                              regression, 3 keys it could not judge (noisy, too few repeats, not
#                              comparable). A runner that is shared and must keep passing sets
#                              ZOBENCH_COMPARE_ARGS=--allow-unjudged: 3 then only when no key was
#                              judged or one is not comparable; the summary still names the keys
# $ZOBENCH_CI_ARGS: more `zobench run` arguments (e.g. "--runtime cpp" for a board without torch);
# $ZOBENCH_COMPARE_ARGS: more `zobench compare` arguments (e.g. "--threshold 10").
# $ZOBENCH_SITE: publish the store's dashboard into this folder after the run (docs/dashboard.md),
# with $ZOBENCH_PUBLISH_ARGS (e.g. "--reports 3");
# $ZOBENCH_DASHBOARD_URL: where that folder is served; the job summary then links to this commit's
# compare view against main.
set -eu
: "${ZOBENCH_STORE:?set ZOBENCH_STORE to the shared store, postgresql://USER@HOST/DB (password in ~/.pgpass or PGPASSWORD)}"
ZOBENCH=${ZOBENCH:-.venv/bin/zobench}
RESULTS=${RESULTS:-results}
case ${1:-} in
  main) export ZOBENCH_BRANCH="${ZOBENCH_BRANCH:-main}" ;;
  pr) ;;
  *) echo "usage: scripts/bench-ci.sh main|pr" >&2; exit 2 ;;
esac
# shellcheck disable=SC2086  # ZOBENCH_CI_ARGS is a list of words
"$ZOBENCH" run --suite ci --no-report --results "$RESULTS" ${ZOBENCH_CI_ARGS:-}
run=$(ls "$RESULTS/runs" | tail -n 1)
# shellcheck disable=SC2086
if [ -n "${ZOBENCH_SITE:-}" ]; then "$ZOBENCH" publish --out "$ZOBENCH_SITE" ${ZOBENCH_PUBLISH_ARGS:-}; fi
[ "$1" = main ] && exit 0
rc=0
# shellcheck disable=SC2086
"$ZOBENCH" compare --baseline-from "$ZOBENCH_STORE" --branch main --results "$RESULTS" --format markdown \
    ${ZOBENCH_COMPARE_ARGS:-} "$run" \
    > "$RESULTS/compare-$run.md" || rc=$?
if [ -n "${ZOBENCH_DASHBOARD_URL:-}" ]; then
  commit=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["git"]["commit"])' "$RESULTS/runs/$run/run.json")
  printf '\n[This commit against main on the dashboard](%s/compare.html?b=%s)\n' "${ZOBENCH_DASHBOARD_URL%/}" "$commit" \
      >> "$RESULTS/compare-$run.md"
fi
cat "$RESULTS/compare-$run.md" >> "${GITHUB_STEP_SUMMARY:-/dev/stdout}"
exit $rc
