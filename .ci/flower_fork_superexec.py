"""A SuperExec for one SuperNode that forks every ClientApp process from a warm parent.

Flower 1.41 runs each message a SuperNode receives in a fresh ``flwr-clientapp`` process
(``flower-superexec`` starts one per task token); importing flwr, torch and fedselect (which
imports scikit-learn) costs about 6 s of CPU per message, and FedCor's rounds send several
messages to every node. This process is Flower's own ``run_superexec`` loop (it acquires the
tasks from the SuperNode's Runtime API, started with ``--isolation process``) with one change:
instead of ``subprocess.Popen(["flwr-clientapp", "--token", ...])`` the executor forks this
process, which has imported those modules once, and the child runs
``flwr.supernode.runtime.run_clientapp.run_clientapp`` with the token, exactly what
``flwr-clientapp`` runs. Every task is still its own process that pulls its message, context
and FAB from the SuperNode, loads the app from the FAB and pushes its reply; only the imports
are shared (the idea of Python's ``forkserver``).

Usage: python .ci/flower_fork_superexec.py --runtime-api-address HOST:PORT [--parent-pid PID]
[--preload MODULE ...] (insecure, like the SuperNode it serves).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from flwr.supercore.constant import ExecutorType
from flwr.supercore.superexec import run_superexec as _rs
from flwr.supercore.superexec.executor import LaunchResult
from flwr.supernode.runtime.run_clientapp import run_clientapp


class ForkExecutor:
    """The SubprocessExecutor's interface; ``launch`` forks instead of starting a new interpreter."""

    def __init__(self) -> None:
        self.children: set[int] = set()

    def get_eligible_capacity(self, supported_task_types, *, insecure=False, root_certificates_path=None):
        return supported_task_types, set()

    def wait_for_capacity(self, task_type=None, *, fab_hash=None, insecure=False, root_certificates_path=None):
        return None

    def launch(self, spec) -> LaunchResult:
        if str(getattr(spec.task_type, "value", spec.task_type)) != "flwr-clientapp":
            return LaunchResult.failed(f"fork executor: only ClientApp tasks, got {spec.task_type}")
        pid = os.fork()
        if pid == 0:  # the child: what `flwr-clientapp --token T --insecure --parent-pid P` does
            code = 1
            try:
                run_clientapp(
                    runtime_api_address=spec.runtime_api_address,
                    token=spec.token,
                    insecure=spec.insecure,
                    parent_pid=spec.parent_pid,
                    runtime_dependency_install=spec.runtime_dependency_install,
                )
                code = 0
            except SystemExit as exc:  # flwr_exit ends the task with sys.exit(code)
                code = exc.code if isinstance(exc.code, int) else 0
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.children.add(pid)
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        """Reap the children that have finished."""
        for pid in list(self.children):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.children.discard(pid)

    def close(self) -> None:
        self.reconcile()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, HOST:PORT")
    ap.add_argument("--parent-pid", type=int, default=None, help="stop when this process (the SuperNode) exits")
    ap.add_argument("--preload", nargs="*", default=[], help="modules to import once, before any task")
    args = ap.parse_args()
    for name in args.preload:
        importlib.import_module(name)
    executor = ForkExecutor()
    _rs.get_executor = lambda *a, **k: executor
    _rs.run_superexec(runtime_api_address=args.runtime_api_address, insecure=True, parent_pid=args.parent_pid,
                      executor_type=ExecutorType.SUBPROCESS)


if __name__ == "__main__":
    main()
