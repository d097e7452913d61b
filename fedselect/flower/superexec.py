"""A SuperExec for one SuperNode that forks every ClientApp process from a warm parent.

Run it as ``python -m fedselect.flower.superexec --runtime-api-address HOST:PORT ...`` beside a
SuperNode started with ``--isolation process``, in place of Flower's ``flower-superexec``.

Why: a SuperNode runs every message it receives (train, evaluate, each of fedselect's queries)
in a fresh ClientApp process. ``flower-superexec`` starts each as a new ``flwr-clientapp``
interpreter, which imports flwr, torch and fedselect (scikit-learn included) before it can
answer: about 6 s of CPU per message, and FedCor's rounds send several messages to every node.
This process is Flower's own SuperExec loop
(:func:`flwr.supercore.superexec.run_superexec.run_superexec`: it acquires the tasks from the
SuperNode's Runtime API) with one change: instead of starting ``flwr-clientapp --token T``, its
executor forks this process, which has imported those modules once (``--preload``), and the
child runs :func:`flwr.supernode.runtime.run_clientapp.run_clientapp` with the token, which is
exactly what ``flwr-clientapp`` runs. Every task is still its own process that pulls its
message, context and app bundle from the SuperNode, loads the ClientApp from the bundle and
pushes its reply; only the imports are shared (the idea of Python's ``forkserver``).

The options are ``flower-superexec``'s: ``--insecure`` (plain HTTP to the Runtime API: only for
a SuperNode whose Runtime API listens on localhost) or ``--root-certificates CA.pem`` (the CA
that signed the certificate the SuperNode serves its Runtime API with, ``flower-supernode
--ssl-certfile/--ssl-keyfile/--ssl-ca-certfile``), ``--parent-pid`` (stop when the SuperNode
exits), ``--superexec-auth-secret-file``, ``--allow-runtime-dependency-installation``; plus
``--preload MODULE ...``, ``--datasets NAME ...`` (fedselect datasets read once, here) and
``--poll-interval SECONDS`` (how often it asks the SuperNode for a
task: 0.2 s by default here, Flower's default is 1 s). A ClientApp process stops when this process
stops (each watches its parent, as Flower's do).

POSIX only (``os.fork``). Written against the SuperExec of flwr 1.42; it checks what it uses at
start and says so when a Flower version lacks it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ForkExecutor", "main"]

_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
DEFAULT_PRELOAD = ("fedselect.flower",)


class ForkExecutor:
    """Flower's SubprocessExecutor interface; :meth:`launch` forks instead of starting an interpreter."""

    def __init__(self) -> None:
        self.children: set[int] = set()

    def get_eligible_capacity(self, supported_task_types, *, insecure=False, root_certificates_path=None):
        return supported_task_types, set()

    def wait_for_capacity(self, task_type=None, *, fab_hash=None, insecure=False, root_certificates_path=None):
        return None

    def launch(self, spec):
        from flwr.supercore.superexec.executor import LaunchResult

        task_type = str(getattr(spec.task_type, "value", spec.task_type))
        if task_type != "flwr-clientapp":
            return LaunchResult.failed(f"fedselect.flower.superexec runs ClientApp tasks only, got {task_type}")
        certificates = None
        if not spec.insecure and spec.root_certificates_path is not None:
            certificates = Path(spec.root_certificates_path).expanduser().read_bytes()
        pid = os.fork()
        if pid == 0:  # the child: what `flwr-clientapp --token T [--insecure | --root-certificates C]` runs
            code = 1
            try:
                from flwr.supernode.runtime.run_clientapp import run_clientapp

                run_clientapp(
                    runtime_api_address=spec.runtime_api_address,
                    token=spec.token,
                    insecure=spec.insecure,
                    certificates=certificates,
                    parent_pid=spec.parent_pid,
                    runtime_dependency_install=spec.runtime_dependency_install,
                )
                code = 0
            except SystemExit as exc:  # Flower ends a task with sys.exit(code)
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # never return into the parent's loop
                traceback.print_exc()
                code = 1
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


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m fedselect.flower.superexec",
        description="A SuperExec for one SuperNode (started with --isolation process) that forks every "
        "ClientApp process from this warm process instead of starting a new interpreter per message.",
    )
    ap.add_argument("--runtime-api-address", required=True, help="the SuperNode's Runtime API, HOST:PORT")
    tls = ap.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true",
                     help="plain HTTP to the Runtime API: only for a Runtime API on localhost")
    tls.add_argument("--root-certificates", metavar="CA_PEM",
                     help="the CA certificate that verifies the Runtime API's TLS certificate")
    ap.add_argument("--parent-pid", type=int, default=None, help="stop when this process (the SuperNode) exits")
    ap.add_argument("--superexec-auth-secret-file", default=None,
                    help="the shared secret file of the SuperNode's --superexec-auth-secret-file")
    ap.add_argument("--allow-runtime-dependency-installation", action="store_true",
                    help="let Flower install the app's dependencies (off: the app runs in this environment)")
    ap.add_argument("--preload", nargs="*", default=list(DEFAULT_PRELOAD), metavar="MODULE",
                    help="modules to import once, before any task (default: %(default)s); the ClientApp "
                    "itself is loaded from the app bundle in each task")
    ap.add_argument("--datasets", nargs="*", default=[], metavar="NAME",
                    help="fedselect datasets to read once into this process's memory (fedselect.data."
                    "load_dataset(NAME)), so that each ClientApp that builds its federation from them "
                    "skips parsing the files, e.g. --datasets fmnist")
    ap.add_argument("--poll-interval", type=float, default=None, metavar="SECONDS",
                    help=f"seconds between requests for a task (default: ${_POLL_ENV}, else 0.2)")
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if not hasattr(os, "fork"):
        raise SystemExit("fedselect.flower.superexec needs os.fork (POSIX); use flower-superexec")
    if args.root_certificates is not None and not Path(args.root_certificates).expanduser().is_file():
        raise SystemExit(f"fedselect.flower.superexec: --root-certificates {args.root_certificates}: no such file")
    if args.poll_interval is not None:
        os.environ[_POLL_ENV] = repr(float(args.poll_interval))
    else:
        os.environ.setdefault(_POLL_ENV, "0.2")
    try:
        from flwr.supercore.constant import ExecutorType
        from flwr.supercore.superexec import run_superexec as rs
        from flwr.supercore.superexec.executor import LaunchResult  # noqa: F401  (used by ForkExecutor)
        from flwr.supernode.runtime.run_clientapp import run_clientapp  # noqa: F401  (what each child runs)
    except ImportError as exc:  # pragma: no cover - another flwr
        raise SystemExit(f"fedselect.flower.superexec: this flwr lacks what it needs ({exc}); "
                         "use flower-superexec") from exc
    if not hasattr(rs, "get_executor") or not hasattr(rs, "run_superexec"):  # pragma: no cover - another flwr
        raise SystemExit("fedselect.flower.superexec: this flwr's SuperExec has no get_executor; use flower-superexec")
    secret = None
    if args.superexec_auth_secret_file is not None:
        from flwr.supercore.auth import load_superexec_auth_secret

        secret = load_superexec_auth_secret(secret_file=args.superexec_auth_secret_file)
    for name in args.preload:
        importlib.import_module(name)
    if args.datasets:
        from fedselect.data import load_dataset

        for name in args.datasets:
            try:
                load_dataset(name)  # parsed arrays stay in fedselect's in-memory cache, which each fork inherits
            except (OSError, KeyError, ValueError) as exc:
                raise SystemExit(f"fedselect.flower.superexec: --datasets {name}: {exc}") from exc
    executor = ForkExecutor()
    print(f"fedselect.flower.superexec: ready (pid {os.getpid()}, preloaded {' '.join(args.preload) or 'nothing'}"
          f"{', datasets ' + ' '.join(args.datasets) if args.datasets else ''}); serving the SuperNode at "
          f"{args.runtime_api_address}", file=sys.stderr, flush=True)
    rs.get_executor = lambda *a, **k: executor  # Flower's loop, our executor
    rs.run_superexec(
        runtime_api_address=args.runtime_api_address,
        insecure=bool(args.insecure),
        root_certificates_path=args.root_certificates,
        superexec_auth_secret=secret,
        parent_pid=args.parent_pid,
        runtime_dependency_install=bool(args.allow_runtime_dependency_installation),
        executor_type=ExecutorType.SUBPROCESS,
    )


if __name__ == "__main__":
    main()
