#!/usr/bin/env bash
# Submit the Slurm templates to a real Slurm: a one-node cluster started on this machine.
#
#   tests/slurm/run.sh        as root on Debian/Ubuntu; run it before every change to launch/
#
# 1. installs slurmctld, slurmd, slurm-client, munge and libpmix-dev with apt-get when
#    missing, and starts munged, slurmctld and slurmd on free ports with their state in a
#    temporary directory (no cgroups: proctrack/linuxproc, task/none work in containers);
# 2. launch/slurm-1node.sbatch renders a small image on the CPU: a valid PNG and stats JSON;
#    so does launch/slurm-multinode.sbatch, its ranks on emulated nodes (RAFI_NODE_SIZE=1), in
#    resident rounds across them;
# 3. launch/slurm-requeue.sbatch: once its first checkpoint exists, its ranks are held still
#    (SIGSTOP) and its batch shell gets the USR1 Slurm sends before the time limit; the
#    template's trap requeues the job, it resumes, and its image must equal an uninterrupted
#    run's;
# 4. cancels what is left, stops the daemons it started and removes the directory.
# Every wait has a deadline. Exits nonzero with a message on any failure.
#
# There are no GPUs here: sbatch options on the command line override the templates'
# #SBATCH lines (--gpus-per-node=0, two tasks), and RENDER_ARGS replaces the render options.
# srun starts Open MPI 5 (the PyPI wheel) ranks through PMIx: SLURM_MPI_TYPE=pmix.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
ranks=2
work=$(mktemp -d /tmp/rafi-slurm.XXXXXX)
chmod 755 "$work"  # munged wants its socket's directory searchable by all
daemons=()

say() { echo "=== tests/slurm: $*"; }
fail() {
  echo "tests/slurm: FAILED: $*" >&2
  exit 1
}

