"""Engine speed: specbench's plain decoding against mlx-lm's, and what the step log costs.

    python3 -m scripts.bench_engine [--model smollm2-135m] [--tokens 64] [--rounds 3] [--quick] [--json PATH]

Prints two ratios, measured in one run on one model and prompt (greedy, the same tokens):

(a) speed: specbench ``generate`` tokens/s over mlx-lm ``stream_generate`` tokens/s. Rounds
    alternate which runs first; per round the ratio of decode throughput (tokens after the
    first / seconds after the first token, so the identical prefill does not dilute it) and
    of end-to-end throughput; the median over rounds is the result, min-max its spread.

(b) logging overhead: the seconds the engine spends keeping its step log, over the seconds of
    the generation. Each ``StepRecord`` construction and ``StepLog.append`` call is timed by a
    wrapper (the wrapper's own two clock reads are counted too), and
    the log's per-step timestamps are added at the measured cost of a clock read (the record's
    argument expressions, a few attribute reads, are not timed). This direct measurement
    resolves far below 1%, which an A/B of whole runs on a shared machine cannot
    (run-to-run noise is several percent). The A/B is printed as a cross-check: the same loop
    with record keeping disabled (records neither built nor stored), interleaved with the normal
    engine; its spread shows the noise floor. Measured for plain ``generate`` and for
    ``speculative_generate`` with prompt lookup (fixed:4; verify records are the largest).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import mlx.core as mx

import specbench.core.engine as engine
from scripts.result_lines import AACheck
from specbench.bench.paired import MIN_UNITS
from specbench.bench.prompt_runs import run_mlx_lm, run_specbench
from specbench.common.files import write_json_atomic
from specbench.common.identity import device_name, versions
from specbench.core.log import StepLog
from specbench.core.policies import DraftPolicy
from specbench.drafters import PromptLookup
from specbench.inputs.prompts import render_prompt
from specbench.models.load import load

PROMPT = "Write a short story about a child who finds an old map in the attic."


def decode_rate(run) -> float:
    seconds = run.wall_s - run.first_token_s
    return (len(run.tokens) - 1) / seconds if seconds > 0 else 0.0


def e2e_rate(run) -> float:
    return len(run.tokens) / run.wall_s


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def speed_ratio(model, tokenizer, prompt: list[int], tokens: int, rounds: int) -> dict:
    """(a): specbench generate vs mlx-lm stream_generate, interleaved rounds."""
    decode, e2e, equal = [], [], True
    rates = {"mlx-lm": [], "specbench": []}
    for r in range(rounds):
        order = ["mlx-lm", "specbench"] if r % 2 == 0 else ["specbench", "mlx-lm"]
        runs = {}
        for name in order:
            if name == "mlx-lm":
                runs[name] = run_mlx_lm(model, tokenizer, prompt, tokens)
            else:
                runs[name] = run_specbench(model, tokenizer, prompt, tokens)
        equal &= runs["mlx-lm"].tokens == runs["specbench"].tokens
        decode.append(decode_rate(runs["specbench"]) / decode_rate(runs["mlx-lm"]))
        e2e.append(e2e_rate(runs["specbench"]) / e2e_rate(runs["mlx-lm"]))
        for name in rates:
            rates[name].append(decode_rate(runs[name]))
    return {
        "decode_ratio": spread(decode),
        "e2e_ratio": spread(e2e),
        "equal_outputs": equal,
        "decode_tokens_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "tokens": len(runs["mlx-lm"].tokens),
    }


def aa_check(model, tokenizer, prompt: list[int], tokens: int, rounds: int) -> AACheck:
    """The A/A arm of (a): mlx-lm's ``stream_generate`` timed against itself in interleaved rounds, the order of
    its two runs alternating as (a)'s does, so its decode-throughput ratio shows the machine's own noise
    (``result_lines.AACheck``); at least ``MIN_UNITS`` rounds, so that it has an interval."""
    ratios = []
    for r in range(max(rounds, MIN_UNITS)):
        first, second = run_mlx_lm(model, tokenizer, prompt, tokens), run_mlx_lm(model, tokenizer, prompt, tokens)
        a, b = (first, second) if r % 2 == 0 else (second, first)
        ratios.append(decode_rate(b) / decode_rate(a))
    return AACheck.of_ratios(ratios)


class RecordTimer:
    """Times every StepRecord construction and StepLog.append the engine makes (or disables them)."""

    def __init__(self, disable: bool = False):
        self.disable = disable
        self.seconds = 0.0
        self.records = 0

    def __enter__(self):
        self._record, self._append = engine.StepRecord, StepLog.append
        real_record, real_append, timer = self._record, self._append, self

        def timed_record(*args, **kwargs):
            t0 = time.perf_counter()
            record = None if timer.disable else real_record(*args, **kwargs)
            timer.seconds += time.perf_counter() - t0
            return record

        def timed_append(log, record):
            t0 = time.perf_counter()
            if not timer.disable:
                real_append(log, record)
            timer.seconds += time.perf_counter() - t0
            timer.records += 1

        engine.StepRecord, StepLog.append = timed_record, timed_append
        return self

    def __exit__(self, *exc):
        engine.StepRecord, StepLog.append = self._record, self._append


def clock_read_s(n: int = 200_000) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        time.perf_counter()
    return (time.perf_counter() - t0) / n


def logging_overhead(model, tokenizer, prompt: list[int], tokens: int, rounds: int, speculative: bool) -> dict:
    """(b): record-keeping seconds / generation seconds, and the A/B cross-check."""

    def once(disable: bool):
        drafter = PromptLookup() if speculative else None
        policy = DraftPolicy.fixed(4) if speculative else None
        with RecordTimer(disable) as timer:
            run = run_specbench(model, tokenizer, prompt, tokens, drafter, policy)
        return run, timer

    clock = clock_read_s()
    fractions, ab = [], []
    for r in range(rounds):
        order = [False, True] if r % 2 == 0 else [True, False]
        results = {disable: once(disable) for disable in order}
        run, timer = results[False]
        # timestamps the log needs beyond the timing the engine does anyway: one per plain step
        stamps = timer.records * clock
        fractions.append((timer.seconds + stamps) / run.wall_s)
        off = results[True][0]
        ab.append(decode_rate(run) / decode_rate(off))
    return {
        "overhead_fraction": spread(fractions),
        "records": timer.records,
        "per_record_us": 1e6 * (timer.seconds / max(1, timer.records) + clock),
        "step_ms": 1e3 * run.wall_s / max(1, timer.records),
        "ab_ratio_logged_over_unlogged": spread(ab),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="16 tokens, 2 rounds")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.rounds = 16, 2
    model, tokenizer = load(args.model)
    prompt = render_prompt(tokenizer, PROMPT)
    # warm-up: both loops once
    run_mlx_lm(model, tokenizer, prompt, 8)
    run_specbench(model, tokenizer, prompt, 8)
    run_specbench(model, tokenizer, prompt, 8, PromptLookup(), DraftPolicy.fixed(4))
    result = {
        "model": args.model,
        "device": device_name(),
        **versions(),
        "prompt_tokens": len(prompt),
        "max_tokens": args.tokens,
        "rounds": args.rounds,
        "speed": speed_ratio(model, tokenizer, prompt, args.tokens, args.rounds),
        "logging_plain": logging_overhead(model, tokenizer, prompt, args.tokens, args.rounds, speculative=False),
        "logging_lookup": logging_overhead(model, tokenizer, prompt, args.tokens, args.rounds, speculative=True),
    }
    s = result["speed"]
    print(
        f"engine speed: {args.model} on {result['device']}, {s['tokens']} tokens, {args.rounds} rounds "
        f"(mlx {result['mlx']}, mlx-lm {result['mlx_lm']})"
    )
    print(
        f"(a) specbench generate / mlx-lm stream_generate, decode tokens/s: {s['decode_ratio']['median']:.3f} "
        f"(min {s['decode_ratio']['min']:.3f}, max {s['decode_ratio']['max']:.3f}); end to end "
        f"{s['e2e_ratio']['median']:.3f} ({s['e2e_ratio']['min']:.3f}-{s['e2e_ratio']['max']:.3f}); "
        f"mlx-lm {s['decode_tokens_per_s']['mlx-lm']:.1f} tok/s, "
        f"specbench {s['decode_tokens_per_s']['specbench']:.1f} tok/s; "
        f"outputs equal: {s['equal_outputs']}"
    )
    for key, label in (("logging_plain", "plain generate"), ("logging_lookup", "lookup fixed:4")):
        o = result[key]
        f = o["overhead_fraction"]
        print(
            f"(b) logging overhead, {label}: {100 * f['median']:.3f}% of generation time "
            f"(min {100 * f['min']:.3f}%, max {100 * f['max']:.3f}%); {o['per_record_us']:.1f} us per record, "
            f"{o['step_ms']:.2f} ms per step, {o['records']} records; A/B logged/unlogged throughput "
            f"{o['ab_ratio_logged_over_unlogged']['median']:.3f} ({o['ab_ratio_logged_over_unlogged']['min']:.3f}-"
            f"{o['ab_ratio_logged_over_unlogged']['max']:.3f}, noise floor)"
        )
    if args.json:
        write_json_atomic(args.json, result)
    return 0


if __name__ == "__main__":
    mx.random.seed(0)
    sys.exit(main())
