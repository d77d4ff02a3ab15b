"""SuffixDecoding against a brute-force transcription of the reference's counts and speculation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from specbench.drafters import Draft, SuffixDecoding
from specbench.drafters.suffix_index import SuffixIndex


class NaiveTree:
    """Occurrence counts of every substring (length <= depth), as the reference's suffix tree keeps."""

    def __init__(self, sequences: list[list[int]], depth: int):
        self.depth = depth
        self.count: Counter = Counter()
        self.last: dict[tuple, int] = {}
        self.children: dict[tuple, set] = {}
        self.position = 0
        self.seq: list[int] = []
        for seq in sequences:
            self.seq = []
            for t in seq:
                self.append(t)

    def append(self, token: int) -> None:
        """Add a token to the current sequence: every substring ending at it gains an occurrence."""
        seq = self.seq
        seq.append(token)
        i = len(seq) - 1
        for length in range(1, min(self.depth, i + 1) + 1):
            s = tuple(seq[i - length + 1 : i + 1])
            self.count[s] += 1
            self.last[s] = self.position
            self.children.setdefault(s[:-1], set()).add(s)
        self.position += 1

    def speculate(self, pattern, max_spec, factor, offset, min_prob):
        pattern = list(pattern)[-self.depth :]
        best = (0.0, [], 0)
        for m in range(1, len(pattern)):
            s = tuple(pattern[-m:])
            if not self.count.get(s):
                break
            budget = max(0, min(max_spec, int(m * factor + offset + 1e-6)))
            tokens, prob, score, node = [], 1.0, 0.0, s
            while len(tokens) < budget and len(node) < self.depth:
                kids = self.children.get(node)
                if not kids:
                    break
                child = max(kids, key=lambda x: (self.count[x], self.last[x]))
                prob *= self.count[child] / self.count[node]
                if prob < min_prob:
                    break
                tokens.append(child[-1])
                score += prob
                node = child
            if score >= best[0]:
                best = (score, tokens, m)
        return best


def naive_draft(context, stored, depth, max_spec, factor=1.0, offset=0.0, min_prob=0.1, local=None, store=None):
    """The reference's draft: local tree over the context, global tree over ``stored`` (trees may be
    passed in, built incrementally by the caller)."""
    local = local or NaiveTree([list(context)], depth)
    score, tokens, _ = local.speculate(context, max_spec, factor, offset, min_prob)
    if stored:
        store = store or NaiveTree(stored, depth)
        g_score, g_tokens, _ = store.speculate(context, max_spec, factor, offset, min_prob)
        if g_score > score:
            return g_tokens
    return tokens


def markov(rng: random.Random, n: int, vocab: int, copy_prob: float = 0.05) -> list[int]:
    """Token stream with repeats: mostly a biased random walk, sometimes copying an earlier span."""
    out: list[int] = []
    while len(out) < n:
        if out and rng.random() < copy_prob:
            start = rng.randrange(len(out))
            out.extend(out[start : start + rng.randint(3, 30)])
        else:
            out.append(min(int(rng.expovariate(0.7)), vocab - 1))
    return out[:n]


def test_index_counts_match_brute_force():
    rng = random.Random(0)
    depth = 6
    seqs = [markov(rng, rng.randint(1, 60), 4) for _ in range(8)]
    index = SuffixIndex(depth)
    for seq in seqs:
        index.start_sequence()
        index.extend(seq)
    naive = NaiveTree(seqs, depth)
    for s, c in naive.count.items():
        state, matched = index.match(s)
        assert matched == len(s), s
        assert index.count[state] == c, (s, index.count[state], c)
    # A string that never occurs does not match in full.
    state, matched = index.match([99])
    assert matched == 0


@pytest.mark.parametrize("seed", range(6))
def test_local_drafts_match_reference(seed):
    rng = random.Random(seed)
    depth = rng.choice([4, 8, 64])
    max_spec = rng.choice([1, 4, 16])
    factor = rng.choice([0.5, 1.0, 2.0])
    offset = rng.choice([0.0, 1.0])
    drafter = SuffixDecoding(
        max_depth=depth, max_spec_tokens=max_spec, max_spec_factor=factor, max_spec_offset=offset, use_global=False
    )
    seq = markov(rng, 300, rng.choice([3, 6, 50]), copy_prob=0.1)
    drafter.begin(seq[:20])
    local = NaiveTree([seq[:20]], depth)
    for n in range(20, len(seq)):
        k = rng.randint(1, 20)
        got = drafter.draft(seq[:n], k)
        want = naive_draft(seq[:n], [], depth, min(k, max_spec), factor, offset, local=local)
        assert got.tokens == want, (n, got.tokens, want)
        drafter.observe([seq[n]])
        local.append(seq[n])
    drafter.end()


