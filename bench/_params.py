"""How big and how often: the full suite, and the seconds-long ``--quick`` smoke version."""

from __future__ import annotations

import os
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class Params:
    sizes: tuple[tuple[int, int], ...]  # (bytes, repetitions) per transfer size
    streams: int  # repetitions of the streamed uploads (64 x 1 MiB, then one sync)
    peak_upload: int  # bytes of the upload whose peak server memory is measured
    pings: int  # round trips per latency sample set
    ops: int  # pipelined elementwise ops per chain
    ops_reps: int
    matmul_n: int
    matmul_chain: int
    matmul_reps: int
    clients: int
    client_ops: int  # pipelined ops per client per repetition
    client_reps: int
    heavy_clients: int  # clients running large matmuls while an idle one reads
    idle_pings: int
    cycles: int  # create/free cycles
    sessions: int  # idle sessions
    consumer_n: int  # samples in the scikit-learn fit of the consumer workload
    consumer_reps: int  # interleaved remote and local fits (odd: the median is one fit's)
    training_steps: int  # steps per round of the digits MLP (bench/training.py)
    training_wide_steps: int  # steps per round of the wide MLP
    training_reps: int  # interleaved remote and local rounds of each
    cnn_steps: int  # steps per round of the CNN example's step (bench/models.py)
    transformer_steps: int  # steps per round of the transformer example's step
    model_reps: int  # interleaved rounds of each: op by op, replayed, local numpy
    server_transfer: int  # bytes moved from one server to another (bench/servers.py)
    server_reps: int  # repetitions of each way of moving them
    parallel_steps: int  # data-parallel steps per round, on one server and on two


FULL = Params(
    sizes=((1 * MIB, 30), (64 * MIB, 12), (512 * MIB, 6)),  # multiples of 3: see transfer._measure
    streams=12,
    peak_upload=512 * MIB,
    pings=2000,
    ops=100_000,
    ops_reps=3,
    matmul_n=1024,
    matmul_chain=8,
    matmul_reps=3,
    clients=16,
    client_ops=10_000,
    client_reps=5,
    heavy_clients=2 * (os.cpu_count() or 1),
    idle_pings=300,
    cycles=10_000,
    sessions=100,
    consumer_n=2000,  # samples of the consumer's fit (bench/consumer.py)
    consumer_reps=5,
    training_steps=200,
    training_wide_steps=10,
    training_reps=5,
    cnn_steps=40,
    transformer_steps=10,
    model_reps=5,
    server_transfer=64 * MIB,  # large enough that bandwidth, not round trips, decides
    server_reps=9,
    parallel_steps=100,
)

QUICK = Params(
    sizes=((1 * MIB, 3), (4 * MIB, 3)),
    streams=2,
    peak_upload=16 * MIB,
    pings=50,
    ops=2000,
    ops_reps=2,
    matmul_n=128,
    matmul_chain=4,
    matmul_reps=2,
    clients=2,
    client_ops=500,
    client_reps=1,
    heavy_clients=1,
    idle_pings=20,
    cycles=200,
    sessions=4,
    consumer_n=200,
    consumer_reps=1,
    training_steps=10,
    training_wide_steps=2,
    training_reps=1,
    cnn_steps=2,
    transformer_steps=1,
    model_reps=1,
    server_transfer=4 * MIB,
    server_reps=1,
    parallel_steps=5,
)
