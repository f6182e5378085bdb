"""Support code only the tests use; no tests here.

- `sshd`: a private sshd on loopback addresses, for two-"node" tests.
- `compared_runs`: 2-rank runs shared by the tests that compare them, one per configuration.
- `shared`: what the two workers of `pytest -n 2` share: runs made once, the machine (`alone`),
  whole modules to a worker.
- `files`: every file of a folder with its SHA-256, for "byte-identical afterwards".
- `messages`: `assert_names(message, *parts)`: an error names its field, flag, file and
  facts, each whole; tests assert those, not sentences, so a rewording breaks none.

Tests import these as `helpers.*` (pytest puts tests/ on sys.path: rootdir conftest, no
tests/__init__.py). The suite's launch machinery (lean launches, the zygote) lives in
tests/harness/, imported as `harness.*`; what the benchmarks share with the tests (ports, the
launches' environment, runs' files, background runs to kill) in benchmarks/support/, imported as
`support.*` (pyproject.toml's pytest `pythonpath` names benchmarks/). Nothing here imports a test
module or conftest. Scripts that tests launch as processes live in tests/scripts/.
"""
