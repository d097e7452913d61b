#!/usr/bin/env bash
# A Flower deployment on this machine that is closed: a SuperLink with TLS and SuperNode
# authentication whose own address (Control, Runtime and Fleet APIs) is the operator's, a
# Fleet-only gateway (fleet_gateway.py) on the address the SuperNodes are given, NODES SuperNodes
# each with its own registered key, TLS certificate and SuperExec secret, client ids bound to the
# registered node ids (node-binding.json), the example app run with `flwr run --stream`, the run
# checked, and every process this script started stopped by its PID.
# docs/flower.rst ("Deploying on localhost with TLS and SuperNode authentication") shows the
# blocks between the [docs:...] markers: pasted in order into a shell in the repository root,
# they do what this script does (which CI runs).
#
# Usage (from anywhere, with fedselect[flower] installed in the active Python environment):
#   bash examples/flower-fedcor/deploy/run_local.sh
# Settings, from the environment:
#   NODES=5            SuperNodes, one per client: the run sets the app's num-clients to it
#   ROUNDS=3           num-server-rounds
#   DATASET=fmnist     the app's dataset: fmnist needs the Fashion-MNIST files (docs/flower.rst says
#                      where), digits ships with scikit-learn
#   RUN_CONFIG=""      more run-config overrides, e.g. "clients-per-round=2 lr=0.05"
#   SUPEREXEC=fork     fork: fedselect's SuperExec (python -m fedselect.flower.superexec) forks each
#                      ClientApp process from a warm parent; flower: Flower's own flower-superexec
#                      (started by each SuperNode), a fresh interpreter per message, much slower
#   LINK_PORT=9093     the SuperLink's own port on 127.0.0.1 (its Fleet, Control and Runtime APIs
#                      share it): the operator's `flwr` and the ServerApp's SuperExec only
#   FLEET_HOST=127.0.0.1 FLEET_PORT=9092   the gateway: the only address SuperNodes are given; on
#                      other machines, FLEET_HOST is the SuperLink host's public address (add it to
#                      the server certificate with generate_credentials.sh's EXTRA_SAN)
#   NODE_PORT=9100     SuperNode i serves its Runtime API on NODE_PORT + i (NODE_PORT + NODES: the
#                      rogue check's claimer)
#   WORK=examples/flower-fedcor/deploy/run   logs, PIDs, flwr's config, the run's records
#   CRED=examples/flower-fedcor/deploy/credentials   CA, server certificate, SuperNode keys
#   ROGUE_CHECK=0      1: also try four attacks that must be refused (CI sets this): a stranger with
#                      ca.crt and the SuperNodes' address registering its own key (`flwr supernode
#                      register`: the gateway refuses the Control API), SuperNodes without a key
#                      and with that unregistered key (the SuperLink refuses them), and a
#                      registered but unbound SuperNode started first claiming client 0 (the
#                      binding refuses it); the script fails unless each is refused
#   ROGUE_WAIT=180     seconds a refused SuperNode has to exit (Flower's retries on a busy machine)
# Exit status: 0 only if the run finished with every round's record written.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."   # the repository root

# [docs:settings]
NODES="${NODES:-5}" ROUNDS="${ROUNDS:-3}" DATASET="${DATASET:-fmnist}" RUN_CONFIG="${RUN_CONFIG:-}"
SUPEREXEC="${SUPEREXEC:-fork}"
LINK_PORT="${LINK_PORT:-9093}" NODE_PORT="${NODE_PORT:-9100}" FLEET_HOST="${FLEET_HOST:-127.0.0.1}" FLEET_PORT="${FLEET_PORT:-9092}"
DEPLOY="$PWD/examples/flower-fedcor/deploy"
WORK="$(mkdir -p "${WORK:-$DEPLOY/run}" && cd "${WORK:-$DEPLOY/run}" && pwd)"
CRED="${CRED:-$DEPLOY/credentials}"
export FLWR_HOME="$WORK/flwr-home" FLWR_TELEMETRY_ENABLED=0   # flwr's config for this deployment only
mkdir -p "$FLWR_HOME" && : >"$WORK/pids"                       # every PID started is appended here
bash "$DEPLOY/generate_credentials.sh" "$NODES" "$CRED" && CRED="$(cd "$CRED" && pwd)"
# [/docs:settings]

