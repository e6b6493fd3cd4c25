"""Exact discrete Gaussian and discrete Laplace samplers, exact Bernoulli(exp(−γ)) draws and the
exact exponential mechanism, vectorised over numpy arrays.

Privacy claim
-------------
* ``discrete_gaussian`` (and ``discrete_gaussian_rows``, the same draws for many generators at
  once): adding independent N_Z(0, σ²) noise to every coordinate of a query with L2 sensitivity
  Δ is ρ-zCDP with ρ = Δ²/(2σ²) (Canonne, Kamath, Steinke 2020, "The Discrete Gaussian for
  Differential Privacy", Theorem 14).
* ``discrete_laplace``: adding independent noise with Pr[z] ∝ exp(−|z|/b) to every coordinate of a
  query with L1 sensitivity Δ is (Δ/b)-DP (the geometric mechanism).
* ``exponential_mechanism``: choosing index i with probability ∝ exp(ε·s_i/(2Δ)), for scores whose
  every entry moves by at most Δ between neighbours, is ε-DP (McSherry and Talwar 2007), and, as
  its privacy loss has bounded range ε, ε²/8-zCDP (Cesar and Rogers 2021, Lemma 3.2).
  ``bernoulli_exp_minus`` is its building block and carries no claim of its own.

All claims need the draws to follow these laws *exactly*, and here they do, given uniform random
bits: every accept/reject decision is a comparison of integers, and no floating-point number
decides anything. σ², b, ε, Δ, γ and the scores must therefore be exact rationals (``int`` or
``fractions.Fraction``); a ``float`` is refused, because it is not the number you chose (convert
a float you do mean with ``Fraction(x)``, which is exact).

Trust assumptions
-----------------
* The generator's output is uniform and unpredictable. Use
  :func:`censusdp_spark.privacy.keyed_rng` (ChaCha20); the claims are only as good as its bits.
* Rejection sampling runs a random number of rounds, so the time a call takes depends on the noise
  it drew (and, for the exponential mechanism, on the scores). This module does not hide that:
  never expose per-call timings to an adversary.
* A value that does not fit in int64 raises ``OverflowError`` instead of wrapping. For σ or b
  below 2**40 that has probability below exp(−2**20).

Method
------
The samplers are CKS20 Algorithms 1–3. Every rejection loop runs on the array of draws still
pending (index arrays shrink each round), never on one draw at a time. The rejections of
Algorithms 2 and 3 are merged into one accept test per candidate, and independent tests run in
the cheapest order. Neither changes the output law, because candidates are independent trials.

*Random words.* Every draw is cut from 16-bit words of the generator's raw output
(``rng.bit_generator.random_raw``), read in blocks and each used once: ``rng.integers`` costs
about 8 µs per call, which would dominate the small calls the engine makes for one node and one
query. A uniform integer below a bound b ≤ 2¹⁶ is a word modulo b, with words at or past the
last multiple of b below 2¹⁶ redrawn. Floats appear only in sizing batches from the expected
acceptance rate, never in a decision.

*Many streams at once.* ``discrete_gaussian_rows`` runs the same code on the pending draws of
many generators together (one stream per evaluation block, say), each draw tagged with its row:
a row's draws keep their order, every word a row's draw takes comes from that row's stream, and
each stream is read in the same amounts at the same steps as alone. So row i is, value for value,
``discrete_gaussian(sigma2, size, rngs[i])``, and the privacy claim is that of the one-stream
call; only the numpy overhead is shared.

*Exact Bernoulli(n/d).* This is the event "uniform integer in [0, d) < n", drawn lazily as
U < n/d for a uniform real U. U's first 16-bit digit is one draw from the generator, compared
with ⌊2¹⁶·n/d⌋. Only when the two are equal (probability 2⁻¹⁶) are later digits compared, with
Python integers, for that draw alone. Bernoulli(x/K) in the K loop of Algorithm 1 compares with
⌊⌊2¹⁶·x⌋/K⌋ = ⌊2¹⁶·x/K⌋, so it needs no products either. No int64 can overflow, whatever the
size of n and d.

*Bernoulli(exp(−1))*: Algorithm 1 with γ = 1 reads independent digits U_K ∈ {0, …, K−1} for
K = 2, 3, … (the event "A = 1" is U_K = 0), stops at the first non-zero digit and returns 1 iff K
is odd. U_2…U_7 are the mixed-radix digits of one uniform integer M ∈ [0, 7!), so one 16-bit
draw decides the outcome unless all six digits are zero. The law depends only on how many values
of M lead to each outcome, so we relabel M: the values of the odd stops come first, then those
of the even stops, and the last value (all digits zero, one in 5040) finishes with the ordinary
loop from K = 8.

*Exponential mechanism.* With s* the largest score and γ_i = ε·(s* − s_i)/(2Δ) ≥ 0, propose i
uniformly and accept it with probability exp(−γ_i) (Algorithm 1 on γ_i), until one is accepted:
each round accepts i with probability exp(−γ_i)/n, so the accepted index has law
∝ exp(−γ_i) ∝ exp(ε·s_i/(2Δ)). The best index is accepted with probability 1, so a round accepts
with probability at least 1/n; proposals are drawn in batches of 4n + 16 and the first accepted
one, by position, is kept. The γ_i share one denominator (their lcm), so the draws reuse the
digit machinery of the Gaussian exponent below.

*Big integers.* With σ² = p/q and t = ⌊σ⌋ + 1 the acceptance exponent of Algorithm 3 is
γ(y) = (q·t·y − p)² / (2·p·q·t²) for y = |Y|. For the production budgets p and q reach
10¹¹–10¹² and the denominator 2⁸⁰, past int64. γ depends only on y, so ⌊γ(y)⌋, the first digit of
its fractional part and the exact remainder are computed with Python integers once per value of
y and gathered into numpy arrays: a table over 0…max y, cached per σ², or over the distinct
values of y when that range passes 2¹⁶. All σ² take this one path, so there is no separate int64
path to get wrong; its cost is about a microsecond per table entry, and there are about 20σ
entries. That is negligible against 10⁶ draws for σ ≲ 3000. For larger σ the distinct values are
tabulated on every call, which brings the rate of 10⁶-draw calls down to about 4 M/s at σ = 10⁴
and 2.5 M/s at σ = 10⁵ (from about 9 M/s).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np

_DIGIT_BITS = 16
"""Bits per digit of the uniform U in exact Bernoulli draws (tests shrink it to force ties)."""
_DIGIT_DTYPE = np.uint16

_WORD_BITS = 16
"""Width of the raw words every draw is cut from."""

_RADIX_TOP = 7
"""Bernoulli(exp(−1)) reads the CKS digits U_2…U_7 from one uniform integer below 7! = 5040."""

_DENSE_TABLE_LIMIT = 1 << 16
"""Largest exponent table indexed directly by |Y|; beyond it, tabulate the distinct values."""

_INT64_LIMIT = 1 << 63

_BATCH_DRAWS = 1 << 20
"""The most draws one batch of trials aims at. A trial's working memory is about 100 bytes, so
this bounds a call's beyond its output (8 bytes a draw) whatever its size; calls of up to this
many draws run exactly as without the bound."""


def discrete_gaussian(sigma2: Fraction | int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` independent values of N_Z(0, sigma2) exactly (CKS20 Algorithm 3), as int64."""
    variance = _exact_positive(sigma2, "sigma2")
    _check_size(size)
    t = math.isqrt(variance.numerator // variance.denominator) + 1
    words = _Words(rng, 16 * min(size, _BATCH_DRAWS))
    return _fill(
        size,
        lambda trials: _gaussian_batch(variance, t, trials, words)[0],
        _gaussian_acceptance_rate(variance.numerator, variance.denominator),
    )


def discrete_gaussian_rows(
    sigma2: Fraction | int, size: int, rngs: Sequence[np.random.Generator]
) -> np.ndarray:
    """Row i is exactly ``discrete_gaussian(sigma2, size, rngs[i])``, as an int64 array of shape
    ``(len(rngs), size)``, and each generator ends where that call leaves it.

    The same code draws the rows together: each step runs once on the pending draws of every row,
    each taking its words from its own row's stream. For many small calls (one stream per block)
    that is a few numpy passes in place of a few dozen per call.
    """
    variance = _exact_positive(sigma2, "sigma2")
    _check_size(size)
    t = math.isqrt(variance.numerator // variance.denominator) + 1
    words = _RowWords(rngs, 16 * min(size, _BATCH_DRAWS))
    return _fill_rows(
        len(rngs),
        size,
        lambda rows: _gaussian_batch(variance, t, rows.size, words, rows),
        _gaussian_acceptance_rate(variance.numerator, variance.denominator),
    )


def discrete_laplace(scale: Fraction | int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``size`` independent values with Pr[z] ∝ exp(−|z|/scale) exactly (CKS20 Alg. 2)."""
    exact_scale = _exact_positive(scale, "scale")
    _check_size(size)
    t, s = exact_scale.numerator, exact_scale.denominator
    words = _Words(rng, 8 * min(size, _BATCH_DRAWS))
    return _fill(
        size,
        lambda trials: _signed(_laplace_magnitudes(t, s, trials, words)[0], words)[0],
        _laplace_acceptance_rate(t, s),
    )


def bernoulli_exp_minus(
    gammas: Sequence[Fraction | int] | np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """One independent draw of Bernoulli(exp(−γ_i)) per exact rational γ_i ≥ 0 (CKS20
    Algorithm 1), as a boolean array."""
    exact = [_exact_non_negative(g, "gamma") for g in gammas]
    table = _rational_exponent_table(exact)
    key = np.arange(len(exact))
    fraction = _Fractions(table.lead, key, table.remainders, table.denom)
    return _bernoulli_exp_minus(table.whole, fraction, _Words(rng, 8 * len(exact)))


def exponential_mechanism(
    scores: Sequence[Fraction | int],
    epsilon: Fraction | int,
    sensitivity: Fraction | int,
    rng: np.random.Generator,
) -> int:
    """Index i drawn with probability exp(ε·s_i/(2Δ)) / Σ_j exp(ε·s_j/(2Δ)), exactly.

    ε-DP and ε²/8-zCDP when every score moves by at most ``sensitivity`` between neighbours (see
    the module docstring). Every score, ε and Δ must be an exact rational.
    """
    eps = _exact_positive(epsilon, "epsilon")
    delta = _exact_positive(sensitivity, "sensitivity")
    exact = [_exact_rational(s, "score") for s in scores]
    if not exact:
        raise ValueError("the exponential mechanism needs at least one score")
    best, scale, n = max(exact), eps / (2 * delta), len(exact)
    table = _rational_exponent_table([scale * (best - s) for s in exact])
    words = _Words(rng, 4 * (4 * n + 16))
    while True:
        proposed = words.below(n, 4 * n + 16)
        fraction = _Fractions(table.lead[proposed], proposed, table.remainders, table.denom)
        accepted = _bernoulli_exp_minus(table.whole[proposed], fraction, words).nonzero()[0]
        if accepted.size:
            return int(proposed[accepted[0]])


def discrete_gaussian_pmf(
    sigma2: Fraction | int, support: Iterable[int] | np.ndarray
) -> np.ndarray:
    """Pr[N_Z(0, sigma2) = x] for each integer x in ``support``, in float64."""
    variance = _exact_positive(sigma2, "sigma2")
    x = np.asarray(support)
    if x.size and x.dtype.kind not in "iu":
        raise TypeError(f"support must hold integers, got dtype {x.dtype}")
    log_weight = -np.square(x.astype(np.float64)) * _half_inverse(variance)
    return np.exp(log_weight) / _gaussian_sums(variance)[0]


def discrete_gaussian_variance(sigma2: Fraction | int) -> float:
    """Var[N_Z(0, sigma2)], which is slightly below sigma2, to float64 precision."""
    variance = _exact_positive(sigma2, "sigma2")
    normaliser, second_moment = _gaussian_sums(variance)
    return second_moment / normaliser


# --- validation ------------------------------------------------------------------------------


def _exact_positive(value: object, name: str) -> Fraction:
    """``value`` as a positive Fraction; floats and other inexact types are refused."""
    if isinstance(value, float | np.floating):
        raise TypeError(
            f"{name}={value!r} is a float; pass a fractions.Fraction such as "
            f"Fraction('{value}'), because a float is not an exact rational you chose"
        )
    if isinstance(value, bool) or not isinstance(value, int | np.integer | Fraction):
        raise TypeError(
            f"{name} must be an int or a fractions.Fraction, got {type(value).__name__} {value!r}"
        )
    exact = Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)
    if exact <= 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return exact


def _exact_rational(value: object, name: str) -> Fraction:
    """``value`` as a Fraction of any sign; floats and other inexact types are refused."""
    if isinstance(value, float | np.floating):
        raise TypeError(
            f"{name}={value!r} is a float; pass a fractions.Fraction such as Fraction({value!r}), "
            "which converts it exactly"
        )
    if isinstance(value, bool) or not isinstance(value, int | np.integer | Fraction):
        raise TypeError(
            f"{name} must be an int or a fractions.Fraction, got {type(value).__name__} {value!r}"
        )
    return Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)


def _exact_non_negative(value: object, name: str) -> Fraction:
    exact = _exact_rational(value, name)
    if exact < 0:
        raise ValueError(f"{name} must be non-negative, got {value!r}")
    return exact


def _check_size(size: object) -> None:
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise TypeError(f"size must be an int, got {type(size).__name__} {size!r}")
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")


# --- random words ----------------------------------------------------------------------------


Rows = np.ndarray | None
"""The row owning each pending draw (for :class:`_RowWords`), or ``None`` for one stream."""


def _pick(rows: Rows, index: np.ndarray) -> Rows:
    """The owners of the draws ``index`` selects (nothing to select with one stream)."""
    return None if rows is None else rows[index]


def _runs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For sorted ``rows``: each distinct row, how often it occurs, and each entry's rank
    among the entries of its row."""
    if not rows.size:
        return rows, rows, rows
    first = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    counts = np.diff(np.append(first, rows.size))
    return rows[first], counts, np.arange(rows.size) - np.repeat(first, counts)


class _Words:
    """Uniform 16-bit words cut from the generator's raw 64-bit output, each used once.

    Reading raw output in blocks costs one numpy call per block, where ``rng.integers`` costs
    about 8 µs per call; small calls (one node, one query) would otherwise be dominated by it.
    """

    def __init__(self, rng: np.random.Generator, block: int) -> None:
        self.rng = rng
        self._block = max(block, 256)
        self._buffer = np.empty(0, dtype=np.uint16)
        self._next = 0

    def take(self, size: int, rows: Rows = None) -> np.ndarray:
        """The next ``size`` words (a read-only view); ``rows`` is for :class:`_RowWords`."""
        if self._next + size > self._buffer.size:
            raw = self.rng.bit_generator.random_raw(max(self._block, size) // 4 + 1)
            fresh = np.asarray(raw, dtype=np.uint64).view(np.uint16)
            self._buffer = np.concatenate((self._buffer[self._next :], fresh))
            self._next = 0
        self._next += size
        return self._buffer[self._next - size : self._next]

    def digits(self, size: int, rows: Rows = None) -> np.ndarray:
        """Uniform digits in [0, 2**_DIGIT_BITS): the top bits of fresh words."""
        return self.take(size, rows) >> (_WORD_BITS - _DIGIT_BITS)

    def coins(self, size: int, rows: Rows = None) -> np.ndarray:
        """Fair coins, as booleans."""
        return self.take(size, rows) >= 1 << (_WORD_BITS - 1)

    def below(self, bound: int, size: int, rows: Rows = None) -> np.ndarray:
        """Uniform integers in [0, bound), exactly: words past the last multiple of ``bound``
        below 2**16 are redrawn. Bounds past 2**16 use ``rng.integers``, which is also exact."""
        if bound > 1 << _WORD_BITS:
            return self.integers(bound, size, rows)
        limit = (1 << _WORD_BITS) // bound * bound
        word = self.take(size, rows)
        redraw = (word >= limit).nonzero()[0]
        if redraw.size:
            word = word.copy()
        while redraw.size:
            word[redraw] = self.take(redraw.size, _pick(rows, redraw))
            redraw = redraw[word[redraw] >= limit]
        return word % bound if bound < 1 << _WORD_BITS else word

    def integers(self, bound: int, size: int, rows: Rows = None) -> np.ndarray:
        return self.rng.integers(0, bound, size=size, dtype=_uniform_dtype(bound))


class _RowWords(_Words):
    """The words of many generators, one stream per row, for draws made for all rows at once.

    A pending draw of row ``r`` gets the next word of ``r``'s stream. ``rows`` lists the owner of
    each pending draw, sorted, with a row's draws in the order ``_Words`` would hand them their
    words; every index array the samplers derive from it (``nonzero``, boolean masks) keeps both
    orders. Each stream is read in the same calls of the same sizes as ``_Words`` reads its one
    stream, so every row gets exactly the words, and its generator ends in exactly the state, of
    the one-stream call.
    """

    def __init__(self, rngs: Sequence[np.random.Generator], block: int) -> None:
        self.rngs = rngs
        self._block = max(block, 256)
        # Words by position in each stream; room for two reads (most rows need no more).
        self._words = np.empty((len(rngs), 8 * (self._block // 4 + 1)), dtype=np.uint16)
        self._read = np.zeros(len(rngs), dtype=np.int64)  # words read from each stream
        self._used = np.zeros(len(rngs), dtype=np.int64)  # words handed out from each stream

    def take(self, size: int, rows: Rows = None) -> np.ndarray:
        """For each pending draw, the next word of its row's stream."""
        if rows is None or rows.size != size:
            raise ValueError("every draw for many streams needs the row that owns it")
        owners, counts, rank = _runs(rows)
        start = self._used[owners]
        short = (start + counts > self._read[owners]).nonzero()[0]
        if short.size:
            self._refill(owners[short], counts[short])
        self._used[owners] = start + counts
        return self._words[rows, np.repeat(start, counts) + rank]

    def integers(self, bound: int, size: int, rows: Rows = None) -> np.ndarray:
        if rows is None or rows.size != size:
            raise ValueError("every draw for many streams needs the row that owns it")
        owners, counts, _ = _runs(rows)
        dtype = _uniform_dtype(bound)
        parts = [
            self.rngs[r].integers(0, bound, size=c, dtype=dtype)
            for r, c in zip(owners.tolist(), counts.tolist(), strict=True)
        ]
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    def _refill(self, rows: np.ndarray, sizes: np.ndarray) -> None:
        """Read each of ``rows``' streams as ``_Words.take`` reads its stream for ``sizes``."""
        raw = np.maximum(self._block, sizes) // 4 + 1
        begin = self._read[rows]
        end = begin + 4 * raw
        width = self._words.shape[1]
        if int(end.max()) > width:
            wider = np.empty((len(self.rngs), max(int(end.max()), 2 * width)), dtype=np.uint16)
            wider[:, :width] = self._words
            self._words = wider
        fresh = [
            self.rngs[r].bit_generator.random_raw(k)
            for r, k in zip(rows.tolist(), raw.tolist(), strict=True)
        ]
        if (raw == raw[0]).all():  # one read size (almost always): one scatter for all rows
            columns = begin[:, None] + np.arange(4 * int(raw[0]))
            self._words[rows[:, None], columns] = np.stack(fresh).view(np.uint16)
        else:
            for r, b, e, words in zip(rows, begin, end, fresh, strict=True):
                self._words[r, b:e] = np.asarray(words, dtype=np.uint64).view(np.uint16)
        self._read[rows] = end


def _uniform_dtype(bound: int) -> type[np.integer]:
    return np.uint32 if bound <= 1 << 32 else np.int64


# --- batching --------------------------------------------------------------------------------


def _fill(size: int, draw_batch: Callable[[int], np.ndarray], rate: float) -> np.ndarray:
    """Concatenate accepted draws from batches of independent trials until there are ``size``.

    Keeping the first accepted draws of a batch selects by position, not value, so the kept draws
    are still independent with the target law. ``rate``, the expected fraction of trials
    accepted, only sizes the batches (four standard deviations of margin, so one batch almost
    always suffices); it decides nothing about any draw. A batch aims at ``_BATCH_DRAWS`` draws
    at most.
    """
    out = np.empty(size, dtype=np.int64)
    filled = 0
    while filled < size:
        wanted = min(size - filled, _BATCH_DRAWS)
        batch = draw_batch(math.ceil((wanted + 4 * math.sqrt(wanted) + 4) / rate))
        take = min(batch.size, wanted)
        out[filled : filled + take] = batch[:take]
        filled += take
    return out


def _fill_rows(
    n: int,
    size: int,
    draw_batch: Callable[[np.ndarray], tuple[np.ndarray, Rows]],
    rate: float,
) -> np.ndarray:
    """``_fill`` for ``n`` rows at once: each row's batches have the sizes ``_fill`` would give
    them, and each keeps its first accepted draws. ``draw_batch`` takes the row of each trial
    (sorted) and returns the accepted draws with their rows."""
    out = np.empty((n, size), dtype=np.int64)
    filled = np.zeros(n, dtype=np.int64)
    pending = np.arange(n) if size else np.arange(0)
    while pending.size:
        wanted = np.minimum(size - filled[pending], _BATCH_DRAWS)
        distinct, which = np.unique(wanted, return_inverse=True)
        trials = np.array(
            [math.ceil((w + 4 * math.sqrt(w) + 4) / rate) for w in distinct.tolist()]
        )[which]
        draws, rows = draw_batch(np.repeat(pending, trials))
        assert rows is not None
        owners, accepted, rank = _runs(rows)
        room = np.minimum(size - filled, _BATCH_DRAWS)
        keep = (rank < room[rows]).nonzero()[0]
        out[rows[keep], filled[rows[keep]] + rank[keep]] = draws[keep]
        filled[owners] += np.minimum(accepted, room[owners])
        pending = pending[filled[pending] < size]
    return out


@lru_cache(maxsize=256)
def _gaussian_acceptance_rate(p: int, q: int) -> float:
    """Pr[a trial of Algorithm 3 is accepted] = (1 − e⁻¹)/(2t) · exp(−σ²/2t²) · Σ_y exp(−y²/2σ²).

    Cached by σ² = p/q as two ints, which hash much faster than a Fraction.
    """
    t = math.isqrt(p // q) + 1
    sigma2 = Fraction(p, q)
    return (
        -math.expm1(-1)
        / (2 * t)
        * math.exp(-float(sigma2) / (2 * t * t))
        * _gaussian_sums(sigma2)[0]
    )


def _laplace_acceptance_rate(t: int, s: int) -> float:
    """Pr[a trial of Algorithm 2 is accepted] = Pr[U passes] · (1 − Pr[Y = 0]/2)."""
    u_passes = -math.expm1(-1) / (t * -math.expm1(-1 / t))
    return u_passes * (1 + math.exp(-s / t)) / 2


def _signed(magnitude: np.ndarray, words: _Words, rows: Rows = None) -> tuple[np.ndarray, Rows]:
    """Attach a fair sign to each magnitude, dropping "−0" (CKS20 Algorithm 2, step 5); and the
    rows of the draws kept."""
    negative = words.coins(magnitude.size, rows)
    keep = (~(negative & (magnitude == 0))).nonzero()[0]
    magnitude = magnitude[keep]
    return np.where(negative[keep], -magnitude, magnitude), _pick(rows, keep)


# --- CKS20 Algorithms 2 and 3 ----------------------------------------------------------------


def _laplace_magnitudes(
    t: int, s: int, trials: int, words: _Words, rows: Rows = None
) -> tuple[np.ndarray, Rows]:
    """⌊(U + t·V)/s⌋ for the trials whose U passes Bernoulli(exp(−U/t)) (Alg. 2, steps 1–4);
    and their rows."""
    u = words.below(t, trials, rows)
    if t > 1:
        passed = _bernoulli_exp_minus_fraction(_uniform_fractions(u, t), words, rows).nonzero()[0]
        u, rows = u[passed], _pick(rows, passed)
    v = _geometric_exp_minus_one(u.size, words, rows)
    u = u.astype(np.int64)
    if t * (int(v.max(initial=0)) + 1) < _INT64_LIMIT:
        x = u + t * v
        return (x if s == 1 else x // s), rows
    # Only for t near 2**63 or a geometric count beyond all plausibility; astype raises on overflow.
    exact = (u.astype(object) + t * v.astype(object)) // s
    return np.asarray(exact.astype(np.int64)), rows


def _gaussian_batch(
    sigma2: Fraction, t: int, trials: int, words: _Words, rows: Rows = None
) -> tuple[np.ndarray, Rows]:
    """Accepted draws of N_Z(0, sigma2) from ``trials`` candidates (Alg. 3, rejections merged),
    and their rows.

    The sign is drawn last: it is independent of the acceptance test, which depends on |Y| only.
    """
    magnitude, rows = _laplace_magnitudes(t, 1, trials, words, rows)
    whole, fraction = _gaussian_exponents(sigma2, t, magnitude)
    accepted = _bernoulli_exp_minus(whole, fraction, words, rows).nonzero()[0]
    return _signed(magnitude[accepted], words, _pick(rows, accepted))


# --- exact Bernoulli draws ------------------------------------------------------------------


@dataclass(frozen=True)
class _Fractions:
    """One rational f_i = numerators[key_i] / denom in [0, 1) per pending draw.

    ``lead`` is ⌊2**_DIGIT_BITS · f_i⌋, the digit that settles almost every Bernoulli draw; the
    exact numerator is looked up only when a draw ties on it.
    """

    lead: np.ndarray
    key: np.ndarray
    numerators: Sequence[int] | np.ndarray
    denom: int

    def take(self, index: np.ndarray) -> _Fractions:
        return _Fractions(self.lead[index], self.key[index], self.numerators, self.denom)

    def numerator(self, i: int) -> int:
        return int(self.numerators[int(self.key[i])])


def _uniform_fractions(u: np.ndarray, t: int) -> _Fractions:
    """The rationals u_i / t for integers 0 ≤ u_i < t."""
    if t <= 1 << (63 - _DIGIT_BITS):
        lead = (u.astype(np.int64) << _DIGIT_BITS) // t
    else:
        lead = (u.astype(object) << _DIGIT_BITS) // t
    return _Fractions(lead.astype(_DIGIT_DTYPE), u, range(t), t)


def _bernoulli_fraction_over(
    fraction: _Fractions, live: np.ndarray, lead: np.ndarray, k: int, words: _Words, rows: Rows
) -> np.ndarray:
    """Bernoulli(f_i / k) for the live elements i: U < f_i/k, decided on U's first digit.

    ``lead`` is ⌊2**_DIGIT_BITS · f_i⌋ for the live elements; since ⌊⌊x⌋/k⌋ = ⌊x/k⌋, its quotient
    by k is the first digit of f_i/k. Ties are settled exactly with Python integers.
    """
    if k >= 1 << _DIGIT_BITS:
        lead = np.zeros_like(lead)
    elif k > 1:
        lead = lead // k
    digit = words.digits(lead.size, rows)
    success = digit < lead
    for i in (digit == lead).nonzero()[0]:
        numerator = fraction.numerator(int(live[i]))
        owner = None if rows is None else rows[i : i + 1]
        success[i] = _below_after_tie(numerator, fraction.denom * k, words, owner)
    return success


def _below_after_tie(numerator: int, denom: int, words: _Words, row: Rows = None) -> bool:
    """Whether U < numerator/denom < 1, given that U's first digit equalled the fraction's."""
    rest = (numerator << _DIGIT_BITS) % denom
    while True:
        target, rest = divmod(rest << _DIGIT_BITS, denom)
        digit = int(words.digits(1, row)[0])
        if digit != target:
            return digit < target


def _bernoulli_exp_minus_fraction(
    fraction: _Fractions, words: _Words, rows: Rows = None
) -> np.ndarray:
    """Bernoulli(exp(−f_i)) for f_i ∈ [0, 1): the K loop of CKS20 Algorithm 1.

    Draw A ~ Bernoulli(f/K) for K = 1, 2, … until A = 0; succeed iff that K is odd. Each round
    writes its parity to every element still live, so an element keeps that of its last round.
    """
    out = np.ones(fraction.lead.size, dtype=bool)
    live = np.arange(fraction.lead.size)
    lead = fraction.lead
    k = 1
    while live.size:
        out[live] = k % 2 == 1
        keep = _bernoulli_fraction_over(
            fraction, live, lead, k, words, _pick(rows, live)
        ).nonzero()[0]
        live, lead = live[keep], lead[keep]
        k += 1
    return out


def _bernoulli_exp_minus(
    whole: np.ndarray, fraction: _Fractions, words: _Words, rows: Rows = None
) -> np.ndarray:
    """Bernoulli(exp(−(w_i + f_i))): w_i draws of Bernoulli(exp(−1)), then exp(−f_i) (Alg. 1)."""
    success = _all_bernoulli_exp_minus_one(whole, words, rows)
    passed = success.nonzero()[0]
    success[passed] = _bernoulli_exp_minus_fraction(
        fraction.take(passed), words, _pick(rows, passed)
    )
    return success


def _all_bernoulli_exp_minus_one(count: np.ndarray, words: _Words, rows: Rows = None) -> np.ndarray:
    """Whether ``count_i`` independent Bernoulli(exp(−1)) draws all succeed, for each i."""
    success = np.ones(count.size, dtype=bool)
    live = (count > 0).nonzero()[0]
    remaining = count[live]
    while live.size:
        passed = _bernoulli_exp_minus_one(live.size, words, _pick(rows, live))
        success[live[(~passed).nonzero()[0]]] = False
        keep = (passed & (remaining > 1)).nonzero()[0]
        live, remaining = live[keep], remaining[keep] - 1
    return success


def _geometric_exp_minus_one(size: int, words: _Words, rows: Rows = None) -> np.ndarray:
    """Successes of Bernoulli(exp(−1)) before the first failure: Pr[V ≥ v] = exp(−v)."""
    count = np.zeros(size, dtype=np.int64)
    live = _bernoulli_exp_minus_one(size, words, rows).nonzero()[0]
    while live.size:
        count[live] += 1
        live = live[_bernoulli_exp_minus_one(live.size, words, _pick(rows, live)).nonzero()[0]]
    return count


@lru_cache(maxsize=4)
def _radix_split(top: int) -> tuple[int, int]:
    """(top!, number of M ∈ [0, top!) whose first non-zero digit among U_2…U_top has odd K)."""
    span = math.factorial(top)
    odd_stops = sum(
        span // math.factorial(k - 1) - span // math.factorial(k) for k in range(3, top + 1, 2)
    )
    return span, odd_stops


def _bernoulli_exp_minus_one(
    size: int, words: _Words, rows: Rows = None, top: int = _RADIX_TOP
) -> np.ndarray:
    """Bernoulli(exp(−1)), mostly from one draw of M ∈ [0, top!) (see the module docstring)."""
    span, odd_stops = _radix_split(top)
    m = words.below(span, size, rows)
    success = m < odd_stops
    undecided = (m == span - 1).nonzero()[0]
    if undecided.size:
        success[undecided] = _unit_loop_from(top + 1, undecided.size, words, _pick(rows, undecided))
    return success


def _unit_loop_from(k: int, size: int, words: _Words, rows: Rows = None) -> np.ndarray:
    """Finish Algorithm 1 with γ = 1 from K = k: stop at the first U_K ≠ 0; 1 iff K is odd."""
    out = np.empty(size, dtype=bool)
    live = np.arange(size)
    while live.size:
        out[live] = k % 2 == 1
        live = live[(words.below(k, live.size, _pick(rows, live)) == 0).nonzero()[0]]
        k += 1
    return out


# --- the Gaussian acceptance exponent --------------------------------------------------------


@dataclass(frozen=True)
class _ExponentTable:
    """γ(y) = (q·t·y − p)² / (2·p·q·t²) = whole + remainders/denom for each tabulated y."""

    whole: np.ndarray
    lead: np.ndarray
    remainders: np.ndarray
    denom: int


def _gaussian_exponents(
    sigma2: Fraction, t: int, magnitude: np.ndarray
) -> tuple[np.ndarray, _Fractions]:
    """⌊γ(|Y|)⌋ and the fractional part of γ(|Y|) for each candidate magnitude."""
    p, q = sigma2.numerator, sigma2.denominator
    size = 1 << int(magnitude.max(initial=0)).bit_length()
    if size <= _DENSE_TABLE_LIMIT:
        table = _dense_exponent_table(p, q, t, size, _DIGIT_BITS)
        key = magnitude
    else:
        values, key = np.unique(magnitude, return_inverse=True)
        table = _exponent_table(p, q, t, values, _DIGIT_BITS)
    fraction = _Fractions(table.lead[key], key, table.remainders, table.denom)
    return table.whole[key], fraction


@lru_cache(maxsize=64)
def _dense_exponent_table(p: int, q: int, t: int, size: int, digit_bits: int) -> _ExponentTable:
    """The exponent table of σ² = p/q for y = 0 … size−1."""
    return _exponent_table(p, q, t, np.arange(size), digit_bits)


def _exponent_table(p: int, q: int, t: int, ys: np.ndarray, digit_bits: int) -> _ExponentTable:
    """γ(y) for σ² = p/q and each y in ``ys``, on Python integers (numpy object arrays)."""
    denom = 2 * p * q * t * t
    numerator = np.square(ys.astype(object) * (q * t) - p)
    whole = numerator // denom
    remainders = numerator - whole * denom
    lead = (remainders << digit_bits) // denom
    return _ExponentTable(whole.astype(np.int64), lead.astype(_DIGIT_DTYPE), remainders, denom)


def _rational_exponent_table(gammas: Sequence[Fraction]) -> _ExponentTable:
    """⌊γ_i⌋ and the fractional part of each γ_i ≥ 0, over the lcm of their denominators.

    A γ_i of 2**63 or more raises ``OverflowError`` (exp(−γ_i) is then below exp(−9·10¹⁸)).
    """
    denom = math.lcm(*(g.denominator for g in gammas)) if gammas else 1
    numerator = np.array([g.numerator * (denom // g.denominator) for g in gammas], dtype=object)
    whole = numerator // denom
    remainders = numerator - whole * denom
    lead = (remainders << _DIGIT_BITS) // denom
    return _ExponentTable(whole.astype(np.int64), lead.astype(_DIGIT_DTYPE), remainders, denom)


# --- the exact law, for tests and evaluation -------------------------------------------------


def _half_inverse(sigma2: Fraction) -> float:
    return float(1 / (2 * sigma2))


def _gaussian_sums(sigma2: Fraction) -> tuple[float, float]:
    """(Σ_x exp(−x²/2σ²), Σ_x x²·exp(−x²/2σ²)) over all integers x.

    For σ² < 1 the series is summed directly up to |x| = 40σ + 2 (later terms are below e⁻⁸⁰⁰).
    For σ² ≥ 1 Poisson summation turns it into a series in exp(−2π²σ²k²), whose k ≥ 4 terms
    are below e⁻³¹⁵: Σ_x exp(−x²/2σ²) = σ√(2π)·Σ_k exp(−2π²σ²k²) and
    Σ_x x²·exp(−x²/2σ²) = σ√(2π)·Σ_k (σ² − 4π²σ⁴k²)·exp(−2π²σ²k²), both over all integers k.
    """
    s2 = float(sigma2)
    if s2 < 1:
        x = np.arange(1, math.ceil(40 * math.sqrt(s2)) + 3, dtype=np.float64)
        weight = np.exp(-np.square(x) * _half_inverse(sigma2))
        return 1 + 2 * float(np.sum(weight)), 2 * float(np.sum(np.square(x) * weight))
    k = np.arange(1, 4, dtype=np.float64)
    decay = np.exp(-2 * math.pi**2 * s2 * np.square(k))
    root = math.sqrt(2 * math.pi * s2)
    normaliser = root * (1 + 2 * float(np.sum(decay)))
    second = root * (s2 + 2 * float(np.sum((s2 - 4 * math.pi**2 * s2**2 * np.square(k)) * decay)))
    return normaliser, second
