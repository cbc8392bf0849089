"""Runnable workloads: ``mpirun -n 4 python -m rafi.examples.forward``."""