ROGUE_CHECK="${ROGUE_CHECK:-0}" ROGUE_WAIT="${ROGUE_WAIT:-180}"
case "$SUPEREXEC" in fork | flower) ;; *) echo "run_local.sh: SUPEREXEC must be fork or flower, got '$SUPEREXEC'" >&2; exit 2 ;; esac
rm -f "$WORK/run.log"

# Every process recorded in $WORK/pids, and what they started (Flower's SuperExecs, ServerApp and
# ClientApp processes), found by parent PID before any is signalled: nothing is stopped by name.
descendants() {
    local pid
    for pid in "$@"; do
        echo "$pid"
        # shellcheck disable=SC2046
        descendants $(pgrep -P "$pid" || true)
    done
}
stop_all() {
    local status=$? pids alive pid
    trap - EXIT INT TERM
    if [[ -s "$WORK/pids" ]]; then
        # shellcheck disable=SC2046
        pids="$(descendants $(cat "$WORK/pids") | sort -u | tr '\n' ' ')"
        # shellcheck disable=SC2086
        kill $pids 2>/dev/null || true
        for _ in $(seq 1 40); do   # a SuperNode and its SuperExec take several seconds to shut down
            alive=0
            for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive=1; done
            [[ $alive -eq 0 ]] && break
            sleep 0.5
        done
        for pid in $pids; do kill -9 "$pid" 2>/dev/null || true; done
        : >"$WORK/pids"
        echo "==> stopped: $pids"
    fi
    exit "$status"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

fail() {
    echo "run_local.sh: $*" >&2
    local f
    for f in "$WORK/run.log" "$WORK/superlink.log" "$WORK/superexec-link.log" "$WORK/gateway.log" \
        "$WORK/supernode-0.log" "$WORK/superexec-0.log" "$WORK/stranger-register.json" \
        "$WORK/rogue-nokey.log" "$WORK/rogue-unregistered.log" "$WORK/rogue-claimer.log"; do
        [[ -s "$f" ]] && { echo "---- $f (last 40 lines)"; tail -40 "$f"; } >&2
    done
    exit 1
}

# The ports must be free: say which variable moves them rather than failing later.
python - "$LINK_PORT" "$NODE_PORT" "$NODES" "$FLEET_PORT" <<'PY' || exit 1
import socket, sys
link, base, n, fleet = (int(a) for a in sys.argv[1:])
for name, port in [("LINK_PORT", link), ("FLEET_PORT", fleet)] + [(f"NODE_PORT+{i}", base + i) for i in range(n + 1)]:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            sys.exit(f"run_local.sh: port {port} ({name}) is in use; set LINK_PORT / FLEET_PORT / NODE_PORT to free ones")
PY
START=$SECONDS

# [docs:superlink]
# The SuperLink on the operator's address only. --isolation process: the ServerApp runs under the
# SuperExec below, which proves itself with the SuperLink's secret (Flower ignores the secret in
# the default subprocess isolation).
flower-superlink --ssl-ca-certfile "$CRED/ca.crt" --ssl-certfile "$CRED/server.pem" --ssl-keyfile "$CRED/server.key" \
    --enable-supernode-auth --disable-runtime-dependency-installation --host 127.0.0.1 --port "$LINK_PORT" \
    --isolation process --superexec-auth-secret-file "$CRED/superlink.secret" >"$WORK/superlink.log" 2>&1 &
link=$!
echo $link >>"$WORK/pids"
flower-superexec --runtime-api-address "127.0.0.1:$LINK_PORT" --root-certificates "$CRED/ca.crt" \
    --superexec-auth-secret-file "$CRED/superlink.secret" --parent-pid "$link" >"$WORK/superexec-link.log" 2>&1 &
echo $! >>"$WORK/pids"
# The address the SuperNodes are given: a gateway that forwards the Fleet API only (the Control
# API, which registers keys, and the Runtime API get 403).
python "$DEPLOY/fleet_gateway.py" --listen "$FLEET_HOST:$FLEET_PORT" --superlink "127.0.0.1:$LINK_PORT" \
    --ssl-certfile "$CRED/server.pem" --ssl-keyfile "$CRED/server.key" --ssl-ca-certfile "$CRED/ca.crt" \
    >"$WORK/gateway.log" 2>&1 &
gateway=$!
echo $gateway >>"$WORK/pids"
cat >"$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "fedselect-local"

[superlink.fedselect-local]
address = "127.0.0.1:$LINK_PORT"
root-certificates = "$CRED/ca.crt"
EOF
for _ in $(seq 60); do flwr supernode list >/dev/null 2>&1 && break; sleep 1; done   # until it answers
# [/docs:superlink]
flwr supernode list >/dev/null 2>&1 || fail "the SuperLink did not answer on 127.0.0.1:$LINK_PORT within 60 s"
for _ in $(seq 60); do (: <"/dev/tcp/$FLEET_HOST/$FLEET_PORT") 2>/dev/null && break; kill -0 $gateway 2>/dev/null || break; sleep 1; done
(: <"/dev/tcp/$FLEET_HOST/$FLEET_PORT") 2>/dev/null || fail "the gateway did not listen on $FLEET_HOST:$FLEET_PORT within 60 s"
echo "==> [$((SECONDS - START)) s] the SuperLink answers on 127.0.0.1:$LINK_PORT (TLS, SuperNode authentication); Fleet-only gateway on $FLEET_HOST:$FLEET_PORT"

# [docs:register]
for ((i = 0; i < NODES; i++)); do
    flwr supernode register "$CRED/supernode-$i.pub" --format json >"$WORK/registered-$i.json"
done
# Each client id bound to the node id its SuperNode's registered key got: {"<node id>": client id}
python -c 'import json, sys; print(json.dumps({str(json.load(open(f"{sys.argv[1]}/registered-{i}.json"))["node-id"]): i
                                             for i in range(int(sys.argv[2]))}))' "$WORK" "$NODES" >"$WORK/node-binding.json"
