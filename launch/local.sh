#!/usr/bin/env bash
# Run an MPI job on this machine, with the flags Open MPI needs as root or oversubscribed.
#
#   launch/local.sh N COMMAND...        e.g.  launch/local.sh 4 python -m rafi.examples.raytrace
#
# Open MPI refuses to run as root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM), and more ranks
# than cores without --oversubscribe; binding is off so oversubscribed ranks share cores.
# Other MPIs (MPICH, Cray) get plain `mpirun -n N`.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NRANKS COMMAND..." >&2
  exit 2
fi
n=$1
shift
launcher=${MPIRUN:-mpirun}
flags=()
if "$launcher" --version 2>&1 | grep -qi "open mpi\|open-mpi\|openrte"; then
  flags+=(--oversubscribe --bind-to none)
  # rafi's shared-memory windows need only osc/sm; the wheel's UCX component, with no UCX
  # device here, prints an error at every window otherwise. `import rafi` sets the same
  # default where the machine has no RDMA device, but only before MPI starts: this covers
  # scripts that import mpi4py first.
  export OMPI_MCA_osc=${OMPI_MCA_osc:-^ucx}
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
fi
exec "$launcher" -n "$n" "${flags[@]}" "$@"
