"""Interactive explorers for JupyterLab: ``LogExplorer`` replays a chosen drafter, k, policy and prompt over a
report's recorded outputs without the model (``explore_logs``); ``Explorer`` generates with a model and shows the
output coloured by token source, its stats and per-step plot.

    LogExplorer(recordings).show()          # recordings: explore_logs.load_recordings(...)
    Explorer(models=["smollm2-135m"]).show()
"""

from __future__ import annotations

import io
import time
from collections.abc import Sequence
from html import escape as esc
from typing import Any

from specbench.bench.timing import clock_stats
from specbench.core.options import GenerateOptions
from specbench.core.policies import DraftPolicy, as_policy
from specbench.core.verify import VERIFY_MODES
from specbench.decoding import speculative_generate
from specbench.drafters import DRAFTERS
from specbench.inputs.capabilities import usable_drafters
from specbench.inputs.prompts import render_prompt
from specbench.models.load import load
from specbench.report.explore_logs import (
    POLICIES,
    Choice,
    Recordings,
    Replay,
    choice_html,
    coloured_outputs,
)
from specbench.report.explore_logs import positions_figure as draw_positions
from specbench.report.explore_logs import replay as explore_replay
from specbench.report.render import coloured_html, stats_html
from specbench.simulate.simulate import model_free_drafters

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
    """ipywidgets controls with live coloured output, generation stats and a per-step plot.

    ``models``: names for ``specbench.models.load.load`` (loaded on first use and kept), or a
    mapping name -> (model, tokenizer) of models already loaded; ``verify``: "exact", "fast" or
    "" (the engine's default: exact when greedy). ``run()`` (the Generate button) decodes with
    the current settings, refreshing the coloured text as tokens arrive.
    """

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
            self.status.value = f"loading {esc(name)} ..."
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
                self.status.value = f"<b>{esc(self.model.value)} has no tokenizer</b>: pick a model with one"
                return None
            factories, skipped = usable_drafters([self.drafter.value], model, self.model.value)
            if self.drafter.value in skipped:
                reason = skipped[self.drafter.value]
                self.status.value = f"<b>drafter {esc(self.drafter.value)} is not available</b>: {esc(reason)}"
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
            f"{esc(how)}: {stats['tokens']} tokens, {stats['decode_tokens_per_s']:.1f} tok/s, "
            f"{esc(stats['finish_reason'])}"
        )
        self.figure = step_timeline(gen.log, title=f"{stats['tokens']} tokens: per-step view")
        self.plot.value = figure_png(self.figure)


class LogExplorer(_Widget):
    """ipywidgets controls (drafter, k, policy, prompt) over recorded outputs: every change replays the choice
    (``explore_logs.replay``, milliseconds: no model runs) and shows its numbers, its acceptance per draft position
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
            result = explore_replay(self.recordings, self.choice())
        except ValueError as err:
            self.status.value = f"<b>cannot replay this choice</b>: {esc(str(err))}"
            return None
        self.replay = result
        self.status.value = esc(self.recordings.describe())
        self.table.value = choice_html(result, self.recordings)
        self.text.value = coloured_outputs(result, self.recordings)
        self.plot.value = figure_png(draw_positions(result))
        return result
