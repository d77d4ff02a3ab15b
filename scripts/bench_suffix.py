"""SuffixDecoding's CPU cost: draft() and update times with a large global store, memory per token.

    python3 -m scripts.bench_suffix [--store-tokens 1000000] [--requests 20] [--quick]

The token streams are synthetic but shaped like agent traffic: a Zipfian vocabulary with
per-token favoured successors (text-like branching), and spans copied from earlier in the request
or from stored sequences (re-read files, repeated tool calls). Prints medians and 90th
percentiles; timings on a shared machine are noisy, so compare within one run.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from array import array

import numpy as np

from specbench.drafters import PromptLookup, SuffixDecoding
from specbench.drafters.suffix_index import SuffixIndex


def index_bytes(index: SuffixIndex) -> int:
    """Approximate memory of the index in bytes (arrays, dict table, dict keys and values)."""
    size = sum(c.itemsize * len(c) for c in vars(index).values() if isinstance(c, array))  # the store's too
    size += sys.getsizeof(index.next) + 32 * len(index.next)  # table + one int key each
    return size + (sys.getsizeof(index.store) if isinstance(index.store, list) else 0)


class AgentLikeStream:
    """Synthetic token sequences with text-like statistics and agent-like repetition."""

    def __init__(self, vocab: int = 32_000, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.vocab = vocab
        weights = 1.0 / np.arange(1, vocab + 1) ** 1.1
        self.unigram = np.cumsum(weights / weights.sum())
        self.favoured = self.rng.integers(0, vocab, size=(vocab, 6))
        self.library: list[list[int]] = []

    def sequence(self, n: int, copy_rate: float = 0.01, sources: list[list[int]] | None = None) -> list[int]:
        rng = self.rng
        out: list[int] = [int(np.searchsorted(self.unigram, rng.random()))]
        draws = rng.random(4 * n + 16)
        picks = np.searchsorted(self.unigram, rng.random(4 * n + 16))
        fav = rng.integers(0, 6, size=4 * n + 16)
        i = 0
        while len(out) < n:
            if draws[i] < copy_rate:
                pool = sources if sources and draws[i] < copy_rate / 2 else [out]
                src = pool[int(rng.integers(len(pool)))]
                start = int(rng.integers(len(src)))
                out.extend(src[start : start + int(rng.integers(10, 200))])
            elif draws[i] < 0.6:
                out.append(int(self.favoured[out[-1], fav[i]]))
            else:
                out.append(int(picks[i]))
            i += 1
            if i >= len(draws):
                draws = rng.random(4 * n + 16)
                picks = np.searchsorted(self.unigram, rng.random(4 * n + 16))
                i = 0
        return out[:n]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def percentiles(values: list[float]) -> tuple[float, float]:
    values = sorted(values)
    return statistics.median(values), values[int(0.9 * (len(values) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store-tokens", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--response-tokens", type=int, default=400)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a small store, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.store_tokens, args.requests, args.prompt_tokens, args.response_tokens = 50_000, 3, 500, 100

    stream = AgentLikeStream()
    sequences: list[list[int]] = []
    total = 0
    while total < args.store_tokens:
        seq = stream.sequence(int(stream.rng.integers(300, 3000)), sources=sequences[-50:])
        seq = seq[: args.store_tokens - total]
        sequences.append(seq)
        total += len(seq)

    drafter = SuffixDecoding(max_tokens=args.store_tokens, max_sequences=None)
    gc.collect()
    rss0 = rss_bytes()
    per_token_update, per_token_cpu = [], []
    t_all = time.perf_counter()
    for seq in sequences:
        t0, c0 = time.perf_counter(), time.process_time()
        drafter.remember(seq)
        per_token_update.append((time.perf_counter() - t0) / len(seq) * 1e6)
        per_token_cpu.append((time.process_time() - c0) / len(seq) * 1e6)
    build_s = time.perf_counter() - t_all
    gc.collect()
    rss1 = rss_bytes()
    index = drafter.global_index
    print(
        f"global store: {drafter.stored_tokens:,} tokens in {len(sequences):,} sequences, "
        f"{len(index.length):,} states, {len(index.next):,} transitions; built in {build_s:.1f} s"
    )
    print(
        f"memory: {(rss1 - rss0) / drafter.stored_tokens:.0f} B/token (RSS growth), "
        f"{index_bytes(index) / drafter.stored_tokens:.0f} B/token (estimate of the index's own objects)"
    )

    suffix_draft, suffix_obs, lookup_draft = [], [], []
    accepted_like = []
    lookup = PromptLookup()
    for _ in range(args.requests):
        sources = sequences[-200:]
        prompt = stream.sequence(args.prompt_tokens, copy_rate=0.02, sources=sources)
        response = stream.sequence(args.response_tokens, copy_rate=0.03, sources=sources + [prompt])
        drafter.begin(prompt)
        lookup.begin(prompt)
        context = list(prompt)
        for t in response:
            t0 = time.perf_counter()
            draft = drafter.draft(context, args.k)
            t1 = time.perf_counter()
            drafter.observe([t])
            t2 = time.perf_counter()
            lookup.draft(context, args.k)
            t3 = time.perf_counter()
            lookup.observe([t])
            suffix_draft.append((t1 - t0) * 1e6)
            suffix_obs.append((t2 - t1) * 1e6)
            lookup_draft.append((t3 - t2) * 1e6)
            accepted_like.append(len(draft.tokens))
            context.append(t)
        t0, c0 = time.perf_counter(), time.process_time()
        drafter.end()
        per_token_update.append((time.perf_counter() - t0) / len(response) * 1e6)
        per_token_cpu.append((time.process_time() - c0) / len(response) * 1e6)

    # Worst case: a long run of one token (a model stuck repeating itself). Every suffix length is its
    # own state, so an update walks max_depth states and a draft evaluates many match lengths.
    worst = SuffixDecoding(use_global=False)
    worst.begin([7] * 2000)
    worst_draft, worst_obs = [], []
    for _ in range(200 if not args.quick else 20):
        t0 = time.perf_counter()
        worst.draft(worst._context, args.k)
        t1 = time.perf_counter()
        worst.observe([7])
        worst_draft.append((t1 - t0) * 1e6)
        worst_obs.append((time.perf_counter() - t1) * 1e6)

    rows = [
        ("suffix draft()", *percentiles(suffix_draft)),
        ("suffix observe() per token (local index)", *percentiles(suffix_obs)),
        ("suffix remember() per token (global index)", *percentiles(per_token_update)),
        ("  the same, process CPU time", *percentiles(per_token_cpu)),
        ("lookup draft() (for scale)", *percentiles(lookup_draft)),
        ("worst case: draft() in a 2000-token repeat", *percentiles(worst_draft)),
        ("worst case: observe() in a 2000-token repeat", *percentiles(worst_obs)),
    ]
    print(f"\n{'operation':45s} {'median us':>10s} {'p90 us':>10s}")
    for name, med, p90 in rows:
        print(f"{name:45s} {med:10.1f} {p90:10.1f}")
    print(
        f"\n{len(suffix_draft):,} drafts over {args.requests} requests "
        f"(prompt {args.prompt_tokens}, response {args.response_tokens} tokens, k={args.k}); "
        f"mean draft length {statistics.mean(accepted_like):.2f}"
    )
    print(
        "targets: draft() median <= 30 us, update <= 10 us per token (wall-clock times; on a busy machine "
        "the CPU-time row shows the work itself)"
    )


if __name__ == "__main__":
    main()
