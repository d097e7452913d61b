"""LocalGrid: a deterministic in-process Flower Grid that calls ClientApps directly (tests, debugging)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

__all__ = ["LocalGrid"]

Fault = Callable[[Message], str | None]


class LocalGrid(Grid):
    """A Flower ``Grid`` whose nodes are ClientApps called in this process, in order.

    No Ray, no network, no threads: ``send_and_receive`` hands each message to its node's
    ``ClientApp`` and returns the replies, so a ServerApp or a strategy runs
    deterministically in seconds. Faults are injected per node, so tests can exercise what
    a deployment does to a strategy.

    Parameters
    ----------
    client_app : flwr.clientapp.ClientApp
        The app every node runs.
    n_nodes : int
        How many nodes; node ``i`` gets ``node_config = {"partition-id": i, "num-partitions": n_nodes}``
        (as Flower's simulation engine sets it) and a random 63-bit node id, as in Flower.
    run_id : int, default 1
    seed : int, optional
        Seeds the node ids (default: random ids, as in a real run).

    Attributes
    ----------
    faults : dict of int to callable
        ``faults[node_id](message)`` returns None (answer normally), ``"timeout"`` (no reply:
        the message is lost as if the timeout expired) or ``"error"`` (an error reply, as a
        SuperNode sends when the ClientApp raises). Exceptions raised by a ClientApp also
        become error replies. A reply whose ``src_node_id`` is not the node the message went
        to, or whose ``reply_to_message_id`` is not that message's, is lost, as a SuperLink
        refuses it. A reply is lost too when its node took longer than its message's ``ttl``
        (:meth:`push_messages`) or than the ``timeout`` of :meth:`send_and_receive`, as on a
        SuperLink.
    sent : list of Message
        Every message pushed, in order.
    apps : dict of int to callable
        Nodes that run their own app (:meth:`add_node`).
    """

    def __init__(self, client_app, n_nodes: int, *, run_id: int = 1, seed: int | None = None) -> None:
        import random

        rng = random.Random(seed)
        self._rng = rng
        self._app = client_app
        self.apps: dict[int, Any] = {}  # per-node apps (add_node); the others run client_app
        self._run = Run.create_empty(run_id)
        self.node_ids = [rng.randrange(1 << 40, 1 << 62) for _ in range(int(n_nodes))]
        self.contexts = {
            node: Context(
                run_id=run_id,
                node_id=node,
                node_config={"partition-id": i, "num-partitions": int(n_nodes)},
                state=RecordDict(),
                run_config={},
            )
            for i, node in enumerate(self.node_ids)
        }
        self.faults: dict[int, Fault] = {}
        self.sent: list[Message] = []
        self._replies: dict[str, Message] = {}
        self._seconds: dict[str, float] = {}  # message id -> seconds its node took (timed_send_and_receive)
        # A Message built outside a Flower runtime takes its run id and source from TaskIdentity.
        TaskIdentity.run_id = run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        TaskIdentity.task_id = 0

    # -- the node set ---------------------------------------------------------------
    def remove_node(self, node_id: int) -> None:
        """The node disappears (it is no longer listed, and messages to it get no reply)."""
        self.node_ids.remove(node_id)

    def add_node(self, node_config: dict[str, Any], client_app: Any = None, *, node_id: int | None = None) -> int:
        """A new node joins with its own ``node_config`` (and its own app, e.g. a hostile one); returns its id.

        ``client_app`` is any callable ``app(message, context) -> Message`` (a ``ClientApp``, or a
        function that forges replies); default: the grid's app. ``node_id``: a removed node's id
        to bring it back (a rejoin), else a fresh random one.
        """
        node = int(node_id) if node_id is not None else self._rng.randrange(1 << 40, 1 << 62)
        if node in self.node_ids:
            raise ValueError(f"LocalGrid: node {node} is already connected")
        if node_id is None or node not in self.contexts:
            self.contexts[node] = Context(
                run_id=self._run.run_id, node_id=node, node_config=dict(node_config), state=RecordDict(), run_config={}
            )
        if client_app is not None:
            self.apps[node] = client_app
        self.node_ids.append(node)
        return node

    def node_of_partition(self, partition_id: int) -> int:
        """The node id whose ``partition-id`` is ``partition_id``."""
        for node, ctx in self.contexts.items():
            if ctx.node_config["partition-id"] == partition_id:
                return node
        raise KeyError(f"LocalGrid: no node has partition-id {partition_id}")

    # -- Grid -----------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_ids)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Deliver each message to its node now; its reply waits for :meth:`pull_messages`.

        A reply that took its node longer than the message's ``ttl`` is dropped, as a SuperLink
        drops a reply to an expired message: the message is lost, as if it timed out.
        """
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            self.sent.append(msg)
            start = time.perf_counter()
            reply = self._deliver(msg)
            self._seconds[msg.metadata.message_id] = seconds = time.perf_counter() - start
            if reply is not None and not _late(msg, seconds):
                self._replies[msg.metadata.message_id] = reply
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        ids = list(message_ids)
        for i in ids:
            self._seconds.pop(i, None)
        return [self._replies.pop(i) for i in ids if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """The replies that came within ``timeout`` seconds (each node's own seconds; None: no bound)."""
        return [reply for reply, _ in self.timed_send_and_receive(messages, timeout=timeout)]

    def timed_send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> list[tuple[Message, float]]:
        """:meth:`send_and_receive`, with the seconds each node took to answer (its app call), by this process's clock.

        The nodes run one after the other here; each reply's seconds are its own node's, as
        if the nodes answered in parallel, as a deployment's do. A reply whose node took
        longer than ``timeout`` (or than its message's ``ttl``) is dropped, as a server that
        stopped waiting never sees it: its client fails, timed out. A
        :class:`~fedselect.flower.SelectorStrategy` uses this method where a grid has it (the
        grid is the server's own): any other grid is polled (``push_messages`` then
        ``pull_messages``), and a reply's seconds are when the server first saw it.
        """
        out = []
        for msg in messages:
            [message_id] = self.push_messages([msg])
            seconds = self._seconds.pop(message_id)
            if timeout is not None and seconds > float(timeout):
                self._replies.pop(message_id, None)
                continue
            out.extend((reply, seconds) for reply in self.pull_messages([message_id]))
        return out

    def _deliver(self, msg: Message) -> Message | None:
        node = msg.metadata.dst_node_id
        if node not in self.node_ids:
            return None
        fault = self.faults.get(node)
        action = fault(msg) if fault is not None else None
        if action == "timeout":
            return None
        if action == "error":
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="injected fault"), reply_to=msg)
        if action is not None:
            raise ValueError(f"LocalGrid: a fault returned {action!r}; expected None, 'timeout' or 'error'")
        try:
            reply = self.apps.get(node, self._app)(msg, self.contexts[node])
        except Exception as exc:  # a SuperNode turns a raising ClientApp into an error reply
            return Message(
                Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg
            )
        try:  # a SuperLink refuses a reply that is not from the node the message went to, or not to that message
            ok = reply.metadata.src_node_id == node and reply.metadata.reply_to_message_id == msg.metadata.message_id
        except Exception:
            ok = False
        return reply if ok else None


def _late(msg: Message, seconds: float) -> bool:
    """Whether a reply that took ``seconds`` came after its message's ``ttl`` expired."""
    try:
        ttl = float(msg.metadata.ttl)
    except Exception:  # a message without a readable ttl never expires here
        return False
    return seconds > ttl
