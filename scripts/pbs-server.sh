#!/usr/bin/env bash
# A live OpenPBS (the open-source PBS Pro) complex on this one host, for tests and CI.
#
#   scripts/pbs-server.sh up        install (apt, once), unpack (or build) OpenPBS, configure, start
#   scripts/pbs-server.sh down      stop every PBS daemon (the datastore is kept)
#   scripts/pbs-server.sh stop      stop pbs_server only (tests of an unreachable scheduler)
#   scripts/pbs-server.sh start     start it again
#   scripts/pbs-server.sh status    daemons, vnodes and queues
#
# Needs root and Debian 12. One MoM with three vnodes (vm[0], vm[1], vm[2]: 2 CPUs each, each with
# its own host resource) so that `-l select=2 -l place=scatter` runs, plus a spare; job history
# on; the custom resources Aurora and Polaris jobs ask for (filesystems, system) and their queue
# names, so that scripts rendered for those machines meet a real server's validation. Side by
# side with scripts/slurm-cluster.sh: pbs_comm moves off 17001, which the first slurmd uses. Facts
# behind each step: ../shared/reference/test-infrastructure.md ("A live PBS Pro (OpenPBS) server").
# Idempotent: a second `up` only starts what is not running and rechecks the configuration; a
# server started afresh cancels the jobs an earlier run left.
set -euo pipefail
NAME=pbs-server
source "$(dirname "$0")/lib.sh"

HERE=$(cd "$(dirname "$0")/.." && pwd)
VENDOR=$HERE/vendor/openpbs
PREBUILT=$VENDOR/openpbs-23.06.06-85-debian12-amd64-stripped.tar.gz
SOURCE=$VENDOR/openpbs-src-cd7ab5eda.tar.gz
PBS_EXEC=/opt/pbs
PBS_HOME=/var/spool/pbs
COMM_PORT=15008   # pbs_comm's default, 17001, is slurmd n1's port
VNODES=3
RUNTIME=(expat libedit2 postgresql postgresql-contrib python3 tcl tk libical3 libhwloc15 libpq5 libcjson1 time)
BUILD=(gcc make libtool libhwloc-dev libx11-dev libxt-dev libedit-dev libical-dev libncurses-dev perl
       postgresql-server-dev-all postgresql-contrib python3-dev tcl-dev tk-dev swig libexpat-dev
       libssl-dev libxext-dev libxft-dev autoconf automake g++ libcjson-dev)

install_pbs() {
    apt_install "${RUNTIME[@]}"
    if [[ -x $PBS_EXEC/sbin/pbs_server.bin ]] && runs_here; then
        return
    fi
    log "unpacking the prebuilt OpenPBS ($PREBUILT)"
    tar xzf "$PREBUILT" -C /
    if ! runs_here; then
        log "the prebuilt binaries do not run here; building the vendored source (about 3 min)"
        build_from_source
    fi
}

runs_here() {  # every library the daemons need resolves
    ! ldd "$PBS_EXEC/sbin/pbs_server.bin" "$PBS_EXEC/sbin/pbs_mom" "$PBS_EXEC/bin/qstat" 2>/dev/null \
        | grep -q "not found"
}

build_from_source() {
    apt_install "${BUILD[@]}"
    local work
    work=$(mktemp -d)
    tar xzf "$SOURCE" -C "$work"
    (cd "$work"/openpbs-* && ./autogen.sh && ./configure --prefix=$PBS_EXEC --with-python=/usr \
        && make -j"$(nproc)" && make install) >"$work/build.log" 2>&1 \
        || { tail -30 "$work/build.log" >&2; exit 1; }
    rm -rf "$work"
}

# PBS ignores 127.0.0.0/8: this host's name must resolve to one of its own other addresses.
host_address() {
    hostname -I 2>/dev/null | tr ' ' '\n' | grep -E '^[0-9]+(\.[0-9]+){3}$' | grep -v '^127\.' | head -n 1
}

