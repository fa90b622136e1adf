"""Train a small character-level transformer on Python's documentation on a Tensorwire server.

A decoder-only transformer, as GPT's: token and position embeddings, blocks of causal
multi-head self-attention and an MLP (each after a layer norm, each added to the residual
stream, each with dropout), a final layer norm and a linear layer to the next character's
logits. It learns to continue the text of Python's documentation topics (the pages
``help("with")`` shows): ``pydoc_data.topics``, which ships with every Python (Python Software
Foundation License), so nothing is downloaded; the text, and so the numbers, differ between
Python versions. The last tenth is held out for validation.

The text is uploaded once; each step uploads where its windows start, gathers them on the
server and reads back the batch's loss. The attention is PyTorch's ``nn.MultiheadAttention``
(``batch_first=True``) with a causal mask; its dropout and the others draw their masks on the
device, from the generator ``nn.manual_seed`` seeds, so one seed gives the same numbers on a
server, with ``--jit`` (the generator's state advances on the device at every replay) and on
numpy (``--local``).

Printed: the unigram baseline's validation loss (the cross-entropy of the held-out characters
under the training text's character frequencies, add-one smoothed: what a model that ignores
the context can do), then ``validation loss X`` per epoch, and at the end a sample: characters
drawn one at a time from the model's softmax (on the client, seeded), after a prompt from the
held-out text.

    python examples/train_transformer.py --url ws://127.0.0.1:8765   # token: TENSOR_SERVER_TOKEN
    python examples/train_transformer.py --token-file ./token --plot curves.png
    python examples/train_transformer.py --local
    python examples/train_transformer.py --jit
    python examples/train_transformer.py --local --quick    # 50 steps: does it learn at all

Needs ``pip install -e '.[examples]'`` for the progress bar and the plot (both optional here).
Exit status 0 when the final validation loss is at most 70% of the unigram baseline's (with
``--quick``, 50 steps, below it), 1 otherwise, 2 when the server cannot be reached or refuses
us, the URL is not one, or an output file cannot be written (one line on stderr).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import running

from client import nn, optim
from client.autodiff import Autodiff, Tensor, no_grad
from client.capture import jit

GOAL = 0.7  # the final validation loss over the unigram baseline's, at most
QUICK_STEPS = 50  # --quick's, in two epochs
EVALUATED = 256  # windows per forward pass of the validation loss


@dataclass(frozen=True)
class Text:
    """The text as character codes: its alphabet (code i is ``alphabet[i]``), the training
    split and the held-out one."""

    alphabet: str
    train: np.ndarray
    held_out: np.ndarray

    def decode(self, codes: Any) -> str:
        return "".join(self.alphabet[code] for code in codes)


def documentation() -> Text:
    """Python's documentation topics, in the order of their names, as codes; the last tenth
    held out."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    alphabet = "".join(sorted(set(text)))
    lookup = {character: code for code, character in enumerate(alphabet)}
    codes = np.array([lookup[character] for character in text], dtype=np.int64)
    cut = len(codes) * 9 // 10
    return Text(alphabet, codes[:cut], codes[cut:])


def windows(codes: np.ndarray, context: int) -> np.ndarray:
    """``codes`` cut into non-overlapping windows of ``context + 1``: a model reads the first
    ``context`` of each and predicts the last ``context``."""
    count = (len(codes) - 1) // context
    starts = np.arange(count)[:, None] * context
    cut: np.ndarray = codes[starts + np.arange(context + 1)]
    return cut


def unigram_loss(text: Text, targets: np.ndarray) -> float:
    """The cross-entropy (nats) of ``targets`` under the training split's character
    frequencies, add-one smoothed so that a character it lacks costs a finite amount."""
    counts = np.bincount(text.train, minlength=len(text.alphabet)) + 1.0
    return float(-np.mean(np.log(counts / counts.sum())[targets]))


class Block(nn.Module):
    """``x + attention(norm(x))``, then ``x + mlp(norm(x))``: a pre-norm transformer block,
    its self-attention PyTorch's ``nn.MultiheadAttention``."""

    def __init__(self, width: int, heads: int, dropout: float, *, ad: Autodiff) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, ad=ad)
        self.attention = nn.MultiheadAttention(
            width, heads, dropout=dropout, batch_first=True, ad=ad
        )
        self.drop = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(width, ad=ad)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width, ad=ad),
            nn.GELU(),
            nn.Linear(4 * width, width, ad=ad),
            nn.Dropout(dropout),
        )

    def forward(self, x: Tensor, future: Tensor) -> Tensor:
        """``future``: (length, length) booleans, True where a position must not attend."""
        h = self.norm1(x)
        attended, _ = self.attention(h, h, h, attn_mask=future, need_weights=False)
        x = x + self.drop(attended)
        out: Tensor = x + self.mlp(self.norm2(x))
        return out


