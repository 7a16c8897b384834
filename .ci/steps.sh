# Timed steps for .ci/run (sourced): `step "what it does" command args...`
# prints "== what it does", runs the command and records how long it took;
# when the script ends -- done or failed -- the table of every step's time is
# printed, with the total and the machine's load. A failing step fails the
# run (its time is marked). Add a step by wrapping its command in `step`;
# a step runs in a subshell, so it cannot set variables for the next ones.

CI_STARTED=$SECONDS
STEP_NAMES=()
STEP_TIMES=()

step() {
    local name="$1"; shift
    echo "== $name"
    local started=$SECONDS rc=0
    STEP_NAMES+=("$name")
    STEP_TIMES+=("running")
    # In a subshell of its own with errexit on, so that a step made of a
    # function stops at its first failing command (errexit is ignored in a
    # command whose status is tested); what a step sets stays in it.
    set +e
    ( set -e; "$@" )
    rc=$?
    set -e
    local took=$((SECONDS - started))
    if [ "$rc" -ne 0 ]; then
        STEP_TIMES[-1]="${took}s FAILED (exit $rc)"
        exit "$rc"
    fi
    STEP_TIMES[-1]="${took}s"
}

step_times() {
    local rc=$?
    if [ "${#STEP_NAMES[@]}" -gt 0 ]; then
        echo "== step times (total $(( (SECONDS - CI_STARTED) / 60 ))m$(( (SECONDS - CI_STARTED) % 60 ))s;" \
             "load $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown); $(nproc 2>/dev/null || echo '?') cores)"
        local i
        for i in "${!STEP_NAMES[@]}"; do
            printf '   %-22s %s\n' "${STEP_TIMES[$i]}" "${STEP_NAMES[$i]}"
        done
    fi
    return "$rc"
}

trap step_times EXIT
