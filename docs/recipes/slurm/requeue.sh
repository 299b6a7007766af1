# goodput's exit codes -> what the Slurm batch script does next. Sourced by goodput.sbatch; tested by
# tests/test_recipes.py. The codes are goodput's (goodput/launch/launcher.py): keep them in step with it.
#
#   0    the run finished                                     -> done
#   75   EXIT_PREEMPTED: saved after the warning signal       -> requeue (the next start resumes from that save)
#   3    EXIT_CRASH_LOOP: attempts made no progress           -> stop; a person must look
#   78   EXIT_FATAL: configuration or state mismatch          -> stop; a restart cannot fix it
#   65   EXIT_NUMERIC: a NaN, spike or corrupted replica      -> stop; the same data or GPU would fail again
#        survived rollback and skip
#   else torchrun ran out of restarts, a node died, ...       -> requeue while GOODPUT_REQUEUES allows
#
# Never twice: when Slurm requeues the job itself (preempted under PreemptMode=REQUEUE, or a failed node with
# JobRequeue), the job is already PENDING again when this runs, and a second `scontrol requeue` is not sent.

GOODPUT_EXIT_PREEMPTED=75
GOODPUT_EXIT_CRASH_LOOP=3
GOODPUT_EXIT_FATAL=78
GOODPUT_EXIT_NUMERIC=65

# goodput_slurm_requeues: true when Slurm is already requeueing this job (its state is back to PENDING, or one of
# the REQUEUE states, while the batch script still runs).
goodput_slurm_requeues() {
    scontrol show job "$SLURM_JOB_ID" 2>/dev/null |
        grep -Eq 'JobState=(PENDING|REQUEUED|REQUEUE_HOLD|REQUEUE_FED)( |$)'
}

# goodput_requeue WHY: requeue this job, unless Slurm already does.
goodput_requeue() {
    if goodput_slurm_requeues; then
        echo "goodput: $1: Slurm is requeueing job $SLURM_JOB_ID itself (PreemptMode=REQUEUE): not requeued again"
        return 0
    fi
    echo "goodput: $1: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
}

# goodput_after_exit STATUS: requeue this job or not, from the exit status of the step that ran goodput launch.
# Prints one line saying what it decided; returns the status the batch script should exit with.
goodput_after_exit() {
    local status=$1
    local restarts=${SLURM_RESTART_COUNT:-0}
    local budget=${GOODPUT_REQUEUES:-10}
    case "$status" in
        0)
            echo "goodput: run finished"
            return 0 ;;
        "$GOODPUT_EXIT_CRASH_LOOP")
            echo "goodput: crash loop (exit $status): not requeued; see the run folder and goodput report"
            return "$status" ;;
        "$GOODPUT_EXIT_FATAL")
            echo "goodput: fatal error (exit $status): not requeued; fix the configuration first"
            return "$status" ;;
        "$GOODPUT_EXIT_NUMERIC")
            echo "goodput: numeric fault (exit $status): not requeued; see goodput report for the rollbacks and skips"
            return "$status" ;;
        "$GOODPUT_EXIT_PREEMPTED")
            goodput_requeue "preempted after a durable save (exit $status)"
            return 0 ;;
        *)
            if [ "$restarts" -ge "$budget" ]; then
                echo "goodput: failed (exit $status) after $restarts requeues: giving up (GOODPUT_REQUEUES=$budget)"
                return "$status"
            fi
            goodput_requeue "failed (exit $status), requeue $((restarts + 1)) of $budget"
            return 0 ;;
    esac
}
