"""Train a small CNN on scikit-learn's handwritten digits on a Tensorwire server.

The digits are 8x8 images of one channel. The network is PyTorch's idiom, layer for layer:
two 3x3 convolutions (the first followed by batch norm), each with a ReLU and a 2x2 max
pooling, then dropout and a linear layer to the 10 classes, trained with Adam on a cosine
schedule (train_mlp.py's loop: the data uploaded once, each step uploads its batch's indices
and reads back its loss and accuracy). Convolutions, pooling, batch norm and dropout are
Tensorwire's extension of the Array API standard (``client.nn``), run on the server; batch
norm's running statistics are updated there, in place, and the dropout masks are drawn there
by the device's generator, which ``nn.manual_seed`` seeds as ``torch.manual_seed`` does. So
one seed gives the same numbers on a server, with ``--jit`` (the step recorded once and run by
id: the generator's state advances on the device at every replay) and on numpy (``--local``).

    python examples/train_cnn.py --url ws://127.0.0.1:8765      # token: TENSOR_SERVER_TOKEN
    python examples/train_cnn.py --token-file ./token --plot curves.png
    python examples/train_cnn.py --local
    python examples/train_cnn.py --jit

Needs ``pip install -e '.[examples]'``, as train_mlp.py. No checkpoints: the dropout masks'
generator lives on the device, and a checkpoint does not hold its state. Exit status 0 when the
held-out accuracy reaches 98%, 1 otherwise, 2 when the server cannot be reached or refuses us,
the URL is not one, or an output file cannot be written (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import running
from train_mlp import Classifier, run

from client import nn
from client.autodiff import Autodiff

GOAL = 0.98


def cnn(ad: Autodiff, seed: int, dropout: float) -> nn.Module:
    """(N, 1, 8, 8) images -> 16 channels at 8x8 -> pooled to 4x4 -> 32 channels -> pooled to
    2x2 -> 128 features -> 10 classes. ``nn.manual_seed`` first: the weights drawn on the
    client, and the dropout masks' generator on every device, start from ``seed``."""
    nn.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, ad=ad),
        nn.BatchNorm2d(16, ad=ad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1, ad=ad),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(32 * 2 * 2, 10, ad=ad),
    )


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The flags (bench/models.py builds the default model from them)."""
    p = running.parser(
        __doc__.splitlines()[0], epochs=15, batch_size=64, lr=1e-2, plot="train_cnn.png"
    )
    p.add_argument("--dropout", type=float, default=0.25, help="dropout before the classifier")
    p.set_defaults(checkpoint=None, checkpoint_every=1, resume=False)  # none: see above
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    build = partial(cnn, seed=args.seed, dropout=args.dropout)
    return run(args, Classifier("train_cnn.py", "CNN", (1, 8, 8), build, GOAL))


if __name__ == "__main__":
    sys.exit(main())
