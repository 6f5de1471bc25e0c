#!/usr/bin/env bash
# The main job on the embedded default: SQLite, Celery's filesystem broker, a filesystem
# object store, the local bubblewrap sandbox. Starts the platform (gateway + one worker
# for every queue) in the background, imports the example dataset, evaluates it with the
# oracle agent through the `synth` CLI, and shows the result.
#
#   bash deploy/embedded.sh          # set-up, start, run the evaluation, leave it running
#   bash deploy/embedded.sh stop     # stop the background processes
#
# Environment: SYNTH_PORT (8000), SYNTH_VAR_DIR (var/), SYNTH_DEMO_ACTOR (examples/oracle-agent.json).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# The embedded default is what you get with none of the service variables set.
unset DATABASE_URL CELERY_BROKER_URL SYNTH_OBJECT_STORE
export SYNTH_VAR_DIR=${SYNTH_VAR_DIR:-$ROOT/var}
PORT=${SYNTH_PORT:-8000}
export SYNTH_PUBLIC_URL=http://127.0.0.1:$PORT
RUNDIR=$SYNTH_VAR_DIR/run
LOGDIR=$SYNTH_VAR_DIR/log
mkdir -p "$RUNDIR" "$LOGDIR"

stop() {
  for name in worker gateway; do
    pidfile=$RUNDIR/$name.pid
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
  done
}

if [ "${1:-}" = "stop" ]; then stop; echo "stopped"; exit 0; fi

bash deploy/setup.sh
PY=$ROOT/.venv/bin/python
SYNTH=$ROOT/.venv/bin/synth

start() {  # name, command...: a background process in its own session, with a pid file
  local name=$1; shift
  if [ -f "$RUNDIR/$name.pid" ] && kill -0 "$(cat "$RUNDIR/$name.pid")" 2>/dev/null; then return; fi
  setsid "$@" >"$LOGDIR/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUNDIR/$name.pid"
}

$PY manage.py migrate --noinput >/dev/null
start gateway "$ROOT/.venv/bin/gunicorn" synth_project.wsgi -b "127.0.0.1:$PORT" -w 1 -k gthread --threads 16 \
  --timeout 0 --access-logfile -
start worker "$ROOT/.venv/bin/celery" -A synth_project worker -Q control,trials,evidence,training -c 3 -B \
  -s "$SYNTH_VAR_DIR/celerybeat-schedule" --without-gossip --without-mingle -l INFO

for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null || { echo "the gateway did not start; see $LOGDIR/gateway.log" >&2; exit 1; }

TOKEN_FILE=$SYNTH_VAR_DIR/demo-token
if [ ! -s "$TOKEN_FILE" ]; then
  (umask 077; $PY manage.py create_token --org demo --user operator --name embedded-demo > "$TOKEN_FILE")
fi
export SYNTH_API_URL=http://127.0.0.1:$PORT SYNTH_TOKEN=$(cat "$TOKEN_FILE")
ACTOR=${SYNTH_DEMO_ACTOR:-examples/oracle-agent.json}

echo "== dataset"
$SYNTH dataset push examples/tasks --name demo/examples --version 1
echo "== evaluation run"
RUN=$($SYNTH run start --dataset demo/examples@1 --actor "@$ACTOR" --plan @examples/eval-plan.json --kind evaluate)
echo "$RUN"
echo "== events"
$SYNTH run events "$RUN" --follow || true
echo "== result"
$SYNTH run show "$RUN"
$SYNTH run trials "$RUN"
cat <<MSG

The platform is still running:
  API     $SYNTH_API_URL/api/docs/    (token in $TOKEN_FILE)
  admin   $SYNTH_API_URL/admin/       (create a login: .venv/bin/python manage.py createsuperuser)
  CLI     export SYNTH_API_URL=$SYNTH_API_URL SYNTH_TOKEN=\$(cat $TOKEN_FILE); .venv/bin/synth run list
  stop    bash deploy/embedded.sh stop
MSG
