#!/usr/bin/env bash
# Start a real Dask cluster on 127.0.0.1 (one `dask scheduler`, N `dask worker`
# processes), run deploy/driver.py against it, and stop every process again,
# also when the fit fails or the script is interrupted.
#
# Usage: deploy/local/start_cluster.sh [-n WORKERS] [-- DRIVER_ARGS...]
#   -n, --workers N   worker processes (1 thread each; default 2); the driver
#                     waits for all of them and uses N row shards unless
#                     DRIVER_ARGS say otherwise (e.g. -- --shards 4 --workers 2)
#   -h, --help        this help
# Environment: PYTHON (default python), DASK (default dask), STARTUP_TIMEOUT
# (seconds to wait for the scheduler, default 30).
# Ports: the OS picks free ones (--port 0); the address is read back from the
# scheduler file, so several copies of this script can run at once.
set -euo pipefail
set -m  # every background process gets its own process group: cleanup stops whole groups (nanny + worker)

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DRIVER="$HERE/../driver.py"
PYTHON=${PYTHON:-python}
DASK=${DASK:-dask}
STARTUP_TIMEOUT=${STARTUP_TIMEOUT:-30}
N_WORKERS=2

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

while (($#)); do
    case "$1" in
        -n | --workers)
            [[ $# -ge 2 && "$2" =~ ^[1-9][0-9]*$ ]] || { echo "start_cluster.sh: error: $1 needs a positive integer" >&2; exit 2; }
            N_WORKERS=$2
            shift 2
            ;;
        -h | --help) usage; exit 0 ;;
        --) shift; break ;;
        *) echo "start_cluster.sh: error: unknown option $1 (driver options go after --)" >&2; exit 2 ;;
    esac
done

WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/mwumkl-local-cluster.XXXXXX")
SCHEDULER_FILE="$WORKDIR/scheduler.json"
SCHEDULER_PID=""
WORKER_PIDS=()
DRIVER_PID=""

group_alive() { kill -0 -- "-$1" 2>/dev/null; }

# Send TERM to the process groups given, wait up to $1 seconds, then KILL what is left.
stop_groups() {
    local grace=$1 pid deadline
    shift
    (($#)) || return 0
    for pid in "$@"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    deadline=$((SECONDS + grace))
    for pid in "$@"; do
        while group_alive "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
        if group_alive "$pid"; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
        wait "$pid" 2>/dev/null || true
    done
}

show_logs() {
    local log
    for log in "$WORKDIR"/*.log; do
        [[ -e "$log" ]] || continue
        echo "---- last lines of $(basename "$log") ----" >&2
        tail -n 15 "$log" >&2
    done
}

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    ((status == 0)) || show_logs
    if [[ -n "$DRIVER_PID" ]]; then stop_groups 5 "$DRIVER_PID"; fi
    # Workers first: a worker whose scheduler is already gone lingers trying to reconnect.
    if ((${#WORKER_PIDS[@]})); then stop_groups 15 "${WORKER_PIDS[@]}"; fi
    if [[ -n "$SCHEDULER_PID" ]]; then stop_groups 10 "$SCHEDULER_PID"; fi
    echo "cluster stopped (scheduler and ${#WORKER_PIDS[@]} workers)"
    rm -rf "$WORKDIR"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

"$DASK" scheduler --host 127.0.0.1 --port 0 --no-dashboard --dashboard-address 127.0.0.1:0 \
    --scheduler-file "$SCHEDULER_FILE" >"$WORKDIR/scheduler.log" 2>&1 &
SCHEDULER_PID=$!

deadline=$((SECONDS + STARTUP_TIMEOUT))
until [[ -s "$SCHEDULER_FILE" ]]; do
    if ! kill -0 "$SCHEDULER_PID" 2>/dev/null; then
        echo "start_cluster.sh: error: the scheduler exited during startup" >&2
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        echo "start_cluster.sh: error: the scheduler did not start within $STARTUP_TIMEOUT s" >&2
        exit 1
    fi
    sleep 0.2
done
sleep 0.2 # the file is written in one go, but give a slow disk a moment
ADDRESS=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$SCHEDULER_FILE")
echo "started scheduler (pid $SCHEDULER_PID) at $ADDRESS"

for ((i = 1; i <= N_WORKERS; i++)); do
    "$DASK" worker --scheduler-file "$SCHEDULER_FILE" --host 127.0.0.1 --nthreads 1 --no-dashboard \
        --name "local-worker-$i" --local-directory "$WORKDIR" --death-timeout 60 \
        >"$WORKDIR/worker-$i.log" 2>&1 &
    WORKER_PIDS+=($!)
    echo "started worker $i (pid $!)"
done

# In the background and waited for: bash runs a trap only between commands, and `wait`
# returns at once on a signal, so INT/TERM stop the driver and the cluster right away.
"$PYTHON" "$DRIVER" --scheduler "$ADDRESS" --workers "$N_WORKERS" --shards "$N_WORKERS" "$@" </dev/null &
DRIVER_PID=$!
wait "$DRIVER_PID"
