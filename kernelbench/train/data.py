"""A synthetic token stream with a known loss floor: a sparse first-order Markov chain.

Every token has ``successors`` possible next tokens (distinct, drawn uniformly) with
probabilities drawn from a flat Dirichlet (normalised Exp(1) draws). Sequences start from the
chain's stationary distribution ``pi``, so every position has the same marginal and the best
possible next-token cross-entropy is the chain's entropy rate

    H = sum_i pi_i * H(P_i)            (nats; the loss floor a perfect model reaches)

A language model learns it by learning the sparse bigram table: easy enough to show progress in
a few hundred steps, hard enough (vocab x successors transitions) that optimizers differ.

The whole stream (``n_sequences`` of ``seq + 1`` tokens) is sampled once on the device from
``seed``; a *data order* seed only permutes which sequences form which batch, so runs with
different order seeds see the same tokens in another order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChainStats:
    vocab: int
    successors: int
    entropy_rate: float  # nats per token: the loss floor
    unigram_entropy: float  # nats: the loss of a model that ignores the context

    def describe(self) -> str:
        return (f"order-1 Markov chain over {self.vocab} tokens, {self.successors} successors each: "
                f"loss floor (entropy rate) {self.entropy_rate:.4f} nats, unigram entropy "
                f"{self.unigram_entropy:.4f}, uniform guess {math.log(self.vocab):.4f}")


class MarkovStream:
    """Batches of (B, seq + 1) token sequences from one sparse Markov chain, on ``device``."""

    def __init__(self, vocab: int, *, n_sequences: int, seq: int, seed: int = 0, successors: int = 8,
                 device: str | torch.device = "cpu") -> None:
        if successors < 1 or successors > vocab:
            raise ValueError(f"successors must be in [1, vocab={vocab}], got {successors}")
        if n_sequences < 1 or seq < 1:
            raise ValueError(f"n_sequences and seq must be at least 1, got {n_sequences} and {seq}")
        self.vocab, self.seq, self.device = vocab, seq, torch.device(device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        # Distinct successors per token: multinomial without replacement over a uniform row.
        self.successors = torch.multinomial(torch.ones(vocab, vocab, device=self.device), successors,
                                            generator=gen)
        # Exp(1) draws from the seeded generator (torch's Gamma sampler takes no generator).
        dirichlet = -torch.log1p(-torch.rand(vocab, successors, generator=gen, device=self.device,
                                             dtype=torch.float64))
        self.probs = dirichlet / dirichlet.sum(dim=1, keepdim=True)
        self.pi = self._stationary()
        self.stats = self._stats()
        self.tokens = self._sample(n_sequences, gen)

    def _stationary(self, tol: float = 1e-13, max_iter: int = 10000) -> torch.Tensor:
        """pi = pi P by the lazy power iteration (converges whether or not the chain is periodic),
        on the CPU: vocab x successors terms, and no atomics to make the sums order-dependent."""
        succ, probs = self.successors.flatten().cpu(), self.probs.cpu()
        pi = torch.full((self.vocab,), 1.0 / self.vocab, dtype=torch.float64)
        for _ in range(max_iter):
            moved = torch.zeros_like(pi).index_add_(0, succ, (pi[:, None] * probs).flatten())
            new = 0.5 * (pi + moved)
            if (new - pi).abs().sum() < tol:
                return new.to(self.device)
            pi = new
        return pi.to(self.device)

    def _stats(self) -> ChainStats:
        row_entropy = -(self.probs * self.probs.log()).sum(dim=1)
        rate = float((self.pi * row_entropy).sum())
        pi = self.pi[self.pi > 0]
        unigram = float(-(pi * pi.log()).sum())
        return ChainStats(self.vocab, self.successors.shape[1], rate, unigram)

    def _sample(self, n: int, gen: torch.Generator) -> torch.Tensor:
        tokens = torch.empty(n, self.seq + 1, dtype=torch.long, device=self.device)
        tokens[:, 0] = torch.multinomial(self.pi.float(), n, replacement=True, generator=gen)
        cdf = self.probs.cumsum(dim=1).float()
        last = self.successors.shape[1] - 1
        for t in range(self.seq):
            cur = tokens[:, t]
            u = torch.rand(n, 1, generator=gen, device=self.device)
            pick = torch.searchsorted(cdf[cur], u).clamp_(max=last)
            tokens[:, t + 1] = self.successors[cur].gather(1, pick).squeeze(1)
        return tokens

    @property
    def n_sequences(self) -> int:
        return self.tokens.shape[0]

    def order(self, order_seed: int, batch: int) -> torch.Tensor:
        """(steps, batch) sequence indices: the identity for order seed 0, a permutation else."""
        steps = self.n_sequences // batch
        if order_seed == 0:
            perm = torch.arange(self.n_sequences, device=self.device)
        else:
            gen = torch.Generator(device=self.device).manual_seed(1_000_003 * order_seed + 17)
            perm = torch.randperm(self.n_sequences, generator=gen, device=self.device)
        return perm[: steps * batch].view(steps, batch)

    def empirical_loss_floor(self, sample: int = 4096) -> float:
        """Cross-entropy of the true chain on the first ``sample`` sequences (checks the floor)."""
        toks = self.tokens[:sample]
        cur, nxt = toks[:, :-1].reshape(-1), toks[:, 1:].reshape(-1)
        match = self.successors[cur] == nxt[:, None]
        p = (self.probs[cur] * match).sum(dim=1)
        return float(-p.log().mean())


@dataclass(frozen=True)
class SlowChainStats:
    vocab: int
    lag: int
    entropy_rate: float  # nats per predicted token: the loss floor
    unigram_entropy: float  # nats: the loss of a model that ignores the context (uniform tokens)

    def describe(self) -> str:
        return (f"slow chain over {self.vocab} tokens, each token after the first {self.lag} the image of the "
                f"token {self.lag} back under a fixed permutation: loss floor {self.entropy_rate:.4f} nats, "
                f"unigram entropy {self.unigram_entropy:.4f}")


class SlowChainStream(MarkovStream):
    """A long-range task a model learns slowly: the first ``lag`` tokens of a sequence are uniform,
    and every later token is ``perm[token lag positions back]`` for one fixed permutation ``perm``.

    Predicting it needs attention to learn to look ``lag`` back and the MLP to learn the
    permutation, so the loss stays near log(vocab) for the first hundred-odd steps and then drops:
    a run whose early trajectory tells optimizers apart. Floor: only the ``lag - 1`` uniform
    targets cost anything, ``(lag - 1) / seq * log(vocab)`` nats per predicted token.
    Same batches and data orders as MarkovStream (only the sampling differs).
    """

    def __init__(self, vocab: int, *, n_sequences: int, seq: int, seed: int = 0, lag: int | None = None,
                 device: str | torch.device = "cpu") -> None:
        if n_sequences < 1 or seq < 2:
            raise ValueError(f"n_sequences must be at least 1 and seq at least 2, got {n_sequences} and {seq}")
        lag = seq // 2 if lag is None else lag
        if not 1 <= lag <= seq:
            raise ValueError(f"lag must be in [1, seq={seq}], got {lag}")
        self.vocab, self.seq, self.lag, self.device = vocab, seq, lag, torch.device(device)
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.perm = torch.randperm(vocab, generator=gen, device=self.device)
        tokens = torch.empty(n_sequences, seq + 1, dtype=torch.long, device=self.device)
        tokens[:, :lag] = torch.randint(vocab, (n_sequences, lag), generator=gen, device=self.device)
        for t in range(lag, seq + 1):
            tokens[:, t] = self.perm[tokens[:, t - lag]]
        self.tokens = tokens
        floor = (lag - 1) / seq * math.log(vocab)
        self.stats = SlowChainStats(vocab, lag, floor, math.log(vocab))

    def empirical_loss_floor(self, sample: int = 4096) -> float:
        """The floor: the sampled targets are uniform before ``lag`` and determined after it."""
        return self.stats.entropy_rate


DATA_SETS = {"markov": "a sparse first-order Markov chain (MarkovStream): learnt in a few dozen steps",
             "slow-chain": "a long-range permuted copy (SlowChainStream): the reference needs hundreds of steps"}


def make_stream(data: str, vocab: int, *, n_sequences: int, seq: int, seed: int, successors: int,
                device: str | torch.device) -> MarkovStream:
    """The token stream of a ``train`` data set (DATA_SETS) on ``device``."""
    if data == "markov":
        return MarkovStream(vocab, n_sequences=n_sequences, seq=seq, seed=seed, successors=successors, device=device)
    if data == "slow-chain":
        return SlowChainStream(vocab, n_sequences=n_sequences, seq=seq, seed=seed, device=device)
    raise ValueError(f"unknown data set {data!r}; accepted: {', '.join(DATA_SETS)}")