# [/docs:register]
for ((i = 0; i < NODES; i++)); do
    grep -q '"success": true' "$WORK/registered-$i.json" || fail "registering supernode-$i.pub failed: $(cat "$WORK/registered-$i.json")"
done
echo "==> [$((SECONDS - START)) s] registered the public keys of $NODES SuperNodes; bound client ids to their node ids in node-binding.json"

expected=$NODES   # SuperNodes the SuperLink must list online
if [[ "$ROGUE_CHECK" == 1 ]]; then
    mkdir -p "$WORK/rogue"
    rm -f "$WORK/rogue/"*
    # A stranger holding only ca.crt and the address SuperNodes are given writes its own flwr
    # config, makes a key and registers it: the gateway must refuse the Control API.
    bash "$DEPLOY/generate_credentials.sh" 1 "$WORK/rogue" >/dev/null
    mv "$WORK/rogue/supernode-0" "$WORK/rogue/stranger" && mv "$WORK/rogue/supernode-0.pub" "$WORK/rogue/stranger.pub"
    mkdir -p "$WORK/stranger-home"
    cat >"$WORK/stranger-home/config.toml" <<EOF
[superlink]
default = "stranger"

[superlink.stranger]
address = "$FLEET_HOST:$FLEET_PORT"
root-certificates = "$CRED/ca.crt"
EOF
    rc=0
    FLWR_HOME="$WORK/stranger-home" flwr supernode register "$WORK/rogue/stranger.pub" --format json \
        >"$WORK/stranger-register.json" 2>&1 || rc=$?
    if grep -q '"success": true' "$WORK/stranger-register.json"; then
        fail "a stranger registered its own key through $FLEET_HOST:$FLEET_PORT: the Control API is open to SuperNodes"
    fi
    grep -q "refused POST /v1/control/register-node" "$WORK/gateway.log" \
        || fail "the stranger's registration failed (exit $rc) without the gateway's refusal in gateway.log"
    echo "==> [$((SECONDS - START)) s] refused as it must be: a stranger's flwr supernode register through the SuperNodes' address (gateway: 403 on /v1/control/register-node, flwr exit $rc)"
    # Two SuperNodes the SuperLink must refuse, both with TLS and both claiming to be client 0: one
    # without a key (it generates one and asks to register: refused, registration is CLI-only), one
    # with the stranger's key, whose registration the gateway refused (its activation is refused).
    # With authentication off, both would join (and each would answer the server's hello as client 0).
    # Each is started on a port that is free when chosen; another process may take it before the
    # SuperNode binds it (it then exits 1 with "address already in use", refused by no one), so a
    # rogue that lost its port is started again on a new one, up to three times.
    declare -A rogue_pid=()
    start_rogue() {
        local who=$1 port key=()
        [[ $who == unregistered ]] && key=(--auth-supernode-private-key "$WORK/rogue/stranger")
        port=$(python - "$LINK_PORT" "$NODE_PORT" "$NODES" "$FLEET_PORT" <<'PY'
import socket, sys
link, base, n, fleet = (int(a) for a in sys.argv[1:])
taken = {link, fleet, *range(base, base + n + 1)}
while True:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if port not in taken:
        print(port)
        break
PY
        )
        flower-supernode --superlink "$FLEET_HOST:$FLEET_PORT" --root-certificates "$CRED/ca.crt" "${key[@]}" \
            --node-config "partition-id=0 num-partitions=$NODES" --host 127.0.0.1 --port "$port" \
            --max-retries 3 >"$WORK/rogue-$who.log" 2>&1 &
        rogue_pid[$who]=$!
        echo $! >>"$WORK/pids"
    }
    wait_rogues() {   # until every rogue has exited, ROGUE_WAIT s at most (a busy machine needs minutes)
        local _ pid alive
        for _ in $(seq $((2 * ROGUE_WAIT))); do
            alive=0
            for pid in "${rogue_pid[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
            [[ $alive -eq 0 ]] && return 0
            sleep 0.5
        done
    }
    for who in nokey unregistered; do start_rogue "$who"; done
    # Each must end on its own, refused (it is killed after ROGUE_WAIT s otherwise, and the check fails).
    wait_rogues
    for attempt in 2 3; do
        again=0
        for who in nokey unregistered; do
            if ! kill -0 "${rogue_pid[$who]}" 2>/dev/null && grep -q "address already in use" "$WORK/rogue-$who.log"; then
                echo "==> the SuperNode with $who key lost its port to another process; starting it again (attempt $attempt)"
                start_rogue "$who"
                again=1
            fi
        done
        [[ $again -eq 1 ]] && wait_rogues || break
    done
    for who in nokey unregistered; do
        pid=${rogue_pid[$who]}
        if kill -0 "$pid" 2>/dev/null; then
            fail "the SuperNode with $who key is still running after $ROGUE_WAIT s: it was not refused"
        fi
        rc=0
        wait "$pid" || rc=$?
        [[ $rc -ne 0 ]] || fail "the SuperNode with $who key exited 0: it was not refused"
        grep -qE "code: 200[14]\]|Failed to activate SuperNode|must be registered" "$WORK/rogue-$who.log" \
            || fail "the SuperNode with $who key exited ($rc) without the SuperLink's refusal in its log"
        echo "==> [$((SECONDS - START)) s] refused as it must be: the SuperNode with $who key (exit $rc: $(grep -oE 'code: 200[14]\][^.]*' "$WORK/rogue-$who.log" | head -1))"
    done
    # A SuperNode the operator registered but did not bind (a spare key, or one registered by
    # mistake), started before the others and claiming client 0: the binding must refuse it.
    bash "$DEPLOY/generate_credentials.sh" 1 "$WORK/rogue/claimer-cred" >/dev/null
    flwr supernode register "$WORK/rogue/claimer-cred/supernode-0.pub" --format json >"$WORK/registered-claimer.json"
    grep -q '"success": true' "$WORK/registered-claimer.json" || fail "registering the claimer's key failed"
    flower-supernode --superlink "$FLEET_HOST:$FLEET_PORT" --root-certificates "$CRED/ca.crt" \
        --auth-supernode-private-key "$WORK/rogue/claimer-cred/supernode-0" --node-config "partition-id=0 num-partitions=$NODES" \
        --host 127.0.0.1 --port $((NODE_PORT + NODES)) --isolation subprocess \
        --ssl-certfile "$WORK/rogue/claimer-cred/supernode-0-tls.pem" --ssl-keyfile "$WORK/rogue/claimer-cred/supernode-0-tls.key" \
        --ssl-ca-certfile "$CRED/ca.crt" >"$WORK/rogue-claimer.log" 2>&1 &
    echo $! >>"$WORK/pids"
    expected=$((NODES + 1))
