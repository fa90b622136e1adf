"""The soak's attackers (``python -m bench.soak``, ``python -m bench.faults``): each a function
of the server's URL that attacks once, as a stranger, an authenticated malicious client or a
malicious peer server would, on loopback. :func:`attack_until` repeats one until a deadline,
in a process of its own; a refused or broken session is opened again.

- costly ops: ops estimated cheap that are not: batches of ``unique_values`` on 65,536 elements
  and ``fft`` with a prime length;
- large batches of tiny ops (``add`` ops, each freed, sent raw: as many as the server's
  ``--max-header-size`` accepts in one message: about 53k at its default of 4 MiB, 100k at
  most);
- view reads: reads of a 64 MiB ``broadcast_to`` view of 8 bytes, 24 at once;
- many tensors: tensors by the million, empty ``full`` ops never freed;
- stalled uploads: uploads of 120 MiB declared and left half sent, on new connections again and
  again;
- wide ops: a ``stack`` over a million inputs (about 2 MiB of header), sent plainly and as a
  registered graph's one op;
- failed registrations: 300 graphs whose one op, a stack of 200,000 inputs of two shapes,
  fails its check with a long error;
- wide graphs: 64 registered graphs of 50,000 declared inputs and one op each;
- exposed writes: writes of one element through a view of a 16 MiB array just exposed for a
  transfer, or whose read is still being answered;
- broadcast vecdot: ``vecdot`` of (L, 1, L) and (1, L, L) broadcast views of one element,
  L = 2048 (2**33 multiply-adds from no memory) and 4096 (over the work cap);
- lying peers: pulls of 8 bytes from peer servers on loopback (``bench/fake_peers.py``) that
  answer with a reply declaring 1 GiB, for the claim or for no request at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import client
from client._frames import Closed
from protocol import Batch
from protocol.codec import byte_view, encode, encode_header, to_frames
from protocol.framing import Opcode
from protocol.graphs import GraphDef, GraphTensor, RegisterGraph
from protocol.ops import AnyOp, Binary, Full, Join, Pull, Unique
from protocol.scalars import scalar_from_python
from server.config import ServerConfig  # the limits the server runs with (the same variables)

from .fake_peers import fake_peer, lies_about_size, strays

MIB = 2**20
GIB = 2**30
RAW_IDS = 10**12  # ids of the raw attackers' ops, far from the client's own
PEERS = ("--peers", "ws://127.0.0.1:*")  # the server may pull from the lying peers' ports
WIDE_INPUTS = 1_000_000  # inputs of the wide ops' stack: about 2 MiB of header
FAILING_INPUTS = 200_000  # inputs of a failing registration's stack: a long error
DECLARED_INPUTS = 50_000  # declared inputs of each wide graph: a 3.2 MiB header
VECDOT_SIDE = 2048  # the broadcast vecdot's L: 2**33 multiply-adds


def _until(deadline: float, attack: Callable[[], None]) -> None:
    """Run ``attack`` until ``deadline``; a refused or broken session is opened again."""
    while time.time() < deadline:
        try:
            attack()
        except (client.TensorwireError, ConnectionError, ValueError, TypeError, Closed):
            time.sleep(0.05)  # Closed: a raw write (large batches) on a connection gone meanwhile


def _costly_ops(url: str) -> None:
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        x = xp.asarray(np.random.default_rng(1).integers(0, 1000, 65_536))
        for _ in range(200):
            dev.submit(Unique(op="unique_values", out=dev.new_id(), x=x.tensor_id))
        xp.fft.fft(xp.astype(x, xp.float64), n=65_521)
        dev.sync()


def _large_batch(x: int, count: int) -> Batch:
    ops: list[AnyOp] = [Binary(op="add", out=RAW_IDS + i, x1=x, x2=x) for i in range(count)]
    return Batch(ops=ops, frees=[op.out for op in ops])


def _large_batches(url: str) -> None:
    with client.RemoteDevice(url) as dev:
        x = client.namespace(dev).ones(16)
        dev.sync()
        sample = len(encode_header(_large_batch(x.tensor_id, 1000)))  # bytes of 1000 ops
        count = min(100_000, int(0.98 * ServerConfig().max_header_size / sample * 1000))
        frames = to_frames(encode(_large_batch(x.tensor_id, count)))
        transport = dev._conn._ws  # noqa: SLF001 - an attacker writes what it likes
        for _ in range(20):
            with transport.send_lock:
                transport.send(frames)
        dev.sync()


def _view_reads(url: str) -> None:
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        view = xp.broadcast_to(xp.zeros(1), (8 * MIB,))  # 64 MiB of float64 from 8 bytes
        for future in [dev.submit_read(view.tensor_id) for _ in range(24)]:
            try:
                future.result()
            except client.RemoteError:
                pass  # refused: what the server should do


def _many_tensors(url: str) -> None:
    with client.RemoteDevice(url) as dev:
        empty = scalar_from_python(0.0)
        for _ in range(1_000_000):  # never freed: the handles are not even made
            dev.submit(Full(out=dev.new_id(), shape=(0,), dtype="float64", value=empty))
        dev.sync()


def _stalled_uploads(url: str) -> None:
    with client.RemoteDevice(url) as dev:
        head = encode_header(Batch(buffers=[120 * MIB] * 8), aligned=True)
        transport = dev._conn._ws  # noqa: SLF001 - an attacker writes what it likes
        with transport.send_lock:
            transport._write_frame(Opcode.BINARY, False, head)  # noqa: SLF001
            block = byte_view(np.zeros(MIB, np.uint8))
            for _ in range(60):  # half of the first buffer, then nothing more
                transport._write_frame(Opcode.CONT, False, block)  # noqa: SLF001
        time.sleep(20)


def _send_raw(dev: client.RemoteDevice, batch: Batch) -> None:
    """Write ``batch`` on ``dev``'s connection as it is, unchecked by the client."""
    transport = dev._conn._ws  # noqa: SLF001 - an attacker writes what it likes
    with transport.send_lock:
        transport.send(to_frames(encode(batch)))