class CharTransformer(nn.Module):
    """Codes (batch, length <= context) -> the next code's logits (batch, length, alphabet)."""

    def __init__(self, alphabet: int, args: argparse.Namespace, *, ad: Autodiff) -> None:
        super().__init__()
        self.token = nn.Embedding(alphabet, args.width, ad=ad)
        self.position = nn.Embedding(args.context, args.width, ad=ad)
        self.drop = nn.Dropout(args.dropout)
        self.blocks = nn.Sequential(
            *(Block(args.width, args.heads, args.dropout, ad=ad) for _ in range(args.layers))
        )
        self.norm = nn.LayerNorm(args.width, ad=ad)
        self.head = nn.Linear(args.width, alphabet, ad=ad)

    def forward(self, codes: Tensor) -> Tensor:
        ad = self.head.weight.namespace
        length = int(codes.shape[1])  # type: ignore[arg-type]
        # causal: position i sees positions up to i (built on the device, nothing uploaded)
        future = ad.triu(ad.ones((length, length), dtype=ad.xp.bool), k=1)
        x = self.drop(self.token(codes) + self.position(ad.arange(length)))
        for block in self.blocks:
            x = block(x, future)
        logits: Tensor = self.head(self.norm(x))
        return logits


def transformer(ad: Autodiff, alphabet: int, args: argparse.Namespace) -> CharTransformer:
    """The model, ``nn.manual_seed`` first: the weights drawn on the client, and the dropout
    masks' generator on every device, start from ``args.seed``."""
    nn.manual_seed(args.seed)
    return CharTransformer(alphabet, args, ad=ad)


def sequence_loss(model: nn.Module, batch: Tensor) -> Tensor:
    """The mean cross-entropy of each window's characters after its first, each predicted
    from those before it: ``batch`` (n, context + 1) codes."""
    ad = batch.namespace
    logits = model(batch[:, :-1])
    alphabet = int(logits.shape[-1])
    return nn.cross_entropy(ad.reshape(logits, (-1, alphabet)), ad.reshape(batch[:, 1:], (-1,)))


def optimizer(model: nn.Module, args: argparse.Namespace) -> optim.AdamW:
    """AdamW at ``args.lr``, weight decay 0.01."""
    return optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)


def training_step(
    model: nn.Module, opt: optim.Optimizer, codes: Tensor, context: int
) -> Callable[[Tensor], Tensor]:
    """The training step on the windows of ``context + 1`` codes of ``codes`` (the text,
    resident on the device) that start where an index array says: gathered there, then
    forward, loss, backward, ``opt``'s update; it returns the loss."""
    ad = codes.namespace
    offsets = ad.asarray(np.arange(context + 1))

    def step(starts: Tensor) -> Tensor:
        rows = ad.expand_dims(starts, axis=1) + offsets
        batch = ad.reshape(ad.take(codes, ad.reshape(rows, (-1,))), rows.shape)
        loss = sequence_loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


@dataclass
class Curves:
    """What training measured: the loss per step, the validation loss per epoch and the
    unigram baseline's."""

    baseline: float
    loss: list[float] = field(default_factory=list)
    validation: list[tuple[int, float]] = field(default_factory=list)  # (step, loss)


