"""Interactive explorers for JupyterLab, and the replays behind one.

``LogExplorer`` replays a chosen drafter, draft length k, policy and prompt over the plain greedy outputs a report
recorded, with the recorded output in place of the model (``specbench.simulate.simulate``; exact under greedy
verification). Per choice: tokens per verification, acceptance per position, the predicted speedup, the sweep's
measured one where it ran the same choice, and the output coloured by token source. ``Explorer`` generates with a
model and shows the output coloured by token source, its stats and per-step plot.

    recordings = load_recordings("smollm2-135m", model, tokenizer, output_dir)
    result = replay(recordings, Choice("lookup", k=4, policy="fixed"))
    LogExplorer(recordings).show()
    Explorer(models=["smollm2-135m"]).show()
"""

from __future__ import annotations

import html
import io
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import polars as pl

from specbench.bench.sweep_summary import per_position_acceptance
from specbench.bench.timing import clock_stats
from specbench.core.log import StepLog
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.core.verify import VERIFY_MODES, check_verify_mode
from specbench.cost import Profile, drafter_cost, predicted_speedup, profile_for
from specbench.decoding import speculative_generate
from specbench.drafters import DRAFTERS
from specbench.inputs.capabilities import usable_drafters
from specbench.inputs.prompts import render_prompt
from specbench.models.load import load
from specbench.report import recorded
from specbench.report.render import coloured_html, legend_html, stats_html, table_html
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
        kind = "the stored profile"
        if self.profile.quick:
            kind = "a quick profile measured now (`specbench profile` stores a full one)"
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
    measured = _measured(recordings, rows, choice, choice.draft_policy())
    return Replay(choice, log, prompts, log.stats(), positions, predicted, measured, d)


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
        cost = f"{recordings.verify} verify cost, d = {result.drafter_cost:.3f}"
        cells.append((f"predicted speedup ({cost})", f"{result.predicted_speedup:.2f}x"))
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
        steps = [r for r in result.log.records if r.labels["prompt"] == prompt]
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


# -- the widgets -------------------------------------------------------------------------------------------------------


VERIFY_CHOICES = (("default", ""), *((mode, mode) for mode in VERIFY_MODES))
DEFAULT_PROMPT = "Write a Python function that adds two numbers, then call it three times."


