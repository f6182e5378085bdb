"""Support code for the benchmarks and the tests; no benchmark and no test here.

- `launch`: start real DeepSpeed runs (free ports, the ranks' environment, /dev/shm cleanup),
  the arguments of a tiny CPU run, and `planned` (the trainer's plan for a launch's flags, in
  the world that launch gives it).
- `node_launcher`: a script, DeepSpeed's per-node launcher without its start-up, that the
  tests' launches run (tests/test_node_launcher.py holds it to DeepSpeed's).
- `zygote`: a script, a process that imported what a rank imports and forks the ranks of the
  suite's lean launches and its `run_python` scripts (conftest starts one a session).
- `runs`: what a run left behind: losses by iteration, consolidated weights.
- `faults`: a run in the background that a test or the fault drill can kill, signal and watch.
- `workspace`: a benchmark's scratch directory and the Tiny Shakespeare data in it.
- `peak_rss`: memory figures from /proc, and a `deepspeed` launch watched for its ranks' peak
  resident set (scale.py, timed_runs).
- `timed_runs`: timed launches of gpt_ds and of its peers (throughput.py,
  activation_checkpointing.py).
- `peers`: what the peers of throughput.py share (peer_trainers.py, plain_loop.py): the random
  windows of train.bin and GPT2LMHeadModel at the table's shape.

A benchmark runs as `python benchmarks/X.py`, so benchmarks/ is first on sys.path and it
imports these as `support.*`; tests/conftest.py puts benchmarks/ on sys.path for the tests.
Nothing here imports pytest, a benchmark script, a test module or tests/helpers/.
"""
