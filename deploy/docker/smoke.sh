#!/usr/bin/env bash
# Smoke-test a built image: the entrypoint answers, a demo trains to the end as the non-root user into a
# mounted runs folder and records env.json, and the healthcheck is healthy while the dashboard is up.
#   deploy/docker/smoke.sh [IMAGE]            (default steadytune:<version>)
#   CONTAINER=podman RUN_ARGS="--runtime runc" deploy/docker/smoke.sh steadytune:0.1.0
# Uses the host network (the dashboard listens on $PORT); needs no GPU and no network access.
set -euo pipefail
cd "$(dirname "$0")/../.."
CONTAINER=${CONTAINER:-docker}
IMAGE=${1:-steadytune:$(sed -n 's/^__version__ = "\(.*\)"/\1/p' src/steadytune/__init__.py)}
PORT=${PORT:-7871}
read -r -a EXTRA <<< "${RUN_ARGS:-}"
RUNS=$(mktemp -d)
NAME=steadytune-smoke-$$
chmod 777 "$RUNS"  # the image's user (uid 1000) writes here
trap '$CONTAINER rm -f "$NAME" >/dev/null 2>&1 || true; rm -rf "$RUNS"' EXIT

run() { "$CONTAINER" run --rm --network=host "${EXTRA[@]}" -v "$RUNS:/runs" "$IMAGE" "$@"; }

echo "== entrypoint"; run --version
echo "== demo with the dashboard, in the background"
"$CONTAINER" run -d --name "$NAME" --network=host "${EXTRA[@]}" -v "$RUNS:/runs" \
  -e HF_HUB_OFFLINE=1 -e STEADYTUNE_DASHBOARD_PORT="$PORT" \
  "$IMAGE" demo --runs-dir /runs --steps 60 --dashboard --port "$PORT" >/dev/null
# podman runs the image's HEALTHCHECK on request; docker runs it on its interval and reports the status.
check() {
  if "$CONTAINER" healthcheck --help >/dev/null 2>&1; then "$CONTAINER" healthcheck run "$NAME" >/dev/null 2>&1
  else [ "$("$CONTAINER" inspect -f '{{.State.Health.Status}}' "$NAME")" = healthy ]; fi
}
healthy=no
for _ in $(seq 1 60); do
  if check; then healthy=yes; break; fi
  sleep 2
done
echo "== healthcheck while the dashboard is up: $healthy"
[ "$healthy" = yes ]
"$CONTAINER" wait "$NAME" >/dev/null
"$CONTAINER" logs "$NAME" 2>&1 | grep -E "^  state" || true
run_dir=$(ls "$RUNS" | head -1)
echo "== the run directory, written as uid $(stat -c %u "$RUNS/$run_dir/env.json")"
grep -q '"read_by": "worker"' "$RUNS/$run_dir/env.json"
[ -d "$RUNS/$run_dir/final" ]
run env "/runs/$run_dir" | head -12
echo "smoke test passed: $IMAGE"