def figure_png(figure: Any) -> bytes:
    """``figure`` as PNG bytes, for an ``ipywidgets.Image`` (the figure is closed: shown once). The explorers draw
    into images rather than ``Output`` widgets: a headless run (papermill, nbconvert) answers an ``Output`` widget's
    messages on the kernel's shell channel while it waits on that channel for the cell's reply, and that race can
    hang the cell for good (jupyter/nbclient#312)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


class _Widget:
    """Shown in a notebook as its ``widget``."""

    widget: Any

    def show(self) -> None:
        from IPython.display import display

        display(self.widget)

    def _ipython_display_(self) -> None:
        self.show()


class Explorer(_Widget):
    """ipywidgets controls with live coloured output, generation stats and a per-step plot. ``models``: names for
    ``specbench.models.load.load`` (loaded on first use and kept), or a mapping name -> (model, tokenizer); ``verify``:
    "exact", "fast" or "" (the engine's default: exact when greedy). ``run()`` (the Generate button) decodes with the
    current settings, refreshing the coloured text as tokens arrive."""

    def __init__(
        self,
        models: Sequence[str] | dict[str, tuple[Any, Any]] = ("smollm2-135m",),
        drafters: Sequence[str] | None = None,
        prompt: str = DEFAULT_PROMPT,
        drafter: str = "lookup",
        policy: str = "auto",
        k: int = 4,
        temperature: float = 0.0,
        max_tokens: int = 64,
        verify: str = "",
        refresh_s: float = 0.25,
    ):
        import ipywidgets as w

        self.loaded: dict[str, tuple[Any, Any]] = dict(models) if isinstance(models, dict) else {}
        names = list(models)
        if not names:
            raise ValueError("give at least one model")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if verify not in dict(VERIFY_CHOICES).values():
            raise ValueError(f"verify must be 'exact', 'fast' or '' (the engine's default), got {verify!r}")
        drafters = list(drafters) if drafters is not None else [*DRAFTERS.names(), "none"]
        if drafter not in drafters:
            raise ValueError(f"drafter {drafter!r} is not among the choices {list(drafters)}")
        self.refresh_s = refresh_s
        self.generation = None
        self.figure = None
        label = {"description_width": "90px"}
        self.model = w.Dropdown(options=names, value=names[0], description="model", style=label)
        self.drafter = w.Dropdown(options=list(drafters), value=drafter, description="drafter", style=label)
        self.policy = w.Dropdown(options=list(POLICIES), value=policy, description="policy", style=label)
        self.k = w.IntSlider(value=k, min=1, max=16, description="k", style=label)
        self.temperature = w.FloatSlider(
            value=temperature, min=0.0, max=1.5, step=0.05, description="temperature", style=label
        )
        self.max_tokens = w.IntSlider(value=max_tokens, min=1, max=512, description="max tokens", style=label)
        self.verify = w.Dropdown(options=list(VERIFY_CHOICES), value=verify, description="verify", style=label)
        self.prompt = w.Textarea(
            value=prompt, description="prompt", style=label, layout=w.Layout(width="100%", height="6em")
        )
        self.chat = w.Checkbox(value=True, description="chat template")
        self.button = w.Button(description="Generate", button_style="primary", icon="play")
        self.status = w.HTML(value="")
        self.text = w.HTML(value="")
        self.stats = w.HTML(value="")
        self.plot = w.Image(format="png")  # an image, not an Output widget: see ``figure_png``
        self.button.on_click(self.run)
        controls = w.VBox(
            [
                w.HBox([self.model, self.drafter, self.policy]),
                w.HBox([self.k, self.temperature, self.max_tokens]),
                self.prompt,
                w.HBox([self.verify, self.chat, self.button, self.status]),
            ]
        )
        self.widget = w.VBox([controls, self.text, w.HBox([self.stats, self.plot])])

    def _load(self, name: str) -> tuple[Any, Any]:
        if name not in self.loaded:
            self.status.value = f"loading {html.escape(name)} ..."
            self.loaded[name] = load(name)
        return self.loaded[name]

    def draft_policy(self) -> DraftPolicy:
        """The policy the controls select (auto picks its own draft length; the others draft k)."""
        return as_policy("auto" if self.policy.value == "auto" else f"{self.policy.value}:{self.k.value}")

    def run(self, _button: Any = None):
        """Generate with the current settings; returns the Generation (None if it could not start)."""
        self.button.disabled = True
        try:
            model, tokenizer = self._load(self.model.value)
            if tokenizer is None:
                self.status.value = f"<b>{html.escape(self.model.value)} has no tokenizer</b>: pick a model with one"
                return None
            factories, skipped = usable_drafters([self.drafter.value], model, self.model.value)
            if self.drafter.value in skipped:
                why = f"drafter {self.drafter.value} is not available"
                self.status.value = f"<b>{html.escape(why)}</b>: {html.escape(skipped[self.drafter.value])}"
                return None
            drafter = factories[self.drafter.value]()
            policy = self.draft_policy() if drafter is not None else None
            prompt = render_prompt(tokenizer, self.prompt.value, chat=self.chat.value)
            options = GenerateOptions(
                max_tokens=self.max_tokens.value,
                temperature=float(self.temperature.value),
                seed=0,
                verify=self.verify.value or None,
            )
            gen = speculative_generate(model, prompt, options, drafter=drafter, policy=policy, tokenizer=tokenizer)
            self.generation = gen
            self.status.value = "generating ..."
            shown = first = last = time.perf_counter()
            drawing = 0.0  # time spent refreshing the text, left out of the decode time
            for i, _ in enumerate(gen):
                last = time.perf_counter()
                if i == 0:
                    first = last
                if last - shown > self.refresh_s:
                    self.text.value = coloured_html(gen.log, tokenizer)
                    self.status.value = f"generating ... {len(gen.tokens)} tokens"
                    shown = time.perf_counter()
                    drawing += shown - last
            self._finish(gen, tokenizer, last - first - drawing, "done")
            return gen
        finally:
            self.button.disabled = False

    def _finish(self, gen: Any, tokenizer: Any, seconds: float, how: str) -> None:
        """Show a finished generation: its coloured text, stats (decode time ``seconds``) and per-step plot."""
        from specbench.report.figures import step_timeline

        self.text.value = coloured_html(gen.log, tokenizer)
        stats = clock_stats(gen, seconds)
        self.stats.value = stats_html(stats)
        self.status.value = (
            f"{html.escape(how)}: {stats['tokens']} tokens, {stats['decode_tokens_per_s']:.1f} tok/s, "
            f"{html.escape(stats['finish_reason'])}"
        )
        self.figure = step_timeline(gen.log, title=f"{stats['tokens']} tokens: per-step view")
        self.plot.value = figure_png(self.figure)


class LogExplorer(_Widget):
    """ipywidgets controls (drafter, k, policy, prompt) over recorded outputs: every change replays the choice
    (``replay``, milliseconds: no model runs) and shows its numbers, its acceptance per draft position
    and its output coloured by token source. ``replay`` holds the choice shown."""

    def __init__(self, recordings: Recordings, choice: Choice | None = None):
        import ipywidgets as w

        choice = choice or Choice()
        choice.check()
        recordings.select(choice.prompt)  # a ValueError naming the choices when the prompt is not recorded
        self.recordings = recordings
        self.replay: Replay | None = None
        label = {"description_width": "70px"}
        policies = [p for p in POLICIES if p != "auto" or recordings.profile is not None]
        self.drafter = w.Dropdown(
            options=list(model_free_drafters()), value=choice.drafter, description="drafter", style=label
        )
        self.k = w.IntSlider(value=choice.k, min=1, max=16, description="k", style=label, continuous_update=False)
        self.policy = w.Dropdown(options=policies, value=choice.policy, description="policy", style=label)
        self.prompt = w.Dropdown(
            options=recordings.prompt_choices(),
            value=choice.prompt,
            description="prompt",
            style=label,
            layout=w.Layout(width="95%"),
        )
        self.status = w.HTML(value="")
        self.table = w.HTML(value="")
        self.text = w.HTML(value="")
        self.plot = w.Image(format="png")
        for control in (self.drafter, self.k, self.policy, self.prompt):
            control.observe(self.update, names="value")
        controls = w.VBox([w.HBox([self.drafter, self.k, self.policy]), self.prompt, self.status])
        self.widget = w.VBox([controls, w.HBox([self.table, self.plot]), self.text])
        self.update()

    def choice(self) -> Choice:
        """The choice the controls select."""
        return Choice(self.drafter.value, int(self.k.value), self.policy.value, self.prompt.value)

    def update(self, _change: Any = None) -> Replay | None:
        """Replay the selected choice and show it; None (and the reason shown) when it cannot be replayed."""
        try:
            result = replay(self.recordings, self.choice())
        except ValueError as err:
            self.status.value = f"<b>cannot replay this choice</b>: {html.escape(str(err))}"
            return None
        self.replay = result
        self.status.value = html.escape(self.recordings.describe())
        self.table.value = choice_html(result, self.recordings)
        self.text.value = coloured_outputs(result, self.recordings)
        self.plot.value = figure_png(positions_figure(result))
        return result
