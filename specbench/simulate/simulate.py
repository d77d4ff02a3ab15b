"""Offline acceptance simulator: what a model-free drafter would do, without running the model.

Under greedy verification every step's accepted tokens are fixed by the draft and the model's own greedy output,
so a recorded plain run (prompt and output ids) is enough to replay speculative decoding with any model-free
drafter, draft length and policy. ``simulate`` runs the engine's decode loop with the recorded output
(``RecordedOutput``) in place of the model and returns the ``StepLog`` the real run would write (timings 0).
Past a recorded stop token the model's predictions are unknown: drafts count as accepted up to the stop.

Token trees against paths (``compare_trees``): acceptance under greedy verification is fixed by the greedy
output, so the simulator measures what a tree buys per verification exactly, with no model run: accepted tokens
per verification, and tokens per verification against the node budget.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbench.common.files import write_parquet_atomic
from specbench.core.draft import Drafter
from specbench.core.engine import Generation, plain_generation
from specbench.core.log import StepLog
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.target import Step
from specbench.core.tree import depths
from specbench.core.verify import accept_tree_greedy
from specbench.cost import Profile, profile_for
from specbench.decoding import break_even_function
from specbench.inputs.stored import read_parquet
from specbench.inputs.trace_prompts import TracePrompts, trace_prompts

FINISH_REASONS = ("stop", "length", "context")


@dataclass
class Recorded:
    """One request's plain greedy run: prompt ids, emitted ids (a stop token included), and why it ended."""

    prompt: list[int]
    output: list[int]
    finish_reason: str
    id: str = ""

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"recorded request {self.id!r} has an empty prompt")
        if not self.output:
            raise ValueError(f"recorded request {self.id!r} has no output tokens")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(
                f"recorded request {self.id!r}: finish_reason must be one of {FINISH_REASONS}, "
                f"got {self.finish_reason!r}"
            )


def record(model: Any, prompts: Iterable[Any], options: GenerateOptions, tokenizer: Any = None) -> list[Recorded]:
    """Run plain greedy decoding on each prompt and keep what the simulator needs."""
    if options.temperature != 0:
        raise ValueError("the simulator replays greedy decoding: record with temperature=0")
    out = []
    for i, prompt in enumerate(prompts):
        gen = plain_generation(model, prompt, options, tokenizer=tokenizer)
        list(gen)  # run to the end
        out.append(Recorded(list(gen.prompt), list(gen.tokens), str(gen.finish_reason()), str(i)))
    return out


def recorded_turns(prompts: TracePrompts, tokenizer: Any) -> Iterator[Recorded]:
    """``trace_prompts``' turns as recorded requests, as if a model had written the replies (no model run): each
    output the reply's text (``reply_text``) and an EOS; made one at a time, so memory stays linear."""
    reason = "stop" if getattr(tokenizer, "eos_token_ids", None) else "length"
    for turn, prompt, output in prompts:
        yield Recorded(prompt, output, reason, f"{prompts.trace_id}/{turn}")


def save_recorded(requests: Sequence[Recorded], path: str | os.PathLike) -> Path:
    """Write recorded requests as parquet (columns id, prompt, output, finish_reason), atomically."""
    import polars as pl

    ids = pl.List(pl.Int64)
    schema: dict[str, Any] = {"id": pl.Utf8, "prompt": ids, "output": ids, "finish_reason": pl.Utf8}
    return write_parquet_atomic(pl.DataFrame([vars(r) for r in requests], schema=schema), path)


def load_recorded(path: str | os.PathLike) -> list[Recorded]:
    """Recorded requests from ``save_recorded``'s parquet (or any table with its columns)."""
    import polars as pl

    frame = read_parquet(path, "record the outputs again (or delete it)")
    if missing := {"prompt", "output", "finish_reason"} - set(frame.columns):
        raise ValueError(
            f"{path}: recorded outputs need columns prompt, output, finish_reason; missing {sorted(missing)}"
        )
    for column in ("prompt", "output"):
        dtype = frame.schema[column]
        if not (isinstance(dtype, pl.List) and (dtype.inner.is_integer() or dtype.inner == pl.Null)):
            raise ValueError(f"{path}: column {column!r} must hold lists of token ids, not {dtype}")
    ids = frame["id"].to_list() if "id" in frame.columns else [str(i) for i in range(len(frame))]
    columns = (frame[c].to_list() for c in ("prompt", "output", "finish_reason"))
    return [Recorded(list(p), list(o), f, str(i)) for i, p, o, f in zip(ids, *columns)]


