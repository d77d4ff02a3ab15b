"""One report, one answer: where two pages of a report folder state different values of one quantity (c(w),
a*(k): key results ``"<model> c(<w>)"`` or verdict text "c(2) = 1.38"), values their cost model does not have, or
opposite speed verdicts (``SpeedVerdict``: "pays" against "loses"; "inconclusive" agrees with either).
``conflicts`` lists them in words: the index opens with them and ``specbench report`` prints them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from specbench.cost.breakeven import break_even_acceptance
from specbench.cost.profile import Profile
from specbench.report import answer, cost_models
from specbench.report.outputs import read_summary
from specbench.report.verdicts import LOSES, PAYS, SpeedVerdict

#: Values stored as key results agree to this relative difference (they come from one profile, computed alike).
RELATIVE = 1e-6

_KEY = re.compile(r"^(?P<model>.+) (?P<quantity>c|a\*)\((?P<w>\d+)\)$")
_VERDICT = re.compile(r"\b(?P<quantity>c|a\*)\((?P<w>\d+)\) = (?P<value>\d+(?:\.\d+)?)")


@dataclass(frozen=True)
class Statement:
    """A value of one quantity a page of the report states: ``quantity`` is "c(2)", "a*(4)", ...; ``model`` the
    model it speaks of ("" where the page's verdict does not name it)."""

    page: str
    model: str
    quantity: str
    value: float
    #: Half a unit of the last digit printed (0 for a stored key result): how far the value may be from the truth.
    rounding: float = 0.0

    def agrees(self, value: float, rounding: float = 0.0) -> bool:
        return abs(self.value - value) <= self.rounding + rounding + RELATIVE * max(abs(self.value), abs(value))


def statements(out: str | Path) -> list[Statement]:
    """What every page of the report folder ``out`` states of c(w) and a*(k), from its stored summary."""
    found = []
    for page in _pages(out):
        summary = read_summary(out, page)
        for key, value in (summary.get("values") or {}).items():
            match = _KEY.match(str(key))
            if match and isinstance(value, (int, float)) and math.isfinite(value):
                model, quantity, w = match.group("model", "quantity", "w")
                found.append(Statement(page, model, f"{quantity}({w})", float(value)))
        for match in _VERDICT.finditer(str(summary.get("verdict") or "")):
            quantity, w, text = match.group("quantity", "w", "value")
            rounding = 0.5 * 10.0 ** -len(text.partition(".")[2])
            found.append(Statement(page, "", f"{quantity}({w})", float(text), rounding))
    return found


def _pages(out: str | Path) -> list[str]:
    """The pages of report folder ``out`` that stored a summary."""
    return [path.parent.name for path in sorted(Path(out).glob("*/summary.json"))]


def speed_statements(out: str | Path) -> list[tuple[str, SpeedVerdict]]:
    """(page, verdict) for every speed verdict the pages of report folder ``out`` state, the answer's table's
    (``answer.PAGE``) among them."""
    found = []
    for page in _pages(out):
        for data in read_summary(out, page).get("speeds") or []:
            verdict = SpeedVerdict.of_json(data)
            if verdict is not None:
                found.append((page, verdict))
    return found + [(answer.PAGE, verdict) for verdict in answer.answer_speeds(out)]


def opposite_verdicts(said: list[tuple[str, SpeedVerdict]]) -> list[str]:
    """Every quantity of which one page says "pays" and another "loses", in words naming both pages."""
    by_quantity: dict[tuple[str, str, str, str, float, str], list[tuple[str, SpeedVerdict]]] = {}
    for page, verdict in said:
        by_quantity.setdefault(verdict.quantity, []).append((page, verdict))
    problems = []
    for group in by_quantity.values():
        pays = sorted({page for page, v in group if v.word == PAYS})
        loses = sorted({page for page, v in group if v.word == LOSES})
        if pays and loses:
            problems.append(
                f"{group[0][1].names()}: {' and '.join(pays)} say{'s' * (len(pays) == 1)} it pays, "
                f"{' and '.join(loses)} say{'s' * (len(loses) == 1)} it loses"
            )
    return problems


def _of_profile(profile: Profile, quantity: str) -> list[float]:
    """The values ``quantity`` has in ``profile``, one per verify mode it measured."""
    width = int(quantity[quantity.index("(") + 1 : -1])
    values = []
    for mode in profile.costs:
        if quantity.startswith("c("):
            if width <= max(profile.widths[mode]):
                values.append(profile.c(width, mode))
        elif width < max(profile.widths[mode]):
            a_star = float(break_even_acceptance(profile, 0.0, width, mode)[width - 1])
            values.append(a_star)
    return [v for v in values if math.isfinite(v)]


def conflicts(out: str | Path) -> list[str]:
    """Every disagreement between the pages of the report in ``out`` and its recorded cost models, in words: a
    model's c(w) or a*(k) stated with two values, or with one its cost model does not have (a page that measured
    or planned with a profile of its own), and opposite speed verdicts of one quantity (``opposite_verdicts``).
    Verdict statements that do not name their model are checked against every recorded model's values."""
    recorded = cost_models.recorded(Path(out))
    names: dict[str, Profile] = {}
    for key, (profile, _) in recorded.items():
        for name in (key, profile.name, profile.model):
            names.setdefault(str(name), profile)
    said = statements(out)
    problems = []
    by_quantity: dict[tuple[str, str], list[Statement]] = {}
    for s in said:
        if s.model:
            by_quantity.setdefault((s.model, s.quantity), []).append(s)
    for (model, quantity), group in sorted(by_quantity.items()):
        if not all(a.agrees(b.value, b.rounding) for a in group for b in group):
            where = ", ".join(f"{s.value:.3g} on {s.page}" for s in group)
            problems.append(f"{model} {quantity} differs between pages: {where}")
    for s in said:
        profiles = [names[s.model]] if s.model in names else ([] if s.model else [p for p, _ in recorded.values()])
        expected = [v for p in profiles for v in _of_profile(p, s.quantity)]
        if expected and not any(s.agrees(v) for v in expected):
            model = s.model or "the report's model"
            shown = " or ".join(f"{v:.3g}" for v in expected)
            problems.append(f"{s.page} states {model} {s.quantity} = {s.value:.3g}; the cost model: {shown}")
    return problems + opposite_verdicts(speed_statements(out))
