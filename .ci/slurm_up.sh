#!/usr/bin/env bash
# Bring up (or check) a local two-node Slurm cluster on this one host, as root:
# munged, slurmctld and two slurmd daemons (nodes n1, n2, one CPU each, partition `debug`).
# Idempotent: a running, healthy cluster with the same slurm.conf is left alone.
#
#   .ci/slurm_up.sh           install if needed, start, wait until both nodes are up, print sinfo
#   .ci/slurm_up.sh --stop    stop the slurm daemons this script started (munged keeps running)
#
# State, spool and logs live under $HIBERT_SLURM_DIR (default /tmp/hibert-slurm). The config is
# written to /etc/slurm/slurm.conf so that sbatch/srun/scontrol find it without SLURM_CONF; a
# slurm.conf that this script did not write is never overwritten.
set -euo pipefail

DIR="${HIBERT_SLURM_DIR:-/tmp/hibert-slurm}"
CONF=/etc/slurm/slurm.conf
MARKER="# hibert local cluster (written by .ci/slurm_up.sh)"
NODES=(n1 n2)
PORTS=(17001 17002)
CTLD_PORT="${HIBERT_SLURMCTLD_PORT:-16817}"
WAIT_S="${HIBERT_SLURM_WAIT_S:-60}"

log() { echo "slurm_up: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# A live process from a pid file; zombies (exited, not yet reaped) do not count.
pid_alive() {
    local pid
    [[ -f "$1" ]] && pid="$(cat "$1")" && kill -0 "$pid" 2>/dev/null \
        && [[ "$(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null)" != Z ]]
}

stop_daemons() {
    local f
    for f in "$DIR"/run/slurmd-*.pid "$DIR"/run/slurmctld.pid; do
        [[ -f "$f" ]] || continue
        if pid_alive "$f"; then
            log "stopping $(basename "$f" .pid) (pid $(cat "$f"))"
            kill "$(cat "$f")" 2>/dev/null || true
            for _ in $(seq 50); do pid_alive "$f" || break; sleep 0.1; done
            if pid_alive "$f"; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
        fi
        rm -f "$f"
    done
}

if [[ "${1:-}" == "--stop" ]]; then
    stop_daemons
    exit 0
fi
[[ $# -eq 0 ]] || die "usage: $0 [--stop]"
[[ $(id -u) -eq 0 ]] || die "must run as root (daemons run with SlurmUser=root)"

# 1. packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; then
    log "installing slurm-wlm and munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurm-wlm munge >/dev/null
fi

# 2. munge: a key, a socket dir, a running daemon (as the munge user, as packaged)
if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating a munge key"
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
chmod 755 /run/munge
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    rm -f /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munged does not answer"
fi

# 3. slurm.conf (daemons restart only when it changed or they are not running)
HOST="$(hostname -s)"
mkdir -p "$DIR"/{state,log,run,spool} /etc/slurm
NEW="$DIR/slurm.conf.new"
{
    echo "$MARKER"
    cat <<EOF
ClusterName=hibert-local
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire seconds before it may start again (default 120)
AuthInfo=cred_expire=10
StateSaveLocation=${DIR}/state
SlurmdSpoolDir=${DIR}/spool/%n
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${DIR}/run/slurmd-%n.pid
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${DIR}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups needed: process tracking by /proc walking, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
PreemptType=preempt/none
ReturnToService=2
JobRequeue=1
SlurmctldTimeout=10
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=600
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=2
EOF
    for i in "${!NODES[@]}"; do
        echo "NodeName=${NODES[$i]} NodeHostname=${HOST} NodeAddr=127.0.0.1 Port=${PORTS[$i]} CPUs=1 State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
} > "$NEW"

if [[ -f "$CONF" ]] && ! head -n1 "$CONF" | grep -qF "$MARKER"; then
    die "$CONF exists and was not written by this script; refusing to replace it"
fi
changed=0
if ! cmp -s "$NEW" "$CONF"; then
    changed=1
    mv "$NEW" "$CONF"
    log "wrote $CONF"
else
    rm -f "$NEW"
fi

# 4. daemons
running=1
pid_alive "$DIR/run/slurmctld.pid" || running=0
for n in "${NODES[@]}"; do pid_alive "$DIR/run/slurmd-$n.pid" || running=0; done
if [[ $changed -eq 1 || $running -eq 0 ]]; then
    stop_daemons
    log "starting slurmctld and slurmd ${NODES[*]}"
    slurmctld || die "slurmctld failed to start; see $DIR/log/slurmctld.log"
    for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
    for n in "${NODES[@]}"; do
        slurmd -N "$n" || die "slurmd -N $n failed to start; see $DIR/log/slurmd-$n.log"
    done
fi

# 5. wait until both nodes are up (idle, or busy with jobs when the cluster was already running);
#    nodes left down/drained by an earlier run are resumed
deadline=$((SECONDS + WAIT_S))
while :; do
    states="$(sinfo -h -N -p debug -o '%N %t' 2>/dev/null | sort -u || true)"
    up=$(grep -cE ' (idle|mix|alloc)$' <<<"$states" || true)
    [[ "$up" -eq ${#NODES[@]} ]] && break
    if grep -qE ' (down|drain|drng|fail)\*?$' <<<"$states"; then
        scontrol update NodeName="$(IFS=,; echo "${NODES[*]}")" State=RESUME >/dev/null 2>&1 || true
    fi
    if (( SECONDS > deadline )); then
        log "nodes not up after ${WAIT_S}s:"; echo "$states" >&2
        tail -n 20 "$DIR"/log/*.log >&2 || true
        exit 1
    fi
    sleep 1
done
scontrol ping
sinfo -N -l