@pytest.mark.parametrize("seed", range(4))
def test_global_drafts_with_eviction_match_reference(seed):
    rng = random.Random(100 + seed)
    depth = rng.choice([5, 12, 64])
    drafter = SuffixDecoding(max_depth=depth, max_spec_tokens=8, max_sequences=4, max_tokens=400)
    drafter.rebuild_min_tokens = 50  # exercise rebuilds
    base = markov(rng, 200, 5)
    live: list[list[int]] = []
    for request in range(14):
        # Requests share material with the base text, so the global index is useful.
        start = rng.randrange(150)
        prompt = base[start : start + rng.randint(2, 30)] + markov(rng, rng.randint(1, 10), 5)
        response = base[rng.randrange(150) :][: rng.randint(5, 60)] + markov(rng, 5, 5)
        drafter.begin(prompt)
        context = list(prompt)
        local, store = NaiveTree([prompt], depth), NaiveTree(live, depth)
        for t in response:
            k = rng.randint(1, 10)
            got = drafter.draft(context, k)
            want = naive_draft(context, live, depth, min(k, 8), local=local, store=store)
            assert got.tokens == want, (request, len(context))
            drafter.observe([t])
            context.append(t)
            local.append(t)
        drafter.end()
        live.append(response)
        while len(live) > 4 or sum(map(len, live)) > 400:
            live.pop(0)
        assert drafter.stored_sequences == len(live)
        assert drafter.stored_tokens == sum(map(len, live))


def test_eviction_decrements_counts():
    drafter = SuffixDecoding(max_depth=16, max_sequences=2, remember_at_end=None)
    a, b, c = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [11, 12, 13]
    for seq in (a, b):
        drafter.remember(seq)
    drafter.begin([0, 1, 2])
    assert drafter.draft([0, 1, 2], 8).tokens == [3, 4]  # global, budget = match length 2
    drafter.end()
    drafter.remember(c)  # evicts a
    index = drafter.global_index
    assert index.match([1, 2]) == (0, 0)  # a's substrings no longer occur
    state, matched = index.match([8, 9])
    assert matched == 2 and index.count[state] == 1  # b's still do
    drafter.begin([0, 1, 2])
    assert drafter.draft([0, 1, 2], 8).tokens == []
    assert drafter.stored_tokens == len(b) + len(c)


def test_requests_share_the_store_and_long_matches_draft_long():
    drafter = SuffixDecoding()
    answer = list(range(100, 160))
    drafter.begin([1, 2, 3])
    drafter.observe(answer)
    drafter.end()  # remembers the response
    drafter.begin([5, 6, 7] + answer[:20])
    draft = drafter.draft([5, 6, 7] + answer[:20], 16)
    assert isinstance(draft, Draft)
    assert draft.tokens == answer[20:36]
    assert drafter.last_draft["source"] == "global"
    # The local index: a repeat inside the request (the end occurrence halves its probability).
    drafter.begin([9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3])
    assert drafter.draft([9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3], 16).tokens == [4, 5, 6, 7]


def test_next_turn_prompt_extends_the_local_index():
    drafter = SuffixDecoding(use_global=False)
    turn1 = [1, 2, 3, 4, 5]
    drafter.begin(turn1)
    drafter.observe([6, 7])
    drafter.end()
    index = drafter.local_index
    turn2 = turn1 + [6, 7, 8, 1, 2, 3]
    drafter.begin(turn2)
    assert drafter.local_index is index  # extended, not rebuilt
    assert drafter.draft(turn2, 8).tokens == naive_draft(turn2, [], 64, 8)
    drafter.begin([4, 4, 4])
    assert drafter.local_index is not index


def test_context_out_of_step_resyncs():
    drafter = SuffixDecoding(use_global=False)
    drafter.begin([1, 2, 3, 1, 2])
    # The caller skipped observe(): the drafter follows the context it is given.
    context = [1, 2, 3, 1, 2, 3, 1]
    assert drafter.draft(context, 4).tokens == naive_draft(context, [], 64, 4)
    other = [5, 6, 5, 6, 5]
    assert drafter.draft(other, 4).tokens == naive_draft(other, [], 64, 4)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_spec_tokens"):
        SuffixDecoding(max_spec_tokens=0)
    with pytest.raises(ValueError, match="remember_at_end"):
        SuffixDecoding(remember_at_end="all")
    with pytest.raises(ValueError, match="token id"):
        SuffixDecoding().remember([1 << 21])


def test_suffix_k_names_a_drafter_whose_drafts_stop_at_k_tokens():
    from specbench.drafters import is_drafter_name, make_drafter

    drafter = make_drafter("suffix:8")
    assert drafter.name == "suffix:8" and drafter.preferred_k == 8
    answer = list(range(100, 160))
    drafter.begin([1, 2, 3])
    drafter.observe(answer)
    drafter.end()
    drafter.begin([5, 6, 7] + answer[:20])
    assert drafter.draft([5, 6, 7] + answer[:20], 16).tokens == answer[20:28]  # 16 asked, 8 drafted
    assert make_drafter("suffix").preferred_k == 16
    assert is_drafter_name("suffix:8") and not is_drafter_name("suffix:0") and not is_drafter_name("suffix:x")
    with pytest.raises(ValueError, match="suffix:K"):
        make_drafter("suffix:0")