fi

# [docs:supernodes]
for ((i = 0; i < NODES; i++)); do
    # TLS to the gateway, signed with its own key; its Runtime API (for the ClientApp processes)
    # serves its own certificate. --isolation process: the SuperExec below runs the ClientApps and
    # proves itself with this node's secret (Flower's own SuperExec, started by the SuperNode in
    # subprocess isolation, needs none).
    secret=()
    [[ $SUPEREXEC == fork ]] && secret=(--superexec-auth-secret-file "$CRED/supernode-$i.secret")
    flower-supernode --superlink "$FLEET_HOST:$FLEET_PORT" --root-certificates "$CRED/ca.crt" \
        --auth-supernode-private-key "$CRED/supernode-$i" --node-config "partition-id=$i num-partitions=$NODES" \
        --host 127.0.0.1 --port $((NODE_PORT + i)) --isolation "$([[ $SUPEREXEC == fork ]] && echo process || echo subprocess)" \
        --ssl-certfile "$CRED/supernode-$i-tls.pem" --ssl-keyfile "$CRED/supernode-$i-tls.key" --ssl-ca-certfile "$CRED/ca.crt" \
        "${secret[@]}" >"$WORK/supernode-$i.log" 2>&1 &
    node=$!
    echo "$node" | tee "$WORK/supernode-$i.pid" >>"$WORK/pids"
    if [[ $SUPEREXEC == fork ]]; then   # else the SuperNode starts Flower's flower-superexec itself
        python -m fedselect.flower.superexec --runtime-api-address "127.0.0.1:$((NODE_PORT + i))" \
            --root-certificates "$CRED/ca.crt" --parent-pid "$node" --datasets "$DATASET" "${secret[@]}" \
            >"$WORK/superexec-$i.log" 2>&1 &
        echo $! >>"$WORK/pids"
    fi
