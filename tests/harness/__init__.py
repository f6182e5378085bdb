"""The test suite's own launch machinery; no tests here.

- `launch`: the suite's launches of the runs benchmarks/support/launch.py starts as a user does,
  faster: `run_deepspeed` through `node_launcher`, `run_python` and one-rank runs forked by the
  `zygote`, `Launch` (a run in the background) also through DeepSpeed's per-node launcher alone
  or the suite's; the session's zygote (`zygote()`), the benchmarks' smoke tests
  (`run_benchmark`) and what tests assert of a command (`run_checked`, `train_fails`).
- `node_launcher`: a script, DeepSpeed's per-node launcher without its start-up, that the
  suite's lean launches run (tests/test_node_launcher.py holds it to DeepSpeed's).
- `zygote`: a script, a process that imported what a rank imports and forks the ranks of the
  suite's lean launches and its `run_python` scripts (conftest starts one a session).

Tests import these as `harness.*` (pytest puts tests/ on sys.path, as for helpers/). They
import what the benchmarks share with them (ports, the launches' environment, runs' files) from
benchmarks/support/ as `support.*`; nothing under benchmarks/ imports these.
"""