class RecordedOutput:
    """A recorded plain greedy output as the decode loop's target (``specbench.core.target``): the
    model's next token at every position is known, so a verification keeps the longest prefix of
    the draft equal to it."""

    vocab = None
    cached_tokens = 0

    def __init__(self, request: Recorded, options: GenerateOptions, context_limit: int | None):
        self.output = request.output
        self.context_limit = context_limit
        self.stop_index = len(self.output) - 1 if request.finish_reason == "stop" else None
        known = len(self.output) if request.finish_reason != "stop" else None
        if (
            known is not None
            and options.max_tokens > known
            and (context_limit is None or len(request.prompt) + known < context_limit)
        ):
            raise ValueError(
                f"recorded request {request.id!r} ended by {request.finish_reason!r} after {known} tokens; "
                f"simulate with max_tokens <= {known} (got {options.max_tokens})"
            )

    def running(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def prefill(self, prompt: list[int], cached: int) -> tuple[Step, None]:
        return Step([self.output[0]]), None

    def queue(self, position: int) -> int:
        return position

    def take(self, queued: int) -> Step:
        return Step([self.output[queued]])

    def verify(
        self,
        draft_tokens: list[int],
        draft_probs: Any,
        position: int,
        parents: list[int] | None = None,
        queue_rejected: bool = False,
    ) -> Step:
        """As a model's: with ``queue_rejected``, a full rejection hands the next step back queued."""
        if parents is not None:  # a token tree: a row's target is the output at its depth
            out = self.output
            targets = [out[position + d] if position + d < len(out) else -1 for d in [0, *depths(parents)]]
            path, emitted = accept_tree_greedy(draft_tokens, parents, targets)
            return Step(emitted if emitted[-1] >= 0 else emitted[:-1], accepted=len(path), path=path)
        targets = self.output[position : position + len(draft_tokens) + 1]
        n = 0
        while n < len(draft_tokens) and n < len(targets) and draft_tokens[n] == targets[n]:
            n += 1
        queued = (
            position + 1 if queue_rejected and draft_tokens and n == 0 and position + 1 < len(self.output) else None
        )
        return Step(list(draft_tokens[:n]) + targets[n : n + 1], accepted=n, queued=queued)


def simulate(
    requests: Sequence[Recorded],
    drafter: Drafter,
    policy: DraftPolicy | str | None = None,
    options: GenerateOptions | None = None,
    cost: Any = None,
    context_limit: int | None = None,
) -> StepLog:
    """Replay speculative decoding with ``drafter`` over recorded plain greedy outputs, in order, with one drafter
    (SuffixDecoding's store carries over); one log with a ``request`` column. ``policy``: a policy or its text
    (default ``auto``, which plans with ``cost``: a ``cost.Profile`` or the model); ``options``: the real run's
    (default: each output's length); ``context_limit``: the model's context length, where it binds.
    """
    if drafter is None:
        raise ValueError("simulate needs a drafter (plain decoding needs no simulation)")
    if getattr(drafter, "needs_hidden", False):
        raise ValueError(
            f"drafter {getattr(drafter, 'name', drafter)!r} needs the model's hidden states: it cannot be simulated"
        )
    policy = DraftPolicy.auto() if policy is None else DraftPolicy.parse(policy) if isinstance(policy, str) else policy
    if cost is None and policy.needs_break_even:
        raise ValueError(
            "DraftPolicy.auto() needs the model's verify cost: pass cost= (a specbench.cost.Profile or the model) "
            "or use DraftPolicy.auto(break_even=...) / fixed:K / adaptive:K"
        )
    log = StepLog()
    for index, request in enumerate(requests):
        opts = options if options is not None else GenerateOptions(max_tokens=len(request.output))
        opts.check()
        if opts.temperature != 0:
            raise ValueError("the simulator replays greedy verification: use temperature=0")
        break_even = None
        if policy.needs_break_even:
            profile = cost if isinstance(cost, Profile) else profile_for(cost, opts.verify_mode)
            break_even = break_even_function(profile, drafter, opts.verify_mode)
        target = RecordedOutput(request, opts, context_limit)
        generation = Generation(
            target, request.prompt, opts, drafter=drafter, policy=policy, break_even=break_even, clock=lambda: 0.0
        )
        list(generation)  # run to the end
        for record in generation.log:
            log.append(record.labelled(request=index))
    return log


#: Where a drafter's store lives when replaying a log: one drafter for all its traces, or a fresh one per trace.
STORES = ("shared", "per-trace")
#: A trace's id and a function giving its recorded requests afresh.
Group = tuple[str, Callable[[], Iterable[Recorded]]]


#: The step log's totals a replay's summary row carries after its accepted tokens per verification.
_REPLAY_STATS = ("tokens_per_verify", "acceptance_rate", "mean_accepted_tokens")
#: The drafters a replay runs unless told otherwise (``model_free_drafters()`` lists every one it can run).
DEFAULT_DRAFTERS = ("lookup", "suffix")


def model_free_drafters() -> tuple[str, ...]:
    """The drafters the simulator can replay: the registered ones that need no model."""
    from specbench.drafters import drafter_kinds

    return tuple(kind.name for kind in drafter_kinds() if kind.model_free)


def model_free_drafter(name: str, k: int) -> Drafter:
    """A fresh model-free drafter by name, able to draft ``k`` tokens."""
    from specbench.drafters import make_drafter, split_drafter_name

    kind, _ = split_drafter_name(name)
    drafter = make_drafter(name, max_draft=k) if kind is not None and kind.model_free else None
    if drafter is None:
        raise ValueError(
            f"drafter {name!r} needs the model: the simulator replays model-free drafters "
            f"({', '.join(model_free_drafters())})"
        )
    return drafter


def check_settings(drafters: Sequence[str], ks: Sequence[int], stores: Sequence[str], limit: int | None) -> None:
    """A ValueError for a drafter, k, store scope or limit the simulator cannot use (before any work)."""
    if not drafters:
        raise ValueError(f"give at least one drafter ({', '.join(model_free_drafters())})")
    for name in drafters:
        model_free_drafter(name, 1)
    if not ks or any(not isinstance(k, int) or isinstance(k, bool) or k < 1 for k in ks):
        raise ValueError(f"k: draft lengths are integers >= 1, got {list(ks)}")
    if not stores or any(s not in STORES for s in stores):
        raise ValueError(f"store: the scopes are {', '.join(STORES)}, got {list(stores)}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit: at least 1 trace, got {limit}")


def group_by_trace(requests: Iterable[Recorded]) -> list[tuple[str, list[Recorded]]]:
    """Recorded requests grouped by trace: the id before its last "/" (``trace/turn``), in order."""
    groups: dict[str, list[Recorded]] = {}
    for request in requests:
        groups.setdefault(request.id.rsplit("/", 1)[0] if "/" in request.id else request.id, []).append(request)
    return list(groups.items())


def replay_logs(
    groups: Sequence[Group],
    drafters: Sequence[str] = DEFAULT_DRAFTERS,
    ks: Sequence[int] = (4, 8, 16),
    stores: Sequence[str] = STORES,
):
    """Every (store, drafter, k) over recorded requests grouped by trace (``groups``: trace id and a function
    giving its requests afresh), at a fixed draft length k: one drafter for every trace in turn (store "shared")
    or a fresh one per trace ("per-trace"). Returns (summary, steps): one row per (drafter, store, k), and every
    step with drafter, store, k, trace and turn columns.
    """
    import polars as pl

    check_settings(drafters, ks, stores, None)
    steps = StepLog()
    rows = []
    for store in stores:
        for name in drafters:
            for k in ks:
                policy = DraftPolicy.fixed(k)
                shared = model_free_drafter(name, k) if store == "shared" else None
                log = StepLog()
                for trace_id, requests in groups:
                    drafter = shared if shared is not None else model_free_drafter(name, k)
                    for record in simulate(requests(), drafter, policy).records:
                        labels = {"store": store, "k": k, "trace": trace_id, "turn": record.labels["request"]}
                        log.append(replace(record, drafter=name, labels=labels))
                stats = log.stats()
                prefills = [r for r in log.records if r.kind == "prefill"]
                row = {"drafter": name, "store": store, "k": k, "traces": len(groups), "turns": len(prefills)}
                row |= {"prompt_tokens": sum(r.verify_width for r in prefills)}
                row |= {key: stats[key] for key in ("tokens", "verifies", "drafted", "accepted")}
                row |= {"accepted_per_verify": stats["accepted"] / stats["verifies"] if stats["verifies"] else 0.0}
                rows.append(row | {key: stats[key] for key in _REPLAY_STATS})
                steps.records.extend(log.records)
    return pl.DataFrame(rows), steps


def trace_groups(traces: Sequence[Any], tokenizer: Any) -> tuple[list[Group], int]:
    """``replay_logs``' groups from traces' recorded replies tokenized with ``tokenizer`` (prompts
    rendered once, each trace's prompts sharing their ids), and how many turns were left out for
    lack of a recorded reply."""
    groups, skipped = [], 0
    for trace in traces:
        prompts = trace_prompts(tokenizer, trace)
        skipped += prompts.skipped
        if prompts.turns:
            groups.append((trace.id, lambda prompts=prompts: recorded_turns(prompts, tokenizer)))
    return groups, skipped


# -- token trees against paths: the same drafter drafting paths or trees ----------------------------------------

#: Drafters compared as path and as tree (the tree is the drafter's ``tree=True``; "suffix-reference"
#: is SuffixDecoding with the reference's tree from one match, ``tree="reference"``).
TREE_DRAFTERS = ("suffix", "lookup")
ALL_TREE_DRAFTERS = ("suffix", "suffix-reference", "lookup")


def tree_drafter(name: str, tree: bool, budget: int) -> Drafter:
    """A fresh model-free drafter ``name`` (of ``ALL_TREE_DRAFTERS``) drafting paths or trees of ``budget`` nodes."""
    from specbench.drafters import PromptLookup, SuffixDecoding

    if name == "suffix":
        return SuffixDecoding(max_spec_tokens=budget, tree=tree)
    if name == "suffix-reference":
        return SuffixDecoding(max_spec_tokens=budget, tree="reference" if tree else False)
    if name == "lookup":
        return PromptLookup(preferred_k=budget, tree=tree)
    raise ValueError(f"tree comparison drafters are {', '.join(ALL_TREE_DRAFTERS)}; got {name!r}")


def record_groups(
    model: Any, tokenizer: Any, groups: Sequence[tuple[str, Callable[[], Iterable[Recorded]]]], max_tokens: int
) -> list[Recorded]:
    """The model's greedy outputs (at most ``max_tokens`` each) for every turn's prompt of ``groups``
    (``simulate.trace_groups``), ids ``trace/turn`` kept."""
    requests = [request for _, turns in groups for request in turns()]
    recorded = record(model, [r.prompt for r in requests], GenerateOptions(max_tokens=max_tokens), tokenizer)
    return [replace(r, id=request.id) for r, request in zip(recorded, requests)]


def compare_trees(
    requests: Sequence[Recorded],
    drafters: Sequence[str] = TREE_DRAFTERS,
    budgets: Sequence[int] = (8, 16),
):
    """Every (trace, drafter, budget) as path and as tree, over recorded greedy outputs grouped by trace
    (one drafter per drafter, mode and budget across the traces in order: SuffixDecoding's store is
    shared). One row each: verifications, accepted tokens, accepted tokens and tokens per
    verification, mean nodes verified, and the share of verifications that drafted a tree."""
    import polars as pl

    if not budgets or any(not isinstance(b, int) or b < 1 for b in budgets):
        raise ValueError(f"node budgets must be integers >= 1, got {list(budgets)}")
    groups = group_by_trace(requests)
    rows = []
    for name in drafters:
        for budget in budgets:
            for tree in (False, True):
                drafter = tree_drafter(name, tree, budget)
                for trace, turns in groups:
                    log = simulate(turns, drafter, DraftPolicy.fixed(budget))
                    stats = log.stats()
                    n = max(stats["verifies"], 1)
                    rows.append(
                        {
                            "trace": trace,
                            "drafter": name,
                            "mode": "tree" if tree else "path",
                            "budget": budget,
                            **{key: stats[key] for key in ("tokens", "verifies", "accepted")},
                            "accepted_per_verify": stats["accepted"] / n,
                            "tokens_per_verify": stats["tokens_per_verify"],
                            "nodes_per_verify": stats["drafted"] / n,
                            "tree_share": sum(r.tree_nodes > 0 for r in log.records if r.kind == "verify") / n,
                        }
                    )
    return pl.DataFrame(rows)


def tree_gain(table) -> Any:
    """``compare_trees``' rows side by side: path and tree accepted tokens per verification and their ratio."""
    import polars as pl

    keys = ["trace", "drafter", "budget"]
    path = table.filter(pl.col("mode") == "path").select(*keys, path=pl.col("accepted_per_verify"))
    tree = table.filter(pl.col("mode") == "tree").select(
        *keys, tree=pl.col("accepted_per_verify"), tree_nodes=pl.col("nodes_per_verify")
    )
    joined = path.join(tree, on=keys)
    return joined.with_columns(ratio=pl.col("tree") / pl.col("path")).sort(keys)
