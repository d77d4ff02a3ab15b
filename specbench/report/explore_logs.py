"""The explorer's logic: a drafter, draft length k and policy replayed over the plain greedy outputs a report
recorded, with the recorded output in place of the model (``specbench.simulate.simulate``; exact under greedy
verification). Per choice: tokens per verification, acceptance per position, the predicted speedup, the sweep's
measured one where it ran the same choice, and the output coloured by token source.

    recordings = load_recordings("smollm2-135m", model, tokenizer, output_dir)
    result = replay(recordings, Choice("lookup", k=4, policy="fixed"))
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import polars as pl

from specbench.bench.positions import per_position_acceptance
from specbench.core.log import StepLog, StepRecord
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy
from specbench.core.verify import check_verify_mode
from specbench.cost import Profile, drafter_cost, predicted_speedup, profile_for
from specbench.report import recorded
from specbench.report.render import coloured_html, legend_html, table_html
from specbench.simulate.simulate import Recorded, model_free_drafter, model_free_drafters, record, simulate

#: Policy families a choice picks from; auto drafts at most k tokens.
POLICIES = ("fixed", "adaptive", "auto")
#: The prompt choice that stands for every recorded prompt.
EVERY_PROMPT = ""


@dataclass(frozen=True)
class ReplayRow:
    """A replayed choice's numbers (``Replay.row``), a row of ``grid``'s table; the rates are None where nothing
    was verified."""

    drafter: str
    policy: str
    k: int
    prompts: int
    tokens: int
    verifies: int
    drafted: int
    accepted: int
    tokens_per_verify: float | None
    acceptance_rate: float | None
    predicted_speedup: float | None
    measured_speedup: float | None


#: Columns of ``grid``'s table, in the order it shows them.
ROW_COLUMNS = tuple(f.name for f in fields(ReplayRow))


@dataclass(frozen=True)
class Choice:
    """What the explorer replays: a model-free drafter, a draft length, a policy family and a prompt (a recorded
    prompt's id, a category, or ``EVERY_PROMPT``)."""

    drafter: str = "lookup"
    k: int = 4
    policy: str = "fixed"
    prompt: str = EVERY_PROMPT

    def check(self) -> None:
        """A ValueError for a drafter, k or policy the replay cannot use."""
        if self.drafter not in model_free_drafters():
            raise ValueError(
                f"drafter {self.drafter!r}: the replay runs without the model, so only model-free drafters "
                f"({', '.join(model_free_drafters())}) can be chosen"
            )
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise ValueError(f"k: a draft length is an integer >= 1, got {self.k!r}")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")

    def draft_policy(self) -> DraftPolicy:
        """A fresh policy object: fixed:k, adaptive:k, or auto drafting at most k."""
        self.check()
        if self.policy == "auto":
            return DraftPolicy.auto(max_k=self.k)
        return getattr(DraftPolicy, self.policy)(self.k)

    @property
    def policy_name(self) -> str:
        """The policy as the logs name it: fixed:4, adaptive:4, or auto (k <= 4)."""
        return f"auto (k <= {self.k})" if self.policy == "auto" else f"{self.policy}:{self.k}"


@dataclass
class Recordings:
    """Plain greedy outputs of one model (rows of ``recorded.OUTPUTS_SCHEMA``), the tokenizer that reads them, the
    cost profile that prices their steps in ``verify`` mode (None: no prediction, and no auto policy), and the
    report folder whose sweep may have measured a choice (``output_dir``)."""

    outputs: pl.DataFrame
    model: str
    verify: str
    profile: Profile | None = None
    tokenizer: Any = None
    output_dir: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        if self.outputs.is_empty():
            raise ValueError(f"no recorded outputs of {self.model}: record some first (``load_recordings``)")

    def prompt_choices(self) -> list[tuple[str, str]]:
        """(label, value) of every prompt choice: every prompt, each category of several, each prompt."""
        rows = recorded.output_rows(self.outputs)
        choices = [(f"every recorded prompt ({len(rows)})", EVERY_PROMPT)]
        counts = self.outputs.group_by("category", maintain_order=True).len()
        choices += [(f"category {c} ({n} prompts)", c) for c, n in counts.iter_rows() if n > 1]
        for row in rows:
            text = " ".join(row.text.split())
            short = text if len(text) <= 48 else text[:47] + "…"
            choices.append((f"{row.id} · {row.category}: {short}", row.id))
        return choices

    def select(self, prompt: str) -> list[recorded.OutputRow]:
        """The recorded outputs a prompt choice stands for: every one, the prompt of that id, or a category's."""
        if prompt == EVERY_PROMPT:
            return recorded.output_rows(self.outputs)
        for column in ("id", "category"):
            rows = self.outputs.filter(pl.col(column) == prompt)
            if not rows.is_empty():
                return recorded.output_rows(rows)
        known = ", ".join(repr(v) for _, v in self.prompt_choices()[1:])
        raise ValueError(f"prompt {prompt!r} is neither a recorded prompt's id nor a category: pick one of {known}")

    def describe(self) -> str:
        """Where the outputs came from and what prices them, in words."""
        rows = recorded.output_rows(self.outputs)
        sources, tokens = ", ".join(dict.fromkeys(r.source for r in rows)), sum(len(r.output) for r in rows)
        text = (
            f"{len(self.outputs)} plain greedy outputs of {self.model} ({tokens} tokens, recorded by {sources}), "
            f"replayed in {self.verify} verify mode"
        )
        if self.profile is None:
            return text + "; no cost profile: no predicted speedup"
        curve = self.profile.curve(self.verify)
        shown = ", ".join(f"c({w}) = {curve[w - 1]:.2f}" for w in (2, 4, 8) if w <= len(curve))
        kind = (
            "a quick profile measured now (`specbench profile` stores a full one)"
            if self.profile.quick
            else "the stored profile"
        )
        return f"{text}; priced by {kind} of {self.profile.device} ({shown})"


def load_recordings(
    model_name: str,
    model: Any,
    tokenizer: Any,
    output_dir: str | os.PathLike | None = None,
    verify: str = "",
    categories: Sequence[str] | None = None,
    max_tokens: int = 32,
) -> Recordings:
    """The plain greedy outputs of ``model_name`` the report in ``output_dir`` recorded (the draft-length sweep's,
    in ``verify`` mode, "" for the engine's default), priced by ``model``'s cost profile (the stored one, else a
    quick measurement); a prompt recorded at several lengths keeps its longest output. When the report holds none,
    one bundled prompt of each of ``categories`` is decoded plainly here (``max_tokens`` each) and recorded in the
    report for next time."""
    mode = GenerateOptions(verify=verify or None).verify_mode
    outputs = recorded.recorded_outputs(output_dir).filter(
        (pl.col("model") == model_name) & (pl.col("verify") == (verify or ""))
    )
    if outputs.is_empty():
        from specbench.inputs.prompts import prompts_from

        prompts = prompts_from("bundled", tokenizer, list(categories or []) or None, 1)
        options = GenerateOptions(max_tokens=max_tokens, verify=verify or None)
        requests = record(model, [p.ids for p in prompts], options, tokenizer)
        found = [
            recorded.OutputRow.of(p, r.output, r.finish_reason, model_name, max_tokens, verify or "", "explorer")
            for p, r in zip(prompts, requests)
        ]
        outputs = recorded.outputs_frame(found)
        recorded.write_outputs(output_dir, outputs)
    outputs = outputs.sort("max_tokens", descending=True).unique("id", keep="first").sort("category", "id")
    profile = profile_for(model, mode)
    return Recordings(outputs, model_name, mode, profile, tokenizer, output_dir)


@dataclass
class Replay:
    """One choice replayed: every step (a ``prompt`` column names the recorded prompt), the totals, acceptance per
    draft position, the predicted speedup (None without a profile) and the sweep's measured one (None where it
    did not run this choice on every prompt)."""

    choice: Choice
    log: StepLog
    prompts: list[str]
    stats: dict[str, Any]
    positions: pl.DataFrame
    predicted_speedup: float | None
    measured_speedup: float | None
    drafter_cost: float = 0.0

    def row(self) -> ReplayRow:
        """The choice's numbers as one row."""
        verified = bool(self.stats["verifies"])
        values: dict[str, Any] = {c: self.stats[c] for c in ("tokens", "verifies", "drafted", "accepted")}
        values |= {c: self.stats[c] if verified else None for c in ("tokens_per_verify", "acceptance_rate")}
        values |= {"predicted_speedup": self.predicted_speedup, "measured_speedup": self.measured_speedup}
        return ReplayRow(self.choice.drafter, self.choice.policy, self.choice.k, len(self.prompts), **values)

    def records_of(self, prompt: str) -> list[StepRecord]:
        """The step records of one replayed prompt."""
        return [r for r in self.log.records if r.labels["prompt"] == prompt]


def _measured(
    recordings: Recordings, rows: list[recorded.OutputRow], choice: Choice, policy: DraftPolicy
) -> float | None:
    """The mean speedup the report's sweep measured for this drafter and policy over these prompts (the run
    recorded with the same model, prompt ids and options: greedy, seed 0, as the sweep runs them), or None unless it
    ran every one of them."""
    if choice.policy == "auto":  # the sweep's auto chose its own longest draft; this one drafts at most k
        return None
    speedups = []
    for row in rows:
        verify = check_verify_mode(row.verify) if row.verify else None
        options = GenerateOptions(max_tokens=row.max_tokens, seed=0, verify=verify)
        key = recorded.generation_key(recordings.model, row.prompt, choice.drafter, policy.name, options)
        found = recorded.find(recordings.output_dir, key)
        if found is None or found.row.get("speedup") is None:
            return None
        speedups.append(float(found.row["speedup"]))
    return sum(speedups) / len(speedups) if speedups else None


def replay(recordings: Recordings, choice: Choice) -> Replay:
    """Replay ``choice`` over its recorded outputs: a fresh drafter and policy per prompt, as the sweep runs them."""
    choice.check()
    if choice.policy == "auto" and recordings.profile is None:
        raise ValueError("the auto policy plans with the model's verify cost: these recordings have no cost profile")
    rows = recordings.select(choice.prompt)
    log = StepLog()
    prompts = []
    for row in rows:
        request = Recorded(row.prompt, row.output, row.finish_reason, row.id)
        options = GenerateOptions(max_tokens=len(request.output), verify=recordings.verify)
        drafter = model_free_drafter(choice.drafter, choice.k)
        steps = simulate([request], drafter, choice.draft_policy(), options, cost=recordings.profile)
        for r in steps.records:
            log.append(r.labelled(prompt=row.id, category=row.category))
        prompts.append(row.id)
    frame = log.to_polars()
    positions = per_position_acceptance(frame, ("drafter",), unit="prompt")
    d = drafter_cost(model_free_drafter(choice.drafter, choice.k), recordings.profile)
    predicted = None
    if recordings.profile is not None:
        predicted = predicted_speedup(log.records, recordings.profile, d, mode=recordings.verify, tokens="emitted")
    return Replay(
        choice,
        log,
        prompts,
        log.stats(),
        positions,
        predicted,
        _measured(recordings, rows, choice, choice.draft_policy()),
        d,
    )


def grid(
    recordings: Recordings, drafter: str, prompt: str, ks: Sequence[int], policies: Sequence[str] = POLICIES
) -> pl.DataFrame:
    """One row (``ROW_COLUMNS``) per policy and draft length, ``drafter`` replayed over ``prompt``'s outputs; auto
    is left out without a cost profile."""
    if not ks:
        raise ValueError("give at least one draft length")
    usable = [p for p in policies if p != "auto" or recordings.profile is not None]
    rows = [asdict(replay(recordings, Choice(drafter, k, p, prompt)).row()) for p in usable for k in sorted(set(ks))]
    schema = {c: pl.Float64 for c in ("tokens_per_verify", "acceptance_rate", "predicted_speedup", "measured_speedup")}
    return pl.DataFrame(rows, schema_overrides=schema, infer_schema_length=None)


def best_predicted(table: pl.DataFrame) -> str:
    """The grid's choice with the best predicted speedup among those that verified a draft, in words ("fixed k=3:
    1.20x"); a choice that only took plain steps is never the best."""
    drafted = table.filter((pl.col("verifies") > 0) & pl.col("predicted_speedup").is_not_null())
    if drafted.is_empty():
        return "none (no choice verified a draft)"
    best = ReplayRow(**drafted.sort("predicted_speedup", descending=True, maintain_order=True).row(0, named=True))
    return f"{best.policy} k={best.k}: {best.predicted_speedup:.2f}x"


# -- what the explorer shows -----------------------------------------------------------------------------------------


def choice_html(result: Replay, recordings: Recordings) -> str:
    """The choice's numbers as a small HTML table, with what the predicted speedup rests on."""
    row = result.row()
    cells = [
        ("choice", f"{row.drafter}, {result.choice.policy_name}"),
        ("prompts replayed", str(row.prompts)),
        ("tokens", str(row.tokens)),
        ("verifications", str(row.verifies)),
        ("tokens per verification", f"{row.tokens_per_verify:.2f}" if row.verifies else "no verification"),
        ("drafted tokens accepted", f"{row.acceptance_rate:.0%} of {row.drafted}" if row.drafted else "none"),
        ("#MAT (tokens per forward)", f"{result.stats['mean_accepted_tokens']:.2f}"),
        ("pauses (plain steps the policy chose)", str(result.stats["pauses"])),
    ]
    if result.predicted_speedup is not None and recordings.profile is not None:
        cells.append(
            (
                f"predicted speedup ({recordings.verify} verify cost, d = {result.drafter_cost:.3f})",
                f"{result.predicted_speedup:.2f}x",
            )
        )
    else:
        cells.append(("predicted speedup", "no cost profile"))
    measured = result.measured_speedup
    if measured is None:
        cells.append(("measured by the sweep", "not run by the sweep"))
    else:
        cells.append((f"measured by the sweep (mean of {row.prompts} paired runs)", f"{measured:.2f}x"))
    return table_html(cells, "0.9em")


def coloured_outputs(result: Replay, recordings: Recordings, max_height: str | None = "12em") -> str:
    """Each replayed prompt's output, every token on the background of its source (one legend above all)."""
    by_id = {row.id: row for row in recorded.output_rows(recordings.outputs)}
    parts = [legend_html()]
    for prompt in result.prompts:
        row = by_id[prompt]
        steps = result.records_of(prompt)
        verifies = sum(1 for r in steps if r.kind == "verify")
        head = f"{prompt} · {row.category}: {len(row.output)} tokens, {verifies} verifications"
        parts.append(f"<div style='margin-top:6px;font-size:0.85em'><b>{html.escape(head)}</b></div>")
        parts.append(coloured_html(steps, recordings.tokenizer, legend=False, max_height=max_height))
    return "".join(parts)


def positions_figure(result: Replay, title: str | None = None):
    """Acceptance of each draft position given the earlier ones were accepted, with its 95 % interval and how many
    drafts reached it (``figures.per_position``)."""
    from specbench.report.figures import per_position

    title = title or f"{result.choice.drafter}, {result.choice.policy_name}: acceptance per draft position"
    return per_position(result.positions, title, min_reached=1, unconditional=False)


def grid_figure(table: pl.DataFrame, title: str = "Replayed over the recorded outputs"):
    """Tokens per verification (left) and predicted speedup (right) against draft length, a line per policy."""
    import matplotlib.pyplot as plt

    from specbench.report.figures.style import POLICY_MARKERS, POLICY_STYLES, label_pair, no_data

    fig, (left, right) = plt.subplots(1, 2, figsize=(9.0, 4.0), constrained_layout=True)
    if table.is_empty():
        no_data(left, "no choice replayed")
        no_data(right, "no choice replayed")
        fig.suptitle(title)
        return fig
    for (policy,), rows in table.sort("k").group_by("policy", maintain_order=True):
        style = {"linestyle": POLICY_STYLES[policy], "marker": POLICY_MARKERS[policy], "label": policy}
        replayed = [ReplayRow(**row) for row in rows.iter_rows(named=True)]
        if verified := [r for r in replayed if r.tokens_per_verify is not None]:
            left.plot([r.k for r in verified], [r.tokens_per_verify for r in verified], **style)
        if predicted := [r for r in replayed if r.predicted_speedup is not None]:
            right.plot([r.k for r in predicted], [r.predicted_speedup for r in predicted], **style)
    for ax in (left, right):
        ax.set_xticks(sorted(table["k"].unique().to_list()))
    tokens = (left, "tokens per verification", "tokens per verification")
    speed = (right, "speedup over plain (predicted)", "predicted speedup (cost profile)")
    label_pair(fig, "draft length k (auto: at most k)", tokens, speed, title)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=8)
    return fig