def train(ad: Autodiff, model: nn.Module, text: Text, args: argparse.Namespace) -> Curves:
    """AdamW with a cosine schedule: ``args.epochs`` epochs of ``args.steps`` batches of
    windows starting at random places of the training split, each followed by the validation
    loss over the held-out windows."""
    held_out = windows(text.held_out, args.context)
    held_out = held_out[: len(held_out) // EVALUATED * EVALUATED]
    curves = Curves(unigram_loss(text, held_out[:, 1:]))
    print(f"unigram baseline: validation loss {curves.baseline:.4f}", flush=True)
    codes = ad.asarray(text.train)  # uploaded once; each step gathers its windows there
    validation = ad.asarray(held_out)
    opt = optimizer(model, args)
    schedule = optim.CosineAnnealingLR(opt, T_max=args.epochs * args.steps)
    order = np.random.default_rng(args.seed)
    step = training_step(model, opt, codes, args.context)
    run_step = jit(step) if args.jit else step  # as train_mlp.py's
    last_start = len(text.train) - args.context - 1
    with running.progress(args.epochs * args.steps) as advance:
        for epoch in range(args.epochs):
            for _ in range(args.steps):
                starts = order.integers(0, last_start + 1, args.batch_size)
                curves.loss.append(float(run_step(ad.asarray(starts))))
                schedule.step()
                advance(curves.loss[-1])
            curves.validation.append((len(curves.loss), evaluate(model, validation)))
            mean_loss = np.mean(curves.loss[-args.steps :])
            print(
                f"epoch {epoch + 1:3d}/{args.epochs}  loss {mean_loss:.4f}  validation loss "
                f"{curves.validation[-1][1]:.4f}",
                flush=True,
            )
    return curves


def evaluate(model: nn.Module, validation: Tensor) -> float:
    """The mean loss over the held-out windows, ``EVALUATED`` at a time, read once."""
    model.eval()
    with no_grad():
        batches = range(0, int(validation.shape[0]), EVALUATED)  # type: ignore[arg-type]
        total = sum(sequence_loss(model, validation[i : i + EVALUATED]) for i in batches)
        mean = float(total) / len(batches)
    model.train()
    return mean


def sample(
    ad: Autodiff, model: nn.Module, prompt: np.ndarray, args: argparse.Namespace
) -> list[int]:
    """``args.sample`` codes after ``prompt`` (``args.context`` codes), each drawn from the
    softmax of the model's logits for the next one (read to the client, drawn there by a
    generator seeded with ``args.seed``); with --jit the forward pass is recorded once and run
    by id, as the training step is."""

    def next_code(window: Tensor) -> Tensor:
        with no_grad():
            probabilities: Tensor = ad.softmax(model(window)[0, -1], axis=-1)
        return probabilities

    run = jit(next_code) if args.jit else next_code
    rng = np.random.default_rng(args.seed)
    codes = list(prompt)
    model.eval()
    for _ in range(args.sample):
        window = ad.asarray(np.array([codes[-args.context :]]))
        p = np.asarray(run(window).array, dtype=np.float64)
        codes.append(int(rng.choice(len(p), p=p / p.sum())))
    return codes[len(prompt) :]


def plot(curves: Curves, path: Path, where: str) -> None:
    """The training and validation losses against the unigram baseline, as a PNG."""
    plt = running.pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    steps = np.arange(1, len(curves.loss) + 1)
    ax.plot(steps, curves.loss, lw=0.6, alpha=0.4, label="batch")
    ax.plot(steps, running.smooth(curves.loss), label="batch (moving average)")
    ax.plot(*zip(*curves.validation, strict=True), "o-", label="validation")
    ax.axhline(curves.baseline, color="grey", ls="--", label="unigram baseline (validation)")
    ax.set(xlabel="step", ylabel="cross-entropy (nats per character)")
    ax.legend()
    fig.suptitle(f"Character-level transformer on Python's documentation\ntrained {where}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"curves written to {path}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The flags (bench/models.py builds the default model from them)."""
    p = running.parser(
        __doc__.splitlines()[0], epochs=5, batch_size=32, lr=3e-3, plot="train_transformer.png"
    )
    p.add_argument("--steps", type=int, default=200, help="steps per epoch")
    p.add_argument("--context", type=int, default=32, help="characters a window holds")
    p.add_argument("--width", type=int, default=64, help="the embedding's size (d_model)")
    p.add_argument("--heads", type=int, default=4, help="attention heads a layer")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--dropout", type=float, default=0.1, help="dropout in every block")
    p.add_argument("--sample", type=int, default=200, help="characters to sample at the end")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_STEPS} steps and a short sample, judged against the baseline (for tests)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.steps, args.sample = 2, QUICK_STEPS // 2, 40
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if (unusable := running.place_outputs(args, "plot", "save")) is not None:
        return _fail(unusable)
    text = documentation()
    print(
        f"text: {len(text.train)} characters to train on and {len(text.held_out)} held out "
        f"(Python's documentation topics), {len(text.alphabet)} distinct",
        flush=True,
    )
    start = time.perf_counter()

    def work(ad: Autodiff) -> tuple[Curves, float, list[int]]:
        model = transformer(ad, len(text.alphabet), args)
        curves = train(ad, model, text, args)
        seconds = time.perf_counter() - start
        if args.save is not None:
            model.save(args.save)
            print(f"weights written to {args.save} (safetensors)")
        return curves, seconds, sample(ad, model, text.held_out[: args.context], args)

    try:
        (curves, seconds, sampled), where = running.on_device(args, work)
    except running.Unusable as exc:
        return _fail(str(exc))
    steps = len(curves.loss)
    print(f"{steps} steps in {seconds:.1f} s ({steps / seconds:.1f}/s)")
    final = curves.validation[-1][1]
    print(f"validation loss {final:.4f}: {final / curves.baseline:.3f} of the unigram baseline's")
    prompt = text.held_out[: args.context]
    print(f"prompt (the held-out text's first {args.context} characters): {text.decode(prompt)!r}")
    print(f"sample:\n{text.decode(sampled)}")
    try:
        plot(curves, args.plot, where)
    except OSError as exc:
        return _fail(f"{args.plot}: {type(exc).__name__}: {exc}")
    return 0 if final <= (1.0 if args.quick else GOAL) * curves.baseline else 1


def _fail(message: str) -> int:
    print(f"train_transformer.py: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
