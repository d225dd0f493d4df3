# Shared by scripts/slurm-cluster.sh and scripts/pbs-server.sh; each sets NAME (its log prefix and
# lock name) before sourcing this file.

log() { echo "[$NAME] $*" >&2; }

need_root() {
    if [[ $(id -u) -ne 0 ]]; then
        echo "$NAME.sh: must run as root (it installs packages and starts daemons)" >&2
        exit 2
    fi
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
    local limit=$1 what=$2; shift 2
    for _ in $(seq $((limit * 10))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "timed out after ${limit}s waiting for ${what}"
    return 1
}

# A running test's command may read a configuration file at any moment (`scancel` read slurm.conf
# empty while another worker's `up` rewrote it with `cat >`): a file is replaced whole, by a
# rename, and only when its text changed. Returns 0 when it changed.
write_if_changed() {  # write_if_changed FILE [MODE] < TEXT
    local file=$1 mode=${2:-} new
    new=$(mktemp "$file.XXXXXX")
    cat >"$new"
    if [[ -f $file ]] && cmp -s "$new" "$file"; then
        rm -f "$new"
        return 1
    fi
    chmod "${mode:-644}" "$new"
    mv -f "$new" "$file"
}

apt_install() {  # apt_install PACKAGE...: those not installed yet
    local missing=()
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    [[ ${#missing[@]} -eq 0 ]] && return
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# One run at a time: tests running side by side may all call `up`. flock holds the lock for the
# run; -o keeps it from the daemons started here (they would hold it for ever).
run_locked() {  # run_locked SCRIPT ARGS...: re-executes SCRIPT under the lock (as root only)
    if [[ $(id -u) -eq 0 && -z ${MMM_ORCH_SCRIPT_LOCKED:-} ]]; then
        MMM_ORCH_SCRIPT_LOCKED=1 exec flock -o "/run/mmm-orch-$NAME.lock" bash "$@"
    fi
}

# A scheduler started afresh recovers the jobs of an earlier run from its saved state; a test run
# must not find its nodes held by them.
cancel_recovered_jobs() {  # cancel_recovered_jobs LIST_COMMAND CANCEL_COMMAND...
    local jobs
    jobs=$($1)
    shift
    [[ -z $jobs ]] && return 0
    log "cancelling $(wc -w <<<"$jobs") job(s) left by an earlier run"
    "$@" $jobs || true  # one may have ended meanwhile
}

# The daemons that run the test jobs (slurmd, PBS's MoM) start at a higher priority than the
# tests, so their jobs too: the test nodes share this host with the suite's own work, where on a
# facility a job has its nodes to itself. On a loaded host of two cores a job's start-up would
# otherwise race its walltime (a chain's link reaching no step before its stop).
as_job_daemon() { nice -n -10 "$@"; }

# A real module system on the test hosts, as the facilities have: Debian's Lmod, and the module
# trees of tests/fixtures/modules (an old and a new programming environment) at the path the test
# profiles' stacks name. A link, so that the trees are the checkout's own.
TEST_MODULES=/opt/mmm-orch-test/modules

install_test_modules() {  # install_test_modules REPOSITORY_ROOT
    apt_install lmod
    mkdir -p "$(dirname "$TEST_MODULES")"
    [[ $(readlink "$TEST_MODULES" 2>/dev/null) == "$1/tests/fixtures/modules" ]] \
        || ln -sfnT "$1/tests/fixtures/modules" "$TEST_MODULES"
}