fix_hosts() {
    local host addr
    host=$(hostname)
    addr=$(host_address)
    [[ -n $addr ]] || { log "no non-loopback IPv4 address on this host: PBS cannot run"; exit 1; }
    if ! grep -Eq "^$addr[[:space:]]+([^#]*[[:space:]])?$host([[:space:]]|\$)" /etc/hosts; then
        log "mapping $host to $addr in /etc/hosts (PBS ignores loopback addresses)"
        # Put it first, so that it wins over a loopback line for the same name.
        { echo "$addr $host"; grep -v "^$addr[[:space:]]" /etc/hosts; } >/etc/hosts.mmm-orch
        cat /etc/hosts.mmm-orch >/etc/hosts  # /etc/hosts may be a bind mount: rewrite, not replace
        rm -f /etc/hosts.mmm-orch
    fi
}

write_conf() {
    local host
    host=$(hostname)
    write_if_changed /etc/pbs.conf <<EOF || true
PBS_SERVER=$host
PBS_START_SERVER=1
PBS_START_SCHED=1
PBS_START_COMM=1
PBS_START_MOM=1
PBS_EXEC=$PBS_EXEC
PBS_HOME=$PBS_HOME
PBS_CORE_LIMIT=unlimited
PBS_SCP=/usr/bin/scp
PBS_COMM_NAME=$host:$COMM_PORT
PBS_LEAF_ROUTERS=$host:$COMM_PORT
EOF
    if [[ ! -d $PBS_HOME/server_priv ]]; then
        # Creates PBS_HOME and the init script; its systemctl/update-rc.d calls fail harmlessly.
        cp /etc/pbs.conf /etc/pbs.conf.mmm-orch
        "$PBS_EXEC/libexec/pbs_postinstall" server 23.06.06 $PBS_EXEC $PBS_HOME postgres >/dev/null 2>&1 || true
        cp /etc/pbs.conf.mmm-orch /etc/pbs.conf
        rm -f /etc/pbs.conf.mmm-orch
    fi
    # Job output goes straight to its final path (-k doe), and the mom copies files with cp.
    mkdir -p $PBS_HOME/mom_priv
    write_if_changed $PBS_HOME/mom_priv/config <<EOF || true
\$clienthost $host
\$usecp *:/ /
EOF
    # Jobs run as root, and PBS gives them root's home: their login shells read this host's
    # /root/.bashrc. Where that runs `pyenv init`, a rehash lock left by a killed shell makes each
    # job wait 60 s for it; the MoM hands this variable to every job so that it waits 1 s.
    if ! grep -qx "PYENV_REHASH_TIMEOUT=1" "$PBS_HOME/pbs_environment" 2>/dev/null; then
        echo "PYENV_REHASH_TIMEOUT=1" >>"$PBS_HOME/pbs_environment"
        pkill -x pbs_mom 2>/dev/null || true  # started again below, reading the new environment
    fi
}

daemons_up() {
    pgrep -x pbs_comm >/dev/null && pgrep -f "pbs_server.bin" >/dev/null \
        && pgrep -x pbs_sched >/dev/null && pgrep -x pbs_mom >/dev/null
}

STARTED=""

start_pbs() {
    if ! daemons_up; then
        log "starting PBS (server, scheduler, comm, mom)"
        as_job_daemon "$PBS_EXEC/libexec/pbs_init.d" start >/dev/null 2>&1 || true
        STARTED=1
    fi
    wait_for 60 "pbs_server" "$PBS_EXEC/bin/qstat" -B
}

qmgr() { "$PBS_EXEC/bin/qmgr" -c "$*"; }