def _wide_ops(url: str) -> None:
    """A stack over a million inputs in one message, sent plainly and as a registered graph's
    one op: what checking, planning and freeing it costs the server."""
    with client.RemoteDevice(url) as dev:
        x = client.namespace(dev).ones(1)
        dev.sync()
        wide = WIDE_INPUTS
        stack = Join(op="stack", out=RAW_IDS, xs=(x.tensor_id,) * wide)
        _send_raw(dev, Batch(ops=[stack], frees=[RAW_IDS]))
        one = GraphTensor(name="x", id=0, shape=(1,), dtype="float64")
        graph = GraphDef(
            inputs=[one],
            ops=[Join(op="stack", out=1, xs=(0,) * wide)],
            outputs=[GraphTensor(name="y", id=1, shape=(wide, 1), dtype="float64")],
        )
        _send_raw(dev, Batch(graphs=[RegisterGraph(graph_id=RAW_IDS, graph=graph)]))
        _send_raw(dev, Batch(drop_graphs=[RAW_IDS]))
        dev.sync()


def _failed_registrations(url: str) -> None:
    """Graphs whose one op fails its check with a long error (a stack of inputs of two
    shapes, alternating), more than the server keeps: it keeps each failure to answer the
    graph's runs."""
    with client.RemoteDevice(url) as dev:
        one = GraphTensor(name="x", id=0, shape=(1,), dtype="float64")
        two = GraphTensor(name="z", id=1, shape=(2,), dtype="float64")
        stack = Join(op="stack", out=2, xs=(0, 1) * (FAILING_INPUTS // 2))
        graph = GraphDef(inputs=[one, two], ops=[stack], outputs=[])
        for graph_id in range(RAW_IDS, RAW_IDS + 300):
            _send_raw(dev, Batch(graphs=[RegisterGraph(graph_id=graph_id, graph=graph)]))
        dev.sync()


def _wide_graphs(url: str) -> None:
    """Registered graphs of many declared inputs and one op, as many as the session may hold:
    structure the server keeps beside the graphs' constants."""
    with client.RemoteDevice(url) as dev:
        inputs = [
            GraphTensor(name=f"x{i}", id=i, shape=(1,), dtype="float64")
            for i in range(DECLARED_INPUTS)
        ]
        last = DECLARED_INPUTS
        stack = Join(op="stack", out=last, xs=tuple(range(DECLARED_INPUTS)))
        out = GraphTensor(name="y", id=last, shape=(DECLARED_INPUTS, 1), dtype="float64")
        graph = GraphDef(inputs=inputs, ops=[stack], outputs=[out])
        for graph_id in range(RAW_IDS, RAW_IDS + 64):
            _send_raw(dev, Batch(graphs=[RegisterGraph(graph_id=graph_id, graph=graph)]))
        dev.sync()


def _exposed_writes(url: str) -> None:
    """Writes of one element through a view of a 16 MiB array just exposed for a transfer, or
    whose read is still being answered: each makes the server move the array's memory first."""
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        root = xp.zeros(2 * MIB)  # 16 MiB of float64
        view = root[:8]
        for _ in range(2):  # an exposure holds its value until claimed or expired
            dev.expose(root.tensor_id, "feed").result()  # any server's id
            view[0] = 1.0
            dev.sync()
        for _ in range(8):
            read = dev.submit_read(root.tensor_id)
            view[0] = 2.0
            dev.sync()
            read.result()


def _broadcast_vecdot(url: str) -> None:
    """``vecdot`` of (L, 1, L) and (1, L, L) broadcast views of one element each: L**3
    multiply-adds from no memory at all, at L under the work cap and at 2L over it."""
    with client.RemoteDevice(url) as dev:
        xp = client.namespace(dev)
        for side in (VECDOT_SIDE, 2 * VECDOT_SIDE):
            one = xp.ones((), dtype=xp.float32)
            a = xp.broadcast_to(one, (side, 1, side))
            b = xp.broadcast_to(one, (1, side, side))
            try:
                float(xp.sum(xp.linalg.vecdot(a, b)))
            except client.RemoteError:
                pass  # over the work cap: refused, what the server should do


def _lying_peers(url: str) -> None:
    """Pulls of 8 bytes from peers on loopback that answer with a reply of 1 GiB: declared
    for the claim, or for no request at all (then refusing the claim)."""
    with client.RemoteDevice(url) as dev:
        for lie in (lies_about_size, strays):
            with fake_peer(lie(GIB)) as peer:
                for _ in range(4):
                    op = Pull(
                        out=dev.new_id(),
                        source=peer.url,
                        capability="A" * 43,
                        shape=(1,),
                        dtype="float64",
                    )
                    try:
                        dev.submit_unchecked(op, op.infer()).numpy()
                    except client.TransferError:
                        pass  # refused: what the server should do


ATTACKS: dict[str, Callable[[str], None]] = {
    "costly ops": _costly_ops,
    "large batches": _large_batches,
    "view reads": _view_reads,
    "many tensors": _many_tensors,
    "stalled uploads": _stalled_uploads,
    "wide ops": _wide_ops,
    "failed registrations": _failed_registrations,
    "wide graphs": _wide_graphs,
    "exposed writes": _exposed_writes,
    "broadcast vecdot": _broadcast_vecdot,
    "lying peers": _lying_peers,
}


def attack_until(name: str, url: str, deadline: float) -> None:
    """Run the attack ``name`` against ``url`` until ``deadline`` (a process of its own)."""
    _until(deadline, lambda: ATTACKS[name](url))