done
# [/docs:supernodes]

# Every registered SuperNode online, and no other node known to the SuperLink.
for _ in $(seq 60); do
    flwr supernode list --format json >"$WORK/nodes.json" 2>/dev/null || true
    python - "$WORK" "$NODES" "$ROGUE_CHECK" <<'PY' && break
import json, sys
from pathlib import Path
work, n, claimer = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
files = [f"registered-{i}.json" for i in range(n)] + (["registered-claimer.json"] if claimer else [])
registered = {str(json.loads((work / name).read_text())["node-id"]) for name in files}
try:
    nodes = json.loads((work / "nodes.json").read_text())["nodes"]
except (ValueError, KeyError):
    sys.exit(1)
known = {str(node["node-id"]) for node in nodes if node.get("status") != "unregistered"}
if known - registered:
    print(f"run_local.sh: the SuperLink knows node(s) never registered: {sorted(known - registered)}", file=sys.stderr)
    sys.exit(2)
online = {str(node["node-id"]) for node in nodes if node.get("status") == "online"}
sys.exit(0 if online == registered else 1)
PY
    rc=$?
    [[ $rc -eq 1 ]] || fail "the SuperLink lists a SuperNode that was never registered (see nodes.json)"
    sleep 1
done
python -c "
import json, sys
nodes = json.load(open('$WORK/nodes.json'))['nodes']
print('==> SuperNodes on the SuperLink:', ', '.join(n['status'] for n in nodes))
sys.exit(sum(n['status'] == 'online' for n in nodes) != $expected)
" || fail "not all $expected registered SuperNodes came online within 60 s (see supernode-*.log)"
if [[ $SUPEREXEC == fork ]]; then   # each SuperExec has read the dataset by now, or has stopped saying why
    for ((i = 0; i < NODES; i++)); do
        for _ in $(seq 120); do grep -q "fedselect.flower.superexec: " "$WORK/superexec-$i.log" && break; sleep 0.5; done
        grep -q "fedselect.flower.superexec: ready" "$WORK/superexec-$i.log" \
            || fail "the SuperExec of SuperNode $i is not ready: $(grep -h "fedselect.flower.superexec" "$WORK/superexec-$i.log")"
    done
