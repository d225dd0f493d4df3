#!/usr/bin/env bash
# A real three-node Slurm cluster with accounting on this one host, for tests and CI.
#
#   scripts/slurm-cluster.sh up                 install (apt, once) and start everything; idempotent
#   scripts/slurm-cluster.sh stop-controller    stop slurmctld only (tests of an unreachable scheduler)
#   scripts/slurm-cluster.sh start-controller   start it again
#   scripts/slurm-cluster.sh down               stop every daemon
#   scripts/slurm-cluster.sh status             daemons and nodes
#
# Needs root and Debian 12 (slurm-wlm 22.05); installs Lmod and links the test module trees
# (scripts/lib.sh, install_test_modules). Daemons: munge, MariaDB, slurmdbd, slurmctld and
# three slurmd (n1, n2, n3: 2 CPUs each, all on localhost, ports 17001-17003; three so that a
# two-node job can hold a spare). A controller started afresh cancels the jobs an earlier run left.
# See ../shared/reference/test-infrastructure.md for why each step is there.
set -euo pipefail
NAME=slurm-cluster
source "$(dirname "$0")/lib.sh"

CLUSTER=mmmtest
PACKAGES=(slurm-wlm slurmdbd mariadb-server munge mpich openssh-server time)  # time: the profile's --profile time
CONF=/etc/slurm
DB_PASS=mmm-orch-test-only   # a throwaway database on a test machine, reachable only over the local socket

running() { pgrep -f "$1" >/dev/null 2>&1; }

start_munge() {
    mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0400 /etc/munge/munge.key
    if ! running "^/usr/sbin/munged|^munged"; then
        runuser -u munge -- /usr/sbin/munged
    fi
    wait_for 10 munge munge -n
}

start_mariadb() {
    mkdir -p /run/mysqld
    chown mysql:mysql /run/mysqld
    if ! running "mysqld"; then
        (mysqld_safe --skip-networking=0 --bind-address=127.0.0.1 >/dev/null 2>&1 &)
    fi
    wait_for 30 mariadb mysqladmin ping
    mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
              CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '${DB_PASS}';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
}

write_configs() {
    mkdir -p "$CONF" /var/spool/slurmctld /var/log/slurm
    local rewritten=""  # an earlier slurm.conf replaced: the running daemons must read it again
    [[ -f $CONF/slurm.conf ]] && rewritten=1
    write_if_changed "$CONF/slurm.conf" <<EOF || rewritten=""
# Written by mmm-orch scripts/slurm-cluster.sh: a three-node test cluster on one host.
ClusterName=${CLUSTER}
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=/var/spool/slurmctld
SlurmctldPidFile=/run/slurmctld.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdSpoolDir=/var/spool/slurmd-%n
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
ProctrackType=proctrack/linuxproc
# task/affinity: srun binds each task to its CPUs (--cpu-bind, --exact), as on the facilities;
# the packing tests check that runs side by side on one node hold CPUs of their own.
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
# Quick turnaround for tests: short kill grace, walltime enforced to the minute.
KillWait=5
OverTimeLimit=0
MinJobAge=300
MessageTimeout=5
# The scheduling passes run every 5 s, not 60 and 30: a job that the quick pass at submission
# skips (a busy controller on 2 cores) still starts within seconds.
SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000,sched_interval=5,bf_interval=5
# Comments are where mmm-orch tags its jobs; keep them in accounting too.
AccountingStoreFlags=job_comment
# QOS job limits are enforced (the facilities' rules, machines/slurm-local.yaml): this needs
# every user's association, which the cluster's root user has.
AccountingStorageEnforce=limits,qos
NodeName=n1 NodeHostname=localhost Port=17001 CPUs=2 RealMemory=4000 State=UNKNOWN
NodeName=n2 NodeHostname=localhost Port=17002 CPUs=2 RealMemory=4000 State=UNKNOWN
NodeName=n3 NodeHostname=localhost Port=17003 CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n1,n2,n3 Default=YES MaxTime=60 State=UP
PartitionName=parked Nodes=n1,n2,n3 MaxTime=60 State=DOWN
# A partition's own bounds (nodes, walltime), as Frontier's and Perlmutter's partitions have.
PartitionName=short Nodes=n1,n2,n3 MaxNodes=2 MaxTime=20 State=UP
EOF
    write_if_changed "$CONF/slurmdbd.conf" 600 <<EOF || true
# Written by mmm-orch scripts/slurm-cluster.sh
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=${DB_PASS}
StorageLoc=slurm_acct_db
EOF
    if [[ -n $rewritten ]] && running slurmctld; then
        log "slurm.conf changed: restarting slurmctld and the slurmd"
        pkill -x slurmd 2>/dev/null || true
        stop_controller
    fi
}

