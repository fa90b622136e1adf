"""Data-parallel training: one model replicated on N devices (N servers, N devices of one
server, or numpy), each replica computing the gradients of its shard of a batch, the
gradients averaged across the replicas by a ring all-reduce, and every replica taking the
same optimizer step, so that the replicas stay bit-identical.

::

    from client.parallel import DataParallel

    spaces = [Autodiff(client.namespace(dev)) for dev in devices]
    model = build(spaces[0])
    dp = DataParallel(model, spaces, build, lambda params: optim.Adam(params, lr=3e-3))
    for batch in batches:                       # numpy arrays: row indices, say
        dp.step(lambda replica, rows: loss_of(replica, rows), batch)
    assert dp.diverged() == []

Like the training toolkit it serves, the package calls only the Array API standard of the
namespaces it is given; arrays move between replicas by ``x.to_device(device)`` alone, so it
runs over any devices whose arrays can move to each other's: ``ring`` (the all-reduce) and
``replicas`` (the models, their optimizers and the step) over it.
"""

from __future__ import annotations

from .replicas import DataParallel as DataParallel
from .replicas import Replica as Replica
from .replicas import ShardLoss as ShardLoss
from .replicas import replicate as replicate
from .ring import all_reduce_mean as all_reduce_mean
