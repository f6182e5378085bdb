"""Support code for the benchmarks, which the tests use too; no benchmark and no test here.

- `launch`: start real DeepSpeed runs as a user does, through the `deepspeed` command (free
  ports, the ranks' environment, /dev/shm cleanup), the arguments of a tiny CPU run, and
  `planned` (the trainer's plan for a launch's flags, in the world that launch gives it).
- `runs`: what a run left behind: losses by iteration, consolidated weights.
- `faults`: a `deepspeed` run in the background that the fault drill or a test can kill, signal
  and watch.
- `workspace`: a benchmark's scratch directory and the Tiny Shakespeare data in it.
- `peak_rss`: memory figures from /proc, and a `deepspeed` launch watched for its ranks' peak
  resident set (scale.py, timed_runs).
- `timed_runs`: timed launches of gpt_ds and of its peers (throughput.py,
  activation_checkpointing.py).
- `peers`: what the peers of throughput.py share (peer_trainers.py, plain_loop.py): the random
  windows of train.bin and GPT2LMHeadModel at the table's shape.

Each module here serves a benchmark script (tests/test_layout.py holds that): the test suite's
own launch machinery (its lean node launcher, the zygote that forks its ranks) lives in
tests/harness/, and no benchmark launches through it. A benchmark runs as
`python benchmarks/X.py`, so benchmarks/ is first on sys.path and it imports these as
`support.*`; pyproject.toml's pytest `pythonpath` puts benchmarks/ on sys.path for the tests.
Nothing here imports pytest, a benchmark script, a test module, tests/helpers/ or tests/harness/.
"""