start_slurmdbd() {
    running "slurmdbd" || slurmdbd
    wait_for 30 slurmdbd sacctmgr -n list cluster
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
}

# The job-count rules the facilities set, as QOS (machines/slurm-local.yaml
# states them, `mmm-orch machines check slurm-local` compares): single, 1 job per user in any
# state (Frontier's debug QOS); pair, 2 submitted and 1 running per user (ALCF's capacity);
# team, 2 jobs per account (a project's limit). Only the queue-rule tests use them. And one
# whose jobs run: backlog, 1 job per user in any state on the debug partition, which only the
# backlog's tests use (tests/test_backlog.py: runs that wait their turn).
QOS_RULES=("single MaxSubmitJobsPerUser=1" "pair MaxSubmitJobsPerUser=2 MaxJobsPerUser=1"
           "team MaxSubmitJobsPerAccount=2" "backlog MaxSubmitJobsPerUser=1")

configure_qos() {
    local rule name names=normal
    for rule in "${QOS_RULES[@]}"; do
        name=${rule%% *}
        names+=",$name"
        sacctmgr -n -P show qos "$name" format=name | grep -qx "$name" \
            || sacctmgr -i add qos "$name" >/dev/null
        # -1 clears what a test changed; then the rule's own limits
        sacctmgr -i modify qos "$name" set MaxSubmitJobsPerUser=-1 MaxJobsPerUser=-1 \
            MaxSubmitJobsPerAccount=-1 MaxJobsPerAccount=-1 MaxWall=-1 ${rule#* } >/dev/null
    done
    sacctmgr -i modify user root set qos="$names" >/dev/null
}

start_controller() {
    running "slurmctld" || slurmctld
    wait_for 30 slurmctld scontrol ping
}

# Until it has exited: an `up` right after would find it still running and not start it.
stop_daemon() {  # stop_daemon NAME
    pkill -x "$1" 2>/dev/null || true
    for _ in $(seq 50); do pgrep -x "$1" >/dev/null || return 0; sleep 0.1; done
    pkill -9 -x "$1" 2>/dev/null || true
}

stop_controller() { stop_daemon slurmctld; }

NODES=(n1 n2 n3)

start_nodes() {
    for node in "${NODES[@]}"; do
        mkdir -p "/var/spool/slurmd-$node"
        running "slurmd -N $node" || as_job_daemon slurmd -N "$node"
    done
    # Nodes left DOWN by an earlier unclean stop come back; then wait until all take jobs.
    scontrol update nodename="$(IFS=,; echo "${NODES[*]}")" state=resume >/dev/null 2>&1 || true
    wait_for 60 "nodes ${NODES[*]} up" nodes_up
}

nodes_up() {
    local states node
    states=$(sinfo -h -N -p debug -o "%N %t" 2>/dev/null | sort -u)
    for node in "${NODES[@]}"; do
        # Up and responding: idle, running jobs, or ending one (a test's job may be completing
        # while another test's `up` runs), or held by the backfill scheduler for a job waiting on
        # more nodes (`plnd`; newer Slurm marks it with a `-`): a suffix such as `*` (not
        # responding) or a drain is not up.
        grep -qx "$node \(idle\|mix\|alloc\|comp\|resv\|plnd\)-\?" <<<"$states" || return 1
    done
}

up() {
    need_root
    local fresh=""
    running slurmctld || fresh=1
    apt_install "${PACKAGES[@]}"
    install_test_modules "$(cd "$(dirname "$0")/.." && pwd)"
    start_munge
    start_mariadb
    write_configs
    start_slurmdbd
    configure_qos
    start_controller
    # Only when started afresh: a restart for a new slurm.conf may happen while tests run.
    [[ -z $fresh ]] || cancel_recovered_jobs "squeue -h -o %i" scancel
    start_nodes
    log "up: cluster ${CLUSTER}, nodes ${NODES[*]}, partitions debug, parked and short, QOS single, pair, team and backlog, accounting on"
}

down() {
    need_root
    stop_daemon slurmd
    stop_controller
    stop_daemon slurmdbd
    log "down (munge and MariaDB left running)"
}

run_locked "$0" "$@"

case "${1:-up}" in
    up) up ;;
    down) down ;;
    stop-controller) need_root; stop_controller; log "slurmctld stopped" ;;
    start-controller) need_root; start_controller; start_nodes; log "slurmctld started" ;;
    status) scontrol ping; sinfo -N ;;
    *) echo "usage: $0 [up|down|stop-controller|start-controller|status]" >&2; exit 2 ;;
esac
