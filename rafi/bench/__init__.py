"""Benchmarks users can run: ``mpirun -n 2 python -m rafi.bench --help``."""
