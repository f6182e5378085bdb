"""The suite's two workers (`pytest -n 2`, helpers/shared.py): a test marked `alone` runs while
the other worker waits, what is made once is made once, and whole modules go to a worker (the
sshd modules together)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from helpers.shared import (
    LONGEST_MODULES,
    SSH_MODULES,
    machine_turn,
    made_once,
    run_order,
    worker_unit,
)
from support.launch import REPO


def test_an_alone_test_waits_for_the_running_one_and_the_next_waits_for_it(tmp_path):
    stem, events = tmp_path / "machine", []
    running = threading.Event()

    def other_worker() -> None:
        with machine_turn(stem, alone=False):
            running.set()
            time.sleep(0.3)
            events.append("other test ends")
        with machine_turn(stem, alone=False):  # at once: the waiting alone test holds the gate
            events.append("next test starts")

    thread = threading.Thread(target=other_worker)
    thread.start()
    running.wait(timeout=5)
    with machine_turn(stem, alone=True):
        events.append("alone starts")
        time.sleep(0.3)
        events.append("alone ends")
    thread.join(timeout=5)
    assert events == ["other test ends", "alone starts", "alone ends", "next test starts"]


def test_what_is_made_once_is_read_back_and_a_failed_make_is_retried(tmp_path):
    made = []

    def make(path):
        made.append(path)
        return f"made {len(made)}"

    def fail(path):
        raise RuntimeError("the run failed")

    with pytest.raises(RuntimeError):
        made_once(tmp_path / "run", fail)
    assert made_once(tmp_path / "run", make) == "made 1"
    assert made_once(tmp_path / "run", make) == "made 1"
    assert made == [tmp_path / "run"]


def test_a_worker_takes_whole_modules_and_the_sshd_modules_together():
    faults = "tests/test_faults.py"
    assert worker_unit(f"{faults}::test_resume_is_exact[zero1]") == faults
    assert worker_unit(f"{faults}::test_universal_checkpoint_tool") == faults
    units = {worker_unit(f"tests/{name}::test_x[a::b]") for name in SSH_MODULES}
    assert units == {"sshd"}


def test_the_sshd_unit_then_the_longest_modules_run_first():
    """Sorted by `run_order`: the sshd modules, the longest modules longest first, then the
    rest in their collection order (a stable sort keeps each module's own)."""
    modules = ["test_a.py", "test_plot.py", "test_two_node.py", "test_b.py", "test_faults.py"]
    assert sorted(modules, key=run_order) == [
        "test_two_node.py", "test_faults.py", "test_plot.py", "test_a.py", "test_b.py",
    ]  # fmt: skip
    assert all((REPO / "tests" / name).is_file() for name in [*SSH_MODULES, *LONGEST_MODULES])


def test_workers_take_the_modules_in_collection_order(tmp_path):
    """xdist would hand a one-test module out after every module with more tests; the suite's
    scheduler keeps `run_order`'s order, so a long one-test module is not left for the end."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from helpers.shared import module_scheduling\n\n"
        "def pytest_xdist_make_scheduler(config, log):\n"
        "    return module_scheduling(config, log)\n"
    )
    ran = tmp_path / "ran.txt"
    for module, count in (("test_a_one.py", 1), ("test_b_many.py", 4)):
        tests = "".join(
            f"def test_{i}():\n    open({str(ran)!r}, 'a').write('{module}\\n')\n\n"
            for i in range(count)
        )
        (tmp_path / module).write_text(tests)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-p", "no:cacheprovider", "-q", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ran.read_text().split() == ["test_a_one.py"] + ["test_b_many.py"] * 4