configure_server() {
    local host
    host=$(hostname)
    # Root may submit (tests and CI run as root); clients connect from 127.0.0.1 as root@localhost.
    qmgr "set server acl_roots = root"
    qmgr "set server flatuid = True"
    qmgr "set server job_history_enable = True"
    qmgr "set server scheduler_iteration = 5"
    qmgr "set sched scheduler_iteration = 5" 2>/dev/null || true
    # Aurora's and Polaris's own resources: a job-wide string, and a host-level one in select.
    "$PBS_EXEC/bin/qmgr" -c "list resource filesystems" >/dev/null 2>&1 \
        || qmgr "create resource filesystems type=string"
    "$PBS_EXEC/bin/qmgr" -c "list resource system" >/dev/null 2>&1 \
        || qmgr "create resource system type=string, flag=h"
    local sched_config=$PBS_HOME/sched_priv/sched_config
    if ! grep -q '^resources:.*system' "$sched_config"; then
        sed -i 's/^resources: "\(.*\)"/resources: "\1, system"/' "$sched_config"
        pkill -HUP -x pbs_sched || true
    fi
    # Queues with the names the machine profiles use, each with a walltime limit to check against.
    local queue
    # (each value set as it ends up: tests run while another worker's `up` rechecks them)
    for queue in workq debug debug-scaling capacity preemptable prod; do
        "$PBS_EXEC/bin/qmgr" -c "list queue $queue" >/dev/null 2>&1 \
            || qmgr "create queue $queue queue_type=execution"
        qmgr "set queue $queue enabled = True"
        qmgr "set queue $queue started = True"
        if [[ $queue == capacity ]]; then
            qmgr "set queue $queue resources_max.walltime = 168:00:00"
        else
            qmgr "set queue $queue resources_max.walltime = 01:00:00"
        fi
    done
    # Takes jobs and never starts them: for tests of submission alone.
    "$PBS_EXEC/bin/qmgr" -c "list queue parked" >/dev/null 2>&1 \
        || qmgr "create queue parked queue_type=execution"
    qmgr "set queue parked enabled = True"
    qmgr "set queue parked started = False"
    qmgr "set queue parked resources_max.walltime = 01:00:00"
    qmgr "set server default_queue = workq"
    # A job killed at its walltime gets SIGKILL this long after SIGTERM (PBS's default is 10 s).
    qmgr "set queue workq kill_delay = 10"
    configure_queue_rules
}

# The kinds of job-count rules ALCF sets (../shared/reference/queue-rules.md), each on a queue of
# its own that only the queue-rule tests use (machines/pbs-local.yaml states them, `mmm-orch
# machines check pbs-local` compares): single, 1 job per user in any state (debug-scaling);
# pair, 2 queued or running and 1 running per user (capacity); routed, a routing queue with
# tiers by node count and walltime and 2 jobs per project (prod). Set afresh on every `up`: a
# test may have changed them. Like `parked`, they take jobs and never start them: the tests
# count jobs, and the vnodes stay free for the others.
configure_queue_rules() {
    # Each attribute set to its value, or unset where the queue has none: never unset and set
    # again (another test may read the queue meanwhile).
    local queue attribute value
    local -A rules=(
        [single.max_queued]="[u:PBS_GENERIC=1]"
        [pair.max_queued]="[u:PBS_GENERIC=2]" [pair.max_run]="[u:PBS_GENERIC=1]"
        [routed-small.resources_max.nodect]=2 [routed-small.resources_max.walltime]=00:30:00
        [routed-large.resources_min.nodect]=3 [routed-large.resources_max.nodect]=3
    )
    for queue in single pair routed-small routed-large; do
        "$PBS_EXEC/bin/qmgr" -c "list queue $queue" >/dev/null 2>&1 \
            || qmgr "create queue $queue queue_type=execution"
        qmgr "set queue $queue enabled = True"
        qmgr "set queue $queue started = False"
        [[ $queue == routed-* ]] && qmgr "set queue $queue from_route_only = True"
        for attribute in max_queued max_run queued_jobs_threshold resources_min.nodect \
                resources_max.nodect resources_max.walltime; do
            value=${rules[$queue.$attribute]:-}
            if [[ -n $value ]]; then
                qmgr "set queue $queue $attribute = $value"
            elif [[ $attribute == resources_max.walltime ]]; then
                qmgr "set queue $queue $attribute = 01:00:00"
            else
                qmgr "unset queue $queue $attribute"
            fi
        done
    done
    # And one whose jobs run: backlog, 1 job per user in any state, which only the backlog's
    # tests use (tests/test_backlog.py: runs that wait their turn).
    "$PBS_EXEC/bin/qmgr" -c "list queue backlog" >/dev/null 2>&1 \
        || qmgr "create queue backlog queue_type=execution"
    qmgr "set queue backlog max_queued = [u:PBS_GENERIC=1]"
    qmgr "set queue backlog resources_max.walltime = 01:00:00"
    qmgr "set queue backlog enabled = True"
    qmgr "set queue backlog started = True"
    "$PBS_EXEC/bin/qmgr" -c "list queue routed" >/dev/null 2>&1 \
        || qmgr "create queue routed queue_type=route"
    qmgr "set queue routed route_destinations = 'routed-small,routed-large'"
    qmgr "set queue routed max_queued = [p:PBS_GENERIC=2]"
    qmgr "set queue routed enabled = True"
    qmgr "set queue routed started = True"
    # Per-project limits count a job's project: ALCF's -A is it (a queuejob hook sets it here).
    "$PBS_EXEC/bin/qmgr" -c "list hook account_project" >/dev/null 2>&1 \
        || qmgr "create hook account_project event=queuejob"
    # Imported only when it differs: the server checks every submission against this hook.
    "$PBS_EXEC/bin/qmgr" -c "export hook account_project application/x-python default" 2>/dev/null \
        | cmp -s - "$HERE/scripts/pbs/account_project.py" \
        || qmgr "import hook account_project application/x-python default $HERE/scripts/pbs/account_project.py"
}