fi
echo "==> [$((SECONDS - START)) s] the SuperLink and $NODES SuperNodes are up (SuperExec: $SUPEREXEC)"

# [docs:run]
flwr run examples/flower-fedcor fedselect-local --stream --run-config \
    "num-clients=$NODES num-server-rounds=$ROUNDS dataset='$DATASET' records-path='$WORK/records-{run_id}.jsonl' node-binding-path='$WORK/node-binding.json' $RUN_CONFIG" \
    2>&1 | tee "$WORK/run.log"
# [/docs:run]
RUN_SECONDS=$((SECONDS - START))

# [docs:check]
run_id=$(sed -n 's/.*Successfully started run \([0-9][0-9]*\).*/\1/p' "$WORK/run.log" | head -1)
flwr ls --run-id "$run_id" --format json | grep '"status"'     # finished:completed, or finished:failed
wc -l <"$WORK/records-$run_id.jsonl"                            # one JSON line per finished round
# [/docs:check]

[[ -n "$run_id" ]] || fail "flwr run did not start a run"
# `flwr run --stream` exits 0 even when the ServerApp fails: the run's status and its records decide.
status=""
for _ in $(seq 20); do
    status=$(flwr ls --run-id "$run_id" --format json 2>/dev/null | python -c "
import json, sys
try:
    print(json.load(sys.stdin)['runs'][0]['status'])
except Exception:
    print('')
")
    [[ "$status" == finished:* ]] && break
    sleep 1
done
records=0
[[ -s "$WORK/records-$run_id.jsonl" ]] && records=$(wc -l <"$WORK/records-$run_id.jsonl")
if grep -qE "Traceback|ServerApp raised an exception|Exit Code: " "$WORK/run.log"; then
    fail "the run's log shows an error (status '$status', $records/$ROUNDS rounds recorded)"
fi
[[ "$status" == "finished:completed" ]] || fail "run $run_id ended with status '$status' ($records/$ROUNDS rounds recorded)"
[[ "$records" -eq "$ROUNDS" ]] || fail "run $run_id recorded $records of $ROUNDS rounds in $WORK/records-$run_id.jsonl"
if [[ "$ROGUE_CHECK" == 1 ]]; then
    claimer=$(python -c "import json; print(json.load(open('$WORK/registered-claimer.json'))['node-id'])")
    grep -q "node $claimer is not in node_binding" "$WORK/run.log" \
        || fail "the registered but unbound SuperNode $claimer claiming client 0 was not refused by the binding"
    ! grep -q "client 0 rejoined on node $claimer" "$WORK/run.log" || fail "node $claimer took client 0"
    echo "==> refused as it must be: the unbound SuperNode $claimer claiming client 0 (the ServerApp: not in node_binding)"
fi
echo "==> run $run_id: $status, $ROUNDS rounds recorded in $WORK/records-$run_id.jsonl; $NODES SuperNodes, SuperExec $SUPEREXEC, ${RUN_SECONDS} s from the SuperLink's start"
# The EXIT trap stops every process in $WORK/pids and what they started (stop_all above).
