"""Support code for the tests and the benchmarks; no tests here.

- `launch`: start real DeepSpeed runs (free ports, the ranks' environment, /dev/shm cleanup)
  and the arguments of a tiny CPU run.
- `runs`: what a run left behind: losses by iteration, consolidated weights.
- `faults`: a run in the background that a test can kill, signal and watch.
- `sshd`: a private sshd on loopback addresses, for two-"node" tests.

Tests import these as `helpers.*` (pytest puts tests/ on sys.path: rootdir conftest, no
tests/__init__.py); benchmarks put tests/ on sys.path themselves. Nothing here imports a test
module or conftest. Scripts that tests launch as processes live in tests/scripts/.
"""
