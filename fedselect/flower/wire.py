"""The server's side of the Grid: the node map with its hello handshake, sending and polling, bytes and seconds."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from logging import INFO, WARNING

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore import log

from ..round.record import Traffic
from . import _protocol as P

__all__ = ["Wire"]

#: the most node refreshes (rounds) between two hellos to a node whose hellos fail (error, no answer)
HELLO_BACKOFF_MAX = 32

#: the exchanges a round waits on (its wall_seconds): oracle questions; training is timed by the transport
ROUND_KINDS = frozenset({"loss", "update", "trial"})

#: pauses between pulls of a polled grid (:meth:`Wire.send_and_receive`): this fraction of the time elapsed,
#: within [POLL_MIN, POLL_MAX] seconds
POLL_FRACTION, POLL_MIN, POLL_MAX = 0.05, 0.01, 1.0


class Wire:
    """What a :class:`~fedselect.flower.SelectorStrategy` server knows of its nodes and how it talks to them.

    Two jobs with their own state. The node map: each new node answers a hello with its client id and n_k;
    an id belongs to the first node that claims it with a usable hello while that node is listed, n_k is the
    one its first usable hello gave, other claims are refused (:meth:`refresh_nodes`), and a node whose hello
    fails is asked again after 1, 2, 4, ... refreshes, at most ``HELLO_BACKOFF_MAX`` apart. The exchanges: one
    message per node, the replies collected within a timeout and timed by the server's own clock
    (:meth:`send_and_receive`), their bytes counted per kind (:meth:`count`) and the round's waiting summed
    (:attr:`wall`). What a round measured is kept until :meth:`begin_round`.

    Parameters
    ----------
    n_clients : int
        N: client ids are 0..N-1; a hello claiming another id is refused.
    query_timeout : float
        Seconds a hello is awaited before it counts as failed.
    max_num_examples : int
        The largest n_k a hello may claim.
    node_binding : mapping of int to int, optional
        Node id -> the one client id that node may claim; a node not in it gets no message.
    reply_limit : int, optional
        The most bytes one reply may carry (None: no limit); a larger hello is refused, and a larger reply is
        counted by its content's size rather than serialised again.

    Attributes
    ----------
    n_samples : dict of int to int
        n_k of each client id, from its first usable hello.
    traffic : dict of str to Traffic
        This round's messages and bytes per kind.
    wall : float
        This round's seconds waiting on the clients' answers to its oracle questions and its training.
    reply_seconds : dict of int to float
        This round's measured seconds of each client's used training reply.
    train_wait : float or None
        While :meth:`waited_for_training` holds: the seconds a client that sent nothing back was waited for.
    """

    def __init__(
        self,
        *,
        n_clients: int,
        query_timeout: float,
        max_num_examples: int,
        node_binding: Mapping[int, int] | None = None,
        reply_limit: int | None = None,
    ) -> None:
        self.n_clients = int(n_clients)
        self.query_timeout = float(query_timeout)
        self.max_num_examples = int(max_num_examples)
        self.binding = None if node_binding is None else {int(n): int(k) for n, k in node_binding.items()}
        self.reply_limit = reply_limit
        self.n_samples: dict[int, int] = {}
        self._node_of: dict[int, int] = {}
        self._client_of: dict[int, int] = {}
        # node -> (the client id it claimed, if that was the reason, and why): not asked again while it is alive
        self._refused: dict[int, tuple[int | None, str]] = {}
        self._hellos: dict[str, tuple[int, float]] = {}  # hello message id -> (node, when sent): awaiting a reply
        self._hello_backoff: dict[int, tuple[int, int]] = {}  # node -> (failed hellos, tick it may be asked again)
        self._hello_tick = 0  # node refreshes so far: the unit of the hello back-off
        self._train_arrivals: dict[int, float] = {}  # id(reply) -> seconds, from start()'s training exchange
        self.train_wait: float | None = None
        self.begin_round()

    def begin_round(self) -> None:
        """Forget the last round's measurements (traffic, waiting, reply seconds)."""
        self.traffic: dict[str, Traffic] = {}
        self.wall = 0.0
        self.reply_seconds: dict[int, float] = {}

    # -- the node map ---------------------------------------------------------------
    def node_of(self, k: int) -> int | None:
        """The node client ``k`` is live on, None if it has none."""
        return self._node_of.get(k)

    def client_of(self, node: int) -> int | None:
        """The client id node ``node`` holds, None if it holds none."""
        return self._client_of.get(node)

    def client_nodes(self) -> dict[int, int]:
        """Client id -> node id of every live client (a copy)."""
        return dict(self._node_of)

    def refusals(self) -> list[tuple[int, str]]:
        """(node, why) of each node refused while it is connected."""
        return [(node, why) for node, (_, why) in self._refused.items()]

    def fill_sizes(self, ids: Iterable[int], n_k: int) -> None:
        """Give clients ``ids`` (who sent no usable hello) the size ``n_k`` until their own hello."""
        for k in ids:
            self.n_samples[int(k)] = int(n_k)

    def n_samples_array(self) -> np.ndarray:
        """n_k of clients 0..N-1 (from their first usable hello)."""
        return np.array([self.n_samples[k] for k in range(self.n_clients)], dtype=np.int64)

    def refresh_nodes(self, grid: Grid, *, connecting: bool = False) -> None:
        """Forget nodes that left; ask new nodes their client id and n_k, binding each id to one node.

        A client id belongs to the first node that claims it with a usable hello, for as long
        as that node is listed; a claim by another node meanwhile is refused (logged once per
        node, which is not asked again while the holder is alive). When the holder leaves,
        the id is free again and the next node to claim it holds it (a rejoin, logged unless
        ``connecting``: the first round's wait for all N). n_k comes from the first usable
        hello of the id and is never replaced.
        """
        N = self.n_clients
        nodes = set(int(n) for n in grid.get_node_ids())
        freed = set()
        for node in [n for n in self._client_of if n not in nodes]:
            k = self._client_of.pop(node)
            if self._node_of.get(k) == node:
                del self._node_of[k]
                freed.add(k)
            log(
                WARNING,
                "fedselect: client %d's node %d has left; client %d is unavailable until it rejoins",
                k,
                node,
                k,
            )
        for node, (claimed, _) in list(self._refused.items()):
            # a node that left is forgotten; one refused for claiming a freed id may claim it now
            if node not in nodes or claimed in freed:
                del self._refused[node]
        new = sorted(n for n in nodes if n not in self._client_of and n not in self._refused)
        bound = self.binding
        if bound is not None:
            for node in [n for n in new if n not in bound]:  # an identity the operator did not bind: no message
                why = "is not in node_binding"
                log(WARNING, "fedselect: node %d %s; refused (not asked while it is connected)", node, why)
                self._refused[node] = (None, why)
            new = [n for n in new if n in bound]
        replies = self._hello_replies(grid, nodes, new)  # also collects hellos still awaited when new is empty
        limit = self.reply_limit
        for node, msg in replies:
            try:
                if msg.has_error():  # a node whose app fails (not yet started?) is asked again after a back-off
                    self._hello_failed(node, f"answered hello with an error: {P.safe_text(msg.error.reason)}")
                    continue
                if limit is not None and P.content_nbytes(msg.content) > limit:
                    raise P.BadReply(f"a hello above max_reply_bytes={limit}")
                m = P.reply_metrics(msg.content)
                k = P.metric_int(m, P.CLIENT_ID, maximum=N - 1)
                n_k = P.metric_int(m, P.NUM_EXAMPLES, minimum=1, maximum=self.max_num_examples)
            except Exception as exc:  # not mapped to a client; not asked again while it stays connected
                reason = P.why(exc)
                log(
                    WARNING,
                    "fedselect: node %s sent an unusable hello (%s); ignored while it stays connected",
                    node
                    if node is not None
                    else P.safe_text(getattr(getattr(msg, "metadata", None), "src_node_id", "?")),
                    reason,
                )
                if node is not None and node in new:
                    self._refused[node] = (None, f"unusable hello: {reason}")
                continue
            if bound is not None and bound[node] != k:
                why = f"claims client id {k}, but node_binding binds it to client id {bound[node]}"
                log(WARNING, "fedselect: node %d %s; refused (not asked again while it is connected)", node, why)
                self._refused[node] = (None, why)
                continue
            holder = self._node_of.get(k)
            if holder is not None and holder != node:
                why = f"claims client id {k}, which node {holder} holds"
                log(
                    WARNING,
                    "fedselect: node %d %s; refused (not asked again while node %d is connected)",
                    node,
                    why,
                    holder,
                )
                self._refused[node] = (k, why)
                continue
            if k in self.n_samples and not connecting:
                log(INFO, "fedselect: client %d rejoined on node %d", k, node)
                if self.n_samples[k] != n_k:
                    log(
                        WARNING,
                        "fedselect: client %d now reports n_k=%d; kept %d (from its first hello)",
                        k,
                        n_k,
                        self.n_samples[k],
                    )
            self._node_of[k] = node
            self._client_of[node] = k
            self.n_samples.setdefault(k, n_k)
            self._hello_backoff.pop(node, None)

    def _hello_replies(self, grid: Grid, nodes: set[int], new: Sequence[int]) -> list[tuple[int, Message]]:
        """Send hellos to the nodes of ``new`` that may be asked now, and collect the hello replies that have
        arrived, without waiting: (node, reply) pairs, the reply possibly an error (the SuperLink's own, for an
        expired message, included).

        A hello unanswered after ``query_timeout`` seconds counts as a failure (it keeps Flower's default
        ``ttl``: a SuperNode that starts late may still answer it while it is awaited). A node
        that failed is asked again after 1, 2, 4, ... node refreshes (one per round; the setup's polls of 0.2 s
        too), at most ``HELLO_BACKOFF_MAX`` apart, and never while its hello is awaited. So a hello is never
        in a round's critical path: a node that has not answered yet is not a candidate until it does.
        """
        self._hello_tick += 1
        for mid, (node, _) in list(self._hellos.items()):  # hellos to nodes that left are not awaited
            if node not in nodes:
                del self._hellos[mid]
        for node in [n for n in self._hello_backoff if n not in nodes]:
            del self._hello_backoff[node]
        awaited = {node for node, _ in self._hellos.values()}
        ask = [n for n in new if n not in awaited and self._hello_backoff.get(n, (0, 0))[1] <= self._hello_tick]
        if ask:
            messages = [Message(RecordDict({"config": ConfigRecord()}), n, P.HELLO, group_id="hello") for n in ask]
            self.count("hello", messages, down=True)
            sent = time.monotonic()
            pushed = {str(i) for i in grid.push_messages(messages) if i}  # a grid lists only what it stored
            for mid, node in P.destinations(messages).items():  # push_messages wrote each message's id
                if mid in pushed:
                    self._hellos[mid] = (node, sent)
                else:
                    self._hello_failed(node, "its hello could not be pushed")
        if not self._hellos:
            return []
        replies = list(grid.pull_messages(list(self._hellos)))
        self.count("hello", replies, down=False)
        out: list[tuple[int, Message]] = []
        for msg in replies:
            try:  # a reply's metadata is the client's: one that cannot be read is dropped
                answers, src = str(msg.metadata.reply_to_message_id), int(msg.metadata.src_node_id)
                node = self._hellos[answers][0] if answers in self._hellos else None
                if node is None or (src != node and not (src == SUPERLINK_NODE_ID and msg.has_error())):
                    log(WARNING, "fedselect: dropped a hello reply from node %s that answers no awaited hello", src)
                    continue
            except Exception as exc:
                log(WARNING, "fedselect: dropped a hello reply whose metadata cannot be read (%s)", P.why(exc))
                continue
            del self._hellos[answers]
            out.append((node, msg))
        now = time.monotonic()
        for mid, (node, sent) in list(self._hellos.items()):
            if now - sent >= self.query_timeout:
                del self._hellos[mid]
                self._hello_failed(node, f"did not answer hello within query_timeout={self.query_timeout:g}s")
        return out

    def _hello_failed(self, node: int, why: str) -> None:
        """Back a node off after a failed hello: asked again 2**(f-1) refreshes later after f failures in a row,
        at most ``HELLO_BACKOFF_MAX``."""
        failures = self._hello_backoff.get(node, (0, 0))[0] + 1
        wait = min(2 ** min(failures - 1, 30), HELLO_BACKOFF_MAX)
        self._hello_backoff[node] = (failures, self._hello_tick + wait)
        log(INFO, "fedselect: node %d %s; asked again in %d round(s)", node, why, wait)

    # -- exchanges ------------------------------------------------------------------
    def exchange(
        self, grid: Grid, messages: list[Message], timeout: float, kind: str, times: dict[int, float] | None = None
    ) -> list[Message]:
        """Send ``messages`` and wait for the replies (counted as ``kind``'s traffic). The exchange's
        seconds count toward the round's ``wall_seconds`` for the round's own kinds (oracle questions);
        ``times``, if given, receives each reply's seconds by client (:meth:`send_and_receive`)."""
        if not messages:
            return []
        self.count(kind, messages, down=True)
        sent = time.monotonic()
        timed = self.send_and_receive(grid, messages, float(timeout))
        if kind in ROUND_KINDS:
            self.wall += time.monotonic() - sent
        replies = [m for m, _ in timed]
        self.count(kind, replies, down=False)
        if times is not None:
            times.update(self.reply_times(messages, timed))
        return replies

    @staticmethod
    def send_and_receive(grid: Grid, messages: list[Message], timeout: float) -> list[tuple[Message, float]]:
        """Send ``messages``; each reply received within ``timeout`` seconds, with the seconds from sending to
        the server's first sight of it, by the server's own clock.

        A grid with a ``timed_send_and_receive`` method (:class:`~fedselect.flower.LocalGrid`, the
        server's own) times the replies itself. Any other grid is polled: ``push_messages``, then
        ``pull_messages`` right away and after pauses of 5 % of the time elapsed (at least 10 ms,
        at most 1 s), so a reply's seconds are late by at most that pause; Flower's own
        ``send_and_receive`` pauses 3 s between pulls on a deployment. The replies' timestamps,
        which their nodes set, are never read. On a polled grid the server also checks what a
        SuperLink (and LocalGrid) checks: a reply counts only if it answers a message of this
        exchange that has no reply yet and comes from the node that message went to, or is the
        error reply the SuperLink itself sends for it (from ``SUPERLINK_NODE_ID``: the node is
        offline, the message expired), which ends the wait for it as Flower's ``send_and_receive``
        does. A second reply, or one from another node, is dropped with a warning; a message the
        grid could not push (an empty or ``None`` id) is not waited for.
        """
        timed = getattr(grid, "timed_send_and_receive", None)
        if callable(timed):
            return [(m, float(s)) for m, s in timed(messages, timeout=timeout)]
        start = time.monotonic()
        pushed = [i for i in grid.push_messages(messages) if i]
        dst = P.destinations(messages)  # push_messages wrote each message's id into its metadata
        pending = set(pushed)
        deadline = start + timeout
        out: list[tuple[Message, float]] = []
        while pending:
            replies = list(grid.pull_messages(list(pending)))
            now = time.monotonic()
            for msg in replies:
                try:  # a reply's metadata is the client's: one that cannot be read is dropped
                    answers, node = msg.metadata.reply_to_message_id, int(msg.metadata.src_node_id)
                    expected = dst.get(str(answers), node)
                    from_link = node == SUPERLINK_NODE_ID and msg.has_error()  # the SuperLink answers for the node
                    if answers not in pending or (node != expected and not from_link):
                        log(
                            WARNING,
                            "fedselect: dropped a reply from node %s that answers %s, not a message of this "
                            "exchange to that node still waiting for its reply",
                            node,
                            P.safe_text(answers),
                        )
                        continue
                except Exception as exc:
                    log(WARNING, "fedselect: dropped a reply whose metadata cannot be read (%s)", P.why(exc))
                    continue
                pending.discard(answers)
                out.append((msg, now - start))
            if not pending or now >= deadline:
                break
            time.sleep(max(0.0, min(max(POLL_MIN, POLL_FRACTION * (now - start)), POLL_MAX, deadline - now)))
        return out

    def reply_times(self, messages: Sequence[Message], timed: Iterable[tuple[Message, float]]) -> dict[int, float]:
        """Each reply's seconds (as :meth:`send_and_receive` measured them) by client id: replies of mapped
        nodes that were sent a message, not errors. A node with two replies gets the later one's seconds."""
        asked = {int(m.metadata.dst_node_id) for m in messages}
        out: dict[int, float] = {}
        for msg, seconds in timed:
            try:  # a reply's metadata is the client's: anything odd in it only loses this measurement
                node = int(msg.metadata.src_node_id)
                k = self._client_of.get(node)
                if k is None or node not in asked or msg.has_error():
                    continue
                out[k] = max(out.get(k, 0.0), float(seconds))
            except Exception:
                continue
        return out

    def count(self, kind: str, messages: Iterable[Message], *, down: bool) -> None:
        """Count ``messages`` as ``kind``'s traffic this round: sent (``down``) or received, by serialised size
        (a reply above the reply limit by its content's size, a reply that cannot be sized as 0 bytes)."""
        tr = self.traffic.setdefault(kind, Traffic())
        limit = None if down else self.reply_limit
        for m in messages:
            try:  # a reply above the limit is counted by its content, not serialised again
                approx = None if limit is None or m.has_error() else P.content_nbytes(m.content)
                size = approx if approx is not None and approx > limit else P.message_bytes(m)
            except Exception:  # a reply that cannot even be sized counts 0 bytes
                size = 0
            if down:
                tr.messages_down += 1
                tr.bytes_down += size
            else:
                tr.messages_up += 1
                tr.bytes_up += size

    def add_wait(self, seconds: float) -> None:
        """Add ``seconds`` waited on the clients to this round's :attr:`wall`."""
        self.wall += seconds

    @contextlib.contextmanager
    def waited_for_training(self, timed: Iterable[tuple[Message, float]], wait: float) -> Iterator[None]:
        """Within the block, the training replies ``timed`` (reply, seconds) came from one exchange that waited
        ``wait`` seconds: :meth:`take_train_arrivals` gives their seconds, :attr:`train_wait` the wait."""
        self._train_arrivals = {id(m): s for m, s in timed}
        self.train_wait = float(wait)
        try:
            yield
        finally:
            self.train_wait = None

    def take_train_arrivals(self) -> dict[int, float]:
        """The seconds of the training replies of :meth:`waited_for_training`, by ``id(reply)``, once (then
        forgotten): replies handed in another way have none."""
        arrivals, self._train_arrivals = self._train_arrivals, {}
        return arrivals