cleanup() {
  local status=$?
  # Every job of this private cluster is ours (also one whose id sbatch had not yet printed);
  # slurmd must still run to end their processes.
  local left deadline=$((SECONDS + 30))
  while [ "${SLURM_CONF:-}" = "$work/slurm.conf" ] && left=$(timeout 10 squeue -h -o %i 2>/dev/null) &&
    [ -n "$left" ]; do
    # shellcheck disable=SC2086  # one job id a word
    timeout 10 scancel $left 2>/dev/null || true
    ((SECONDS < deadline)) || break
    sleep 1
  done
  if [ "$status" != 0 ]; then
    for f in "$work"/*.out "$work"/*.log; do
      [ -f "$f" ] && echo "--- $f (last 40 lines)" >&2 && tail -n 40 "$f" >&2
    done
  fi
  local pid
  for pid in "${daemons[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${daemons[@]}"; do
    timeout 10 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
  [ "$status" = 0 ] || echo "tests/slurm: FAILED (exit $status)" >&2
}
trap cleanup EXIT
trap 'fail "interrupted"' INT TERM

[ "$(id -u)" = 0 ] || fail "must run as root (it installs and starts Slurm)"
command -v python >/dev/null || fail "no python on PATH: the templates run python"

install() {
  local missing=() pkg
  # libpmix-dev: Debian's mpi/pmix plugin loads the unversioned libpmix.so, which only it ships
  for pkg in slurmctld slurmd slurm-client munge libpmix-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} = 0 ] && return
  command -v apt-get >/dev/null || fail "missing ${missing[*]} and no apt-get to install them"
  say "installing ${missing[*]}"
  timeout 600 apt-get update -qq || fail "apt-get update"
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >"$work/apt.log" 2>&1 || fail "apt-get install ${missing[*]} (log: below)"
}

start_slurm() {
  local host node ports
  host=$(hostname -s)
  node=$(slurmd -C | head -n 1)  # NodeName=HOST CPUs=... RealMemory=...: this machine as it is
  # two free ports, so that another cluster (or another run of this test) does not collide
  ports=$(python -c 'import socket
s = [socket.socket() for _ in range(2)]
for x in s:
    x.bind(("", 0))
print(*(x.getsockname()[1] for x in s))')
  dd if=/dev/urandom of="$work/munge.key" bs=1024 count=1 status=none
  chmod 400 "$work/munge.key"
  mkdir -p "$work/state" "$work/spool"
  cat >"$work/slurm.conf" <<EOF
ClusterName=rafitest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=${ports% *}
SlurmdPort=${ports#* }
SlurmUser=root
AuthType=auth/munge
# cred_expire is also how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket=$work/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
# PMIx's step directories (spmix_appdir_UID_JOB.STEP) here: job ids repeat in every run
TmpFS=$work
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
KillWait=5
MailProg=/bin/true
ReturnToService=2
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$work/slurm.conf
  say "starting munged, slurmctld, slurmd ($node)"
  # In the foreground (-F, -D) the daemons also log to stderr: only what comes before their
  # log file is open is news there.
  munged -F --key-file="$work/munge.key" --socket="$work/munge.sock" --pid-file="$work/munged.pid" \
    --log-file="$work/munged.log" --seed-file="$work/munged.seed" 2>>"$work/daemons.stderr" &
  daemons+=($!)
  local deadline=$((SECONDS + 30))
  until [ -S "$work/munge.sock" ]; do
    ((SECONDS < deadline)) || fail "munged did not start: $(cat "$work/daemons.stderr")"
    sleep 0.2
  done
  slurmctld -D -f "$SLURM_CONF" 2>>"$work/daemons.stderr" &
  daemons+=($!)
  slurmd -D -f "$SLURM_CONF" 2>>"$work/daemons.stderr" &
  daemons+=($!)
  deadline=$((SECONDS + 60))
  until [ "$(timeout 10 sinfo -h -n "$host" -o %t 2>/dev/null)" = idle ]; do
    ((SECONDS < deadline)) || fail "the node is not idle after 60 s: $(timeout 10 sinfo 2>&1)
$(tail -n 20 "$work/daemons.stderr")"
    sleep 1
  done
}

# The value of FIELD in `scontrol show job ID`.
job_field() {
  timeout 10 scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p"
}

# Submit a template with the options that fit this machine; print the job id.
submit() {
  local id
  id=$(timeout 30 sbatch --parsable --chdir="$work" --output="$work/%x-%j.out" --time=10 \
    --ntasks-per-node=$ranks --overcommit --gpus-per-node=0 "$@") || fail "sbatch $*"
  echo "${id%%;*}"
}

# Wait up to SECONDS for job ID to end; fail unless it completed.
wait_job() {
  local id=$1 deadline=$((SECONDS + $2)) state
  while :; do
    state=$(job_field "$id" JobState)
    case $state in
      COMPLETED) return ;;
      FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE | PREEMPTED)
        fail "job $id ended $state (exit $(job_field "$id" ExitCode))"
        ;;
    esac
    ((SECONDS < deadline)) || fail "job $id is still ${state:-unknown} after $2 s"
    sleep 1
  done
}

started=$SECONDS
install
start_slurm
export SLURM_MPI_TYPE=pmix      # srun --mpi=pmix: Open MPI 5 ranks need PMIx
export OMPI_MCA_osc=^ucx        # as in launch/local.sh: the wheel's UCX component has no device here

say "srun starts MPI ranks"
timeout 120 srun -n $ranks --overcommit python -c \
  "from mpi4py import MPI; assert MPI.COMM_WORLD.size == $ranks, MPI.COMM_WORLD.size" ||
  fail "srun --mpi=pmix cannot start $ranks MPI ranks (srun --mpi=list: $(srun --mpi=list 2>&1 | tr '\n' ' '))"

say "launch/slurm-1node.sbatch"
export RENDER_ARGS="--backend cpu --width 64 --height 64 --samples 2 --quiet"
id=$(submit --cpus-per-task=1 "$root/launch/slurm-1node.sbatch")
wait_job "$id" 300
python "$root/tests/slurm/check.py" render "$work/rafi-$id.png" "$work/rafi-$id.json" \
  --size 64x64 --ranks $ranks || fail "launch/slurm-1node.sbatch wrote no valid image and stats"

say "launch/slurm-multinode.sbatch (its nodes emulated: RAFI_NODE_SIZE=1, resident rounds across them)"
export RENDER_ARGS="--backend cpu --width 64 --height 64 --samples 2 --mode resident --quiet"
id=$(RAFI_NODE_SIZE=1 submit --nodes=1 --cpus-per-task=1 "$root/launch/slurm-multinode.sbatch")
wait_job "$id" 300
python "$root/tests/slurm/check.py" render "$work/rafi-$id.png" "$work/rafi-$id.json" \
  --size 64x64 --ranks $ranks || fail "launch/slurm-multinode.sbatch wrote no valid image and stats"

# A render that goes on for a second or more after its first checkpoint (compiling the kernels
# comes before it): one sample a pass, so that it takes hundreds of rounds (all 64 samples in one
# pass take 9, fewer than --checkpoint-every, and write no checkpoint at all); the same render
# uninterrupted is the reference.
export RENDER_ARGS="--backend cpu --width 256 --height 256 --samples 64 --samples-per-pass 1 \
--checkpoint-every 50 --quiet"
say "reference: the requeue job's render, uninterrupted"
# shellcheck disable=SC2086  # RENDER_ARGS: one word per option, as in the template
timeout 300 "$root/launch/local.sh" $ranks python -m rafi.examples.raytrace $RENDER_ARGS \
  --checkpoint "$work/reference.h5" --output "$work/reference.npy" || fail "the reference render"

say "launch/slurm-requeue.sbatch"
export RENDER_OUTPUT=$work/requeued.npy CKPT_DIR=$work
id=$(submit "$root/launch/slurm-requeue.sbatch")
deadline=$((SECONDS + 180))
until [ -f "$work/rafi-$id.h5" ]; do  # renamed into place only when complete
  state=$(job_field "$id" JobState)
  [ "$state" = PENDING ] || [ "$state" = RUNNING ] || fail "job $id is $state before its first checkpoint"
  ((SECONDS < deadline)) || fail "job $id wrote no checkpoint in 180 s"
  sleep 0.2
done
# Hold the ranks still (SIGSTOP), so that the render cannot end before the requeue however fast
# this machine is, then send the batch shell the USR1 Slurm sends before the time limit
# (--signal=B:USR1@120): the template's trap requeues the job, which kills the ranks.
step=$(timeout 10 scontrol listpids "$id" | awk '$3 == "0" { print $1 }')
# shellcheck disable=SC2086  # one PID a word
if [ -z "$step" ] || ! kill -STOP $step; then
  fail "job $id has no ranks to stop: its render ended before it could be requeued"
fi
timeout 10 scancel --batch --signal=USR1 "$id" || fail "scancel --batch --signal=USR1 $id"
wait_job "$id" 300
restarts=$(job_field "$id" Restarts)
[ "$restarts" = 1 ] || fail "job $id was restarted $restarts times, expected once"
resumed=$(grep "^resuming from $work/rafi-$id.h5" "$work/rafi-long-$id.out") || fail "job $id did not resume"
say "job $id was requeued once: $resumed"
python "$root/tests/slurm/check.py" same "$work/requeued.npy" "$work/reference.npy" ||
  fail "the requeued render differs from the uninterrupted one"

say "passed in $((SECONDS - started)) s"
