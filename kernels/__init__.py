"""rafi's device code: outbox push/emit, partition by destination, scans, workload kernels.

Modules here hold Numba device code only; host orchestration lives in ``rafi``.
Modules that need numba-cuda import it themselves and are loaded by the cuda backend alone.
"""