configure_vnodes() {
    # The definition is kept outside mom_priv: pbs_mom -s insert copies it into its config store.
    local host file=$PBS_HOME/mmm-orch-vnodes.conf
    host=$(hostname)
    "$PBS_EXEC/bin/qmgr" -c "list node $host" >/dev/null 2>&1 || qmgr "create node $host"
    {
        echo '$configversion 2'
        echo "$host: resources_available.ncpus = 0"
        for i in $(seq 0 $((VNODES - 1))); do
            echo "vm[$i]: resources_available.ncpus = 2"
            echo "vm[$i]: resources_available.host = $host-$i"
            echo "vm[$i]: resources_available.system = polaris"
            echo "vm[$i]: sharing = default_excl"
        done
    } >"$file.new"
    if ! cmp -s "$file.new" "$file"; then
        mv "$file.new" "$file"
        "$PBS_EXEC/sbin/pbs_mom" -s remove mmm-orch-vnodes >/dev/null 2>&1 || true
        "$PBS_EXEC/sbin/pbs_mom" -s insert mmm-orch-vnodes "$file"
        pkill -HUP -x pbs_mom || true
    else
        rm -f "$file.new"
    fi
    wait_for 60 "$VNODES vnodes" vnodes_up
}

vnodes_up() {  # reachable, busy or not
    [[ $("$PBS_EXEC/bin/pbsnodes" -av 2>/dev/null | grep -Ec "^     state = (free|job-busy|job-exclusive)") -ge $VNODES ]]
}

can_run_a_job() {
    local id
    id=$("$PBS_EXEC/bin/qsub" -q workq -l walltime=00:01:00 -o /dev/null -j oe -- /bin/true) || return 1
    for _ in $(seq 120); do
        if "$PBS_EXEC/bin/qstat" -x -f "$id" 2>/dev/null | grep -q "job_state = F"; then
            return 0
        fi
        sleep 0.5
    done
    log "a test job ($id) did not run within 60 s"
    return 1
}

up() {
    need_root
    install_pbs
    install_test_modules "$HERE"
    fix_hosts
    write_conf
    start_pbs
    configure_server >/dev/null
    configure_vnodes
    if [[ -n $STARTED ]]; then
        cancel_recovered_jobs "$PBS_EXEC/bin/qselect" "$PBS_EXEC/bin/qdel" -W force
        can_run_a_job  # a server already running (and maybe busy) has shown that before
    fi
    log "up: server $(hostname), vnodes vm[0]-vm[$((VNODES - 1))], queues workq debug debug-scaling capacity preemptable prod parked single pair backlog routed (routing), history on"
}

down() {
    need_root
    "$PBS_EXEC/libexec/pbs_init.d" stop >/dev/null 2>&1 || true
    log "down"
}

run_locked "$0" "$@"

case "${1:-up}" in
    up) up ;;
    down) down ;;
    stop) need_root; pkill -x pbs_server.bin || pkill -f "$PBS_EXEC/sbin/pbs_server.bin" || true
          for _ in $(seq 50); do pgrep -f pbs_server.bin >/dev/null || break; sleep 0.1; done
          log "pbs_server stopped" ;;
    start) need_root; "$PBS_EXEC/sbin/pbs_server"; wait_for 60 "pbs_server" "$PBS_EXEC/bin/qstat" -B
           wait_for 60 "vnodes" vnodes_up; log "pbs_server started" ;;
    status) "$PBS_EXEC/bin/qstat" -B; "$PBS_EXEC/bin/pbsnodes" -aSj; "$PBS_EXEC/bin/qstat" -Q ;;
    *) echo "usage: $0 [up|down|stop|start|status]" >&2; exit 2 ;;
esac
